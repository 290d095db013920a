"""Table 2's alone baselines at the reduced setting, shared: one per (language, sample count), 3
seeds each, where configs/addition_table2.py trains one seed of each row's own.

  python -m xlt.main --config=configs/addition_table2_shared.py --workdir=runs/table2_shared [--points=standard]

The reference reports one baseline per condition: Standard alone with 4,096 samples is 22.98% in
each of the three rows that have it. configs/addition_table2.py trains each row's alone models
beside its mixed ones, one seed each, so the same condition (Standard alone, 512 3-digit samples)
came out at 99.5%, 8.0% and 14.6% in three rows (results/addition_table2_cpu.json): the row's
seed and its data order decide it. Here every alone condition of Table 2 at `:cpu` (the
reference's counts / 8) trains once, with 3 seeds, by the same recipe and budget:
  standard  512 (lang 2 of Letter/Roman/Hex + Standard), 1,024 (lang 1 of Standard + Roman/Hex),
            1,440 (lang 1 of Standard + Letter)
  hex       512 (lang 2 of Standard + Hex), 3,200 (lang 1 of Hex + Standard)
  letter    160 (lang 2 of Standard + Letter), 1,024 (lang 1 of Letter + Standard)
  roman     256 (lang 2 of Standard + Roman), 1,024 (lang 1 of Roman + Standard)
The points run in that order; Roman's decoding makes its point the slowest (hours on one core).
xlt's figures: results/addition_table2_shared_cpu.json, docs/results.md.
"""

from configs import addition_sweep

SIZES = (("standard", (512, 1024, 1440)), ("hex", (512, 3200)), ("letter", (160, 1024)),
         ("roman", (256, 1024)))


def get_config(arg: str = ""):
  if arg not in ("", "cpu"):  # the counts are the reduced setting's
    raise ValueError(f"unknown config argument {arg!r}; expected '' or 'cpu' (the same baselines)")
  c = addition_sweep.get_config("cpu")
  c.name = "addition_table2_shared"
  c.num_seeds = 3
  c.grid = [{"name": lang, "sweep.language": lang, "sweep.samples": sizes} for lang, sizes in SIZES]
  return c
