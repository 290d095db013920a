"""The model's products, with backward passes that XLA:CPU runs in its fast kernels.

XLA:CPU runs a product that contracts any axis of its left operand but the last outside its
fast (YNNPACK) kernels, at about half their speed. Autodiff writes exactly such products for
a dense layer's weight gradient (x^T dy, contracting the tokens) and for the attention's key
and value gradients (contracting the query positions). `python benchmarks/matmul.py jax`, its
"weight gradient" lines, measure the two forms side by side.

Here those gradients transpose the smaller of their two operands into a copy behind
optimization barriers (`_transposed_product`), so that XLA cannot fold the transpose back
into the product, which is then a plain one. The forward passes and the other gradients are
the plain products, except the attention's value product: XLA ran it in the slow form too when
written token-major, so it runs head-major behind a barrier (but in a decoding step, where the
plain product is fast). On other platforms every function here is the plain product: their
matmul libraries take transposed operands at full speed.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


def _on_cpu() -> bool:
  return jax.default_backend() == "cpu"


def _transposed_product(x_MxK, dy_MxN, precision=None):
  """x^T dy contracting axis -2 of both (leading axes are batch axes), the smaller operand
  transposed into a copy: materialised first (else XLA recomputes its producer, e.g. the
  GELU, inside a slow transposing loop) and behind barriers."""
  barrier = jax.lax.optimization_barrier
  if x_MxK.shape[-1] <= dy_MxN.shape[-1]:
    return jnp.matmul(barrier(barrier(x_MxK).mT), dy_MxN, precision=precision)
  return barrier(jnp.matmul(barrier(barrier(dy_MxN).mT), x_MxK, precision=precision)).mT


def dense(x, w, dimension_numbers, precision=None, preferred_element_type=None):
  """`lax.dot_general` for a dense layer (x's last n axes against w's first n; flax's
  `dot_general` argument), its weight gradient by `_transposed_product` on CPU."""
  (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
  n = len(lhs_c)
  is_dense = (not lhs_b and not rhs_b and tuple(lhs_c) == tuple(range(x.ndim - n, x.ndim))
              and tuple(rhs_c) == tuple(range(n)))
  if not is_dense or preferred_element_type is not None or not _on_cpu():
    return jax.lax.dot_general(x, w, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  return _dense(x, w, n, precision)


def product(x, w):
  """x [..., in] @ w [in, out] as a dense layer (`dense`): a product written outside a flax
  layer that should get the dense layers' backward pass."""
  return dense(x, w, (((x.ndim - 1,), (0,)), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dense(x, w, n, precision):
  dims = ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ()))
  return jax.lax.dot_general(x, w, dims, precision=precision)


def _dense_bwd(n, precision, residuals, dy):
  x, w = residuals
  k = math.prod(w.shape[:n])
  x_MxK, w_KxN = x.reshape(-1, k), w.reshape(k, -1)
  dy_MxN = dy.reshape(x_MxK.shape[0], w_KxN.shape[1])
  dx = jnp.dot(dy_MxN, w_KxN.T, precision=precision).reshape(x.shape)
  dw = _transposed_product(x_MxK, dy_MxN, precision).reshape(w.shape)
  return dx.astype(x.dtype), dw.astype(w.dtype)


_dense.defvjp(lambda x, w, n, precision: (_dense(x, w, n, precision), (x, w)), _dense_bwd)


def dense_t(x, w, n: int, precision=None):
  """x's last n axes against w's last n: a dense layer whose weight is stored [out..., in...]
  as torch's Linear holds it (xlt.layers.Linear), its weight gradient dy^T x by
  `_transposed_product` on CPU, its input gradient dy @ w a plain product."""
  return _dense_t(x, w, n, precision) if _on_cpu() else _product_t(x, w, n, precision)


def _product_t(x, w, n, precision):
  dims = ((tuple(range(x.ndim - n, x.ndim)), tuple(range(w.ndim - n, w.ndim))), ((), ()))
  return jax.lax.dot_general(x, w, dims, precision=precision)


_dense_t = functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))(_product_t)


def _dense_t_bwd(n, precision, residuals, dy):
  x, w = residuals
  k = math.prod(w.shape[w.ndim - n:])
  x_MxK, w_NxK = x.reshape(-1, k), w.reshape(-1, k)
  dy_MxN = dy.reshape(x_MxK.shape[0], w_NxK.shape[0])
  dx = jnp.dot(dy_MxN, w_NxK, precision=precision).reshape(x.shape)
  dw = _transposed_product(dy_MxN, x_MxK, precision).reshape(w.shape)
  return dx.astype(x.dtype), dw.astype(w.dtype)


_dense_t.defvjp(lambda x, w, n, precision: (_dense_t(x, w, n, precision), (x, w)), _dense_t_bwd)


def mask_bias(mask_TxS):
  """0 where attended, -1e30 where masked, added to the scores. On CPU behind a barrier: XLA
  folds a constant bias back into a select, a pass of its own over the [B, H, T, S] scores;
  as an operand, the add, the row max and the exp fuse into the scores' product
  (`python benchmarks/attention.py` measures both; docs/speed.md)."""
  bias_TxS = jnp.where(mask_TxS, 0.0, -1e30).astype(jnp.float32)
  return jax.lax.optimization_barrier(bias_TxS) if _on_cpu() else bias_TxS


def causal_query_chunks(t: int) -> int:
  """Into how many chunks of query positions a causal self-attention over t positions is cut
  (xlt.model.causal_attention): chunk i attends only to the keys up to its last query, so the
  scores above the diagonal that the mask would zero are never computed. On CPU
  floor(sqrt(t / 32)), the fastest count `benchmarks/attention.py --seq 512` found (docs/speed.md);
  1 below 128 tokens, where the extra, smaller products cost more than the skipped scores
  save. Elsewhere 1: not measured on accelerators."""
  return max(1, math.isqrt(t // 32)) if _on_cpu() else 1


def _grouped(x_BxHxTxN, g: int):
  """[B, H, T, N] -> [B, G, R·T, N] (R = H / G): query head h = g·R + r becomes rows
  r·T .. r·T + T - 1 of key/value head g's block, a free reshape."""
  b, h, t, n = x_BxHxTxN.shape
  return x_BxHxTxN.reshape(b, g, (h // g) * t, n)


def attention_scores(q_BxHxTxK, k_BxGxSxK):
  """q.k per head: [B, H, T, S]. With fewer key/value heads G than query heads H
  (grouped-query attention; query head h reads key/value head h // (H / G)), each key/value
  head's queries are one product [R·T, K] x [K, S]: the keys are never repeated to H heads
  (transformers' repeat_kv), a copy whose gradient was a further reduction per layer, and the
  products are R times taller."""
  h, g = q_BxHxTxK.shape[1], k_BxGxSxK.shape[1]
  if g != h:
    b, _, t, _ = q_BxHxTxK.shape
    return attention_scores(_grouped(q_BxHxTxK, g), k_BxGxSxK).reshape(b, h, t, k_BxGxSxK.shape[2])
  if _on_cpu():
    return _scores(q_BxHxTxK, k_BxGxSxK)
  return jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxGxSxK)


def attention_values(p_BxHxTxS, v_BxGxSxK):
  """The weights' product with the values, token-major: [B, T, H, K]; grouped as
  `attention_scores` when there are fewer value heads G than weight heads H."""
  b, h, t, _ = p_BxHxTxS.shape
  g = v_BxGxSxK.shape[1]
  if g != h:
    p_BxGxRTxS = _grouped(p_BxHxTxS, g)
    if _on_cpu() and t > 1:  # head-major, as _values (below)
      out_BxGxRTxK = _values_head_major(p_BxGxRTxS, v_BxGxSxK)
    else:
      out_BxGxRTxK = jnp.einsum("bhts,bhsk->bhtk", p_BxGxRTxS, v_BxGxSxK)
    return out_BxGxRTxK.reshape(b, h, t, -1).transpose(0, 2, 1, 3)
  # one query position (a decoding step): the plain product, which XLA:CPU runs well there;
  # with _values's barrier, benchmarks/compare.py's decode job on one core took 31 and 40 ms
  # per new token where it had taken 13-14 (two rounds each, a noisy machine)
  if _on_cpu() and t > 1:
    return _values(p_BxHxTxS, v_BxGxSxK)
  return jnp.einsum("bhts,bhsk->bthk", p_BxHxTxS, v_BxGxSxK)


@jax.custom_vjp
def _scores(q_BxHxTxK, k_BxHxSxK):
  return jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxHxSxK)


def _scores_bwd(residuals, ds_BxHxTxS):
  q_BxHxTxK, k_BxHxSxK = residuals
  dq = jnp.einsum("bhts,bhsk->bhtk", ds_BxHxTxS, k_BxHxSxK)
  dk = _transposed_product(ds_BxHxTxS, q_BxHxTxK)  # ds^T q
  return dq.astype(q_BxHxTxK.dtype), dk.astype(k_BxHxSxK.dtype)


@jax.custom_vjp
def _values(p_BxHxTxS, v_BxHxSxK):
  # head-major, then transposed: written token-major, XLA:CPU ran this product outside its
  # fast kernels too
  out_BxHxTxK = jax.lax.optimization_barrier(jnp.einsum("bhts,bhsk->bhtk", p_BxHxTxS, v_BxHxSxK))
  return out_BxHxTxK.transpose(0, 2, 1, 3)


def _values_bwd(residuals, do_BxTxHxK):
  p_BxHxTxS, v_BxHxSxK = residuals
  do_BxHxTxK = do_BxTxHxK.transpose(0, 2, 1, 3)
  dp = jnp.einsum("bhtk,bhsk->bhts", do_BxHxTxK, v_BxHxSxK)
  dv = _transposed_product(p_BxHxTxS, do_BxHxTxK)  # p^T do
  return dp.astype(p_BxHxTxS.dtype), dv.astype(v_BxHxSxK.dtype)


@jax.custom_vjp
def _values_head_major(p_BxHxTxS, v_BxHxSxK):
  """`_values` without the final transpose (the grouped path reshapes first)."""
  return jax.lax.optimization_barrier(jnp.einsum("bhts,bhsk->bhtk", p_BxHxTxS, v_BxHxSxK))


def _values_head_major_bwd(residuals, do_BxHxTxK):
  p_BxHxTxS, v_BxHxSxK = residuals
  dp = jnp.einsum("bhtk,bhsk->bhts", do_BxHxTxK, v_BxHxSxK)
  dv = _transposed_product(p_BxHxTxS, do_BxHxTxK)  # p^T do
  return dp.astype(p_BxHxTxS.dtype), dv.astype(v_BxHxSxK.dtype)


_scores.defvjp(lambda q, k: (_scores(q, k), (q, k)), _scores_bwd)
_values.defvjp(lambda p, v: (_values(p, v), (p, v)), _values_bwd)
_values_head_major.defvjp(lambda p, v: (_values_head_major(p, v), (p, v)), _values_head_major_bwd)
