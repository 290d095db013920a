import networkx as nx
import numpy as np
import pytest

from xlt.data import common, graph


@pytest.fixture(scope="module")
def g():
  return graph.make_graph(100, 0.02, 504)


def test_graph_is_fixed_by_seed(g):
  assert g.number_of_nodes() == 100
  assert g.number_of_edges() == 137  # reported in configs/graph.py
  assert nx.utils.graphs_equal(g, nx.erdos_renyi_graph(100, 0.02, seed=504))


def test_split_disjoint_deterministic_and_reachable(g):
  s = graph.split_pairs(g, num_test=500, num_val=100, seed=0)
  train, val, test = set(s.train), set(s.val), set(s.test)
  assert not train & test and not train & val and not val & test
  assert len(test) == 500 and len(val) == 100
  assert train | val | test == set(graph.reachable_pairs(g))
  assert all(a != b and nx.has_path(g, a, b) for a, b in test)
  assert graph.split_pairs(g, num_test=500, num_val=100, seed=0) == s
  assert graph.split_pairs(g, num_test=500, num_val=100, seed=1) != s


def test_training_paths_are_valid_shortest_and_from_train_pairs(g):
  s = graph.split_pairs(g, num_test=500, num_val=100, seed=0)
  paths = graph.sample_paths(g, s.train, 2048, seed=0)
  assert len({tuple(p) for p in paths}) == 2048  # distinct samples
  train = set(s.train)
  for p in paths:
    assert (p[0], p[-1]) in train
    assert all(g.has_edge(a, b) for a, b in zip(p[:-1], p[1:]))
    assert len(p) - 1 == nx.shortest_path_length(g, p[0], p[-1])
  # pairs with several shortest paths contribute different paths
  pairs = [(p[0], p[-1]) for p in paths]
  assert len(set(pairs)) < len(pairs)


@pytest.mark.parametrize("seed", [504, 3])
def test_path_pool_equals_networkx_all_shortest_paths(seed):
  g = graph.make_graph(100, 0.02, seed)
  pairs = graph.reachable_pairs(g)
  assert graph.path_pool(g, pairs) == [p for pr in pairs for p in sorted(nx.all_shortest_paths(g, *pr))]
  unreachable = next((s, t) for s in g for t in g if s != t and not nx.has_path(g, s, t))
  with pytest.raises(ValueError, match="no path"):
    graph.shortest_paths(g, unreachable)


@pytest.mark.parametrize("language", graph.LANGUAGES)
def test_encode_decode_round_trip_and_score(g, language):
  path = nx.shortest_path(g, *graph.split_pairs(g, num_test=10, num_val=0, seed=0).test[0])
  ex = graph.make_example(path, language)
  assert ex.prompt[-1] == graph.DELIMS[language.split("_")[0]]
  assert graph.decode_path(ex.answer, language) == path
  assert graph.score(g, (path[0], path[-1]), list(ex.answer), language) == {"valid": 1.0, "shortest": 1.0}
  assert graph.score(g, (path[0], path[-1]), list(ex.answer[:-1]), language)["valid"] == 0.0


def test_formats():
  assert graph.make_example([3, 7, 9], "node_plain").text == "3 9 : 3 7 9"
  assert graph.make_example([3, 7, 9], "edge_plain").text == "3 9 = 3 7 , 7 9"
  assert graph.make_example([3, 7, 9], "edge_offset").text == "10003 10009 = 10003 10007 , 10007 10009"
  assert graph.decode_path(["3", "7", ",", "8", "9"], "edge_plain") is None  # edges must chain


def test_validity_accepts_longer_real_paths(g):
  # a walk there and back again is a real (non-shortest) path
  a, b = next(iter(g.edges))
  c = next(n for n in g[b] if n != a) if len(g[b]) > 1 else None
  if c is None:
    pytest.skip("edge without a continuation")
  walk = [a, b, c, b, c]
  s = graph.score(g, (a, c), [str(x) for x in walk], "node_plain")
  assert s == {"valid": 1.0, "shortest": 0.0}


def test_tokenizer_round_trip_and_loss_mask(g):
  tok = common.WordTokenizer(graph.symbols(g, "node_plain") + graph.symbols(g, "edge_offset"))
  ex = graph.make_example([3, 7, 9], "edge_offset")
  ids = tok.encode(ex.prompt + ex.answer)
  assert tok.decode(ids) == list(ex.prompt + ex.answer)
  assert tok.pad_id == 0
  enc = common.encode_examples([ex], tok, 16)
  n = len(ex.prompt) + len(ex.answer) + 1
  assert enc.tokens[0, n - 1] == tok.eos_id and not enc.tokens[0, n:].any()
  # targets tokens[1:]: the mask covers exactly the answer and EOS
  expected = np.zeros(15)
  expected[len(ex.prompt) - 1:n - 1] = 1
  np.testing.assert_array_equal(enc.loss_mask[0], expected)
  with pytest.raises(ValueError, match="not in the vocabulary"):
    tok.encode(["12345"])
  with pytest.raises(ValueError, match="does not fit"):
    common.encode_examples([ex], tok, 5)


def test_too_many_samples_is_a_clear_error(g):
  s = graph.split_pairs(g, num_test=500, num_val=100, seed=0)
  with pytest.raises(ValueError, match="distinct shortest paths"):
    graph.sample_paths(g, s.train[:10], 1000, seed=0)
  with pytest.raises(ValueError, match="reachable pairs"):
    graph.split_pairs(g, num_test=9000, num_val=100, seed=0)


def test_unknown_language():
  with pytest.raises(ValueError, match="unknown graph language"):
    graph.check_language("edge_klingon")


def test_failure_kinds():
  g = nx.path_graph(5)  # 0 - 1 - 2 - 3 - 4
  e = "edge_plain"
  assert graph.failure(g, (0, 2), "0 1 , 1 2".split(), e) is None
  assert graph.failure(g, (0, 2), "0 1 , 0 1".split(), e) == "malformed"  # a repeated edge does not chain
  assert graph.failure(g, (0, 1), "0 1 , 1".split(), e) == "malformed"  # went on after the last edge
  assert graph.failure(g, (0, 2), "1 2".split(), e) == "wrong start"
  assert graph.failure(g, (0, 3), "0 1 , 1 3".split(), e) == "non-edge"
  assert graph.failure(g, (0, 3), "0 1 , 1 2".split(), e) == "wrong end"
  assert graph.failure(g, (4, 2), "10004 10003 10002".split(), "node_offset") is None
