"""Token cross-entropy whose backward pass keeps only the logits in their compute dtype.

The model returns float32 logits (the head's bf16 product cast up). Differentiated as written,
`logsumexp` keeps `exp(logits - max)` for its backward pass: on a 1B Llama step on a GPU
(batch 8 x 2048, a 128k vocabulary) XLA wrote that float32 tensor, a float32 gradient and its
bf16 cast, 8.4 GB each, about 11 ms of a 240 ms step (benchmarks/gpu_check.py's trace).
`tokens` computes the same loss with a custom VJP whose only large residual is the logits cast
back to the compute dtype, which is lossless (they were computed in it) and which XLA folds
into the head's own output, and whose gradient `softmax - one_hot` is one fused pass.

On CPU xlt keeps optax's formula: every CPU result in results/ was computed with it, and the
custom formula rounds the gradient differently (`exp(l - lse)` against `exp(l - max) / sum`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cross_entropy(logits_BxTxV, labels_BxT, residual_dtype):
  return _forward(logits_BxTxV, labels_BxT, residual_dtype)[0]


def _forward(logits_BxTxV, labels_BxT, residual_dtype):
  lse_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  label_BxT = jnp.take_along_axis(logits_BxTxV, labels_BxT[..., None], axis=-1)[..., 0]
  return lse_BxT - label_BxT, (logits_BxTxV.astype(residual_dtype), labels_BxT, lse_BxT)


def _backward(residual_dtype, res, g_BxT):
  del residual_dtype
  logits_BxTxV, labels_BxT, lse_BxT = res
  p_BxTxV = jnp.exp(logits_BxTxV.astype(lse_BxT.dtype) - lse_BxT[..., None])
  onehot_BxTxV = jax.nn.one_hot(labels_BxT, p_BxTxV.shape[-1], dtype=p_BxTxV.dtype)
  return (p_BxTxV - onehot_BxTxV) * g_BxT[..., None], None


_cross_entropy.defvjp(_forward, _backward)


def tokens(logits_BxTxV, labels_BxT, residual_dtype=None):
  """Cross-entropy of each position [B, T]: float logits [B, T, V], integer labels [B, T].
  `residual_dtype` None: optax's `softmax_cross_entropy_with_integer_labels`; a dtype: the same
  loss, its backward pass keeping the logits cast to that dtype (lossless only if every logit
  is representable in it: the compute dtype of a head without a soft cap)."""
  if residual_dtype is None:
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, labels_BxT)
  return _cross_entropy(logits_BxTxV, labels_BxT, jnp.dtype(residual_dtype))


def residual_dtype(cfg):
  """The dtype `tokens` keeps the logits in for `cfg`'s model on this backend (None: optax's
  formula, kept on CPU). A soft-capped head (Gemma 2) has float32 logits past its tanh."""
  if jax.default_backend() == "cpu":
    return None
  return "float32" if cfg.final_logit_softcap else cfg.dtype
