"""Graph navigation transfer, "different grammar" pair (reference Table 3, rows 2 and 5).

  python -m xlt.main --config=configs/graph.py --workdir=/tmp/graph

Language 1 = node lists, plain ids (N=2048 samples); language 2 = edge lists, plain ids
(M=256). Reference validity: lang 2 alone ~23.9%, mixed ~98.05% ± 1.8; lang 1 alone
98.34%, mixed 98.93% ± 1.1. Other pairs: configs/graph_vocab.py, configs/graph_grammar_vocab.py;
M=512: `--config.mixture.target_samples=512`.
"""

import ml_collections


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
  c.graph.seed = 504  # 137 edges, diameter 9 (the reference reports 152 edges)
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

  c.model = ml_collections.ConfigDict()
  c.model.num_layers = 6
  c.model.num_heads = 4
  c.model.d_model = 64
  c.model.block_size = 128
  c.model.mlp_ratio = 4
  c.model.tie_embeddings = False
  c.model.dtype = "float32"

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 64
  c.train.steps = 4000
  c.train.grad_accum = 1
  c.train.eval_every = 200
  c.train.patience = 4  # evaluations without a gain of min_delta
  c.train.min_delta = 0.005
  c.train.target_score = 1.0
  c.train.log_every = 50
  c.train.checkpoint_every = 500

  c.opt = ml_collections.ConfigDict()
  c.opt.name = "adamw"
  c.opt.schedule = "cosine"
  c.opt.peak_lr = 3e-3
  c.opt.warmup_steps = 200
  c.opt.total_steps = c.train.get_ref("steps")
  c.opt.b1 = 0.9
  c.opt.b2 = 0.95
  c.opt.weight_decay = 0.1
  c.opt.clip = 1.0

  c.eval = ml_collections.ConfigDict()
  c.eval.batch_size = 1000

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  c.mesh.devices = -1  # -1: all devices; n > 0: the first n
  return c
