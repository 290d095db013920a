"""Addition transfer, every pair of reference Table 2, as one grid.

  python -m xlt.main --config=configs/addition_table2.py --workdir=runs/table2        # reference size (GPU)
  python -m xlt.main --config=configs/addition_table2.py:cpu --workdir=runs/table2_cpu [--point_workers=2]

Reference (lang 1 alone / mixed, lang 2 alone / mixed, exact match):
  Standard + Letter  11520/1280   100% / 98.6%    0%     / 98.2%
  Standard + Roman    8192/2048   100% / 98.9%    19.42% / 59.38%
  Standard + Hex      8192/4096   100% / 97.5%    0%     / 97.94%
  Letter + Standard   8192/4096   100% / 98.4%    22.98% / 98.1%
  Roman + Standard    8192/4096   100% / 98.2%    22.98% / 32%
  Hex + Standard     25600/4096   100% / 98.73%   22.98% / 96.09%
Each point trains its conditions × seeds together; finished points are skipped on a rerun.
`:cpu` is the reduced setting of configs/addition.py (3-digit operands, counts / 8); Roman
points take over an hour each on one core (Roman decoding).
xlt's latest figures: results/addition_table2_cpu.json, docs/results.md; notes: docs/experiments.md.
"""

from configs import addition
from xlt.data import addition as addition_data

PAIRS = (("standard", "letter", 11520, 1280), ("standard", "roman", 8192, 2048),
         ("standard", "hex", 8192, 4096), ("letter", "standard", 8192, 4096),
         ("roman", "standard", 8192, 4096), ("hex", "standard", 25600, 4096))


def get_config(arg: str = ""):
  c = addition.get_config(arg)
  c.name = "addition_table2"
  scale = addition.CPU_SAMPLE_SCALE if arg == "cpu" else 1
  block = lambda s, t: max(c.model.block_size, *(  # 9-digit Roman examples are 108 tokens: 128
      -(-addition_data.max_example_length(l, c.addition.max_digits) // 64) * 64 for l in (s, t)))
  c.grid = [{"name": f"{s}+{t}", "mixture.source": s, "mixture.target": t,
             "mixture.source_samples": n // scale, "mixture.target_samples": m // scale,
             "model.block_size": block(s, t)}
            for s, t, n, m in PAIRS]
  return c
