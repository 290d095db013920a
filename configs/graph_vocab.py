"""Graph navigation transfer, "different vocabulary" pair (reference Table 3, rows 1 and 4).

  python -m xlt.main --config=configs/graph_vocab.py --workdir=runs/graph_vocab

Language 1 = edge lists, plain ids (N=2048); language 2 = edge lists with ids shifted by
10000 (M=256), so no node token is shared. Reference validity: lang 2 alone 23.9%,
mixed 57.32% ± 4.2 (M=512: 64.45% → 82.62%); lang 1 alone 97.26%, mixed 99.32%.

Obtained as configs/graph_table3.py's points (graph.py's recipe, 2 CPU devices, seeds 0-2;
that docstring has the command), rerun after xlt/matmul.py at 8482be8 (2026-11-25, an AMD EPYC
with AVX-512): lang 2 50.50% ± 4.45 → 71.40% ± 5.47 (526 s); M=512: 81.90% ± 1.55 → 88.60% ±
2.31 (499 s); lang 1 alone 95.20%, mixed 98.53% ± 0.81. At 1513862, before xlt/matmul.py:
45.80% ± 1.15 → 70.97% ± 4.02 (917 s), M=512 82.90% ± 1.64 → 88.73% ± 2.00.
"""

from configs import graph


def get_config():
  c = graph.get_config()
  c.name = "graph_diff_vocab"
  c.mixture.source = "edge_plain"
  c.mixture.target = "edge_offset"
  return c
