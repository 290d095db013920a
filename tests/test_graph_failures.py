"""xlt.graph_failures: the failure tally and its report, on a path graph small enough to count by hand."""

import networkx as nx

from xlt import graph_failures


def test_tally_and_report_count_each_failure_kind_and_distance():
  g = nx.path_graph(5)  # 0 - 1 - 2 - 3 - 4
  e = "edge_plain"
  records = [{"member": "mixed_x/seed_0", "set": e, "prompt": "0 2 =", "answer": "0 1 , 1 2"},
             {"member": "mixed_x/seed_1", "set": e, "prompt": "0 2 =", "answer": "0 1 , 0 1"},
             {"member": "mixed_x/seed_1", "set": e, "prompt": "0 1 =", "answer": "0 1"},
             {"member": "alone_x/seed_0", "set": "node_plain", "prompt": "4 0 :", "answer": "4 3 0"}]
  failures, by_distance = graph_failures.tally(g, records)
  assert failures[("mixed_x", e)] == {"valid": 2, "malformed": 1}
  assert failures[("alone_x", "node_plain")] == {"non-edge": 1}
  assert by_distance[("mixed_x", e)] == {2: [1, 2], 1: [1, 1]}
  table = graph_failures.report(failures, by_distance)
  assert "| mixed_x | edge_plain | 2 | 1 | 0 | 0 | 0 |" in table and "50.0% (2)" in table
