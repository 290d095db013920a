"""Graph navigation: shortest paths in a fixed Erdős–Rényi graph, in several languages.

An instance is a (start, target) pair; its answer is a shortest path. A *language* is
a (grammar, vocabulary) pair, named `<grammar>_<vocab>`:

  grammar `node`: `s t : s a b t`            (the path as a node list)
  grammar `edge`: `s t = s a , a b , b t`    (consecutive pairs, `,` between edges)
  vocab `plain`:  node i is the token `i`
  vocab `offset`: node i is the token `i + 10000` (no node token is shared with `plain`)

The delimiter (`:` for node lists, `=` for edge lists) ends the prompt; the loss is
taken on the path only. The grammars differ in the query too: with one shared delimiter,
`s t :` would not say which grammar to answer in, and a mixed model would have to guess
(it then answers most edge-list queries with node lists). Training samples are the
different shortest paths of training pairs; evaluation uses pairs never seen in
training. Unreachable pairs and start == target are excluded.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import networkx as nx
import numpy as np

from xlt.data.common import Example, Task

GRAMMARS = ("node", "edge")
VOCABS = {"plain": 0, "offset": 10000}
LANGUAGES = tuple(f"{g}_{v}" for g in GRAMMARS for v in VOCABS)
DELIMS = {"node": ":", "edge": "="}
EDGE_SEP = ","


@dataclasses.dataclass(frozen=True)
class Split:
  """Disjoint (start, target) pairs: `train` for training, `val` for early stopping,
  `test` for the reported numbers. Each list is sorted by a seeded permutation."""

  train: tuple[tuple[int, int], ...]
  val: tuple[tuple[int, int], ...]
  test: tuple[tuple[int, int], ...]


@functools.lru_cache(maxsize=8)
def make_graph(num_nodes: int = 100, edge_prob: float = 0.02, seed: int = 0) -> nx.Graph:
  return nx.erdos_renyi_graph(num_nodes, edge_prob, seed=seed)


def check_language(language: str) -> tuple[str, int]:
  grammar, _, vocab = language.partition("_")
  if grammar not in GRAMMARS or vocab not in VOCABS:
    raise ValueError(f"unknown graph language {language!r}; known: {', '.join(LANGUAGES)}")
  return grammar, VOCABS[vocab]


def reachable_pairs(graph: nx.Graph) -> list[tuple[int, int]]:
  """Ordered (start, target) pairs with start != target and a path between them."""
  comp = {n: i for i, c in enumerate(nx.connected_components(graph)) for n in c}
  return [(s, t) for s in graph for t in graph if s != t and comp[s] == comp[t]]


def split_pairs(graph: nx.Graph, *, num_test: int, num_val: int, seed: int) -> Split:
  pairs = reachable_pairs(graph)
  if num_test + num_val >= len(pairs):
    raise ValueError(
        f"asked for {num_test} test + {num_val} val pairs but the graph has only "
        f"{len(pairs)} reachable pairs")
  order = np.random.default_rng(seed).permutation(len(pairs))
  pairs = [pairs[i] for i in order]
  return Split(train=tuple(pairs[num_test + num_val:]), val=tuple(pairs[num_test:num_test + num_val]),
               test=tuple(pairs[:num_test]))


def shortest_paths(graph: nx.Graph, pair: tuple[int, int]) -> list[list[int]]:
  """Every shortest path from pair[0] to pair[1], sorted (as lists of nodes)."""
  paths = _paths_from(graph, pair[0]).get(pair[1])
  if paths is None:
    raise ValueError(f"no path from {pair[0]} to {pair[1]} in the graph")
  return [list(p) for p in paths]


@functools.lru_cache(maxsize=256)
def _paths_from(graph: nx.Graph, source: int) -> dict[int, tuple[tuple[int, ...], ...]]:
  """Every shortest path from `source` to each node it reaches, sorted per target: one
  breadth-first search per source instead of one per pair (`nx.all_shortest_paths`
  searches again for every pair; a 100-node graph's ~9k training pairs took seconds).
  Keyed on the graph object, which `make_graph` caches: graphs are not modified here."""
  preds = nx.predecessor(graph, source)  # node -> its predecessors on shortest paths
  dist = nx.single_source_shortest_path_length(graph, source)
  paths: dict[int, tuple[tuple[int, ...], ...]] = {source: ((source,),)}
  for node in sorted(preds, key=dist.__getitem__):  # a node's predecessors come before it
    if node != source:
      paths[node] = tuple(sorted(p + (node,) for q in preds[node] for p in paths[q]))
  return paths


def path_pool(graph: nx.Graph, pairs: Sequence[tuple[int, int]]) -> list[list[int]]:
  """Every shortest path of every pair: the population training samples come from."""
  return [p for pair in pairs for p in shortest_paths(graph, pair)]


def sample_paths(graph: nx.Graph, pairs: Sequence[tuple[int, int]], n: int, seed: int,
                 language: str = "") -> list[list[int]]:
  """`n` distinct (pair, shortest path) samples, drawn without replacement."""
  pool = path_pool(graph, pairs)
  if n > len(pool):
    raise ValueError(
        f"{language or 'graph'}: asked for {n} training samples but the {len(pairs)} training "
        f"pairs have only {len(pool)} distinct shortest paths")
  idx = np.random.default_rng(seed).choice(len(pool), size=n, replace=False)
  return [pool[i] for i in sorted(idx)]


def _node(i: int, offset: int) -> str:
  return str(i + offset)


def prompt(pair: tuple[int, int], language: str) -> tuple[str, ...]:
  grammar, offset = check_language(language)
  return (_node(pair[0], offset), _node(pair[1], offset), DELIMS[grammar])


def encode_path(path: Sequence[int], language: str) -> tuple[str, ...]:
  grammar, offset = check_language(language)
  nodes = [_node(i, offset) for i in path]
  if grammar == "node":
    return tuple(nodes)
  out: list[str] = []
  for a, b in zip(nodes[:-1], nodes[1:]):
    out += ([EDGE_SEP] if out else []) + [a, b]
  return tuple(out)


def decode_path(tokens: Sequence[str], language: str) -> list[int] | None:
  """Tokens of an answer back to a node list; None if they are not well formed.

  An edge list must chain: each edge starts where the previous one ended.
  """
  grammar, offset = check_language(language)
  try:
    if grammar == "node":
      return [int(t) - offset for t in tokens] if tokens else None
    if len(tokens) < 2 or (len(tokens) + 1) % 3:
      return None
    edges = [tokens[i:i + 2] for i in range(0, len(tokens), 3)]
    if any(tokens[i] != EDGE_SEP for i in range(2, len(tokens), 3)):
      return None
    nodes = [int(edges[0][0]) - offset]
    for a, b in edges:
      if int(a) - offset != nodes[-1]:
        return None
      nodes.append(int(b) - offset)
    return nodes
  except ValueError:
    return None


def make_example(path: Sequence[int], language: str) -> Example:
  return Example(prompt((path[0], path[-1]), language), encode_path(path, language))


def symbols(graph: nx.Graph, language: str) -> list[str]:
  grammar, offset = check_language(language)
  return [DELIMS[grammar]] + ([EDGE_SEP] if grammar == "edge" else []) + [_node(i, offset) for i in graph]


def score(graph: nx.Graph, pair: tuple[int, int], answer: Sequence[str], language: str) -> dict:
  """`valid`: a real path from the right start to the right target (optimal or not);
  `shortest`: valid and of shortest length."""
  nodes = decode_path(answer, language)
  valid = bool(
      nodes and nodes[0] == pair[0] and nodes[-1] == pair[1]
      and all(graph.has_edge(a, b) for a, b in zip(nodes[:-1], nodes[1:])))
  shortest = valid and len(nodes) - 1 == nx.shortest_path_length(graph, *pair)
  return {"valid": float(valid), "shortest": float(shortest)}


FAILURES = ("malformed", "wrong start", "non-edge", "wrong end")


def failure(graph: nx.Graph, pair: tuple[int, int], answer: Sequence[str], language: str) -> str | None:
  """Why an answer is not a valid path, checked in this order (None when it is valid):
  `malformed` (not a node list, or edges that do not chain, e.g. a repeated edge or an
  answer that goes on after its last edge), `wrong start`, `non-edge` (a hop the graph lacks),
  `wrong end` (a real path that stops short of the target or passes it)."""
  nodes = decode_path(answer, language)
  if nodes is None:
    return "malformed"
  if nodes[0] != pair[0]:
    return "wrong start"
  if not all(graph.has_edge(a, b) for a, b in zip(nodes[:-1], nodes[1:])):
    return "non-edge"
  if nodes[-1] != pair[1]:
    return "wrong end"
  return None


def eval_set(graph: nx.Graph, pairs: Sequence[tuple[int, int]], language: str, max_new: int):
  from xlt.data.common import EvalSet

  return EvalSet(language, tuple(prompt(p, language) for p in pairs),
                 lambda i, answer: score(graph, pairs[i], answer, language), "valid", max_new)


def build(c, counts: dict[str, int]) -> Task:
  """The graph task: `counts[language]` training samples of each language (config
  fields: see configs/graph.py). With a source and a target, the target's pairs follow
  `c.mixture.target_pairs`."""
  from xlt.data.common import WordTokenizer, max_length

  g = c.graph
  graph = make_graph(g.num_nodes, g.edge_prob, g.seed)
  split = split_pairs(graph, num_test=g.num_test_pairs, num_val=g.num_val_pairs, seed=g.split_seed)
  mix = c.mixture
  for lang in counts:
    check_language(lang)
  if mix.target_pairs not in ("any", "disjoint"):
    raise ValueError(f"mixture.target_pairs must be 'any' or 'disjoint', got {mix.target_pairs!r}")
  # The source draws first; the target (and any other language) draws independently,
  # or, with target_pairs="disjoint", only from pairs the source never trains on.
  order = sorted(counts, key=lambda l: l != mix.source)
  train, used = {}, set()
  for i, lang in enumerate(order):
    pool = split.train
    if mix.target_pairs == "disjoint" and lang != mix.source:
      pool = [p for p in split.train if p not in used]
    paths = sample_paths(graph, pool, counts[lang], g.sample_seed + i, lang)
    if lang == mix.source:
      used = {(p[0], p[-1]) for p in paths}
    train[lang] = [make_example(p, lang) for p in paths]
  tok = WordTokenizer(s for lang in order for s in symbols(graph, lang))
  # Longest possible answer: the diameter of the graph, in the wordier language.
  diameter = max(nx.diameter(graph.subgraph(cc)) for cc in nx.connected_components(graph))
  longest = max(len(encode_path(range(diameter + 1), lang)) for lang in order)
  seq_len = 3 + longest + 1
  seq_len = max(seq_len, max_length(ex for v in train.values() for ex in v))
  return Task(
      tokenizer=tok, seq_len=seq_len, train=train,
      val={l: eval_set(graph, split.val, l, longest + 1) for l in order},
      test={l: eval_set(graph, split.test, l, longest + 1) for l in order},
      info={"nodes": graph.number_of_nodes(), "edges": graph.number_of_edges(),
            "reachable_pairs": len(reachable_pairs(graph)), "train_pairs": len(split.train),
            "val_pairs": len(split.val), "test_pairs": len(split.test), "diameter": diameter})
