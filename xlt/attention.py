"""Which attention kernel computes a layer: per platform, or the one the config names
(`Config.attention`).

  xlt     xlt.layers.causal_attention: any mask, soft-capping, attention dropout, query chunks
          (tuned for XLA:CPU). "auto" on a CPU, and what every other choice falls back to.
  xla     jax.nn.dot_product_attention(implementation="xla"): the plain softmax, with an
          explicit mask (causal, sliding window, padding, decoding offsets).
  cudnn   jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's fused (flash)
          attention on a GPU, bf16/fp16 only; "auto" on a GPU (fp32 there takes "xla").
  splash  the Pallas splash attention kernel on a TPU (where this jax ships it): causal and
          sliding-window masks, soft-capping; sequences in blocks of 128. "auto" on a TPU.

A kernel that cannot compute what a layer asks falls back, with a one-line reason logged once:
soft-capping (but on splash) and attention dropout to xlt, cuDNN's other gaps (fp32, decoding
offsets, head widths) to xla, splash's (padding, decoding, lengths, a jax without it) to xlt.
Shape letters as in xlt.model.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "xlt")
SPLASH_BLOCK = 128  # splash's default block sizes: its sequences are multiples of this


@functools.cache
def splash_missing() -> str | None:
  """Why the splash kernel cannot be used with this jax (None: it can)."""
  try:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel  # noqa: F401
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask  # noqa: F401
  except ImportError as e:  # older or trimmed jax builds do not ship the TPU kernels
    return f"this jax has no splash attention ({e})"
  return None


def _cudnn_missing(dtype, decoding: bool, head_dim: int) -> str | None:
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    return f"cuDNN attention needs bf16/fp16, not {jnp.dtype(dtype)}"
  if decoding:  # its causal mask is aligned to the first key, not to the query's position
    return "cuDNN's causal mask does not take a decoding offset"
  if head_dim % 8 or head_dim > 128:
    return f"cuDNN needs a head width that is a multiple of 8 up to 128, not {head_dim}"
  return None


def _splash_missing(platform: str, padded: bool, decoding: bool, seq: int) -> str | None:
  if platform != "tpu":
    return f"splash attention is a TPU kernel (platform {platform})"
  if padded or decoding:
    return "splash attention here takes neither padding masks nor decoding offsets"
  if seq % SPLASH_BLOCK:
    return f"splash attention needs a sequence length that is a multiple of {SPLASH_BLOCK}, not {seq}"
  return splash_missing()


def choose(requested: str, platform: str, *, dtype="float32", softcap=None, dropout: bool = False,
           padded: bool = False, decoding: bool = False, head_dim: int = 64, seq: int = 128) -> tuple[str, str | None]:
  """(implementation, why it is not the one requested, or None) for a layer on `platform`
  ("cpu", "gpu"/"cuda"/"rocm", "tpu"). `dropout`: the attention weights are dropped
  (training with dropout), which only xlt's attention does; `padded`: a left-padded batch;
  `decoding`: queries after position 0 (a KV cache)."""
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f"model.attention must be one of {', '.join(IMPLEMENTATIONS)}, got {requested!r}")
  platform = "gpu" if platform in ("cuda", "rocm") else platform
  if requested == "auto":
    requested = {"gpu": "cudnn", "tpu": "splash"}.get(platform, "xlt")
  if requested == "xlt":
    return "xlt", None
  if dropout:
    return "xlt", f"{requested} attention has no attention dropout"
  if requested == "splash":
    why = _splash_missing(platform, padded, decoding, seq)
    return ("xlt", why) if why else ("splash", None)
  if requested == "cudnn" and platform != "gpu":
    return "xlt", f"cuDNN attention needs a GPU (platform {platform})"
  if softcap:
    return "xlt", f"{requested} attention has no soft-capping"
  if requested == "cudnn":  # what cuDNN lacks, XLA's attention on the GPU does
    why = _cudnn_missing(dtype, decoding, head_dim)
    return ("xla", why) if why else ("cudnn", None)
  return "xla", None


@functools.cache
def log_fallback(requested: str, chosen: str, why: str):
  """One line per distinct fallback (layers and retraces repeat them)."""
  logging.warning("attention=%s: using %s, %s", requested, chosen, why)


def attend(impl: str, q_BxHxTxK, k_BxGxSxK, v_BxGxSxK, mask, *, scale: float, window: int = 0, softcap=None,
           interpret: bool = False):
  """Attention of head-major queries [B, H, T, K] over keys/values [B, G, S, K] (G divides H:
  query head h reads key/value head h // (H / G)) with `impl` ("xla", "cudnn", "splash"):
  out [B, T, H, K]. `mask` (True: attend) is [T, S] or [B, 1, T, S], the model's causal,
  window and padding mask; cuDNN and splash build the causal/window mask themselves from
  `window` (0: none) where the batch has no padding (a [T, S] mask). `interpret`: run the
  splash kernel in Pallas' interpreter (tests on a CPU)."""
  if impl == "splash":
    return _splash(q_BxHxTxK * scale, k_BxGxSxK, v_BxGxSxK, window, softcap, interpret)
  q, k, v = (x.transpose(0, 2, 1, 3) for x in (q_BxHxTxK, k_BxGxSxK, v_BxGxSxK))  # jax.nn's [B, T, N, K]
  if impl == "cudnn" and mask.ndim == 2:  # no padding: cuDNN's own causal / sliding-window mask
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation="cudnn",
                                        local_window_size=(window - 1, 0) if window else None)
  mask = mask[None, None] if mask.ndim == 2 else mask
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation=impl)


def _splash(q_BxHxTxK, k_BxGxSxK, v_BxGxSxK, window: int, softcap, interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

  h, t, s = q_BxHxTxK.shape[1], q_BxHxTxK.shape[2], k_BxGxSxK.shape[2]
  one = mask_lib.LocalMask((t, s), (window - 1, 0), 0) if window else mask_lib.CausalMask((t, s))
  kernel = kernel_lib.make_splash_mha(mask_lib.MultiHeadMask([one] * h), head_shards=1, q_seq_shards=1,
                                      attn_logits_soft_cap=softcap, interpret=interpret)
  g = k_BxGxSxK.shape[1]
  # key/value heads repeated to the query heads (as transformers' repeat_kv)
  k_BxHxSxK, v_BxHxSxK = (jnp.repeat(x, h // g, axis=1) for x in (k_BxGxSxK, v_BxGxSxK))
  out_BxHxTxK = jax.vmap(kernel)(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK)
  return out_BxHxTxK.transpose(0, 2, 1, 3).astype(q_BxHxTxK.dtype)
