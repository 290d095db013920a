"""The structure measure (xlt.structure: relative deltas per block, swap curve, language probe,
edge ratios) of finished testbed or regime-map runs, as an experiment a study's config can
request (xlt.experiments.structure):

  python -m xlt.main --config=configs/structure.py --workdir=runs/structure \
      --config.runs="('runs/claims_study/depth_6',)"

The runs are only read; the JSON files and figures are written in this workdir. The figures
recorded in results/structure/ were taken with `python -m xlt.structure` (the same measure).
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "structure"
  c.kind, c.task = "structure", "arithmetic"  # the experiment (xlt.experiments), its data
  c.runs = ()  # finished testbed / regime-map workdirs, e.g. ("runs/merge",)
  c.stages = ()  # their fine-tune stages; (): every one each run has (finetune, finetune_r<i>)
  c.problems = 200  # problems per set in the swap curve
  c.seeds = 0  # the first N seeds of each run; 0: all
  return c
