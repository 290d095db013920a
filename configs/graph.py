"""Graph navigation transfer, "different grammar" pair (reference Table 3, rows 2 and 5).

  python -m xlt.main --config=configs/graph.py --workdir=/tmp/graph

Language 1 = node lists, plain ids (N=2048 samples); language 2 = edge lists, plain ids
(M=256). Reference validity: lang 2 alone ~23.9%, mixed ~98.05% ± 1.8; lang 1 alone
98.34%, mixed 98.93% ± 1.1.

At e391328 (2026-11-25 15:08 UTC; the ensemble's default on CPU now `map`, each member's step
data-parallel over the 2 CPU devices, where the runs below split the members over the devices;
a 2-core AMD EPYC with AVX2 and no AVX-512, on which both xlt and PyTorch step about half as fast
as on the AVX-512 machine below; nothing else running; `/usr/bin/time -v python -m xlt.main
--config=configs/graph.py --workdir=/tmp/runs/graph`): **16.5 min wall** (992 s), 20,662 train
tokens/s; lang 1 alone 98.40% ± 0.61, mixed 98.33% ± 0.29; lang 2 alone 45.10% ± 4.64, mixed
**94.30% ± 1.32** (per seed 95.8 / 93.3 / 93.8; best validation 97.3 / 97.7 / 95.7 at steps
1200 / 1100 / 1000). Within a seed's spread of the runs below; short of the reference's 98.05%.

Obtained with xlt/matmul.py (commit 2bc7311, 2026-11-25; 2 CPU devices, members split over
them (xlt.ensemble "devices"); an AMD EPYC with 2 cores, nothing else running): **650 s wall**
(`/usr/bin/time`), 34,546 train tokens/s; lang 1 alone 98.63% ± 0.58, mixed 98.60% ± 0.46;
lang 2 alone 49.07% ± 5.76, mixed **95.53% ± 0.49** (per seed 95.2 / 96.1 / 95.3; best
validation 97.3 / 97.3 / 96.5, at step 1200 of 1200 for all three). Short of the reference's
98.05%, in 11 of the 20 minutes' budget. Rerun at bc80f42 (the same training code) on
2026-11-25 10:02 UTC on an AMD EPYC with 2 cores and AVX-512, nothing else running: **507 s
wall**, 40,203 train tokens/s; lang 1 98.23% ± 0.64 -> 98.17% ± 0.35; lang 2 51.67% ± 3.13 ->
**95.30% ± 1.01** (96.2 / 94.2 / 95.5; best validation 97.3 / 97.7 / 95.7 at steps 1200 /
1100 / 1200): another machine's kernels round differently, and the two runs differ by about
a seed's spread. The same recipe before xlt/matmul.py (481b6f6,
2026-11-24, same machine model): 932 s wall, 21,348 train tokens/s; lang 1 98.00% ± 0.62 ->
98.27% ± 0.75; lang 2 46.63% ± 1.36 -> 94.53% ± 1.00 (95.3 / 94.9 / 93.4; best validation
steps 1100 / 1100 / 1200): the two runs differ by float rounding (other programs for the
same gradients) and by about a seed's spread. The same recipe,
unchanged, on the second graph by the rule below (`--config.graph.seed=700`), rerun at 8482be8
(the same training code as bc80f42) on 2026-11-25 on the AVX-512 machine, nothing else running:
505 s wall; lang 1 98.23% ± 0.40 → 98.33% ± 0.55; lang 2 44.80% ± 2.25 → **93.90% ± 2.25**
(91.3 / 95.2 / 95.2; best validation steps 1100 / 1200 / 1100). At 481b6f6 (2026-11-24,
before xlt/matmul.py): 977 s (beside a one-minute benchmark); lang 1 97.23% ± 1.31 → 98.27% ±
0.35; lang 2 50.47% ± 6.31 → 93.83% ± 1.91 (95.4 / 91.7 / 94.4). The commit before 481b6f6 (0759c31) drew its dropout masks with
flax's nn.Dropout, other random bits for the same recipe: 999 s, lang 2 49.67% ± 7.86 → 95.53%
± 1.01 (96.7 / 95.0 / 94.9); second graph 48.13% ± 4.23 → 94.37% ± 1.25 (980 s). The two differ
by about a seed's spread: the masks' randomness alone moves the mean by a point.

The recipe: dropout 0.05 and weight decay 1.0 (xlt's defaults 0 and 0.1), 1200 steps, batch 64,
cosine from peak 3e-3 after 200 warm-up steps, early stopping with patience 4. Chosen by the
mean over seeds 0-2 of each mixed member's best validation score (validity on 128 pairs disjoint
from test, mean over its two languages), mixed only (`--config.conditions="('mixed',)"` plus the
override), graph 504; the rows above the line on 2026-11-23 (commits 13e4daf-9033672, which
differ in how members are stepped, not in what they compute), the dropout rows on 2026-11-24
(0759c31's code) with weight decay 1.0:
  weight decay 0.1 (the old default, from its 9-model run)  93.88   (test 90.27 ± 2.72)
  RoPE positions                                            88.02   (test 80.60 ± 0.70)
  RoPE + weight decay 1.0                                   92.45   (test 88.73 ± 4.14)
  weight decay 1.0                                          96.48   (test 92.73 ± 1.21)
  weight decay 2.0                                          94.66   (test 94.00 ± 1.22)
  weight decay 1.0, 1800 steps                              92.58   (test 89.40 ± 7.20)
  weight decay 1.0, 1800 steps, patience 8                  94.40   (test 93.40 ± 0.44)
  weight decay 1.0, 360 warm-up steps (the reference's
    1560 per 10k samples, scaled to 2304)                   95.31   (test 94.27 ± 1.57)
  ---
  + dropout 0.05                                            97.92   (test 95.53 ± 1.01)  chosen
  + dropout 0.1                                             96.61   (test 95.43 ± 0.64)
  + dropout 0.2                                             93.49   (test 90.27 ± 1.93)
  + dropout 0.1, 1500 steps                                 96.88   (test 93.23 ± 0.81)
(The test column is for the record; the rule is validation. Dropout's cost is in its masks'
random bits; xlt.model.dropout, since 481b6f6, hashes a quarter as often as flax's nn.Dropout:
`python benchmarks/dropout.py`, one member, beside a training run: a step 1.35x the
dropout-free one with flax's masks, 1.20x with xlt's (medians of 5 rounds).) Where the mixed edge-list answers fail (`python -m xlt.errors
--config=configs/graph.py --predictions=<workdir>/predictions.jsonl`, the run above): of 3,000
answers (3 seeds x 1,000 pairs) 61 malformed, 32 with a hop the graph lacks, 71 ending at
another node; validity by the pair's distance 79.0% at 1 hop, 93.5% at 2, 91-98% at 3-7
(0759c31's run: 64, 25, 45; 77.1% at 1 hop, 89.5% at 2). Most
failures on short paths are the edge grammar, not navigation: after a correct path the model
writes `, t` instead of ending (`60 98 = 60 98 , 98`; 0759c31's run also repeated edges,
`20 90 , 20 90`). Short paths are rare among the 256 edge-list samples: 6 of one hop and 14
of two (samples are shortest paths, and a short pair has one, so 2.3% of them are one hop
against 3.0% of the training pairs and 3.5% of the test pairs), and node lists cannot teach
when an edge list ends. Without dropout the same
analysis (that recipe's probe) gave 77 malformed, 39 missing hops, 102 wrong ends, and 89.5% at
1 hop, 76.6% at 7 hops.

Validity against budget, this recipe but 3x the steps (cosine over 3600), mixed only, no early
stopping (`--config.conditions="('mixed',)" --config.train.steps=3600 --config.train.patience=1000
--config.train.eval_every=200`, commit 4951f1c (flax's dropout masks), 1,769 s wall, about half
of it beside the test suite): lang 2 mixed **96.87% ± 0.32** (96.5 / 97.0 / 97.1; best steps
3000 / 2800 / 3200), lang 1 98.97% ± 0.25. Validation (mean of the three members) by step:
400 73.3, 800 85.9, 1200 87.1, 1600 88.5, 2000 92.2, 2400 94.8, 2800 97.4, 3000 96.7, 3200
97.9, 3400 96.9, 3600 97.0: a plateau at ~97% from ~2800 steps, where the 1200-step schedule
ends at 97.9 too; three times the budget buys +1.3 points of test validity, still short of 97.
Validity against budget, weight decay 1.0 without dropout but longer: 3x the steps, mixed only,
no early stopping (`--config.conditions="('mixed',)" --config.model.dropout=0 --config.train.steps=3600
--config.train.patience=1000 --config.train.eval_every=200`, commit fc33313, 2,217 s wall beside
the test suite) gave lang 2 mixed 91.87% ± 1.00 (93.0 / 91.5 / 91.1), lang 1 97.97% ± 0.45.
Its validation (mean of the three members, both languages) by step: 400 67.8, 800 81.3, 1200
81.6, 1600 84.4, 2000 89.7, 2400 93.1, 2800 92.8, 3200 91.0, 3400 94.4 (best), 3600 91.8: a
plateau at 91-94% from ~2400 steps. With dropout 0.1, 1500 steps validated no better than 1200
(table). Earlier defaults, each at its own HEAD on the machine of its day: weight decay 1.0
alone (8e519b6): lang 2 47.73% ± 8.00 -> 92.73% ± 1.21 in 823 s, second graph 51.50% ± 1.61 ->
89.03% ± 1.02; weight decay 0.1 (72daf54): 48.97% ± 1.59 -> 90.27% ± 2.72 in 796 s (3x the
steps: 90.30% ± 2.13), second graph 46.57% ± 2.48 -> 86.50% ± 3.06; on one CPU device
(ca4965b): 47.47% ± 2.71 -> 90.23% ± 1.53 (744 s). (This graph has 137 edges and diameter 9,
shorter paths than the reference's 152-edge graph, so edge lists alone already reach ~47%.)
configs/graph_table3.py, graph_vocab.py and graph_grammar_vocab.py start from this config;
their docstrings' numbers were measured with this recipe (2026-11-25, after xlt/matmul.py;
2026-11-24 before it), and graph_table3's also
with the earlier one (`--config.opt.weight_decay=0.1 --config.model.dropout=0`).
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

  # dropout 0.05 (xlt's default 0): chosen on validation, see the docstring
  c.model = common.model(num_layers=6, num_heads=4, d_model=64, block_size=128, dropout=0.05)
  # measured: the 9 models plateau by ~1000-1200 steps (see the timing in the README)
  c.train = common.train(batch_size=64, steps=1200, eval_every=100, patience=4)
  # weight decay 1.0 (xlt's default 0.1): chosen on validation, see the docstring
  c.opt = common.opt(c.train, schedule="cosine", peak_lr=3e-3, warmup_steps=200, weight_decay=1.0)
  c.eval = common.eval_(batch_size=1000)
  c.mesh = common.mesh()
  return c
