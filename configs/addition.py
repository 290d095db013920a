"""Addition transfer, Standard + Letter (reference Table 2, row 1).

  python -m xlt.main --config=configs/addition.py --workdir=runs/addition            # reference size (GPU)
  python -m xlt.main --config=configs/addition.py:cpu --workdir=runs/addition_cpu    # reduced, 2-core CPU

Language 1 = standard decimal (N=11520), language 2 = letter (M=1280). Reference exact
match: standard alone 100%, mixed 98.6% ± 1.4; letter alone 0%, mixed 98.2% ± 1.6.
All Table 2 pairs: configs/addition_table2.py; sample-size sweeps: configs/addition_sweep.py.

The reference model: 12 layers, 8 heads, width 128, block 64 (~2.5e6 parameters), batch
1024, peak lr 0.002 with a linear warmup ("Lin. Incr."), LitGPT, hence rotary positions.
`:cpu` is a reduced setting for a 2-core CPU (`reduce_for_cpu`): 3-digit operands, a 4×128
model, sample counts / 8 (CPU_SAMPLE_SCALE), 3 mixed seeds and one per alone baseline, up to
5000 steps; dropout 0.05 and weight decay 1.0, chosen on validation. Compare directions, not
digits. Why and how it was chosen: docs/experiments.md.
xlt's latest figures: results/addition_cpu.json, docs/results.md."""

import ml_collections

from configs import common


def get_config(arg: str = ""):
  c = ml_collections.ConfigDict()
  c.name = "addition_standard_letter"
  c.kind, c.task = "synthetic", "addition"  # the experiment (xlt.experiments), its data
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
  c.model = common.model(num_layers=12, num_heads=8, d_model=128, block_size=64, pos_embedding="rope")
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


CPU_SAMPLE_SCALE = 8  # reference sample counts / reduced ones (see the module docstring)


def reduce_for_cpu(c):
  """The reduced setting of the module docstring: 3-digit operands, a 4x128 model, 1/8 of
  the samples; ~10 minutes per mixture pair on 2 cores."""
  c.addition.min_digits = c.addition.max_digits = 3
  c.mixture.source_samples //= CPU_SAMPLE_SCALE
  c.mixture.target_samples //= CPU_SAMPLE_SCALE
  c.model.num_layers, c.model.num_heads, c.model.d_model = 4, 4, 128
  c.model.dropout = 0.05  # with weight decay 1.0: chosen on validation (docs/experiments.md)
  c.train.batch_size = 128
  c.train.steps = 5000  # a budget the mixed members stop within (best steps 2125-2750)
  c.train.min_steps = 750
  c.train.eval_every = 125
  c.train.patience = 8
  c.opt.peak_lr = 2e-3
  c.opt.warmup_steps = 200
  c.opt.weight_decay = 1.0
  c.num_seeds = 3
  c.seeds_per_condition = {"target_alone": 1, "source_alone": 1}
  return c
