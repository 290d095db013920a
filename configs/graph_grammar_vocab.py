"""Graph navigation transfer, "different grammar and vocabulary" (reference Table 3, rows 3, 6).

  python -m xlt.main --config=configs/graph_grammar_vocab.py --workdir=runs/graph_gv

Language 1 = node lists, plain ids (N=2048); language 2 = edge lists with ids shifted by
10000 (M=256). Reference validity: lang 2 alone 23.8%, mixed 47.56% ± 3.6 (M=512: 68.37% →
85.16%); lang 1 alone 98.34%, mixed 98.83%.
configs/graph.py's recipe; measured as configs/graph_table3.py's points.
xlt's latest figures: results/graph_grammar_vocab.json, docs/results.md.
"""

from configs import graph


def get_config():
  c = graph.get_config()
  c.name = "graph_diff_grammar_vocab"
  c.mixture.target = "edge_offset"
  return c
