"""The decoder's building blocks (xlt.model assembles them): dropout, rotary embeddings,
causal attention, the activations, norms and MLPs.

Besides GPT-2's choices (LayerNorm, GELU MLP) they cover what Hugging Face decoders compute
(docs/families.md lists the facts; each is summarised where it is used): RMSNorm and Gemma's
(1 + w) RMSNorm, gated MLPs (SwiGLU, tanh-GeGLU), llama3 rope scaling, soft-capped scores.
Functions take the model's Config (duck-typed: this module does not import xlt.model).

Shape letters as in xlt.model.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xlt import matmul


DROPOUT_BITS = 16  # random bits per entry of a dropout mask (xlt.model.dropout)


def init(axes, std=0.02):
  return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


def zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dropout(key, x, rate: float):
  """Zeroes each entry of `x` with probability `rate` (rounded to a multiple of 2^-16) and
  scales the rest by 1 / (1 - that rate), so the expectation is `x`.

  Why not flax's nn.Dropout: it draws a float32 uniform per entry from the partitionable
  threefry, which hashes once per entry; 16 bits per entry from the non-partitionable threefry
  (two 32-bit words per hash) is a quarter of the hashes: on CPU a graph-config step with
  flax's masks took 1.35x a dropout-free one, with these 1.20x (benchmarks/dropout.py). The
  mask depends only on the key and x's shape, so it is the same however x is sharded."""
  threshold = round(rate * 2**DROPOUT_BITS)
  keep = 1.0 - threshold / 2**DROPOUT_BITS
  with jax.threefry_partitionable(False):  # read when traced: scoped to this draw
    bits = jax.random.bits(key, x.shape, jnp.dtype(f"uint{DROPOUT_BITS}"))
  return jnp.where(bits >= threshold, x / keep, 0).astype(x.dtype)


def module_dropout(module: nn.Module, cfg, x):
  """Dropout of `x` when `cfg.dropout` > 0 and the call was given a "dropout" rng (training:
  xlt.train); otherwise `x` itself, so evaluation and dropout-free models are unchanged."""
  if cfg.dropout == 0.0 or not module.has_rng("dropout"):
    return x
  return dropout(module.make_rng("dropout"), x, cfg.dropout)


def llama3_freqs(head_dim: int, base: float, scaling: dict) -> np.ndarray:
  """Llama 3's rope frequencies (transformers' `_compute_llama3_parameters`, in float32 as
  there): wavelengths below original_max_position_embeddings / high_freq_factor keep their
  frequency, those above original / low_freq_factor are divided by `factor`, and the band
  between interpolates. Static: independent of the sequence length."""
  f32 = np.float32
  inv = (f32(1.0) / (f32(base) ** (np.arange(0, head_dim, 2).astype(f32) / f32(head_dim)))).astype(f32)
  factor, low, high = (f32(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
  old = f32(scaling["original_max_position_embeddings"])
  wavelen = f32(2 * math.pi) / inv
  out = np.where(wavelen > old / low, inv / factor, inv)
  smooth = (old / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * out / factor + smooth * out
  medium = ~(wavelen < old / high) & ~(wavelen > old / low)
  return np.where(medium, smoothed, out).astype(f32)


def rope(x_BxTxHxK, pos_T, base: float, scaling: dict | None = None):
  """Rotates each (first half, second half) pair of head features by position x frequency
  (GPT-NeoX / LitGPT layout, and transformers' rotate_half: feature i pairs with i + K/2), so
  q.k depends on positions only through their offset. `scaling` (rope_type llama3) changes
  the frequencies only. `pos_T` is one position per query, shared by the rows, or [B, T]:
  each row's own (left-padded batches, whose rows start at different offsets)."""
  half = x_BxTxHxK.shape[-1] // 2
  if scaling:
    freq = jnp.asarray(llama3_freqs(2 * half, base, scaling))
  else:
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if pos_T.ndim == 2:
    angle_BxTxK = pos_T[:, :, None].astype(jnp.float32) * freq[None, None, :]
    cos, sin = jnp.cos(angle_BxTxK)[:, :, None, :], jnp.sin(angle_BxTxK)[:, :, None, :]
  else:
    angle_TxK = pos_T[:, None].astype(jnp.float32) * freq[None, :]
    cos, sin = jnp.cos(angle_TxK)[None, :, None, :], jnp.sin(angle_TxK)[None, :, None, :]
  # split (whose gradient is a concatenate), not two slices (whose gradients are zero-padded
  # full-width copies added up)
  x1, x2 = (x.astype(jnp.float32) for x in jnp.split(x_BxTxHxK, 2, axis=-1))
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_BxTxHxK.dtype)


def causal_attention(q_BxHxTxK, k_BxGxSxK, v_BxGxSxK, mask_TxS, drop=lambda p: p, query_chunks=1, softcap=None):
  """softmax(q.k + mask) @ v, normalised after the value product (flash attention's order):
  the division then touches [B, H, T, K] instead of [B, H, T, S], and the row maximum is
  outside the gradient (softmax does not depend on it), so the backward pass has no
  reduce_max to differentiate. On XLA:CPU every pass over the [B, H, T, S] scores costs
  about as much as a matmul; this order makes three fewer of them per layer and step.

  `query_chunks` > 1 (self-attention from position 0, so that the mask is lower-triangular)
  cuts the queries into that many chunks, each attending to the keys up to its last
  position: the same values, without the masked scores above the diagonal
  (xlt.matmul.causal_query_chunks says how many pay). `softcap` (Gemma 2) replaces the
  scores s by tanh(s / cap) * cap before the mask is added. The mask is [T, S], shared by
  the rows, or [B, 1, T, S]: each row's own (padding masked too). Keys and values may have
  fewer heads G than the queries H (grouped-query attention: query head h reads key/value
  head h // (H / G)); they are not repeated (xlt.matmul.attention_scores)."""
  k_BxHxSxK, v_BxHxSxK = k_BxGxSxK, v_BxGxSxK  # (H = G in the names below: either count works)
  t = q_BxHxTxK.shape[2]
  if query_chunks > 1:
    if k_BxHxSxK.shape[2] != t:
      raise ValueError(f"query_chunks={query_chunks} needs self-attention from position 0 (as many keys as "
                       f"queries); got {t} queries and {k_BxHxSxK.shape[2]} keys")
    bounds = [round(t * i / query_chunks) for i in range(query_chunks + 1)]
    return jnp.concatenate(
        [_attention(q_BxHxTxK[:, :, lo:hi], k_BxHxSxK[:, :, :hi], v_BxHxSxK[:, :, :hi], mask_TxS[..., lo:hi, :hi], drop,
                    softcap)
         for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo], axis=1)
  return _attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop, softcap)


def _attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop, softcap=None):
  if (q_BxHxTxK.shape[2] == 1 and k_BxHxSxK.shape[1] != q_BxHxTxK.shape[1]
      and jax.default_backend() == "cpu"):
    return _one_query_grouped(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop, softcap)
  dt = q_BxHxTxK.dtype
  p_BxHxTxS = _unnormalised_weights(matmul.attention_scores(q_BxHxTxK, k_BxHxSxK), mask_TxS, softcap)
  # >= 1: the diagonal is unmasked (or, for a padding query that may see no real key, every
  # score is -1e30 and each exp 1: finite, unused values)
  sum_BxTxHx1 = p_BxHxTxS.sum(-1).transpose(0, 2, 1)[..., None]
  # `drop` (dropout of the attention weights) after the sum: the normalised weights are dropped
  out_BxTxHxK = matmul.attention_values(drop(p_BxHxTxS).astype(dt), v_BxHxSxK)
  return (out_BxTxHxK.astype(jnp.float32) / sum_BxTxHx1).astype(dt)


def _unnormalised_weights(att_BxHxTxS, mask_TxS, softcap=None):
  """exp(scores - row max) in float32, the soft-cap (Gemma 2) and the mask applied: the attention
  weights before their division by the row sum, in whatever layout the scores come."""
  att_BxHxTxS = att_BxHxTxS.astype(jnp.float32)
  if softcap:
    att_BxHxTxS = jnp.tanh(att_BxHxTxS / softcap) * softcap
  # the mask as an added bias (xlt.matmul.mask_bias): masked entries become exp(-1e30) = 0
  att_BxHxTxS = att_BxHxTxS + matmul.mask_bias(mask_TxS)
  return jnp.exp(att_BxHxTxS - jax.lax.stop_gradient(att_BxHxTxS.max(-1, keepdims=True)))


def _one_query_grouped(q_BxHx1xK, k_BxGxSxK, v_BxGxSxK, mask_TxS, drop, softcap=None):
  """`_attention` of one query per row against fewer key/value heads G than query heads H, on a
  CPU (a decoding step of a Llama-like model): the same ops, in the grouped layout [B, G, R, S]
  from the scores' product to the values' (query head h = g·R + r). With the scores reshaped
  to [B, H, 1, S] between them, XLA:CPU fused the product with the softmax in a form that read
  a large KV cache several times slower (benchmarks/decode_attention.py)."""
  dt = q_BxHx1xK.dtype
  b, h, _, d = q_BxHx1xK.shape
  g, s = k_BxGxSxK.shape[1], k_BxGxSxK.shape[2]
  att_BxGxRxS = matmul.attention_scores(q_BxHx1xK.reshape(b, g, h // g, d), k_BxGxSxK)
  p_BxGxRxS = _unnormalised_weights(att_BxGxRxS, mask_TxS, softcap)  # mask [T, S] or [B, 1, T, S], T = 1
  sum_Bx1xHx1 = p_BxGxRxS.sum(-1).reshape(b, 1, h, 1)
  p_BxGxRxS = drop(p_BxGxRxS.reshape(b, h, 1, s)).astype(dt).reshape(b, g, h // g, s)
  out_BxGxRxK = jnp.einsum("bgrs,bgsk->bgrk", p_BxGxRxS, v_BxGxSxK)  # as matmul.attention_values
  return (out_BxGxRxK.reshape(b, 1, h, d).astype(jnp.float32) / sum_Bx1xHx1).astype(dt)


_GELU_C = (2 / jnp.pi) ** 0.5


@jax.custom_jvp
def gelu(x):
  """GELU, tanh approximation (GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`; flax's
  `nn.gelu` default), with its derivative written out: autodiff of the formula sums two paths
  through x (x * (1 + tanh(u(x)))), which XLA:CPU ran as a separate pass over the [B, T, F]
  activations in every backward step; one expression fuses into the product with the
  incoming gradient."""
  return 0.5 * x * (1 + jnp.tanh(_GELU_C * (x + 0.044715 * x ** 3)))


@gelu.defjvp
def _gelu_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  t = jnp.tanh(_GELU_C * (x + 0.044715 * x ** 3))
  slope = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * x * x)
  return 0.5 * x * (1 + t), slope * dx


@jax.custom_jvp
def silu(x):
  """SiLU (x · sigmoid(x), jax.nn.silu's value), with its derivative written out, as `gelu`'s:
  one expression of x that fuses into the product with the incoming gradient, where autodiff
  of the product kept sigmoid(x) and x apart (SwiGLU's backward pass over [B, T, F])."""
  return x * jax.nn.sigmoid(x)


@silu.defjvp
def _silu_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  s = jax.nn.sigmoid(x)
  return x * s, s * (1 + x * (1 - s)) * dx


class RMSNorm(nn.Module):
  """x / rms(x) * w, in float32 (transformers' LlamaRMSNorm: eps inside the root, the weight
  applied after casting back), or with `plus_one` Gemma's x / rms(x) * (1 + w), whose weight
  starts at 0 and multiplies before the cast."""

  eps: float
  plus_one: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    init_fn = nn.initializers.zeros_init() if self.plus_one else nn.initializers.ones_init()
    scale = self.param("scale", nn.with_logical_partitioning(init_fn, ("norm",)), (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.plus_one:
      return (y * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)
    return y.astype(self.dtype) * scale.astype(self.dtype)


def norm(cfg, name: str):
  """The config's norm: GPT-2's LayerNorm (scale and bias), RMSNorm or Gemma's (1 + w)."""
  dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
  if cfg.norm == "layernorm":
    return nn.LayerNorm(
        epsilon=cfg.ln_eps, name=name, dtype=dt, param_dtype=pdt,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
        bias_init=zeros(("norm",)))
  return RMSNorm(cfg.ln_eps, cfg.norm == "rmsnorm_plus_one", dt, pdt, name=name)


def dense(cfg, features, name: str, axes, *, std=0.02, use_bias=None, axis=-1):
  """A dense layer with xlt's matmul, initialisers and logical axes `axes` (given inputs first;
  the bias takes the output ones). `use_bias` None follows `cfg.bias`. Its weight is laid out
  as `cfg.dense_layout` says: "kernel", flax's DenseGeneral [in..., out...], or "weight",
  torch's Linear [out..., in...] (`Linear`)."""
  num_in = len(axis) if isinstance(axis, tuple) else 1
  use_bias = cfg.bias if use_bias is None else use_bias
  dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
  if cfg.dense_layout == "weight":
    out_axes = axes[num_in:]
    return Linear(tuple(features) if isinstance(features, tuple) else (features,), num_in, out_axes + axes[:num_in],
                  std, use_bias, dt, pdt, name=name)
  return nn.DenseGeneral(
      features, axis=axis, name=name, dtype=dt, param_dtype=pdt, use_bias=use_bias, dot_general=matmul.dense,
      kernel_init=init(axes, std), bias_init=zeros(axes[num_in:]))


class Linear(nn.Module):
  """A dense layer over x's last `num_in` axes whose weight is [out..., in...], torch's Linear
  layout: a Hugging Face checkpoint's weights are then the parameters as stored (a view of
  the file, no transpose on load or save). `axes`: the weight's logical axes, outputs first."""

  features: tuple[int, ...]
  num_in: int
  axes: tuple
  std: float
  use_bias: bool
  dtype: jnp.dtype
  param_dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    n, out = self.num_in, len(self.features)
    w = self.param("weight", init(self.axes, self.std), self.features + x.shape[x.ndim - n:], self.param_dtype)
    bias = self.param("bias", zeros(self.axes[:out]), self.features, self.param_dtype) if self.use_bias else None
    x, w, bias = nn.dtypes.promote_dtype(x, w, bias, dtype=self.dtype)
    y = matmul.dense_t(x, w, n)
    return y if bias is None else y + bias


class DenseParams(nn.Module):
  """A dense layer's parameters as `dense` declares them (the same names, shapes, initialisers
  and logical axes) without its product: `fused_dense` computes several such layers at once.
  Called with the input width; returns (weight as stored, bias or None)."""

  cfg: object
  features: tuple
  axes: tuple  # inputs first, as `dense` takes them
  use_bias: bool | None = None

  @nn.compact
  def __call__(self, d_in: int):
    c = self.cfg
    pdt = jnp.dtype(c.param_dtype)
    if c.dense_layout == "weight":
      w = self.param("weight", init(self.axes[1:] + self.axes[:1]), self.features + (d_in,), pdt)
    else:
      w = self.param("kernel", init(self.axes), (d_in,) + self.features, pdt)
    use_bias = c.bias if self.use_bias is None else self.use_bias
    return w, self.param("bias", zeros(self.axes[1:]), self.features, pdt) if use_bias else None


def fused_dense(cfg, x, specs):
  """Dense layers that read the same input x [..., D] computed as one product, each layer's
  parameters its own (`DenseParams`, concatenated where used): specs ((name, features, axes,
  use_bias), ...) as `dense` takes them; returns each layer's output. One wide product in
  place of several narrow ones, and its input gradient one product where the separate layers'
  were one each and their sum (GQA's narrow key and value products ran the GPU's matrix units
  below the rest). The separate layers' values to float rounding."""
  dt, d = jnp.dtype(cfg.dtype), x.shape[-1]
  params = [DenseParams(cfg, tuple(f), axes, bias, name=name)(d) for name, f, axes, bias in specs]
  widths = [math.prod(f) for _, f, _, _ in specs]
  x = x.astype(dt)
  if cfg.dense_layout == "weight":
    y = matmul.dense_t(x, jnp.concatenate([w.reshape(n, d).astype(dt) for (w, _), n in zip(params, widths)]), 1)
  else:
    y = matmul.product(x, jnp.concatenate([w.reshape(d, n).astype(dt) for (w, _), n in zip(params, widths)], 1))
  outs = jnp.split(y, np.cumsum(widths)[:-1], axis=-1)
  return [o.reshape(x.shape[:-1] + tuple(f)) + (0 if b is None else b.astype(dt))
          for o, (_, b), (_, f, _, _) in zip(outs, params, specs)]


class Mlp(nn.Module):
  """GPT-2's fc -> GELU -> proj, or a gated MLP proj(act(gate(x)) * up(x)) with act SiLU
  (swiglu: Llama, Mistral, Qwen) or tanh-GELU (geglu: Gemma)."""

  cfg: object

  @nn.compact
  def __call__(self, x_BxTxD):
    c = self.cfg
    f = c.mlp_width
    # GPT-2: residual projections start smaller so the residual stream stays O(1).
    out_std = 0.02 / (2 * c.num_layers) ** 0.5
    if c.mlp == "gelu":
      x_BxTxF = gelu(dense(c, f, "fc", ("embed", "mlp"))(x_BxTxD))
    else:
      act = silu if c.mlp == "swiglu" else gelu
      if c.fused_projections:
        gate_BxTxF, up_BxTxF = fused_dense(c, x_BxTxD, [(n, (f,), ("embed", "mlp"), None) for n in ("gate", "up")])
      else:
        gate_BxTxF, up_BxTxF = (dense(c, f, n, ("embed", "mlp"))(x_BxTxD) for n in ("gate", "up"))
      x_BxTxF = act(gate_BxTxF) * up_BxTxF
    x_BxTxD = dense(c, c.d_model, "proj", ("mlp", "embed"), std=out_std)(x_BxTxF)
    return module_dropout(self, c, x_BxTxD)
