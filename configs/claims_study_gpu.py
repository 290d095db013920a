"""The claims study's deepest point (depth 24: both fine-tune regimes, every recipe and merge of
configs/claims_study.py) on one GPU: how far a GPU carries the study in the few minutes a lent
device gives (issue 40's GPU check), stage by stage.

  python -m xlt.main --config=configs/claims_study_gpu.py --workdir=runs/claims_study_gpu

Exploratory, not preregistered: a run on another device trains other bases
(docs/prereg/claims_study.md, "Devices"), so its numbers are not the study's depth-24 verdicts,
which come from the CPU run (results/studies/claims_study.json). No reference numbers.
"""

from configs import claims_study


def get_config():
  c = claims_study.get_config()
  c.name = "claims_study_gpu"
  c.grid = [claims_study.point(24)]
  return c
