"""xlt.merge.data_aware (RegMean, RegMean++, Fisher merging) by hand and on a tiny GPT with statistics from
xlt.merge_statistics; parity with fusion-bench's merging functions: tests/test_merge_fusion.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlt import merge_data, merge_statistics, model
from xlt.merge import data_aware, registry
from xlt.param_paths import HF, XLT

CFG = model.Config(vocab_size=16, block_size=8, num_layers=2, num_heads=2, d_model=8)
RNG = np.random.default_rng(0)
BATCHES = [RNG.integers(0, 16, (3, 6)).astype(np.int32) for _ in range(2)]


def test_regmean_by_hand():
  # one input unit each: G_i = diag(g_i), so each input column is the g-weighted mean of the experts'
  w1, w2 = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([[5.0, 6.0], [7.0, 8.0]], np.float32)
  w, b = "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.bias"  # torch [out, in]
  experts = [{w: w1, b: np.array([1.0, 3.0], np.float32)}, {w: w2, b: np.array([3.0, 5.0], np.float32)}]
  grams = [{w: np.diag([1.0, 3.0])}, {w: np.diag([3.0, 1.0])}]
  out = data_aware.regmean(experts, grams=grams, alpha=1.0, naming=HF)
  # column j (input unit j) is (g1_j w1[:, j] + g2_j w2[:, j]) / (g1_j + g2_j)
  np.testing.assert_allclose(out[w], [[4.0, 3.0], [6.0, 5.0]], atol=1e-6)
  np.testing.assert_array_equal(out[b], [2.0, 4.0])  # no Gram: the mean
  # equal Grams of any kind give the mean, and alpha only scales the off-diagonal
  full = RNG.normal(size=(2, 2))
  same = [{w: full @ full.T}] * 2
  np.testing.assert_allclose(data_aware.regmean(experts, grams=same, alpha=0.5, naming=HF)[w], (w1 + w2) / 2,
                             atol=1e-5)
  with pytest.raises(ValueError, match="grams must be one mapping per expert"):
    data_aware.regmean(experts, grams=grams[:1])


def test_fisher_by_hand():
  experts = [{"w": np.array([0.0, 4.0], np.float32)}, {"w": np.array([2.0, 8.0], np.float32)}]
  fishers = [{"w": np.array([3.0, 1.0])}, {"w": np.array([1.0, 1.0])}]
  out = data_aware.fisher(experts, fishers=fishers, eps=0.0)
  np.testing.assert_allclose(out["w"], [0.5, 6.0])
  np.testing.assert_allclose(data_aware.fisher(experts, fishers=fishers, weights=[1, 3], eps=0.0)["w"], [1.0, 7.0])
  # normalize weighs expert i by 1 / |F_i|: |F_1| = sqrt(10), |F_2| = sqrt(2)
  c = np.array([1 / np.sqrt(10), 1 / np.sqrt(2)])
  want = (c[0] * 3 * 0 + c[1] * 1 * 2) / (c[0] * 3 + c[1] * 1)
  np.testing.assert_allclose(data_aware.fisher(experts, fishers=fishers, normalize=True, eps=0.0)["w"][0], want,
                             rtol=1e-6)


BASE = None


def _expert(seed):
  global BASE
  if BASE is None:  # random parameters of the model's shapes (its init would compile for seconds)
    shapes, rng = jax.eval_shape(lambda: model.init_params(CFG, jax.random.key(0))), np.random.default_rng(0)
    BASE = jax.tree.map(lambda s: (0.3 * rng.normal(size=s.shape)).astype(s.dtype), shapes)
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (x + 0.05 * rng.normal(size=x.shape)).astype(x.dtype), BASE)


def test_grams_are_the_kernels_inputs_and_regmean_solves_the_least_squares():
  experts = [_expert(1), _expert(2)]
  grams = [merge_statistics.grams(CFG, e, BATCHES) for e in experts]
  path = ("block_1", "attn", "proj", "kernel")  # [H, K, D]: two input axes
  assert "block_1/attn/proj/kernel" in grams[0] and grams[0]["block_1/attn/proj/kernel"].shape == (8, 8)
  # the inputs of that kernel, captured here on their own, one batch after the other
  @jax.jit
  def inputs(params, tokens):
    seen = []

    def capture(next_fun, args, kwargs, context):
      if context.method_name == "__call__" and tuple(context.module.path) + ("kernel",) == path:
        seen.append(args[0].reshape(-1, 8))
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(capture):
      model.apply(CFG, params, tokens)
    return seen[0]

  x = np.concatenate([np.asarray(inputs(experts[0], jnp.asarray(t))) for t in BATCHES]).astype(np.float64)
  np.testing.assert_allclose(grams[0]["block_1/attn/proj/kernel"], x.T @ x / len(x), rtol=1e-4, atol=1e-6)
  # alpha 1: the merged map zeroes the gradient of sum_i |X_i W - X_i W_i|^2, i.e. sum_i G_i (W - W_i) = 0
  merged = registry.merge("regmean", {"experts": experts}, {"grams": grams, "alpha": 1.0})
  rows = lambda tree: XLT.rows(path, np.asarray(tree["block_1"]["attn"]["proj"]["kernel"], np.float64))
  g = [gr["block_1/attn/proj/kernel"].astype(np.float64) for gr in grams]
  residual = sum(gi @ (rows(merged) - rows(e)).T for gi, e in zip(g, experts))
  assert np.abs(residual).max() < 1e-5 and np.abs(rows(merged) - rows(experts[0])).max() > 1e-3


def _leaf(tree, path):
  for name in path.split("/"):
    tree = tree[name]
  return np.asarray(tree)


def test_regmean_plusplus_measures_each_stage_on_the_merge_so_far():
  experts = [_expert(1), _expert(2)]
  staged, calls = merge_data.staged_grams(CFG, [BATCHES[:1], BATCHES[1:]]), []

  def measure(models, paths):
    calls.append((paths, models))
    return staged(models, paths)

  merged = registry.merge("regmean_plusplus", {"experts": experts}, {"measure": measure, "alpha": 0.9})
  firsts = [paths[0].split("/")[0] for paths, _ in calls]
  assert firsts == ["wpe", "block_0", "block_1", "lm_head"]  # the order the model runs
  # block 1 is measured with the merged embedding and block 0, each expert's own block 1
  _, models = calls[2]
  for i, m in enumerate(models):
    for path in ("wte/embedding", "block_0/mlp/fc/kernel", "block_1/mlp/fc/kernel"):
      want = experts[i] if path.startswith("block_1") else merged
      np.testing.assert_array_equal(_leaf(m, path), _leaf(want, path), err_msg=path)
  # those grams make block 1 RegMean's merge of them; RegMean's own grams (each expert's alone) differ
  grams = [merge_statistics.grams(CFG, m, b) for m, b in zip(models, (BATCHES[:1], BATCHES[1:]))]
  once = registry.merge("regmean", {"experts": experts}, {"grams": grams, "alpha": 0.9})
  path = "block_1/attn/proj/kernel"
  np.testing.assert_allclose(_leaf(merged, path), _leaf(once, path), atol=1e-6)
  own = [merge_statistics.grams(CFG, e, b) for e, b in zip(experts, (BATCHES[:1], BATCHES[1:]))]
  plain = registry.merge("regmean", {"experts": experts}, {"grams": own, "alpha": 0.9})
  assert np.abs(_leaf(plain, path) - _leaf(merged, path)).max() > 1e-4
  with pytest.raises(ValueError, match="measure gave grams of block_1/mlp/fc/kernel, outside the stage"):
    data_aware.regmean_plusplus(experts, measure=lambda models, paths: [{"block_1/mlp/fc/kernel": np.eye(8)}] * 2)


def test_diagonal_fisher_is_the_mean_squared_per_sequence_gradient():
  params = _expert(3)
  fisher = merge_statistics.diagonal_fisher(CFG, params, BATCHES)
  grad = jax.jit(jax.grad(lambda p, t: merge_statistics._sequence_nll(CFG, p, t)))
  squares = [jax.tree.map(lambda g: np.square(np.asarray(g, np.float64)), grad(params, jnp.asarray(t)))
             for batch in BATCHES for t in batch]
  want = jax.tree.map(lambda *s: sum(s) / len(s), *squares)
  for a, b in zip(jax.tree.leaves(fisher), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-9)
  merged = registry.merge("fisher", {"experts": [params, _expert(4)]},
                          {"fishers": [fisher, merge_statistics.diagonal_fisher(CFG, _expert(4), BATCHES)]})
  assert jax.tree.structure(merged) == jax.tree.structure(params)


def test_masked_statistics_count_only_the_kept_positions():
  # a causal model: the first 4 positions of a sequence see what they would see alone, so the
  # statistics over them, masked, equal those of the sequences cut to 4 tokens
  params, tokens = _expert(5), BATCHES[0]
  keep = np.zeros(tokens.shape, np.float32)
  keep[:, :4] = 1
  masked = merge_statistics.grams(CFG, params, [(tokens, keep)])
  cut = merge_statistics.grams(CFG, params, [tokens[:, :4]])
  for k in cut:
    np.testing.assert_allclose(masked[k], cut[k], rtol=1e-4, atol=1e-6)
  targets = np.zeros((tokens.shape[0], tokens.shape[1] - 1), np.float32)
  targets[:, :3] = 1  # the targets of the first 4 tokens
  for a, b in zip(jax.tree.leaves(merge_statistics.diagonal_fisher(CFG, params, [(tokens, targets)])),
                  jax.tree.leaves(merge_statistics.diagonal_fisher(CFG, params, [tokens[:, :4]]))):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-9)
  with pytest.raises(ValueError, match="the mask must be"):
    merge_statistics.grams(CFG, params, [(tokens, targets)])


def test_statistics_sharded_over_the_mesh_equal_unsharded():
  # batches of 3 over 8 devices (data 4 x fsdp 2): padded with rows that count for nothing
  from xlt import sharding
  assert len(jax.devices()) >= 8
  mesh = sharding.make_mesh({"data": 4, "fsdp": 2, "tensor": 1, "devices": 8})
  params = _expert(6)
  keep = np.ones(BATCHES[1].shape, np.float32)
  keep[:, -2:] = 0
  batches = [BATCHES[0], (BATCHES[1], keep)]
  one, many = merge_statistics.grams(CFG, params, batches), merge_statistics.grams(CFG, params, batches, mesh=mesh)
  assert set(one) == set(many)
  for k in one:
    np.testing.assert_allclose(many[k], one[k], rtol=1e-5, atol=1e-7)
  fisher_one = merge_statistics.diagonal_fisher(CFG, params, BATCHES)
  fisher_many = merge_statistics.diagonal_fisher(CFG, params, BATCHES, mesh=mesh)
  for a, b in zip(jax.tree.leaves(fisher_many), jax.tree.leaves(fisher_one)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-10)
