"""The second claims study's pilots, stage 1b (issue 68): candidate base designs judged only on
the structure criteria preregistered in docs/prereg/claims_study_2_pilots_1b.md before these
runs (S1, S2L, S3, S4, B1, the gates); no claim is computed from them.

  python -m xlt.main --config=configs/structure_pilots_1b.py --workdir=runs/structure_pilots_1b
  python -m xlt.pilots --workdir=runs/structure_pilots_1b \
      --prereg=docs/prereg/claims_study_2_pilots_1b.md --runs_commit=<commit> \
      --out=results/studies/structure_pilots_1b.json

What changed from stage 1 (configs/structure_pilots.py, results/studies/structure_pilots.json),
from its structure figures alone: every base trains twice as long (4,000 steps, the schedule
with it), since the own-script targets missed the base's gate G1 (64-84% on the target's other
operations); the two designs whose languages share every input token (dose_400, dose_100)
are dropped, since they cannot differ at the bottom (their similarity was as high after the
bottom blocks as through the middle); the task dose is a dose-response on the scripts base
(0, 400, 1,200 problems). The grid, one point per design, each a testbed run at 8 blocks with 3
bases and only the experts the measures need:
  scripts_long           A: configs/structure_pilots.py's scripts base
  scripts_dose400_long   A and B: the scripts base with 400 problems of the task in the source
  scripts_dose1200_long  A and B at three times that dose
  clones_long            C: the cloned target with operands least significant digit first
Not a table of the papers: no reference numbers. Results: results/studies/structure_pilots_1b.json.
"""

from configs import structure_pilots
from configs.structure_pilots import SCRIPTS, design, scripts_base

DESIGNS = (
    design("scripts_long", SCRIPTS[2], scripts_base()),
    design("scripts_dose400_long", SCRIPTS[2], scripts_base(), dose=400),
    design("scripts_dose1200_long", SCRIPTS[2], scripts_base(), dose=1200),
    {**structure_pilots.DESIGNS[2], "name": "clones_long"},
)
BASE_STEPS = 4000


def get_config():
  c = structure_pilots.get_config()
  c.name = "structure_pilots_1b"
  c.base.train.steps = BASE_STEPS  # the cosine schedule follows (configs/common.opt)
  c.grid = [dict(d) for d in DESIGNS]
  return c
