"""Sample-size sweep for one addition language alone (reference Figure 1).

  python -m xlt.main --config=configs/addition_sweep.py --workdir=runs/sweep_standard
  python -m xlt.main --config=configs/addition_sweep.py:cpu --workdir=runs/sweep_cpu \
      --config.sweep.language=roman --config.model.block_size=128

Finds where a language alone starts and stops generalizing: the reference saw standard
addition fail at 4k samples and reach ~100% at 8k; Roman above 80% already at 4k. All
sizes × seeds train together; a smaller size uses a prefix of the larger one's problems.
`:cpu` divides the sizes by 8 (configs/addition.py).
xlt's latest figures: results/addition_sweep_cpu.json, docs/results.md.
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
