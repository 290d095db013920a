"""Graph navigation transfer, all of reference Table 3 as one grid: three language pairs
(different grammar, vocabulary, both) × M ∈ {256, 512}, N = 2048, 3 seeds each.

  python -m xlt.main --config=configs/graph_table3.py --workdir=runs/graph_table3

Reference validity, lang 2 alone → mixed (M=256 | M=512):
  diff. vocab             23.9% → 57.32%   | 64.45% → 82.62%
  diff. grammar           23.9% → 98.05%   | 64.45% → 97.17%
  diff. grammar + vocab   23.8% → 47.56%   | 68.37% → 85.16%
Each point takes about as long as configs/graph.py (8.5-16 min on a 2-core CPU).

Obtained with configs/graph.py's recipe (dropout 0.05, weight decay 1.0), seeds 0-2, graph seed
504, 2 CPU devices (test validity on 1000 unseen pairs, mean ± std), rerun after xlt/matmul.py
on 2026-11-25 on an AMD EPYC with AVX-512. Five points ran as `python -m xlt.main
--config=configs/graph_table3.py --workdir=runs/graph_table3 --points=diff_vocab_m256,
diff_grammar_vocab_m256,diff_vocab_m512,diff_grammar_m512,diff_grammar_vocab_m512` at commit
8482be8 (499-526 s each, 43.1 min for the five, nothing else running but a 3-minute pause in
the first); diff_grammar_m256 is configs/graph.py's own run at bc80f42 (the same training
code), 507 s:

  pair (lang 1 → lang 2)        M    lang 2 alone → mixed      lang 1 alone → mixed     reference lang 2
  diff. vocab (edge → edge+off)  256  50.50 ± 4.45 → 71.40 ± 5.47  95.20 → 98.53 ± 0.81  23.9 → 57.32
  diff. grammar (node → edge)    256  51.67 ± 3.13 → 95.30 ± 1.01  98.23 → 98.17 ± 0.35  23.9 → 98.05
  diff. grammar + vocab          256  49.83 ± 0.96 → 63.53 ± 2.93  97.83 → 97.93 ± 0.60  23.8 → 47.56
  diff. vocab                    512  81.90 ± 1.55 → 88.60 ± 2.31  95.20 → 97.77 ± 0.68  64.45 → 82.62
  diff. grammar                  512  81.50 ± 0.79 → 98.03 ± 0.32  98.23 → 98.67 ± 0.06  64.45 → 97.17
  diff. grammar + vocab          512  84.10 ± 2.57 → 84.20 ± 1.14  97.83 → 98.07 ± 0.59  68.37 → 85.16

(xlt repeats the alone baselines over 3 seeds too; lang 1 alone is the mean over them.)
The reference's ordering holds at both M: a different grammar transfers most (+43.6 and +16.5
points), a different vocabulary less (+20.9, +6.7), both together least (+13.7, +0.1: at M=512
none). Against the reference's mixed values: diff. grammar at M=512 matches (98.03 vs 97.17)
and both at M=512 is close (84.20 vs 85.16); diff. grammar at M=256 is short (95.30 vs 98.05);
the two vocabulary pairs transfer more than the reference's at M=256 (71.40 vs 57.32, 63.53 vs
47.56) and diff. vocab at M=512 too (88.60 vs 82.62). The alone baselines are higher than the
reference's (this graph's paths are shorter), so the gains are smaller.

Before xlt/matmul.py (commit 1513862, 2026-11-24, 824-917 s a point, 71.6 min for the five, on
an earlier 2-core machine of the same model name), lang 2 alone → mixed: diff. vocab 45.80 ± 1.15 → 70.97 ±
4.02 (M=256), 82.90 ± 1.64 → 88.73 ± 2.00 (512); diff. grammar 46.63 ± 1.36 → 94.53 ± 1.00,
82.37 ± 0.49 → 97.50 ± 0.10; both 46.53 ± 3.50 → 64.97 ± 1.99, 80.97 ± 5.30 → 83.87 ± 0.64:
the same ordering; every mixed value moved by less than 2 points.

With the earlier recipe, weight decay 0.1 and no dropout (`--config.opt.weight_decay=0.1
--config.model.dropout=0`), commit f87b2d7, 2026-11-23, 77.7 min for the grid partly beside
other runs, lang 2 alone → mixed: diff. vocab 46.33 ± 3.23 → 58.00 ± 2.69 (M=256), 72.17 ±
1.55 → 82.37 ± 1.01 (512); diff. grammar 45.57 ± 0.59 → 89.40 ± 0.80, 71.70 ± 1.82 → 95.67 ±
0.49; both 47.67 ± 3.46 → 51.23 ± 3.82, 75.70 ± 0.35 → 78.77 ± 2.95: the same ordering, with
less transfer everywhere.
"""

from configs import graph

PAIRS = (("diff_vocab", "edge_plain", "edge_offset"), ("diff_grammar", "node_plain", "edge_plain"),
         ("diff_grammar_vocab", "node_plain", "edge_offset"))


def get_config():
  c = graph.get_config()
  c.name = "graph_table3"
  c.grid = [{"name": f"{name}_m{m}", "mixture.source": s, "mixture.target": t, "mixture.target_samples": m}
            for m in (256, 512) for name, s, t in PAIRS]
  return c
