"""Addition transfer, every pair of reference Table 2, as one grid.

  python -m xlt.main --config=configs/addition_table2.py --workdir=runs/table2        # reference size (GPU)
  python -m xlt.main --config=configs/addition_table2.py:cpu --workdir=runs/table2_cpu

Reference (lang 1 alone / mixed, lang 2 alone / mixed, exact match):
  Standard + Letter  11520/1280   100% / 98.6%    0%     / 98.2%
  Standard + Roman    8192/2048   100% / 98.9%    19.42% / 59.38%
  Standard + Hex      8192/4096   100% / 97.5%    0%     / 97.94%
  Letter + Standard   8192/4096   100% / 98.4%    22.98% / 98.1%
  Roman + Standard    8192/4096   100% / 98.2%    22.98% / 32%
  Hex + Standard     25600/4096   100% / 98.73%   22.98% / 96.09%
Each point trains its conditions × seeds together; finished points are skipped on a rerun.
"""

from configs import addition

PAIRS = (("standard", "letter", 11520, 1280), ("standard", "roman", 8192, 2048),
         ("standard", "hex", 8192, 4096), ("letter", "standard", 8192, 4096),
         ("roman", "standard", 8192, 4096), ("hex", "standard", 25600, 4096))


def get_config(arg: str = ""):
  c = addition.get_config(arg)
  c.name = "addition_table2"
  c.grid = [{"name": f"{s}+{t}", "mixture.source": s, "mixture.target": t,
             "mixture.source_samples": n, "mixture.target_samples": m,
             # 9-digit Roman examples are up to 108 tokens
             "model.block_size": 128 if "roman" in (s, t) else c.model.block_size}
            for s, t, n, m in PAIRS]
  return c
