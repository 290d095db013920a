"""The second claims study's pilots, stage 1c (issue 68): candidate base designs judged only on
the structure criteria preregistered in docs/prereg/claims_study_2_pilots_1c.md before these
runs (S1, S2L, S3, S4, B1, the gates); no claim is computed from them.

  python -m xlt.main --config=configs/structure_pilots_1c.py --workdir=runs/structure_pilots_1c \
      --point_workers=2
  python -m xlt.pilots --workdir=runs/structure_pilots_1c \
      --prereg=docs/prereg/claims_study_2_pilots_1c.md --runs_commit=<commit> \
      --out=results/studies/structure_pilots_1c.json

What changed from stage 1b (configs/structure_pilots_1b.py, results/studies/structure_pilots_1b.json),
from its structure figures alone: the 8-block scripts bases decide their output script after
block 3 (the lens's source share falls from 0.82 to 0.33 there), so the middle third already reads
out in the target. Two ways a base could keep the source's readout deeper: more blocks (16, the
same width), and a low-resource target the base meets mostly through translation (25 problems of
each operation in place of 100, 600 translations each way in place of 300). The grid, one point
per design, each a testbed run with 3 bases and only the experts the measures need:
  scripts_deep           A at 16 blocks: stage 1b's scripts_long base
  scripts_dose400_deep   A and B at 16 blocks: with 400 problems of the task in the source
  scripts_lowres         A at 8 blocks: the target in the base mostly through translation
Not a table of the papers: no reference numbers. Results: results/studies/structure_pilots_1c.json.
"""

from configs import structure_pilots, structure_pilots_1b
from configs.merge import OTHER_OPS, parts
from configs.structure_pilots import SCRIPTS, SOURCE, design, translations

DEEP = 16
TARGET = SCRIPTS[2]


def lowres_base() -> tuple:
  """structure_pilots.scripts_base with the target's own problems cut to 25 of each operation
  and its translations doubled (600 each way)."""
  mid = [p for l in SCRIPTS[:2] for p in parts(OTHER_OPS, l, 600, 150) + translations(l, 600)]
  target = parts(OTHER_OPS, TARGET, 25, 25) + translations(TARGET, 600)
  return parts(OTHER_OPS, SOURCE, 2000, 500) + tuple(mid) + target


DESIGNS = (
    {**design("scripts_deep", TARGET, structure_pilots.scripts_base()), "model.num_layers": DEEP},
    {**design("scripts_dose400_deep", TARGET, structure_pilots.scripts_base(), dose=400), "model.num_layers": DEEP},
    design("scripts_lowres", TARGET, lowres_base()),
)


def get_config():
  c = structure_pilots_1b.get_config()
  c.name = "structure_pilots_1c"
  c.grid = [dict(d) for d in DESIGNS]
  return c
