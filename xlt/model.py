"""A decoder in Flax: GPT-2 by default (pre-LayerNorm, causal attention, GELU MLP; learned
absolute positions or rotary embeddings), and by its options the Hugging Face decoders
xlt.pretrained loads (Llama 2/3, Mistral, Qwen2, Qwen3, Gemma, Gemma 2): RMSNorm, gated MLPs,
grouped-query attention, q/k norms, sliding windows, soft-capping (building blocks: xlt.layers).

Parameters are a plain nested dict whose paths name the block and the module kind:

  wte, wpe, ln_f, lm_head,
  block_{i}/{ln_1, attn/{qkv, proj}, ln_2, mlp/{fc, proj}}

so a parameter partition or a layer swap is a function of the path (`xlt.param_paths.path_info`).
(`wpe` exists only with `pos_embedding="learned"`; RoPE has no position parameters.) Other
options add or replace leaves with the same vocabulary: attn/{q, k, v} (separate kernels
when there are fewer key/value heads than query heads), attn/{q_norm, k_norm} (qk_norm),
mlp/{gate, up, proj} (gated MLPs), ln_1_post / ln_2_post (post_norms: Gemma 2 normalises each
branch's output before the residual add).
Every parameter carries logical axis names (`embed`, `heads`, `kv_heads`, `kv`, `mlp`,
`vocab`, ...); the config's sharding rules map them onto mesh axes (xlt.sharding).

Shape letters: B batch, T query positions, S key positions (cache length), D model
width, H heads, G key/value heads, K head width, V vocabulary, F MLP width.

How it runs, without changing the values: `Config.attention` picks the attention kernel per
platform (xlt.attention; on a CPU xlt's own), `Config.remat` recomputes each Block's
activations in the backward pass, and `dtype` (compute) may differ from `param_dtype` (bf16
matmuls over fp32 parameters, whose optimizer state follows them).

Left-padded batches (batched inference on prompts of different lengths): `apply`'s
`valid_BxT` marks the real tokens; each row's positions then count its real tokens only and
no query attends to padding (see `Padding`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P

from xlt import attention as attention_lib
from xlt import layers
from xlt import matmul
from xlt import param_paths
from xlt.sharding import BATCH, batch_ways
from xlt.layers import DROPOUT_BITS, causal_attention, dropout, gelu, rope  # noqa: F401 (xlt.model's API)

NORMS = ("layernorm", "rmsnorm", "rmsnorm_plus_one")
MLPS = ("gelu", "swiglu", "geglu")
DENSE_LAYOUTS = param_paths.DENSE_LEAVES  # Config.dense_layout, each the name of its dense leaves
# what a rematerialised Block keeps for the backward pass (jax.checkpoint policies)
REMAT_POLICIES = {"nothing": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int
  block_size: int = 128  # the longest sequence the position table covers
  num_layers: int = 6
  num_heads: int = 4
  d_model: int = 64
  mlp_ratio: int = 4
  tie_embeddings: bool = False
  dtype: str = "float32"  # compute dtype
  ln_eps: float = 1e-5  # every norm's epsilon
  # "learned": a GPT-2 position table (wpe). "rope": rotary embeddings on queries and keys
  # (LitGPT's default, the reference's addition model); attention then sees relative offsets,
  # which is what aligning digits of variable-length operands needs.
  pos_embedding: str = "learned"
  rope_base: float = 10000.0  # Hugging Face's rope_theta
  # Dropout (GPT-2's places: the embeddings, the attention weights, each residual branch's
  # output) while training; evaluation never drops. 0 builds no dropout at all.
  dropout: float = 0.0
  # ---- options for Hugging Face decoders (xlt.pretrained); the defaults are GPT-2's
  norm: str = "layernorm"  # or "rmsnorm" (Llama), "rmsnorm_plus_one" (Gemma's x * (1 + w))
  mlp: str = "gelu"  # or "swiglu" (Llama, Mistral, Qwen), "geglu" (Gemma, tanh-GELU)
  mlp_dim: int | None = None  # MLP width; None: mlp_ratio * d_model
  num_kv_heads: int | None = None  # key/value heads (GQA; 1 is MQA); None: num_heads
  head_dim: int | None = None  # None: d_model // num_heads
  bias: bool = True  # biases of the dense layers (and of LayerNorm, which always has one)
  qkv_bias: bool | None = None  # biases of q, k, v alone (Qwen2); None: as `bias`
  qk_norm: bool = False  # RMSNorm of each query and key head before RoPE (Qwen3)
  post_norms: bool = False  # norms of the attention and MLP outputs (Gemma 2)
  # llama3 scaling of the RoPE frequencies: ((key, value), ...) of transformers' rope_scaling
  # (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings); () = none
  rope_scaling: tuple = ()
  embed_scale: bool = False  # Gemma: embeddings times sqrt(d_model) (in the compute dtype)
  attn_logit_softcap: float | None = None  # Gemma 2: scores become tanh(s / cap) * cap
  final_logit_softcap: float | None = None  # Gemma 2: the same on the logits
  # Each query sees itself and the sliding_window - 1 positions before it (0: all earlier),
  # on the layers `sliding_layers` lists (None: every layer; Gemma 2: the even ones).
  sliding_window: int = 0
  sliding_layers: tuple[int, ...] | None = None
  query_pre_attn_scalar: float | None = None  # Gemma 2: scores scale by this ** -0.5, not head_dim's
  param_dtype: str = "float32"
  # Rows the embedding (and columns the head) has beyond vocab_size: ids no token has, added
  # so that a mesh's tensor axis divides the table (xlt.pretrained.load pads so, as MaxText
  # does); the logits are cut back to vocab_size, so nothing downstream sees them.
  vocab_padding: int = 0
  # How each dense layer holds its weight: "kernel", flax's [in..., out...] (xlt's own models,
  # GPT-2's Conv1D), or "weight", torch Linear's [out..., in...], the leaf then named "weight"
  # (the Hugging Face families but GPT-2: their files' tensors are the parameters as stored).
  # The same values either way, to float rounding of the weight gradients.
  dense_layout: str = "kernel"
  # ---- how it runs (the same values): the attention kernel (xlt.attention: "auto" is xlt's
  # own on a CPU, cuDNN on a GPU, splash on a TPU), and activation rematerialisation
  # ("block": each Block's activations are recomputed in the backward pass, keeping only what
  # `remat_policy` saves: "nothing", or "dots", the dense layers' outputs)
  attention: str = "auto"
  remat: str = "none"
  remat_policy: str = "nothing"
  # The dense layers that read one input (q, k, v; gate, up) computed as one product of their
  # weights concatenated where used (xlt.layers.fused_dense): the same parameters, the same
  # values to float rounding, on any mesh. Timed on one GPU only (docs/speed.md).
  fused_projections: bool = False

  def __post_init__(self):
    if isinstance(self.rope_scaling, dict) or (self.rope_scaling and isinstance(self.rope_scaling, list)):
      object.__setattr__(self, "rope_scaling", tuple(sorted(dict(self.rope_scaling).items())))
    if self.sliding_layers is not None:
      object.__setattr__(self, "sliding_layers", tuple(int(i) for i in self.sliding_layers))
    for f in ("vocab_size", "block_size", "num_layers", "num_heads", "d_model", "mlp_ratio"):
      if getattr(self, f) <= 0:
        raise ValueError(f"model.{f} must be positive, got {getattr(self, f)}")
    if self.vocab_padding < 0:
      raise ValueError(f"model.vocab_padding must be >= 0, got {self.vocab_padding}")
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ValueError(f"model.d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    if self.pos_embedding not in ("learned", "rope"):
      raise ValueError(f"model.pos_embedding must be 'learned' or 'rope', got {self.pos_embedding!r}")
    if not (self.dropout == 0.0 or 2.0**-DROPOUT_BITS <= self.dropout < 1.0):
      raise ValueError(f"model.dropout must be 0 or in [2^-{DROPOUT_BITS}, 1), got {self.dropout}")
    if self.pos_embedding == "rope" and self.head_width % 2:
      raise ValueError(f"rope needs an even head width, got {self.head_width}")
    self._check_options()

  def _check_options(self):
    if self.norm not in NORMS:
      raise ValueError(f"model.norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
    if self.mlp not in MLPS:
      raise ValueError(f"model.mlp must be one of {', '.join(MLPS)}, got {self.mlp!r}")
    if self.num_kv_heads is not None and (self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads):
      raise ValueError(f"model.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
    if self.rope_scaling and dict(self.rope_scaling).get("rope_type") != "llama3":
      raise ValueError(f"model.rope_scaling supports rope_type llama3 only, got {dict(self.rope_scaling)}")
    if self.sliding_window < 0 or any(not 0 <= i < self.num_layers for i in self.sliding_layers or ()):
      raise ValueError(f"model.sliding_window must be >= 0 and sliding_layers in [0, {self.num_layers}), got "
                       f"{self.sliding_window} and {self.sliding_layers}")
    if self.attention not in attention_lib.IMPLEMENTATIONS:
      raise ValueError(f"model.attention must be one of {', '.join(attention_lib.IMPLEMENTATIONS)}, "
                       f"got {self.attention!r}")
    if self.dense_layout not in DENSE_LAYOUTS:
      raise ValueError(f"model.dense_layout must be one of {', '.join(DENSE_LAYOUTS)}, got {self.dense_layout!r}")
    if self.remat not in ("none", "block") or self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"model.remat must be none or block and remat_policy one of {', '.join(REMAT_POLICIES)}, "
                       f"got {self.remat!r} and {self.remat_policy!r}")

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_width(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def mlp_width(self) -> int:
    return self.mlp_dim or self.mlp_ratio * self.d_model

  def window(self, layer: int) -> int:
    """Layer `layer`'s sliding window (0: none)."""
    local = self.sliding_layers is None or layer in self.sliding_layers
    return self.sliding_window if local else 0


def config_from(model_config, vocab_size: int) -> Config:
  """A `Config` from a config file's `model` fields and the tokenizer's vocab size. The
  embedding table is padded to a multiple of `vocab_multiple` (unused ids), so the vocab
  axis splits evenly over a tensor-parallel mesh axis."""
  m = dict(model_config)
  multiple = m.pop("vocab_multiple", 8)
  return Config(vocab_size=-(-vocab_size // multiple) * multiple, **m)


_init = layers.init
_dropout = layers.module_dropout


def _qkv(c: Config, x_BxTxD):
  """Queries [B, T, H, K], keys and values [B, T, G, K]: one fused kernel [D, 3, H, K] (GPT-2's
  c_attn) when every query head has its own key/value head, else separate q, k, v (computed as
  one product under `fused_projections`). Weights (`dense_layout="weight"`) are never fused
  into one leaf: each is then its checkpoint's tensor as stored."""
  h, g, k = c.num_heads, c.kv_heads, c.head_width
  bias = c.bias if c.qkv_bias is None else c.qkv_bias
  if g == h and c.dense_layout == "kernel":
    qkv_BxTx3xHxK = layers.dense(c, (3, h, k), "qkv", ("embed", "qkv", "heads", "kv"), use_bias=bias)(x_BxTxD)
    # split, not indexing: the gradient of a split is one concatenate, where three index ops
    # became three zero-padded copies of the [B, T, 3, H, K] tensor added up (XLA:CPU: ~10%
    # of the addition step)
    return tuple(x[:, :, 0] for x in jnp.split(qkv_BxTx3xHxK, 3, axis=2))
  specs = [("q", (h, k), ("embed", "heads", "kv"), bias), ("k", (g, k), ("embed", "kv_heads", "kv"), bias),
           ("v", (g, k), ("embed", "kv_heads", "kv"), bias)]
  if c.fused_projections:
    return tuple(layers.fused_dense(c, x_BxTxD, specs))
  return tuple(layers.dense(c, f, name, axes, use_bias=b)(x_BxTxD) for name, f, axes, b in specs)


class Padding(NamedTuple):
  """What a left-padded batch changes, for every layer: each row's positions (the count of
  its real tokens before each one, as transformers' generate derives position_ids from the
  attention mask), and which keys are real tokens (padding is never attended to)."""

  pos_BxT: jax.Array
  keys_valid_BxS: jax.Array


class PaddedCache(NamedTuple):
  """A KV cache (`init_cache(..., padded=True)`) that remembers which slots hold real tokens,
  so that decoding steps after a left-padded prefill keep masking the padding and number
  their positions per row."""

  layers: tuple  # per layer (keys, values), as `init_cache`
  valid_BxS: jax.Array  # True where a real token was written; padding and unwritten slots False


def batch_sharded(x_BxTxD):
  """The residual stream held split over the batch's mesh axes (data x fsdp) when a mesh is set
  (jax.set_mesh, as the training loop and xlt.plan do). Without it XLA's partitioner is free to
  keep fsdp's activations whole on every device: the 8B plan's largest collective was an
  all-reduce of the whole batch's activations, not fsdp's all-gathers of weights. A data-only
  mesh already splits the batch this way (the same program)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(BATCH) <= set(mesh.axis_names):
    return x_BxTxD
  types = dict(zip(mesh.axis_names, mesh.axis_types))
  if any(types[a] != AxisType.Auto for a in BATCH):  # inside shard_map (Manual): already per device
    return x_BxTxD
  ways = batch_ways(mesh)
  if ways == 1 or x_BxTxD.shape[0] % ways:  # one way, or a batch (a decode's) that does not split evenly
    return x_BxTxD
  return jax.lax.with_sharding_constraint(x_BxTxD, P(BATCH, *([None] * (x_BxTxD.ndim - 1))))


def _padding(tokens_BxT, cache, pos, valid_BxT):
  """The batch's `Padding` and the cache's updated slot validity (None without a cache); both
  None when nothing is padded (no `valid_BxT` and a plain cache), so the programs are the
  unpadded ones."""
  if valid_BxT is None and not isinstance(cache, PaddedCache):
    return None, None
  if cache is not None and not isinstance(cache, PaddedCache):
    raise ValueError("valid_BxT with a KV cache needs init_cache(..., padded=True), which remembers the padding")
  valid_BxT = jnp.ones(tokens_BxT.shape, bool) if valid_BxT is None else jnp.asarray(valid_BxT).astype(bool)
  if cache is None:  # training / scoring: the keys are the queries themselves
    start, keys_valid_BxS, cache_valid_BxS = pos, valid_BxT, None
  else:  # a row's next position is the count of real tokens it has cached
    start = cache.valid_BxS.sum(-1, dtype=jnp.int32)[:, None]
    cache_valid_BxS = jax.lax.dynamic_update_slice(cache.valid_BxS, valid_BxT, (0, pos))
    # prefill attends to its own chunk alone (Attention)
    keys_valid_BxS = valid_BxT if isinstance(pos, int) and pos == 0 else cache_valid_BxS
  # padding takes position 0 (any real position would do: no real query reads it)
  pos_BxT = jnp.maximum(start + jnp.cumsum(valid_BxT, axis=1, dtype=jnp.int32) - 1, 0)
  return Padding(pos_BxT, keys_valid_BxS), cache_valid_BxS


class Attention(nn.Module):
  cfg: Config
  window: int = 0  # sliding window of this layer (0: none)

  @nn.compact
  def __call__(self, x_BxTxD, cache, pos, pad: Padding | None = None):
    c, dt = self.cfg, jnp.dtype(self.cfg.dtype)
    q_BxTxHxK, k_BxTxGxK, v_BxTxGxK = _qkv(c, x_BxTxD)
    if c.qk_norm:  # one weight of K entries shared by all heads (Qwen3), before RoPE
      qk_norm = lambda name: layers.RMSNorm(c.ln_eps, c.norm == "rmsnorm_plus_one", dt, jnp.dtype(c.param_dtype),
                                            name=name)
      q_BxTxHxK, k_BxTxGxK = qk_norm("q_norm")(q_BxTxHxK), qk_norm("k_norm")(k_BxTxGxK)
    if c.pos_embedding == "rope":  # keys are cached rotated: a key's position never changes
      pos_T = pos + jnp.arange(x_BxTxD.shape[1]) if pad is None else pad.pos_BxT
      scaling = dict(c.rope_scaling) if c.rope_scaling else None
      q_BxTxHxK, k_BxTxGxK = rope(q_BxTxHxK, pos_T, c.rope_base, scaling), rope(k_BxTxGxK, pos_T, c.rope_base, scaling)
    # Attention runs head-major ([B, H, T, K]) and the cache is kept that way: a decoding step
    # then reads the cache in the layout its matmuls want, instead of transposing all of it
    # per layer and token (XLA:CPU spent half of each decoding step on those copies).
    q_BxHxTxK, k_BxGxTxK, v_BxGxTxK = (x.transpose(0, 2, 1, 3) for x in (q_BxTxHxK, k_BxTxGxK, v_BxTxGxK))
    if cache is not None:  # decoding: write this chunk at `pos`, attend to all written so far
      at = tuple(jnp.asarray(i, jnp.int32) for i in (0, 0, pos, 0))  # one index type, also under x64
      k_BxGxSxK = jax.lax.dynamic_update_slice(cache[0], k_BxGxTxK.astype(cache[0].dtype), at)
      v_BxGxSxK = jax.lax.dynamic_update_slice(cache[1], v_BxGxTxK.astype(cache[1].dtype), at)
      cache = (k_BxGxSxK, v_BxGxSxK)
      if isinstance(pos, int) and pos == 0:  # prefill: the cache beyond this chunk is empty
        k_BxGxSxK, v_BxGxSxK = k_BxGxTxK, v_BxGxTxK  # (and masked): attend to the chunk alone
    else:  # training / scoring: the keys are the queries' own positions
      k_BxGxSxK, v_BxGxSxK = k_BxGxTxK, v_BxGxTxK
    t, s = x_BxTxD.shape[1], k_BxGxSxK.shape[2]
    q_Tx1, k_1xS = jnp.arange(t)[:, None] + pos, jnp.arange(s)[None, :]
    causal_TxS = q_Tx1 >= k_1xS
    if self.window:  # the query itself and the window - 1 positions before it
      causal_TxS = causal_TxS & (k_1xS > q_Tx1 - self.window)
    # slots, not positions: a row's padding is all on its left, so among its real tokens slot
    # offsets equal position offsets, and the window is transformers' (which counts slots)
    if pad is not None:  # [B, 1, T, S]: no query attends to padding
      causal_TxS = causal_TxS[None, None] & pad.keys_valid_BxS[:, None, None, :]
    scale = c.query_pre_attn_scalar ** -0.5 if c.query_pre_attn_scalar else c.head_width ** -0.5
    impl = self._implementation(dt, pad is not None, not (isinstance(pos, int) and pos == 0), t)
    if impl != "xlt":
      out_BxTxHxK = attention_lib.attend(impl, q_BxHxTxK, k_BxGxSxK.astype(dt), v_BxGxSxK.astype(dt), causal_TxS,
                                         scale=scale, window=self.window, softcap=c.attn_logit_softcap)
      return self._project(out_BxTxHxK), cache
    # query head h reads key/value head h // (H / G), as repeat_kv, without the repeat
    # (xlt.matmul.attention_scores)
    out_BxTxHxK = causal_attention(q_BxHxTxK * scale, k_BxGxSxK.astype(dt), v_BxGxSxK.astype(dt), causal_TxS,
                                   lambda p: _dropout(self, c, p),
                                   # from position 0 (training, scoring, prefill) the mask is lower-triangular
                                   matmul.causal_query_chunks(t) if isinstance(pos, int) and pos == 0 else 1,
                                   softcap=c.attn_logit_softcap)
    return self._project(out_BxTxHxK), cache

  def _implementation(self, dt, padded: bool, decoding: bool, t: int) -> str:
    """xlt.attention's choice for this layer on the default backend (Python, at trace time)."""
    c = self.cfg
    impl, why = attention_lib.choose(
        c.attention, jax.default_backend(), dtype=dt, softcap=c.attn_logit_softcap,
        dropout=c.dropout > 0 and self.has_rng("dropout"), padded=padded, decoding=decoding,
        head_dim=c.head_width, seq=t)
    if why:
      attention_lib.log_fallback(c.attention, impl, why)
    return impl

  def _project(self, out_BxTxHxK):
    c = self.cfg
    # GPT-2: residual projections start smaller so the residual stream stays O(1).
    out_BxTxD = layers.dense(c, c.d_model, "proj", ("heads", "kv", "embed"), axis=(-2, -1),
                             std=0.02 / (2 * c.num_layers) ** 0.5)(out_BxTxHxK)
    return _dropout(self, c, out_BxTxD)


class Block(nn.Module):
  cfg: Config
  window: int = 0

  @nn.compact
  def __call__(self, x_BxTxD, cache, pos, pad=None):
    c = self.cfg
    y_BxTxD, cache = Attention(c, self.window, name="attn")(layers.norm(c, "ln_1")(x_BxTxD), cache, pos, pad)
    if c.post_norms:
      y_BxTxD = layers.norm(c, "ln_1_post")(y_BxTxD)
    x_BxTxD = x_BxTxD + y_BxTxD
    y_BxTxD = layers.Mlp(c, name="mlp")(layers.norm(c, "ln_2")(x_BxTxD))
    if c.post_norms:
      y_BxTxD = layers.norm(c, "ln_2_post")(y_BxTxD)
    return x_BxTxD + y_BxTxD, cache


class GPT(nn.Module):
  """`__call__(tokens_BxT, cache=None, pos=0, valid_BxT=None, last_only=False) -> (logits_BxTxV, cache)`.

  With a cache (from `init_cache`), the tokens are written at positions
  `pos .. pos+T-1` and attend to every earlier position: prefill and one-token
  decoding steps are the same call. `valid_BxT` (left padding: False/0 for padding) and a
  `PaddedCache` give each row its own positions and mask its padding (`Padding`).
  `last_only`: the last position's logits alone, [B, 1, V] (a prefill that samples the next token).
  """

  cfg: Config

  @nn.compact
  def __call__(self, tokens_BxT, cache=None, pos=0, valid_BxT=None, last_only=False):
    c, dt, pdt = self.cfg, jnp.dtype(self.cfg.dtype), jnp.dtype(self.cfg.param_dtype)
    pad, cache_valid_BxS = _padding(tokens_BxT, cache, pos, valid_BxT)
    wte = nn.Embed(c.vocab_size + c.vocab_padding, c.d_model, name="wte", embedding_init=_init(("vocab", "embed")), param_dtype=pdt)
    x_BxTxD = wte(tokens_BxT)
    if c.pos_embedding == "learned":
      wpe = self.param("wpe", _init(("pos", "embed")), (c.block_size, c.d_model), pdt)
      if pad is None:
        x_BxTxD = x_BxTxD + jnp.take(wpe, pos + jnp.arange(tokens_BxT.shape[1]), axis=0)[None]
      else:
        x_BxTxD = x_BxTxD + jnp.take(wpe, pad.pos_BxT, axis=0)
    x_BxTxD = _dropout(self, c, x_BxTxD).astype(dt)
    if c.embed_scale:  # Gemma: sqrt(D) rounded to the compute dtype first, as transformers does
      x_BxTxD = x_BxTxD * jnp.asarray(c.d_model ** 0.5, dt)
    x_BxTxD = batch_sharded(x_BxTxD)
    new_cache, layer_caches = [], cache.layers if isinstance(cache, PaddedCache) else cache
    block = Block
    if c.remat == "block" and cache is None:  # training: decoding has no backward pass to save for
      # static: `pos` (an int from position 0) selects the query chunks (argument 0 is the module)
      block = nn.remat(Block, policy=REMAT_POLICIES[c.remat_policy], static_argnums=(3,))
    for i in range(c.num_layers):
      x_BxTxD, layer_cache = block(c, c.window(i), name=f"block_{i}")(
          x_BxTxD, None if cache is None else layer_caches[i], pos, pad)
      x_BxTxD = batch_sharded(x_BxTxD)
      new_cache.append(layer_cache)
    if last_only:  # the final norm and the head act on each position alone: [B, T, V] is never made
      x_BxTxD = x_BxTxD[:, -1:]
    x_BxTxD = layers.norm(c, "ln_f")(x_BxTxD)
    if c.tie_embeddings:
      # wte.attend, as a dense layer over wte^T (its weight gradient the fast way round), in the
      # compute dtype as flax's attend and the untied head: promoted to float32 parameters, the
      # head of a 128k vocabulary ran as three float32 products, 28% of a 1B step on a GPU
      x_BxTxD, emb_VxD = nn.dtypes.promote_dtype(x_BxTxD, wte.embedding, dtype=dt)
      logits_BxTxV = matmul.product(x_BxTxD, emb_VxD.T)
    else:
      logits_BxTxV = layers.dense(c, c.vocab_size + c.vocab_padding, "lm_head", ("embed", "vocab"),
                                  use_bias=False)(x_BxTxD)
    logits_BxTxV = logits_BxTxV[..., :c.vocab_size].astype(jnp.float32)
    if c.final_logit_softcap:
      logits_BxTxV = jnp.tanh(logits_BxTxV / c.final_logit_softcap) * c.final_logit_softcap
    if isinstance(cache, PaddedCache):
      return logits_BxTxV, PaddedCache(tuple(new_cache), cache_valid_BxS)
    return logits_BxTxV, (None if cache is None else tuple(new_cache))


def init_cache(cfg: Config, batch: int, length: int | None = None, *, padded: bool = False):
  """Per layer (keys, values), each [B, G, S, K] (head-major: see Attention; the key/value
  heads, not the query heads), zero-filled. `padded`: a `PaddedCache` (for left-padded
  batches: `apply`'s `valid_BxT`), the same layers with every slot marked empty."""
  s = length or cfg.block_size
  shape = (batch, cfg.kv_heads, s, cfg.head_width)
  kv = tuple((jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype)) for _ in range(cfg.num_layers))
  return PaddedCache(kv, jnp.zeros((batch, s), bool)) if padded else kv



def init_params(cfg: Config, rng):
  """Plain (unboxed) parameter dict: {'wte': ..., 'block_0': {...}, ...}."""
  boxed = GPT(cfg).init(rng, jnp.zeros((1, 1), jnp.int32))["params"]
  return nn.unbox(boxed)


def logical_axes(cfg: Config):
  """The logical axis names of every parameter, as a pytree of PartitionSpecs."""
  boxed = jax.eval_shape(lambda: GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  return nn.get_partition_spec(boxed)["params"]


def apply(cfg: Config, params, tokens_BxT, cache=None, pos=0, dropout_rng=None, *, valid_BxT=None,
          last_only=False):
  """The forward pass; with `dropout_rng` (training) and `cfg.dropout` > 0, with dropout.

  `valid_BxT` (1 for real tokens, 0 for left padding) gives each row positions counting its
  real tokens and masks the padding from every query, so a left-padded row's logits are
  those of the row alone; with a cache, use `init_cache(..., padded=True)`, which keeps the
  mask for the decoding steps after (they need no `valid_BxT`). None: no padding.
  `last_only`: the logits of the last position alone, [B, 1, V]: for a long prompt and a large
  vocabulary, [B, T, V] float32 logits are a prefill's largest array. The values match the full
  logits' last position to float rounding, not bit for bit (XLA:CPU fuses and tiles the head
  differently for one position)."""
  rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
  return GPT(cfg).apply({"params": params}, tokens_BxT, cache, pos, valid_BxT, last_only, rngs=rngs)


def separate_projections(cfg: Config) -> Config:
  """`cfg` computing each dense layer by its own call (not `fused_projections`): for code that
  intercepts the dense layers' calls (LoRA's adapters, RegMean's inputs)."""
  return dataclasses.replace(cfg, fused_projections=False) if cfg.fused_projections else cfg


def count_params(params, stacked: bool = False) -> int:
  """The parameters' count; stacked: an ensemble's [E, ...] leaves, one member's count (from
  the shapes: nothing is sliced, which on sharded leaves would compile a program per leaf)."""
  return sum(x.size // (x.shape[0] if stacked else 1) for x in jax.tree.leaves(params))


# (block index or None, module kind) of a parameter path: the rule lives in xlt.param_paths, which
# the model, the partitions and the merge library all read
path_info = param_paths.path_info
