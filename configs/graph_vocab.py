"""Graph navigation transfer, "different vocabulary" pair (reference Table 3, rows 1 and 4).

  python -m xlt.main --config=configs/graph_vocab.py --workdir=runs/graph_vocab

Language 1 = edge lists with ids shifted by 10000 (N=2048); language 2 = edge lists, plain ids
(M=256), so no node token is shared. That is the reference's direction: its Table 3 caption
mixes offset pairs with standard ones, and its lang 2 alone (23.9%) is the diff. grammar row's,
whose lang 2 is plain edge lists too. Reference validity: lang 2 alone 23.9%, mixed 57.32% ± 4.2
(M=512: 64.45% → 82.62%); lang 1 alone 97.26%, mixed 99.32%.
configs/graph.py's recipe; measured as configs/graph_table3.py's points.
xlt's latest figures: results/graph_vocab.json, docs/results.md.
"""

from configs import graph


def get_config():
  c = graph.get_config()
  c.name = "graph_diff_vocab"
  c.mixture.source = "edge_offset"
  c.mixture.target = "edge_plain"
  return c
