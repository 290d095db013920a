"""Graph navigation transfer, all of reference Table 3 as one grid: three language pairs
(different grammar, vocabulary, both) × M ∈ {256, 512}, N = 2048, 3 seeds each.

  python -m xlt.main --config=configs/graph_table3.py --workdir=runs/graph_table3 [--points=a,b] [--point_workers=2]

Reference validity, lang 2 alone → mixed (M=256 | M=512):
  diff. vocab             23.9% → 57.32%   | 64.45% → 82.62%
  diff. grammar           23.9% → 98.05%   | 64.45% → 97.17%
  diff. grammar + vocab   23.8% → 47.56%   | 68.37% → 85.16%
Pairs are (lang 1, lang 2) as in the reference's caption: diff. vocab is offset edges → plain
edges, so its lang 2 alone is the same condition as diff. grammar's (one shared baseline).
Each point takes about as long as configs/graph.py, whose recipe it uses.
xlt's latest figures: results/graph_table3.json, docs/results.md; notes: docs/experiments.md.
"""

from configs import graph

PAIRS = (("diff_vocab", "edge_offset", "edge_plain"), ("diff_grammar", "node_plain", "edge_plain"),
         ("diff_grammar_vocab", "node_plain", "edge_offset"))


def get_config():
  c = graph.get_config()
  c.name = "graph_table3"
  c.grid = [{"name": f"{name}_m{m}", "mixture.source": s, "mixture.target": t, "mixture.target_samples": m}
            for m in (256, 512) for name, s, t in PAIRS]
  return c
