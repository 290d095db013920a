"""Sample-size sweep for one addition language alone (reference Figure 1).

  python -m xlt.main --config=configs/addition_sweep.py --workdir=runs/sweep_standard
  python -m xlt.main --config=configs/addition_sweep.py:cpu --workdir=runs/sweep_cpu \
      --config.sweep.language=roman --config.model.block_size=128

Finds where a language alone starts and stops generalizing: the reference saw standard
addition fail at 4k samples and reach ~100% at 8k; Roman above 80% already at 4k. All
sizes × seeds train together; a smaller size uses a prefix of the larger one's problems.

xlt `:cpu` (3-digit operands, sizes / 8; `--workdir=runs/sweep_cpu --config.num_seeds=1
--config.train.steps=1500`, commit 0061499, the :cpu recipe with dropout 0.05 and weight
decay 1.0; 1907 s wall beside another run and the tests), standard test exact match: 125:
0.10%, 250: 0.50%, 500: 11.20%, 1000: 100.00%, 2000: 95.80%, i.e. the threshold lies between
500 and 1000 (reference: 4k-8k). Rerun after xlt/matmul.py (9c2272c, 2026-11-25, an AMD EPYC
with 2 cores and AVX-512, nothing else running; 9.8 min wall): 125: 0.30%, 250: 0.30%, 500:
33.90%, 1000: 98.80%, 2000: 99.90%, the same threshold. Before b9b39ac (weight decay 0.1, no dropout; 489 s): 125:
0.20%, 250: 0.30%, 500: 1.60%, 1000: 74.40%, 2000: 92.10%: the same threshold.
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
