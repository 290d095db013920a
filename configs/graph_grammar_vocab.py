"""Graph navigation transfer, "different grammar and vocabulary" (reference Table 3, rows 3, 6).

  python -m xlt.main --config=configs/graph_grammar_vocab.py --workdir=runs/graph_gv

Language 1 = node lists, plain ids (N=2048); language 2 = edge lists with ids shifted by
10000 (M=256). Reference validity: lang 2 alone 23.8%, mixed 47.56% ± 3.6 (M=512: 68.37% →
85.16%); lang 1 alone 98.34%, mixed 98.83%.

Obtained as configs/graph_table3.py's points (graph.py's recipe, 2 CPU devices, seeds 0-2;
that docstring has the command), rerun after xlt/matmul.py at 8482be8 (2026-11-25, an AMD EPYC
with AVX-512): lang 2 49.83% ± 0.96 → 63.53% ± 2.93 (515 s); M=512: 84.10% ± 2.57 → 84.20% ±
1.14 (519 s); lang 1 alone 97.83%, mixed 97.93% ± 0.60. At 1513862, before xlt/matmul.py:
46.53% ± 3.50 → 64.97% ± 1.99 (870 s), M=512 80.97% ± 5.30 → 83.87% ± 0.64.
"""

from configs import graph


def get_config():
  c = graph.get_config()
  c.name = "graph_diff_grammar_vocab"
  c.mixture.target = "edge_offset"
  return c
