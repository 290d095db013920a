"""xlt.matmul's dense products in both weight layouts (model.Config.dense_layout): each equals
lax.dot_general with its gradients, a model in one layout computes what the other does, and a
training step's products all contract their left operand's last axis (XLA:CPU's fast form)."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from xlt import matmul, model, param_paths

@pytest.mark.parametrize("x_shape, w_shape", [
    ((3, 5, 4), (4, 6)),  # x narrower than dy: x is the transposed copy
    ((3, 5, 6), (6, 2)),  # dy narrower: dy is, and the product is transposed back
    ((2, 5, 3, 4), (3, 4, 7)),  # DenseGeneral over two axes (the attention's output projection)
])
def test_dense_product_and_its_gradients_equal_lax(x_shape, w_shape, autodiff_products):
  """xlt's dense product is lax.dot_general with another weight-gradient program: the same
  values and gradients, also under vmap (ensembles), and through a whole model."""
  n = len(w_shape) - 1
  x = jax.random.normal(jax.random.key(0), x_shape)
  w = jax.random.normal(jax.random.key(1), w_shape)
  dims = ((tuple(range(len(x_shape) - n, len(x_shape))), tuple(range(n))), ((), ()))
  weights = jax.random.normal(jax.random.key(2), x_shape[:-n] + w_shape[n:])
  loss = lambda f: (lambda x, w: (f(x, w, dims) * weights).sum())
  np.testing.assert_allclose(matmul.dense(x, w, dims), jax.lax.dot_general(x, w, dims), rtol=1e-6)
  got = jax.jit(jax.grad(loss(matmul.dense), (0, 1)))(x, w)
  want = jax.jit(jax.grad(loss(jax.lax.dot_general), (0, 1)))(x, w)
  for g, g_want in zip(got, want):
    assert g.shape == g_want.shape and g.dtype == g_want.dtype
    np.testing.assert_allclose(g, g_want, rtol=1e-5, atol=1e-5)
  xs, ws = jnp.stack([x, 2 * x]), jnp.stack([w, -w])
  got = jax.jit(jax.vmap(jax.grad(loss(matmul.dense), (0, 1))))(xs, ws)
  want = jax.jit(jax.vmap(jax.grad(loss(jax.lax.dot_general), (0, 1))))(xs, ws)
  for g, g_want in zip(got, want):
    np.testing.assert_allclose(g, g_want, rtol=1e-5, atol=1e-5)
  # the model's parameters get the same gradient through it as through lax.dot_general
  cfg = model.Config(vocab_size=11, block_size=8, num_layers=1, num_heads=2, d_model=8, tie_embeddings=True)
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(3), (2, 8), 0, 11)
  f = lambda p: model.apply(cfg, p, tokens)[0].std()
  got = jax.jit(jax.grad(f))(params)
  autodiff_products()
  want = jax.jit(jax.grad(f))(params)  # a fresh function (jax.grad's), traced with the patch
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got, want)


@pytest.mark.parametrize("x_shape, w_shape", [
    ((3, 5, 4), (6, 4)),  # x narrower than dy: x is the transposed copy
    ((3, 5, 6), (2, 6)),  # dy narrower: dy is, and the product is transposed back
    ((2, 5, 3, 4), (7, 3, 4)),  # over two axes (the attention's output projection)
])
def test_product_with_a_torch_layout_weight_and_its_gradients_equal_lax(x_shape, w_shape):
  """matmul.dense_t (a weight stored [out..., in...], torch's Linear) is lax.dot_general
  contracting x's last n axes with w's last n: the same values and gradients, under vmap too."""
  n = len(w_shape) - 1
  x = jax.random.normal(jax.random.key(0), x_shape)
  w = jax.random.normal(jax.random.key(1), w_shape)
  dims = ((tuple(range(len(x_shape) - n, len(x_shape))), tuple(range(1, len(w_shape)))), ((), ()))
  weights = jax.random.normal(jax.random.key(2), x_shape[:-n] + w_shape[:1])
  mine = lambda x, w: (matmul.dense_t(x, w, n) * weights).sum()
  lax = lambda x, w: (jax.lax.dot_general(x, w, dims) * weights).sum()
  np.testing.assert_allclose(matmul.dense_t(x, w, n), jax.lax.dot_general(x, w, dims), rtol=1e-6)
  for grad in (jax.grad, lambda f, argnums: jax.vmap(jax.grad(f, argnums), in_axes=(0, None))):
    xs = x if grad is jax.grad else jnp.stack([x, -2 * x])
    got, want = jax.jit(grad(mine, (0, 1)))(xs, w), jax.jit(grad(lax, (0, 1)))(xs, w)
    for g, g_want in zip(got, want):
      assert g.shape == g_want.shape and g.dtype == g_want.dtype
      np.testing.assert_allclose(g, g_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama_gqa", "llama_mha", "gpt2"])
def test_weight_layout_computes_what_the_kernel_layout_does(family):
  """Config.dense_layout="weight" ([out..., in...] leaves named "weight") is the "kernel" model
  with every dense leaf transposed (and a fused qkv kernel split into q, k, v: weights are
  never fused): its logical axes permuted alike, the same logits and (to rounding) gradients;
  xlt.param_paths finds the output rows of either."""
  kw = dict(vocab_size=37, block_size=16, num_layers=2, num_heads=4, d_model=16)
  if family != "gpt2":
    kw |= dict(norm="rmsnorm", mlp="swiglu", pos_embedding="rope", num_kv_heads=2 if family == "llama_gqa" else 4)
  cfg = model.Config(**kw)
  cfg_w = dataclasses.replace(cfg, dense_layout="weight")
  params = model.init_params(cfg, jax.random.key(0))
  rows = lambda names, x: param_paths.XLT.rows(names, np.asarray(x))  # [out, in] of either layout

  def as_weights(tree):
    out = {}
    for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
      names = param_paths.path_names(p)
      if names[-2:-1] == ("qkv",):  # [D, 3, H, K] / [3, H, K] -> q, k, v's [D, H, K] / [H, K]
        for i, part in enumerate("qkv"):
          x_i = x[:, i] if names[-1] == "kernel" else x[i]
          w_i = as_weights({"m": {part: {names[-1]: x_i}}})["m"][part]
          functools.reduce(lambda d, k: d.setdefault(k, {}), names[:-2] + (part,), out).update(w_i)
        continue
      node = functools.reduce(lambda d, k: d.setdefault(k, {}), names[:-1], out)
      if names[-1] == "kernel":
        r = param_paths.XLT.row_axes(names, x.shape)
        node["weight"] = jnp.transpose(x, r + tuple(a for a in range(x.ndim) if a not in r))
        np.testing.assert_array_equal(rows(names[:-1] + ("weight",), node["weight"]), rows(names, x))
      else:
        node[names[-1]] = x
    return out

  params_w = as_weights(params)
  shapes_w = jax.eval_shape(lambda: model.init_params(cfg_w, jax.random.key(0)))
  assert jax.tree.map(np.shape, params_w) == jax.tree.map(lambda s: s.shape, shapes_w)
  axes, axes_w = model.logical_axes(cfg), model.logical_axes(cfg_w)
  mlp = "up" if family != "gpt2" else "fc"
  assert tuple(axes_w["block_0"]["mlp"][mlp]["weight"]) == tuple(axes["block_0"]["mlp"][mlp]["kernel"])[::-1]
  assert tuple(axes_w["block_0"]["attn"]["proj"]["weight"]) == ("embed", "heads", "kv")
  tokens = jax.random.randint(jax.random.key(3), (2, 16), 0, 37)
  apply = compiled(model.apply)
  np.testing.assert_allclose(apply(cfg_w, params_w, tokens)[0], apply(cfg, params, tokens)[0], rtol=1e-5, atol=1e-6)
  grad = jax.jit(jax.grad(lambda c, p: model.apply(c, p, tokens)[0].std(), 1), static_argnums=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grad(cfg_w, params_w), as_weights(grad(cfg, params)))


@pytest.mark.parametrize("pos_embedding, tie, layout", [("learned", False, "kernel"), ("rope", True, "kernel"),
                                                         ("rope", False, "weight")])
def test_every_product_of_a_training_step_contracts_its_left_operands_last_axis(pos_embedding, tie, layout):
  """On XLA:CPU a product contracting another axis of its left operand runs outside the fast
  (YNNPACK) kernels at about half speed (benchmarks/matmul.py). Autodiff writes the dense
  layers' weight gradients and the attention's key and value gradients so; xlt's own
  backward passes (xlt.matmul) write none."""
  cfg = model.Config(vocab_size=11, block_size=16, num_layers=2, num_heads=2, d_model=16,
                     pos_embedding=pos_embedding, tie_embeddings=tie, dense_layout=layout)
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(3), (2, 16), 0, 11)
  hlo = jax.jit(jax.grad(lambda p: model.apply(cfg, p, tokens)[0].std())).lower(params).compile().as_text()
  products = [line for line in hlo.splitlines() if " dot(" in line]
  assert len(products) >= 2 * 3 * 6  # per layer 4 dense layers and 2 attention products, 3 each
  for line in products:
    batch = re.search(r"lhs_batch_dims=\{([\d,]*)\}", line)
    last = len(batch.group(1).split(",")) + 1 if batch else 1  # every operand here is [batch..., rows, cols]
    assert f"lhs_contracting_dims={{{last}}}" in line, line
