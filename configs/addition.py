"""Addition transfer, Standard + Letter (reference Table 2, row 1).

  python -m xlt.main --config=configs/addition.py --workdir=runs/addition            # reference size (GPU)
  python -m xlt.main --config=configs/addition.py:cpu --workdir=runs/addition_cpu    # reduced, 2-core CPU

Language 1 = standard decimal (N=11520), language 2 = letter (M=1280). Reference exact
match: standard alone 100%, mixed 98.6% ± 1.4; letter alone 0%, mixed 98.2% ± 1.6.
All Table 2 pairs: configs/addition_table2.py; sample-size sweeps: configs/addition_sweep.py.

The reference model: 12 layers, 8 heads, width 128, block 64 (~2.5e6 parameters), batch
1024, peak lr 0.002 with a linear warmup ("Lin. Incr."). `:cpu` keeps the data and the
languages but shrinks the model and batch so a pair trains in minutes on 2 cores: a
reduced model needs fewer steps but is a different model; compare directions, not digits.
"""

import ml_collections

from configs import common


def get_config(arg: str = ""):
  c = ml_collections.ConfigDict()
  c.name = "addition_standard_letter"
  c.task = "addition"
  c.seed = 0
  c.num_seeds = 3
  c.conditions = ("target_alone", "source_alone", "mixed")

  c.addition = ml_collections.ConfigDict()
  c.addition.min_digits = 3
  c.addition.max_digits = 9
  c.addition.seed = 0  # which problems are drawn (fixed across run seeds)
  c.addition.num_test = 1000
  c.addition.num_val = 256

  c.mixture = ml_collections.ConfigDict()
  c.mixture.source = "standard"
  c.mixture.target = "letter"
  c.mixture.source_samples = 11520
  c.mixture.target_samples = 1280

  # block 64 as in the reference; Roman pairs need 128 (9-digit Roman examples reach 108 tokens)
  c.model = common.model(num_layers=12, num_heads=8, d_model=128, block_size=64)
  # accuracy sits at 0 for a long while before addition is learned: no early stop before min_steps
  c.train = common.train(batch_size=1024, steps=5000, eval_every=250, patience=6, min_steps=2500)
  # "Lin. Incr.": linear warmup to the peak, then constant
  c.opt = common.opt(c.train, schedule="linear", peak_lr=2e-3, warmup_steps=500)
  c.eval = common.eval_(batch_size=1000)
  c.mesh = common.mesh()

  if arg == "cpu":
    reduce_for_cpu(c)
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; expected '' or 'cpu'")
  return c


def reduce_for_cpu(c):
  """Same data and languages, a model and batch that a 2-core CPU trains in minutes."""
  c.model.num_layers, c.model.num_heads, c.model.d_model = 4, 4, 64
  c.train.batch_size = 128
  c.train.steps = 3000
  c.train.min_steps = 1500
  c.train.eval_every = 250
  c.opt.peak_lr = 3e-3
  c.opt.warmup_steps = 200
  c.num_seeds = 2
  return c
