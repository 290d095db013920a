"""Sample-size sweep for one addition language alone (reference Figure 1).

  python -m xlt.main --config=configs/addition_sweep.py --workdir=runs/sweep_standard
  python -m xlt.main --config=configs/addition_sweep.py:cpu --workdir=runs/sweep_cpu \
      --config.sweep.language=roman --config.model.block_size=128

Finds where a language alone starts and stops generalizing: the reference saw standard
addition fail at 4k samples and reach ~100% at 8k; Roman above 80% already at 4k. All
sizes × seeds train together; a smaller size uses a prefix of the larger one's problems.

xlt `:cpu` (3-digit operands, sizes / 8; `--config.num_seeds=1 --config.train.steps=1500`,
489 s on 2 cores), standard test exact match: 125: 0.20%, 250: 0.30%, 500: 1.60%,
1000: 74.40%, 2000: 92.10%, i.e. the threshold lies between 500 and 1000 (reference: 4k-8k).
"""

import ml_collections

from configs import addition


def get_config(arg: str = ""):
  c = addition.get_config(arg)
  c.name = "addition_sweep"
  c.sweep = ml_collections.ConfigDict()
  c.sweep.language = "standard"
  c.sweep.samples = (1000, 2000, 4000, 8000, 16000)
  if arg == "cpu":  # the reduced setting's counts (configs/addition.py)
    c.sweep.samples = tuple(n // addition.CPU_SAMPLE_SCALE for n in c.sweep.samples)
  return c
