"""xlt.merge on tiny hand-made trees with hand-computed values."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlt import merge
from xlt import param_paths as naming
from xlt.merge import combine, core
from xlt.merge.maet import tensor_similarity  # xlt.merge.maet is the function

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Shapes of a tiny xlt GPT: D=2, H=1, K=2, F=4, V=3, T=3.
D, H, K, F, V, T = 2, 1, 2, 4, 3, 3
BLOCK_SHAPES = {
    ("ln_1", "scale"): (D,), ("ln_1", "bias"): (D,),
    ("attn", "qkv", "kernel"): (D, 3, H, K), ("attn", "qkv", "bias"): (3, H, K),
    ("attn", "proj", "kernel"): (H, K, D), ("attn", "proj", "bias"): (D,),
    ("ln_2", "scale"): (D,), ("ln_2", "bias"): (D,),
    ("mlp", "fc", "kernel"): (D, F), ("mlp", "fc", "bias"): (F,),
    ("mlp", "proj", "kernel"): (F, D), ("mlp", "proj", "bias"): (D,),
}
TOP_SHAPES = {("wte", "embedding"): (V, D), ("wpe",): (T, D), ("ln_f", "scale"): (D,),
              ("ln_f", "bias"): (D,), ("lm_head", "kernel"): (D, V)}


def nest(flat: dict) -> dict:
  tree = {}
  for path, x in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = x
  return tree


def gpt_tree(num_blocks: int, fill, dtype=np.float32) -> dict:
  """An xlt-shaped tree whose leaf at `path` is fill(path, shape)."""
  flat = {p: s for p, s in TOP_SHAPES.items()}
  for b in range(num_blocks):
    flat.update({(f"block_{b}", *p): s for p, s in BLOCK_SHAPES.items()})
  return nest({p: np.asarray(fill(p, s), dtype) for p, s in flat.items()})


def flat(tree) -> dict:
  return {naming.path_str(p): np.asarray(x) for p, x in core.leaves_with_paths(tree)}


def random_tree(seed: int, num_blocks: int = 3, dtype=np.float32) -> dict:
  rng = np.random.default_rng(seed)
  return gpt_tree(num_blocks, lambda p, s: rng.normal(size=s), dtype)


def assert_trees_equal(a, b):
  fa, fb = flat(a), flat(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    assert fa[k].dtype == fb[k].dtype, k
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


# ---- naming


def test_block_kind_agrees_with_model_path_info_and_rows_fit_real_shapes():
  from xlt import model

  cfg = model.Config(vocab_size=10, block_size=8, num_layers=3, num_heads=2, d_model=8)
  shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))  # no compile: fast
  rng = np.random.default_rng(0)
  params, other = (jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), shapes) for _ in range(2))
  for key_path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    assert merge.XLT.block_kind(key_path) == model.path_info(key_path)
    assert merge.XLT.block_kind(naming.path_names(key_path)) == model.path_info(key_path)
    rows = merge.XLT.rows(key_path, x)
    np.testing.assert_array_equal(merge.XLT.from_rows(key_path, rows, x.shape), np.asarray(x))
  blk = params["block_0"]
  assert merge.XLT.rows(("block_0", "attn", "qkv", "kernel"), blk["attn"]["qkv"]["kernel"]).shape == (3 * 2 * 4, 8)
  assert merge.XLT.rows(("block_0", "attn", "proj", "kernel"), blk["attn"]["proj"]["kernel"]).shape == (8, 2 * 4)
  assert merge.XLT.rows(("block_0", "attn", "qkv", "bias"), blk["attn"]["qkv"]["bias"]).shape == (1, 3 * 2 * 4)
  assert merge.XLT.rows(("lm_head", "kernel"), params["lm_head"]["kernel"]).shape == (10, 8)
  assert merge.XLT.rows(("wte", "embedding"), params["wte"]["embedding"]).shape == (10, 8)
  # A merge of two trees of the model's layout keeps the structure, shapes and dtypes.
  swapped = merge.layer_swap(params, other, bottom=1, top=1)
  assert jax.tree_util.tree_structure(swapped) == jax.tree_util.tree_structure(params)
  np.testing.assert_array_equal(swapped["block_1"]["mlp"]["fc"]["kernel"], params["block_1"]["mlp"]["fc"]["kernel"])
  np.testing.assert_array_equal(swapped["block_2"]["ln_1"]["scale"], other["block_2"]["ln_1"]["scale"])


# ---- layer swapping


def expert_tree(expert_id: int, num_blocks: int) -> dict:
  """Leaves are constants naming (expert, leaf): 1000 * expert + the leaf's index."""
  order = {}
  return gpt_tree(num_blocks, lambda p, s: np.full(s, 1000 * expert_id + order.setdefault(p, len(order))))


def test_layer_swap_takes_each_leaf_from_the_right_expert():
  task, lang = expert_tree(1, 4), expert_tree(2, 4)
  out = flat(merge.layer_swap(task, lang, bottom=1, top=1))
  ft, fl = flat(task), flat(lang)
  assert out.keys() == ft.keys()
  for name, x in out.items():
    block = merge.XLT.block_kind(name)[0]
    if block in (0, 3):
      np.testing.assert_array_equal(x, fl[name], err_msg=name)
    elif block in (1, 2):
      np.testing.assert_array_equal(x, ft[name], err_msg=name)
    else:  # non-block: the average of the two experts
      np.testing.assert_array_equal(x, (ft[name] + fl[name]) / 2, err_msg=name)
    assert x.dtype == np.float32


def test_transition_zone_is_the_weighted_average():
  task = gpt_tree(6, lambda p, s: np.full(s, 1.0))
  lang = gpt_tree(6, lambda p, s: np.full(s, 5.0))
  out = merge.layer_swap(task, lang, bottom=1, top=0, lower_transition=1, task_weight=3, language_weight=1)
  values = [float(out[f"block_{b}"]["mlp"]["fc"]["kernel"][0, 0]) for b in range(6)]
  assert values == [5.0, 2.0, 1.0, 1.0, 1.0, 1.0]  # block 1: (3 * 1 + 1 * 5) / 4
  assert float(out["wte"]["embedding"][0, 0]) == 2.0  # non-block average, same weights


def test_non_block_rules():
  task, lang = gpt_tree(4, lambda p, s: np.full(s, 1.0)), gpt_tree(4, lambda p, s: np.full(s, 3.0))
  for rule, value in (("task", 1.0), ("language", 3.0), ("average", 2.0)):
    out = merge.layer_swap(task, lang, bottom=1, top=1, non_block=rule)
    for leaf in (out["wte"]["embedding"], out["wpe"], out["ln_f"]["bias"], out["lm_head"]["kernel"]):
      np.testing.assert_array_equal(leaf, value)
    np.testing.assert_array_equal(out["block_1"]["ln_1"]["scale"], 1.0)  # norms move with their block
  with pytest.raises(ValueError, match="non_block"):
    merge.layer_swap(task, lang, bottom=1, top=1, non_block="base")


def test_swap_plan():
  assert merge.swap_plan(4, 1, 1) == [1.0, 0.0, 0.0, 1.0]
  assert merge.swap_plan(8, 2, 1, 1, 2) == [1.0, 1.0, 0.5, 0.0, 0.0, 0.5, 0.5, 1.0]
  assert merge.swap_plan(6, 1, 0, 1, 0, task_weight=3, language_weight=1) == [1.0, 0.25, 0.0, 0.0, 0.0, 0.0]
  assert merge.swap_plan(32, 5, 2) == [1.0] * 5 + [0.0] * 25 + [1.0] * 2  # the paper's default
  assert merge.swap_plan(4, 2, 2) == [1.0] * 4  # zones may tile the model exactly
  with pytest.raises(ValueError, match=r"bottom=2 \+ lower_transition=1 \+ upper_transition=0 \+ top=2 = 5 .* 4"):
    merge.swap_plan(4, 2, 2, 1)
  with pytest.raises(ValueError, match="bottom must be a non-negative integer"):
    merge.swap_plan(4, -1, 1)
  tree = gpt_tree(4, lambda p, s: np.zeros(s))
  with pytest.raises(ValueError, match="overlap"):
    merge.layer_swap(tree, tree, bottom=2, top=1, upper_transition=2)
  with pytest.raises(ValueError, match="num_blocks=5 .* 4 blocks"):
    merge.layer_swap(tree, tree, bottom=1, top=1, num_blocks=5)


# ---- soups and task arithmetic


def test_soup():
  a, b = random_tree(0), random_tree(1)
  assert_trees_equal(merge.soup([a]), a)
  out, fa, fb = flat(merge.soup([a, b], [1, 3])), flat(a), flat(b)
  for k in out:
    np.testing.assert_allclose(out[k], 0.25 * fa[k] + 0.75 * fb[k], rtol=1e-6, atol=1e-6)
  assert_trees_equal(a, random_tree(0))  # the inputs are left alone
  with pytest.raises(ValueError, match="non-negative"):
    merge.soup([a, b], [1, -1])
  with pytest.raises(TypeError, match="not one tree"):
    merge.soup(a)


def test_merging_a_model_with_itself_returns_it():
  for m in (random_tree(2), random_tree(3, dtype=jnp.bfloat16)):
    assert_trees_equal(merge.soup([m, m]), m)
    assert_trees_equal(merge.soup([m, m, m], [0.2, 0.3, 0.5]), m)
    assert_trees_equal(merge.layer_swap(m, m, bottom=1, top=1, lower_transition=1, task_weight=3), m)
    assert_trees_equal(merge.task_arithmetic(m, [m, m], [0.7, 0.4]), m)
    assert_trees_equal(merge.ties(m, [m, m]), m)
    assert_trees_equal(merge.dare(m, [m, m]), m)
    assert_trees_equal(merge.sparsify_rows(m, m, 0.0), m)
    assert_trees_equal(merge.maet(m, m, m, [m, m]), m)


def test_merges_leave_their_inputs_alone():
  base, a, b = random_tree(0), random_tree(1), random_tree(2)
  merge.soup([a, b])
  merge.layer_swap(a, b, bottom=1, top=1, lower_transition=1)
  merge.task_arithmetic(base, [a, b])
  merge.ties(base, [a, b], density=0.5)
  merge.dare(base, [a, b], drop=0.5)
  merge.sparsify_rows(a, base, 0.5)
  merge.maet(base, a, b, [a, b], key_ratio=0.5)
  for tree, seed in ((base, 0), (a, 1), (b, 2)):
    assert_trees_equal(tree, random_tree(seed))


def test_task_arithmetic():
  base = gpt_tree(2, lambda p, s: np.full(s, 1.0))
  e1 = gpt_tree(2, lambda p, s: np.full(s, 3.0))
  e2 = gpt_tree(2, lambda p, s: np.full(s, 0.5))
  assert_trees_equal(merge.task_arithmetic(base, [e1, e2], 0.0), base)
  assert_trees_equal(merge.task_arithmetic(base, [e1], 1.0), e1)
  out = merge.task_arithmetic(base, [e1, e2], [0.5, -1.0])  # 1 + 0.5 * 2 - 1 * (-0.5)
  np.testing.assert_array_equal(out["block_1"]["attn"]["qkv"]["kernel"], 2.5)
  rand_base, rand_e = random_tree(4), random_tree(5)
  for k, x in flat(merge.task_arithmetic(rand_base, [rand_e])).items():
    np.testing.assert_allclose(x, flat(rand_e)[k], rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="3 values for 2 experts"):
    merge.task_arithmetic(base, [e1, e2], [1, 1, 1])


def test_magnitude_weights_use_the_mean_row_mav_over_all_rows():
  base = {"wte": {"embedding": np.zeros((2, 2), np.float32)}, "ln_f": {"scale": np.zeros(2, np.float32)}}
  # expert a: embedding rows MAV 1 and 2, the scale (one row) MAV 3 -> mean 2
  a = {"wte": {"embedding": np.array([[1, -1], [2, 2]], np.float32)}, "ln_f": {"scale": np.array([3, -3], np.float32)}}
  b = {"wte": {"embedding": np.full((2, 2), 4, np.float32)}, "ln_f": {"scale": np.full(2, -4, np.float32)}}  # mean 4
  np.testing.assert_allclose(merge.magnitude_weights([a, b], base), [2 / 3, 1 / 3])
  with pytest.raises(ValueError, match="expert 1 equals the base"):
    merge.magnitude_weights([a, base], base)


# ---- TIES and DARE


def test_ties_trim_elect_disjoint_mean():
  base = {"w": np.full(5, 10.0, np.float32)}
  deltas = [[3, -1, 2, 0.5, -4],   # top 3 of 5 by |.|: 3, 2, -4
            [2, 1, -5, 4, 0.1],    # -5, 4, 2
            [-1, 6, 1.5, -3, 4]]   # 6, -3, 4
  experts = [{"w": base["w"] + np.asarray(d, np.float32)} for d in deltas]
  # trimmed: [3,0,2,0,-4], [2,0,-5,4,0], [0,6,0,-3,4]; sums [5,6,-3,1,0] -> signs + + - + none
  # agreeing means: (3+2)/2, 6, -5, 4, and 0 where the sum is exactly 0
  out = merge.ties(base, experts, density=0.6, convention="xlt")
  np.testing.assert_allclose(out["w"], [12.5, 16.0, 5.0, 14.0, 10.0])
  # the default is mergekit's rule: an exact 0 sum elects +, whose agreeing delta is 4
  np.testing.assert_allclose(merge.ties(base, experts, density=0.6)["w"], [12.5, 16.0, 5.0, 14.0, 14.0])
  out = merge.ties(base, experts, density=0.6, lambdas=0.5, convention="xlt")
  np.testing.assert_allclose(out["w"], [11.25, 13.0, 7.5, 12.0, 10.0])
  # Without the trim: sums [4,6,-1.5,1.5,0.1]; means (3+2)/2, (1+6)/2, -5, (0.5+4)/2, (0.1+4)/2
  np.testing.assert_allclose(merge.ties(base, experts, density=1.0, convention="xlt")["w"], [12.5, 13.5, 5.0, 12.25, 12.05], rtol=1e-6)
  with pytest.raises(ValueError, match="density"):
    merge.ties(base, experts, density=0.0)


def test_magmax_keeps_each_entrys_largest_change_whole():
  base = {"w": np.full(5, 10.0, np.float32), "b": np.zeros(2, np.float32)}
  deltas = [[3, -1, 2, 0.5, -4],
            [2, 1, -5, 4, 0.1],
            [-1, 6, 1.5, -3, 4]]  # the last entry: |-4| = |4|, the first expert's wins
  experts = [{"w": base["w"] + np.asarray(d, np.float32), "b": np.array([i, -i], np.float32)}
             for i, d in enumerate(deltas)]
  out = merge.magmax(base, experts)
  np.testing.assert_array_equal(out["w"], [13.0, 16.0, 5.0, 14.0, 6.0])
  np.testing.assert_array_equal(out["b"], [2.0, -2.0])
  np.testing.assert_array_equal(merge.magmax(base, experts, scale=0.5)["w"], [11.5, 13.0, 7.5, 12.0, 8.0])
  one = merge.magmax(base, experts[:1], scale=0.5)  # one expert: task arithmetic
  np.testing.assert_array_equal(one["w"], merge.task_arithmetic(base, experts[:1], 0.5)["w"])


def test_top_fraction_mask_keeps_ties_and_at_least_one():
  np.testing.assert_array_equal(core.top_fraction_mask([1, 3, 3, 2], 0.25), [False, True, True, False])
  np.testing.assert_array_equal(core.top_fraction_mask([5.0, 1.0], 0.1), [True, False])
  assert core.fraction_count(0.7, 10) == 7 and core.fraction_count(0.25, 2) == 1


def test_dare_is_seeded_and_rescales_survivors():
  n = 1_000_000
  base = {"a": np.zeros(n, np.float32), "b": np.zeros(4, np.float32)}
  expert = {"a": np.full(n, 0.5, np.float32), "b": np.ones(4, np.float32)}
  out = merge.dare(base, [expert], drop=0.9, seed=7)
  mask = combine.dare_mask(7, 0, ("a",), (n,), 0.9)
  np.testing.assert_array_equal(out["a"], np.where(mask, np.float32(0.5) / np.float32(0.1), 0))
  assert set(np.unique(out["a"])) == {0.0, np.float32(5.0)}
  assert abs(mask.mean() - 0.1) < 0.003
  assert abs(out["a"].mean() - 0.5) < 0.005  # E[rescaled delta] = delta
  # Same seed, same result, whatever the input arrays or the other leaves.
  again = merge.dare({"a": jnp.asarray(base["a"])}, [{"a": jnp.asarray(expert["a"])}], drop=0.9, seed=7)
  assert isinstance(again["a"], np.ndarray)
  np.testing.assert_array_equal(again["a"], out["a"])
  assert not np.array_equal(merge.dare(base, [expert], drop=0.9, seed=8)["a"], out["a"])
  # The second expert draws its own masks.
  two = merge.dare(base, [expert, expert], drop=0.5, seed=7, lambdas=0.5)
  expect = sum(0.5 * np.where(combine.dare_mask(7, i, ("a",), (n,), 0.5), 1.0, 0) for i in range(2))
  np.testing.assert_allclose(two["a"], expect)
  assert_trees_equal(merge.dare(base, [expert], drop=0.0), expert)
  for drop in (1.0, -0.1, 1.5):
    with pytest.raises(ValueError, match=r"DARE drop must be in \[0.0, 1.0\)"):
      merge.dare(base, [expert], drop=drop)


# ---- row sparsification


def test_sparsify_rows_reverts_rows_at_or_under_the_threshold():
  base = {"block_0": {"mlp": {"fc": {"kernel": np.zeros((2, 3), np.float32), "bias": np.zeros(3, np.float32)}}}}
  kernel = np.array([[0.1, 1.0, 0.5], [-0.1, -1.0, 0.5]], np.float32)  # column (row) MAVs 0.1, 1.0, 0.5
  expert = {"block_0": {"mlp": {"fc": {"kernel": kernel, "bias": np.array([0.2, 0.2, 0.2], np.float32)}}}}
  out = merge.sparsify_rows(expert, base, 0.4)["block_0"]["mlp"]["fc"]
  np.testing.assert_array_equal(out["kernel"], [[0.0, 1.0, 0.5], [0.0, -1.0, 0.5]])
  np.testing.assert_array_equal(out["bias"], 0.0)  # one row of MAV 0.2
  out = merge.sparsify_rows(expert, base, 0.1)["block_0"]["mlp"]["fc"]
  np.testing.assert_array_equal(out["bias"], np.float32(0.2))


# ---- MAET


def test_maet_key_neurons_and_tensor_selection():
  # Two tensors, 4 rows: the fc kernel's columns and the embedding's rows.
  def tree(kernel, emb):
    return {"block_0": {"mlp": {"fc": {"kernel": np.asarray(kernel, np.float32) + 1}}},
            "wte": {"embedding": np.asarray(emb, np.float32) + 1}}

  base = tree(np.zeros((2, 2)), np.zeros((2, 2)))
  # ability delta: kernel columns with norms 5 and 1, embedding rows with norms 1 and 2
  ability = tree([[3, 0], [4, 1]], [[1, 0], [0, 2]])
  source = tree(np.zeros((2, 2)), [[0, 0], [0, 1]])
  target = tree([[0, 1], [0, 0]], [[0, 0], [0, 1]])
  # key_ratio 0.25 = 1 of 4 rows: N_A = kernel column 0, N_L0 = embedding row 1.
  # R(A) = 0.8 * Delta_AL on N_A u N_L0 - 0.2 * Delta_L0 on N_L0:
  #   kernel [[2.4, 0], [3.2, 0]], embedding [[0, 0], [0, 1.6 - 0.2]]
  # cosine with R_Lang: kernel 0, embedding 1 -> the kernel is the ability tensor (ratio 0.5).
  out, info = merge.maet(base, ability, source, [target], key_ratio=0.25, tensor_ratio=0.5, return_info=True)
  assert info["selected"] == ["block_0/mlp/fc/kernel"]
  assert info["ranking"] == ["wte/embedding", "block_0/mlp/fc/kernel"]
  assert info["key_rows"] == {"ability": 1, "source_language": 1, "total": 4}
  np.testing.assert_allclose(info["similarity"]["wte/embedding"], 1.0)
  np.testing.assert_allclose(out["block_0"]["mlp"]["fc"]["kernel"], 1 + np.array([[0.48, 1.0], [0.64, 0.0]]), rtol=1e-6)
  np.testing.assert_allclose(out["wte"]["embedding"], 1 + np.array([[0.0, 0.0], [0.0, 1.0]]))
  # gamma, eta and mu: the selected tensor gets gamma R(A) + eta R_Lang, R_Lang = sum mu_i R(L_i)
  out = merge.maet(base, ability, source, [target, target], key_ratio=0.25, tensor_ratio=0.5,
                   gamma=1.0, eta=0.5, mu=[1.0, 0.5])
  np.testing.assert_allclose(out["block_0"]["mlp"]["fc"]["kernel"], 1 + np.array([[2.4, 0.75], [3.2, 0.0]]), rtol=1e-6)
  np.testing.assert_allclose(out["wte"]["embedding"], 1 + np.array([[0.0, 0.0], [0.0, 1.5]]))


def test_maet_similarity_options_rank_differently():
  def tree(a, b):
    return {"ln_f": {"scale": np.asarray(a, np.float32)}, "ln_f_2": {"scale": np.asarray(b, np.float32)}}

  base = tree([0, 0], [0, 0])
  ability = tree([1, 0], [10, 1])  # alpha 1, beta 0: R(A) = the ability delta
  target = tree([1, 0], [10, -2])  # cosines 1 and 0.957; dots 1 and 98
  kw = dict(alpha=1.0, beta=0.0, gamma=1.0, eta=0.0, key_ratio=1.0, tensor_ratio=0.5, return_info=True)
  _, cosine = merge.maet(base, ability, base, [target], similarity="cosine", **kw)
  out, dot = merge.maet(base, ability, base, [target], similarity="dot", **kw)
  assert cosine["selected"] == ["ln_f_2/scale"] and dot["selected"] == ["ln_f/scale"]
  np.testing.assert_array_equal(out["ln_f"]["scale"], [1, 0])  # base + R(A), eta 0
  np.testing.assert_array_equal(out["ln_f_2"]["scale"], [10, -2])  # base + R_Lang
  assert tensor_similarity(np.zeros(2), np.ones(2)) == 0.0  # a zero weight: cosine 0
  with pytest.raises(ValueError, match="similarity"):
    merge.maet(base, ability, base, [target], similarity="l2")
  with pytest.raises(ValueError, match="target_language_models is empty"):
    merge.maet(base, ability, base, [])


# ---- analysis


def analysis_trees():
  z = lambda *s: np.zeros(s, np.float32)
  base = {"block_0": {"ln_1": {"scale": z(2)}, "mlp": {"fc": {"kernel": z(2, 2)}}},
          "block_1": {"ln_1": {"scale": z(2)}, "mlp": {"fc": {"kernel": z(2, 2)}}},
          "wte": {"embedding": z(3, 2)}}
  f = lambda x: np.asarray(x, np.float32)
  expert = {"block_0": {"ln_1": {"scale": f([0.1, 0.1])}, "mlp": {"fc": {"kernel": f([[1, 0], [-1, 0]])}}},
            "block_1": {"ln_1": {"scale": f([2, 0])}, "mlp": {"fc": {"kernel": f([[1, 1], [1, 1]])}}},
            "wte": {"embedding": f([[1, 1], [0, 0], [0, 0]])}}
  return expert, base


def test_row_change_and_heatmap(tmp_path):
  expert, base = analysis_trees()
  change = merge.row_change(expert, base, threshold=0.5)
  assert change["blocks"] == [0, 1]
  assert change["columns"] == ["mlp/fc/kernel", "ln_1/scale"]
  assert change["share"] == [[0.5, 0.0], [1.0, 1.0]]
  assert change["non_block"] == pytest.approx({"wte/embedding": 1 / 3})
  # row MAVs: 1, 0 | 0.1 | 1, 1 | 1 | 1, 0, 0 -> median 1
  assert merge.default_threshold(expert, base) == 1.0
  png = tmp_path / "plots" / "row_change.png"
  merge.plot_row_change(change, str(png), "expert vs base")
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert os.listdir(png.parent) == ["row_change.png"]  # no temporary file left


# ---- errors


def test_structure_errors_name_the_path():
  a = random_tree(0, 2)
  missing = random_tree(1, 2)
  del missing["block_1"]["attn"]["qkv"]["bias"]
  with pytest.raises(ValueError, match="block_1/attn/qkv/bias: in task expert but missing from language expert"):
    merge.layer_swap(a, missing, bottom=1, top=0)
  with pytest.raises(ValueError, match="block_1/attn/qkv/bias: in expert 1 but missing from base"):
    merge.ties(missing, [missing, a])
  shaped = random_tree(1, 2)
  shaped["block_0"]["mlp"]["fc"]["kernel"] = np.zeros((D, F + 1), np.float32)
  with pytest.raises(ValueError, match=r"block_0/mlp/fc/kernel: shape \(2, 4\) in expert 0 vs \(2, 5\) in expert 1"):
    merge.soup([a, shaped])
  typed = random_tree(1, 2)
  typed["ln_f"]["scale"] = typed["ln_f"]["scale"].astype(np.float16)
  with pytest.raises(ValueError, match="ln_f/scale: dtype float32 in base vs float16 in expert 0"):
    merge.dare(a, [typed])
  listed = {"w": [np.zeros(2)]}
  with pytest.raises(ValueError, match="containers"):
    merge.check_compatible([listed, {"w": (np.zeros(2),)}])


def test_empty_expert_lists_are_errors():
  a = random_tree(0, 2)
  for call in (lambda: merge.soup([]), lambda: merge.task_arithmetic(a, []), lambda: merge.ties(a, []),
               lambda: merge.dare(a, []), lambda: merge.magnitude_weights([], a)):
    with pytest.raises(ValueError, match="experts is empty"):
      call()


def test_import_is_pure():
  code = ("import sys, xlt.merge; bad = [m for m in ('flax', 'optax', 'xlt.model', 'matplotlib') "
          "if m in sys.modules]; assert not bad, bad")
  subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_layer_swap_soups_several_experts_of_one_kind_first():
  const = lambda v: gpt_tree(2, lambda p, s: np.full(s, v))
  t1, t2, l1, l2 = const(1.0), const(3.0), const(10.0), const(30.0)
  got = merge.layer_swap([t1, t2], [l1, l2], bottom=1, top=0, non_block="task")
  assert_trees_equal(got, merge.layer_swap(merge.soup([t1, t2]), merge.soup([l1, l2]), bottom=1, top=0,
                                           non_block="task"))
  np.testing.assert_allclose(got["block_0"]["mlp"]["fc"]["kernel"], 20.0)  # language soup
  np.testing.assert_allclose(got["block_1"]["mlp"]["fc"]["kernel"], 2.0)   # task soup
