"""Graph navigation transfer, "different grammar" pair (reference Table 3, rows 2 and 5).

  python -m xlt.main --config=configs/graph.py --workdir=runs/graph
  python -m xlt.main --config=configs/graph.py --workdir=runs/graph_m512 --config.mixture.target_samples=512

Language 1 = node lists, plain ids (N=2048 samples); language 2 = edge lists, plain ids
(M=256). Reference validity: lang 2 alone 23.9%, mixed 98.05% ± 1.8; lang 1 alone 98.34%,
mixed 98.93% ± 1.1 (M=512: lang 2 64.45% -> 97.17%).

The recipe (dropout 0.05, weight decay 1.0, 1200 steps) was chosen on validation among twelve;
the graph is chosen by the rule at `c.graph.seed`. The probes, the budget and failure analyses:
docs/experiments.md. Other pairs: configs/graph_vocab.py, configs/graph_grammar_vocab.py; all
of Table 3: configs/graph_table3.py. xlt's latest figures: results/graph.json, docs/results.md.
"""

import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "graph_diff_grammar"
  c.kind, c.task = "synthetic", "graph"  # the experiment (xlt.experiments), its data
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

  # dropout 0.05 (xlt's default 0): chosen on validation, see docs/experiments.md
  c.model = common.model(num_layers=6, num_heads=4, d_model=64, block_size=128, dropout=0.05)
  # measured: the 9 models plateau by ~1000-1200 steps (docs/experiments.md)
  c.train = common.train(batch_size=64, steps=1200, eval_every=100, patience=4)
  # weight decay 1.0 (xlt's default 0.1): chosen on validation, see docs/experiments.md
  c.opt = common.opt(c.train, schedule="cosine", peak_lr=3e-3, warmup_steps=200, weight_decay=1.0)
  c.eval = common.eval_(batch_size=1000)
  c.mesh = common.mesh()
  return c
