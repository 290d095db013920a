"""A GPT decoder in Flax (pre-LayerNorm, causal attention, GELU MLP; learned absolute
positions or rotary embeddings).

Parameters are a plain nested dict whose paths name the block and the module kind:

  wte, wpe, ln_f, lm_head,
  block_{i}/{ln_1, attn/{qkv, proj}, ln_2, mlp/{fc, proj}}

so a parameter partition or a layer swap is a function of the path (`xlt.paths.path_info`).
(`wpe` exists only with `pos_embedding="learned"`; RoPE has no position parameters.)
Every parameter carries logical axis names (`embed`, `heads`, `mlp`, `vocab`, ...); the
config's sharding rules map them onto mesh axes (xlt.sharding).

Shape letters: B batch, T query positions, S key positions (cache length), D model
width, H heads, K head width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlt import matmul
from xlt import paths


DROPOUT_BITS = 16  # random bits per entry of a dropout mask (xlt.model.dropout)


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int
  block_size: int = 128  # the longest sequence the position table covers
  num_layers: int = 6
  num_heads: int = 4
  d_model: int = 64
  mlp_ratio: int = 4
  tie_embeddings: bool = False
  dtype: str = "float32"  # compute dtype; parameters stay float32
  ln_eps: float = 1e-5
  # "learned": a GPT-2 position table (wpe). "rope": rotary embeddings on queries and keys
  # (LitGPT's default, the reference's addition model); attention then sees relative offsets,
  # which is what aligning digits of variable-length operands needs.
  pos_embedding: str = "learned"
  rope_base: float = 10000.0
  # Dropout (GPT-2's places: the embeddings, the attention weights, each residual branch's
  # output) while training; evaluation never drops. 0 builds no dropout at all.
  dropout: float = 0.0

  def __post_init__(self):
    for f in ("vocab_size", "block_size", "num_layers", "num_heads", "d_model", "mlp_ratio"):
      if getattr(self, f) <= 0:
        raise ValueError(f"model.{f} must be positive, got {getattr(self, f)}")
    if self.d_model % self.num_heads:
      raise ValueError(f"model.d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    if self.pos_embedding not in ("learned", "rope"):
      raise ValueError(f"model.pos_embedding must be 'learned' or 'rope', got {self.pos_embedding!r}")
    if not (self.dropout == 0.0 or 2.0**-DROPOUT_BITS <= self.dropout < 1.0):
      raise ValueError(f"model.dropout must be 0 or in [2^-{DROPOUT_BITS}, 1), got {self.dropout}")
    if self.pos_embedding == "rope" and (self.d_model // self.num_heads) % 2:
      raise ValueError(f"rope needs an even head width, got d_model/num_heads={self.d_model // self.num_heads}")


def config_from(model_config, vocab_size: int) -> Config:
  """A `Config` from a config file's `model` fields and the tokenizer's vocab size. The
  embedding table is padded to a multiple of `vocab_multiple` (unused ids), so the vocab
  axis splits evenly over a tensor-parallel mesh axis."""
  m = dict(model_config)
  multiple = m.pop("vocab_multiple", 8)
  return Config(vocab_size=-(-vocab_size // multiple) * multiple, **m)


def _init(axes, std=0.02):
  return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


def _zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _layer_norm(cfg: Config, name: str):
  return nn.LayerNorm(
      epsilon=cfg.ln_eps, name=name, dtype=jnp.dtype(cfg.dtype),
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
      bias_init=_zeros(("norm",)))


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


def _dropout(module: nn.Module, cfg: Config, x):
  """Dropout of `x` when `cfg.dropout` > 0 and the call was given a "dropout" rng (training:
  xlt.train); otherwise `x` itself, so evaluation and dropout-free models are unchanged."""
  if cfg.dropout == 0.0 or not module.has_rng("dropout"):
    return x
  return dropout(module.make_rng("dropout"), x, cfg.dropout)


def rope(x_BxTxHxK, pos_T, base: float):
  """Rotates each (first half, second half) pair of head features by position x frequency
  (GPT-NeoX / LitGPT layout), so q.k depends on positions only through their offset."""
  half = x_BxTxHxK.shape[-1] // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_TxK = pos_T[:, None].astype(jnp.float32) * freq[None, :]
  cos, sin = jnp.cos(angle_TxK)[None, :, None, :], jnp.sin(angle_TxK)[None, :, None, :]
  # split (whose gradient is a concatenate), not two slices (whose gradients are zero-padded
  # full-width copies added up)
  x1, x2 = (x.astype(jnp.float32) for x in jnp.split(x_BxTxHxK, 2, axis=-1))
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_BxTxHxK.dtype)


def causal_attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p, query_chunks=1):
  """softmax(q.k + mask) @ v, normalised after the value product (flash attention's order):
  the division then touches [B, H, T, K] instead of [B, H, T, S], and the row maximum is
  outside the gradient (softmax does not depend on it), so the backward pass has no
  reduce_max to differentiate. On XLA:CPU every pass over the [B, H, T, S] scores costs
  about as much as a matmul; this order makes three fewer of them per layer and step.

  `query_chunks` > 1 (self-attention from position 0, so that the mask is lower-triangular)
  cuts the queries into that many chunks, each attending to the keys up to its last
  position: the same values, without the masked scores above the diagonal
  (xlt.matmul.causal_query_chunks says how many pay)."""
  t = q_BxHxTxK.shape[2]
  if query_chunks > 1:
    if k_BxHxSxK.shape[2] != t:
      raise ValueError(f"query_chunks={query_chunks} needs self-attention from position 0 (as many keys as "
                       f"queries); got {t} queries and {k_BxHxSxK.shape[2]} keys")
    bounds = [round(t * i / query_chunks) for i in range(query_chunks + 1)]
    return jnp.concatenate(
        [_attention(q_BxHxTxK[:, :, lo:hi], k_BxHxSxK[:, :, :hi], v_BxHxSxK[:, :, :hi], mask_TxS[lo:hi, :hi], drop)
         for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo], axis=1)
  return _attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop)


def _attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop):
  dt = q_BxHxTxK.dtype
  # the mask as an added bias (xlt.matmul.mask_bias): masked entries become exp(-1e30) = 0
  att_BxHxTxS = matmul.attention_scores(q_BxHxTxK, k_BxHxSxK).astype(jnp.float32) + matmul.mask_bias(mask_TxS)
  max_BxHxTx1 = jax.lax.stop_gradient(att_BxHxTxS.max(-1, keepdims=True))
  p_BxHxTxS = jnp.exp(att_BxHxTxS - max_BxHxTx1)
  sum_BxTxHx1 = p_BxHxTxS.sum(-1).transpose(0, 2, 1)[..., None]  # >= 1: the diagonal is unmasked
  # `drop` (dropout of the attention weights) after the sum: the normalised weights are dropped
  out_BxTxHxK = matmul.attention_values(drop(p_BxHxTxS).astype(dt), v_BxHxSxK)
  return (out_BxTxHxK.astype(jnp.float32) / sum_BxTxHx1).astype(dt)


class Attention(nn.Module):
  cfg: Config

  @nn.compact
  def __call__(self, x_BxTxD, cache, pos):
    c, dt = self.cfg, jnp.dtype(self.cfg.dtype)
    h, k = c.num_heads, c.d_model // c.num_heads
    qkv_BxTx3xHxK = nn.DenseGeneral(
        (3, h, k), name="qkv", dtype=dt, dot_general=matmul.dense,
        kernel_init=_init(("embed", "qkv", "heads", "kv")),
        bias_init=_zeros(("qkv", "heads", "kv")))(x_BxTxD)
    # split, not indexing: the gradient of a split is one concatenate, where three index ops
    # became three zero-padded copies of the [B, T, 3, H, K] tensor added up (XLA:CPU: ~10%
    # of the addition step)
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = (x[:, :, 0] for x in jnp.split(qkv_BxTx3xHxK, 3, axis=2))
    if c.pos_embedding == "rope":  # keys are cached rotated: a key's position never changes
      pos_T = pos + jnp.arange(x_BxTxD.shape[1])
      q_BxTxHxK, k_BxTxHxK = rope(q_BxTxHxK, pos_T, c.rope_base), rope(k_BxTxHxK, pos_T, c.rope_base)
    # Attention runs head-major ([B, H, T, K]) and the cache is kept that way: a decoding step
    # then reads the cache in the layout its matmuls want, instead of transposing all of it
    # per layer and token (XLA:CPU spent half of each decoding step on those copies).
    q_BxHxTxK, k_BxHxTxK, v_BxHxTxK = (x.transpose(0, 2, 1, 3) for x in (q_BxTxHxK, k_BxTxHxK, v_BxTxHxK))
    if cache is not None:  # decoding: write this chunk at `pos`, attend to all written so far
      k_BxHxSxK = jax.lax.dynamic_update_slice(cache[0], k_BxHxTxK.astype(cache[0].dtype), (0, 0, pos, 0))
      v_BxHxSxK = jax.lax.dynamic_update_slice(cache[1], v_BxHxTxK.astype(cache[1].dtype), (0, 0, pos, 0))
      cache = (k_BxHxSxK, v_BxHxSxK)
      if isinstance(pos, int) and pos == 0:  # prefill: the cache beyond this chunk is empty
        k_BxHxSxK, v_BxHxSxK = k_BxHxTxK, v_BxHxTxK  # (and masked): attend to the chunk alone
    else:  # training / scoring: the keys are the queries' own positions
      k_BxHxSxK, v_BxHxSxK = k_BxHxTxK, v_BxHxTxK
    t, s = x_BxTxD.shape[1], k_BxHxSxK.shape[2]
    causal_TxS = (jnp.arange(t)[:, None] + pos) >= jnp.arange(s)[None, :]
    out_BxTxHxK = causal_attention(q_BxHxTxK * (k ** -0.5), k_BxHxSxK.astype(dt), v_BxHxSxK.astype(dt), causal_TxS,
                                   lambda p: _dropout(self, c, p),
                                   # from position 0 (training, scoring, prefill) the mask is lower-triangular
                                   matmul.causal_query_chunks(t) if isinstance(pos, int) and pos == 0 else 1)
    out_BxTxD = nn.DenseGeneral(
        c.d_model, axis=(-2, -1), name="proj", dtype=dt, dot_general=matmul.dense,
        # GPT-2: residual projections start smaller so the residual stream stays O(1).
        kernel_init=_init(("heads", "kv", "embed"), 0.02 / (2 * c.num_layers) ** 0.5),
        bias_init=_zeros(("embed",)))(out_BxTxHxK)
    return _dropout(self, c, out_BxTxD), cache


_GELU_C = (2 / jnp.pi) ** 0.5


@jax.custom_jvp
def gelu(x):
  """GELU, tanh approximation (GPT-2's; flax's `nn.gelu` default), with its derivative
  written out: autodiff of the formula sums two paths through x (x * (1 + tanh(u(x)))),
  which XLA:CPU ran as a separate pass over the [B, T, F] activations in every backward
  step; one expression fuses into the product with the incoming gradient."""
  return 0.5 * x * (1 + jnp.tanh(_GELU_C * (x + 0.044715 * x ** 3)))


@gelu.defjvp
def _gelu_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  t = jnp.tanh(_GELU_C * (x + 0.044715 * x ** 3))
  slope = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * x * x)
  return 0.5 * x * (1 + t), slope * dx


class Mlp(nn.Module):
  cfg: Config

  @nn.compact
  def __call__(self, x_BxTxD):
    c, dt = self.cfg, jnp.dtype(self.cfg.dtype)
    f = c.mlp_ratio * c.d_model
    x_BxTxF = nn.Dense(f, name="fc", dtype=dt, dot_general=matmul.dense, kernel_init=_init(("embed", "mlp")),
                       bias_init=_zeros(("mlp",)))(x_BxTxD)
    x_BxTxF = gelu(x_BxTxF)
    x_BxTxD = nn.Dense(c.d_model, name="proj", dtype=dt, dot_general=matmul.dense,
                       kernel_init=_init(("mlp", "embed"), 0.02 / (2 * c.num_layers) ** 0.5),
                       bias_init=_zeros(("embed",)))(x_BxTxF)
    return _dropout(self, c, x_BxTxD)


class Block(nn.Module):
  cfg: Config

  @nn.compact
  def __call__(self, x_BxTxD, cache, pos):
    y_BxTxD, cache = Attention(self.cfg, name="attn")(_layer_norm(self.cfg, "ln_1")(x_BxTxD), cache, pos)
    x_BxTxD = x_BxTxD + y_BxTxD
    x_BxTxD = x_BxTxD + Mlp(self.cfg, name="mlp")(_layer_norm(self.cfg, "ln_2")(x_BxTxD))
    return x_BxTxD, cache


class GPT(nn.Module):
  """`__call__(tokens_BxT, cache=None, pos=0) -> (logits_BxTxV, cache)`.

  With a cache (from `init_cache`), the tokens are written at positions
  `pos .. pos+T-1` and attend to every earlier position: prefill and one-token
  decoding steps are the same call.
  """

  cfg: Config

  @nn.compact
  def __call__(self, tokens_BxT, cache=None, pos=0):
    c, dt = self.cfg, jnp.dtype(self.cfg.dtype)
    wte = nn.Embed(c.vocab_size, c.d_model, name="wte", embedding_init=_init(("vocab", "embed")))
    x_BxTxD = wte(tokens_BxT)
    if c.pos_embedding == "learned":
      wpe = self.param("wpe", _init(("pos", "embed")), (c.block_size, c.d_model))
      x_BxTxD = x_BxTxD + jnp.take(wpe, pos + jnp.arange(tokens_BxT.shape[1]), axis=0)[None]
    x_BxTxD = _dropout(self, c, x_BxTxD).astype(dt)
    new_cache = []
    for i in range(c.num_layers):
      x_BxTxD, layer_cache = Block(c, name=f"block_{i}")(
          x_BxTxD, None if cache is None else cache[i], pos)
      new_cache.append(layer_cache)
    x_BxTxD = _layer_norm(c, "ln_f")(x_BxTxD)
    if c.tie_embeddings:
      # wte.attend, as a dense layer over wte^T (its weight gradient the fast way round)
      x_BxTxD, emb_VxD = nn.dtypes.promote_dtype(x_BxTxD, wte.embedding)
      logits_BxTxV = matmul.dense(x_BxTxD, emb_VxD.T, (((x_BxTxD.ndim - 1,), (0,)), ((), ())))
    else:
      logits_BxTxV = nn.Dense(c.vocab_size, use_bias=False, name="lm_head", dtype=dt, dot_general=matmul.dense,
                              kernel_init=_init(("embed", "vocab")))(x_BxTxD)
    return logits_BxTxV.astype(jnp.float32), (None if cache is None else tuple(new_cache))


def init_cache(cfg: Config, batch: int, length: int | None = None):
  """Per layer (keys, values), each [B, H, S, K] (head-major: see Attention), zero-filled."""
  s = length or cfg.block_size
  shape = (batch, cfg.num_heads, s, cfg.d_model // cfg.num_heads)
  return tuple((jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype)) for _ in range(cfg.num_layers))


def init_params(cfg: Config, rng):
  """Plain (unboxed) parameter dict: {'wte': ..., 'block_0': {...}, ...}."""
  boxed = GPT(cfg).init(rng, jnp.zeros((1, 1), jnp.int32))["params"]
  return nn.unbox(boxed)


def logical_axes(cfg: Config):
  """The logical axis names of every parameter, as a pytree of PartitionSpecs."""
  boxed = jax.eval_shape(lambda: GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  return nn.get_partition_spec(boxed)["params"]


def apply(cfg: Config, params, tokens_BxT, cache=None, pos=0, dropout_rng=None):
  """The forward pass; with `dropout_rng` (training) and `cfg.dropout` > 0, with dropout."""
  rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
  return GPT(cfg).apply({"params": params}, tokens_BxT, cache, pos, rngs=rngs)


def count_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))


# (block index or None, module kind) of a parameter path: the rule lives in xlt.paths, which
# the model, the partitions and the merge library all read
path_info = paths.path_info
