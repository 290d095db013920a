"""Graph navigation transfer, "different grammar" pair (reference Table 3, rows 2 and 5).

  python -m xlt.main --config=configs/graph.py --workdir=/tmp/graph

Language 1 = node lists, plain ids (N=2048 samples); language 2 = edge lists, plain ids
(M=256). Reference validity: lang 2 alone ~23.9%, mixed ~98.05% ± 1.8; lang 1 alone
98.34%, mixed 98.93% ± 1.1.

Obtained at HEAD (commit 72daf54 + its README, 2026-11-23 18:26 UTC; 2 CPU devices, the
default since xlt.cpu_devices; the project's machine that day an AMD EPYC with 2 cores):
796 s wall, 25,050 train tokens/s, 1.17 GB peak RSS; lang 1 alone 97.03% ± 0.50, mixed
97.83% ± 0.65; lang 2 alone 48.97% ± 1.59, mixed 90.27% ± 2.72 (per seed 92.8 / 90.6 / 87.4;
best validation steps 1000 / 900 / 1200 of 1200). Short of the reference's 98.05%, and not for
want of steps: the same recipe 3x longer, mixed only, no early stopping (`--config.conditions=
"('mixed',)" --config.train.steps=3600 --config.train.patience=1000 --config.train.eval_every=200`,
819 s, commit 5470e27: 72daf54 and a log line; same machine) gave mixed edge 90.30% ± 2.13 (per seed 92.2 / 90.7 / 88.0; best
validation steps 3000 / 1400 / 2400), node 97.23% ± 0.78; validation (128 pairs, mean of the
seeds) by step: 200: 54.4, 400: 74.6, 800: 87.4, 1200: 84.6, 1600: 87.9, 2000: 90.5, 2400: 93.0,
2800: 91.4, 3200: 92.3, 3600: 92.4, a plateau from ~2000 steps (~440 s of the 3-member run).
The same recipe, unchanged, on the second graph by the rule below (`--config.graph.seed=700`,
commit 3411967, same machine and day, 778 s, 1.22 GB peak RSS): lang 1 alone 96.50% ± 0.95, mixed
97.03% ± 1.05; lang 2 alone 46.57% ± 2.48, mixed 86.50% ± 3.06 (per seed 87.8 / 83.0 / 88.7).

Earlier, on one CPU device (test validity on 1000 unseen pairs, mean ± std over seeds 0-2; 744 s wall on the
2-core CPU of that day, 1.1 GB peak RSS, 2026-11-23, commit ca4965b): lang 1 alone 97.23% ± 0.64, mixed
97.30% ± 0.17; lang 2 alone 47.47% ± 2.71, mixed 90.23% ± 1.53 (per seed 91.9 / 89.9 / 88.9;
best validation steps 900-1000 of 1200). (This graph has 137 edges and diameter 9, shorter
paths than the reference's 152-edge graph, so edge lists alone already reach ~47%.) Short of
the reference's 98.05%: a probe of the same recipe with 2400 steps (2026-11-22, before the
attention reorder) stopped the mixed members early at steps 1100-1300 with validation ~0.90
and test 83.17% ± 3.45, so more steps of this recipe do not close the gap.
On one device, the second graph (`--config.graph.seed=700`:
137 edges, diameter 9; 556 s wall, same day): lang 1 alone 96.37% ± 1.10, mixed 96.97% ± 1.17;
lang 2 alone 45.77% ± 1.80, mixed 87.60% ± 4.26 (per seed 92.3 / 84.0 / 86.5).
Rerun as a point of configs/graph_table3.py (commit f87b2d7, 660 s): lang 2 alone 45.57% ± 0.59,
mixed 89.40% ± 0.80 (per seed 90.2 / 89.4 / 88.6); lang 1 alone 97.90% ± 0.69, mixed 97.20% ± 0.36.
Other pairs: configs/graph_vocab.py, configs/graph_grammar_vocab.py;
M=512: `--config.mixture.target_samples=512`.
"""

import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "graph_diff_grammar"
  c.task = "graph"
  c.seed = 0  # first seed; seeds are seed .. seed + num_seeds - 1 (init and data order)
  c.num_seeds = 3
  c.conditions = ("target_alone", "source_alone", "mixed")

  c.graph = ml_collections.ConfigDict()
  c.graph.num_nodes = 100
  c.graph.edge_prob = 0.02
  # The rule: of seeds 0..999, the first whose G(100, 0.02) has the most edges, nearest the
  # reference's 152 (504: 137 edges, diameter 9). The second graph the recipe is reported on
  # is the next seed by the same rule (700, also 137 edges): --config.graph.seed=700.
  c.graph.seed = 504
  c.graph.split_seed = 0
  c.graph.sample_seed = 0  # which training paths are drawn (fixed across run seeds)
  c.graph.num_test_pairs = 1000
  c.graph.num_val_pairs = 128  # early stopping only; disjoint from test

  c.mixture = ml_collections.ConfigDict()
  c.mixture.source = "node_plain"  # language 1, high-resource
  c.mixture.target = "edge_plain"  # language 2, low-resource
  c.mixture.source_samples = 2048
  c.mixture.target_samples = 256
  # "any": target pairs drawn independently of the source's (they may overlap);
  # "disjoint": the target trains only on pairs the source never sees.
  c.mixture.target_pairs = "any"

  c.model = common.model(num_layers=6, num_heads=4, d_model=64, block_size=128)
  # measured: the 9 models plateau by ~1000-1200 steps (see the timing in the README)
  c.train = common.train(batch_size=64, steps=1200, eval_every=100, patience=4)
  # weight decay 1.0 (xlt's default 0.1): chosen on validation, see the docstring
  c.opt = common.opt(c.train, schedule="cosine", peak_lr=3e-3, warmup_steps=200, weight_decay=1.0)
  c.eval = common.eval_(batch_size=1000)
  c.mesh = common.mesh()
  return c
