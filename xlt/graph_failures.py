"""Why a graph experiment's answers fail: reads its predictions.jsonl and the config's graph,
and prints per condition and language how many answers fail and why
(`xlt.data.graph.failure`), and validity by the pair's shortest-path distance.

  python -m xlt.graph_failures --config=configs/graph.py --predictions=runs/graph/predictions.jsonl

Pass the same `--config.graph.*` overrides the run had (the graph is rebuilt from them).
"""

from __future__ import annotations

import collections
import json
import sys

import networkx as nx

from xlt.data import graph as graph_lib


def tally(graph: nx.Graph, records) -> tuple[dict, dict]:
  """(failures, by_distance) from predictions records: failures[(condition, set)] counts
  each failure kind (and "valid"); by_distance[(condition, set)][d] = [valid, total]."""
  failures = collections.defaultdict(collections.Counter)
  by_distance = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))
  for r in records:
    lang = r["set"]
    _, offset = graph_lib.check_language(lang)
    pair = tuple(int(x) - offset for x in r["prompt"].split()[:2])
    key = (r["member"].split("/seed_")[0], lang)
    why = graph_lib.failure(graph, pair, r["answer"].split(), lang)
    failures[key][why or "valid"] += 1
    cell = by_distance[key][nx.shortest_path_length(graph, *pair)]
    cell[0] += why is None
    cell[1] += 1
  return failures, by_distance


def report(failures: dict, by_distance: dict) -> str:
  kinds = ("valid",) + graph_lib.FAILURES
  lines = ["| condition | set | " + " | ".join(kinds) + " |", "|---" * (2 + len(kinds)) + "|"]
  for key in sorted(failures):
    lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(str(failures[key][k]) for k in kinds) + " |")
  dists = sorted({d for v in by_distance.values() for d in v})
  lines += ["", "validity by shortest-path distance (answers)", "",
            "| condition | set | " + " | ".join(str(d) for d in dists) + " |", "|---" * (2 + len(dists)) + "|"]
  for key in sorted(by_distance):
    cells = by_distance[key]
    lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(
        f"{cells[d][0] / cells[d][1]:.1%} ({cells[d][1]})" if d in cells else "–" for d in dists) + " |")
  return "\n".join(lines)


def main(argv):
  from absl import flags
  from ml_collections import config_flags

  c = config_flags.DEFINE_config_file("config", None, "the run's config file")
  path = flags.DEFINE_string("predictions", None, "the run's predictions.jsonl")
  flags.mark_flags_as_required(["config", "predictions"])
  flags.FLAGS(argv)
  g = c.value.graph
  graph = graph_lib.make_graph(g.num_nodes, g.edge_prob, g.seed)
  with open(path.value) as f:
    records = [json.loads(line) for line in f if line.strip()]
  print(report(*tally(graph, records)))


if __name__ == "__main__":
  main(sys.argv)
