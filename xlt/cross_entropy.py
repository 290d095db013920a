"""Token cross-entropy whose backward pass keeps only the logits in their compute dtype.

The model returns float32 logits (the head's bf16 product cast up). Differentiated as written,
`logsumexp` keeps `exp(logits - max)` for its backward pass: on a 1B Llama step on a GPU
(batch 8 x 2048, a 128k vocabulary) XLA wrote that float32 tensor, a float32 gradient and its
bf16 cast, 8.4 GB each, about 11 ms of a 240 ms step (benchmarks/gpu_check.py's trace).
`tokens` computes the same loss with a custom VJP whose only large residual is the logits cast
back to the compute dtype, which is lossless (they were computed in it) and which XLA folds
into the head's own output, and whose gradient is one fused pass. Its steps are autodiff's of
optax's formula, so on CPU the loss and its gradient equal optax's bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cross_entropy(logits_BxTxV, labels_BxT, residual_dtype):
  return _forward(logits_BxTxV, labels_BxT, residual_dtype)[0]


def _forward(logits_BxTxV, labels_BxT, residual_dtype):
  # jax.nn.logsumexp's own steps, so that the value and the gradient below are autodiff's of
  # optax's formula bit for bit (tests/test_cross_entropy.py)
  max_BxTx1 = jnp.max(logits_BxTxV, axis=-1, keepdims=True, initial=-jnp.inf)
  max_BxTx1 = lax.select(jnp.isfinite(max_BxTx1), max_BxTx1, lax.full_like(max_BxTx1, 0))
  sum_BxTx1 = jnp.abs(jnp.sum(jnp.exp(logits_BxTxV - max_BxTx1), axis=-1, keepdims=True))
  lse_BxT = (jnp.log(sum_BxTx1) + max_BxTx1)[..., 0]
  label_BxT = jnp.take_along_axis(logits_BxTxV, labels_BxT[..., None], axis=-1)[..., 0]
  return lse_BxT - label_BxT, (logits_BxTxV.astype(residual_dtype), labels_BxT, max_BxTx1, sum_BxTx1)


def _backward(residual_dtype, res, g_BxT):
  del residual_dtype
  logits_BxTxV, labels_BxT, max_BxTx1, sum_BxTx1 = res
  exp_BxTxV = jnp.exp(logits_BxTxV.astype(max_BxTx1.dtype) - max_BxTx1)
  onehot_BxTxV = jax.nn.one_hot(labels_BxT, exp_BxTxV.shape[-1], dtype=exp_BxTxV.dtype)
  return exp_BxTxV * (g_BxT[..., None] / sum_BxTx1) - onehot_BxTxV * g_BxT[..., None], None


_cross_entropy.defvjp(_forward, _backward)


def tokens(logits_BxTxV, labels_BxT, residual_dtype):
  """Cross-entropy of each position [B, T]: float logits [B, T, V], integer labels [B, T]; optax's
  `softmax_cross_entropy_with_integer_labels`, its backward pass keeping the logits cast to
  `residual_dtype` (lossless only if every logit is representable in it: the compute dtype of a
  head without a soft cap, `residual_dtype(cfg)`)."""
  return _cross_entropy(logits_BxTxV, labels_BxT, jnp.dtype(residual_dtype))


def residual_dtype(cfg):
  """The dtype `tokens` keeps the logits of `cfg`'s model in: its compute dtype, in which its
  head computed them, or float32 past a soft cap (Gemma 2: the logits' tanh is float32)."""
  return "float32" if cfg.final_logit_softcap else cfg.dtype
