"""Graph navigation transfer, "different vocabulary" pair (reference Table 3, rows 1 and 4).

  python -m xlt.main --config=configs/graph_vocab.py --workdir=runs/graph_vocab

Language 1 = edge lists, plain ids (N=2048); language 2 = edge lists with ids shifted by
10000 (M=256), so no node token is shared. Reference validity: lang 2 alone 23.9%,
mixed 57.32% ± 4.2 (M=512: 64.45% → 82.62%); lang 1 alone 97.26%, mixed 99.32%.

Obtained as configs/graph_table3.py's points (graph.py's recipe, commit 1513862, 2026-11-24,
seeds 0-2; that docstring has the command): lang 2 45.80% ± 1.15 → 70.97% ± 4.02 (917 s);
M=512: 82.90% ± 1.64 → 88.73% ± 2.00; lang 1 alone 94.70%, mixed 98.67% ± 0.45.
"""

from configs import graph


def get_config():
  c = graph.get_config()
  c.name = "graph_diff_vocab"
  c.mixture.source = "edge_plain"
  c.mixture.target = "edge_offset"
  return c
