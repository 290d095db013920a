"""Rank-stabilised LoRA (Kalajdzievski 2023: scale alpha / sqrt(r)) on the attention and MLP
projections of xlt's decoder, placed by the same partition declarations as freezing. Every
kernel of a block's attn and mlp is a projection: GPT-2's fused attn/qkv and mlp/fc, and the
pretrained families' (xlt.pretrained) separate attn/{q, k, v} and mlp/{gate, up}, with
attn/proj and mlp/proj in both; norms (q_norm, k_norm included) have no kernel.

Adapters are their own pytree, keyed like the kernels they adapt, plus their scale:

  {"scale": s, "block_0": {"attn": {"qkv": {"kernel": {"a": [r, in], "b": [out, r]}}, ...}, ...}}

`in` / `out` flatten the kernel's input / output axes (xlt.param_paths's rows = output
units), so a [D, 3, H, K] qkv kernel has in = D, out = 3HK, a [D, G, K] k kernel in = D,
out = GK, and attn/proj's [H, K, D] in = HK. The adapted kernel is
W + s * (b @ a) in the [out, in] view (`merge_into`), and the adapter forward adds
s * (x @ a^T) @ b^T beside the frozen base projection without forming that sum (`apply`).
b starts at zero, so a fresh adapter changes nothing. The scale is a leaf so an adapter
checkpoint says alone how to apply it; it is never trained.

Training a LoRA model trains the *composite* {"base": params, "lora": adapters}, one of
xlt.composite's kinds: the loss runs the adapter forward for it, and the train step
differentiates and updates only the adapters (`split`): the base and the scale get no gradient, no optimizer
state and no update, so they stay bit for bit, and any optax transformation (xlt's AdamW,
a gated partition optimizer over the adapters' labels) trains the adapters. Partial LoRA
= adapters only on some labels of a partition (`init(..., labels=..., trainable=...)`);
a kernel with no adapter is frozen, as is every norm, bias, embedding and the head.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xlt import layers
from xlt import matmul
from xlt import model as model_lib
from xlt.io import tensor_files
from xlt.param_paths import DENSE_LEAVES, XLT, dense_leaf, path_names, path_str

KINDS = ("attn", "mlp")  # every kernel of these: attn/{qkv | q, k, v; proj}, mlp/{fc | gate, up; proj}


def scale(rank: int, alpha: float) -> float:
  """rsLoRA's scale alpha / sqrt(rank) (LoRA's alpha / rank shrinks large ranks' updates)."""
  return float(alpha) / math.sqrt(rank)


def is_composite(params) -> bool:
  return isinstance(params, dict) and set(params) == {"base", "lora"}


def in_out(path, shape) -> tuple[int, int]:
  """(inputs, outputs) of a dense leaf of `shape`: its non-row and row axes' sizes (xlt.param_paths)."""
  out_axes = XLT.row_axes(path_names(path), tuple(shape))
  out = math.prod(shape[a] for a in out_axes)
  return math.prod(shape) // out, out


def targets(params, labels=None, trainable=None) -> list[tuple[str, ...]]:
  """Paths of the kernels that get an adapter: every attn / mlp kernel inside a block, or,
  with a label tree, those whose label is in `trainable` (a label or a set)."""
  chosen = None if labels is None else {trainable} if isinstance(trainable, str) else set(trainable)
  if labels is not None and not chosen:
    raise ValueError("LoRA: a label tree needs the trainable labels that get adapters")
  label_of = {} if labels is None else {path_names(p): l for p, l in jax.tree_util.tree_flatten_with_path(labels)[0]}
  out = []
  for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = path_names(p)
    block, kind = XLT.block_kind(names)
    if block is None or kind not in KINDS or names[-1] not in DENSE_LEAVES:
      continue
    if chosen is None or label_of[names] in chosen:
      out.append(names)
  if labels is not None:
    unknown = chosen - set(label_of.values())
    if unknown:
      raise ValueError(f"LoRA: trainable labels {sorted(unknown)} are not in the label tree "
                       f"(it has {sorted(set(label_of.values()))})")
  return out


def init(params, rng, *, rank: int, alpha: float, labels=None, trainable=None) -> dict:
  """Adapters for `params` (one model's parameter tree): a ~ N(0, 1/in), b = 0.

  rank: r, at most min(in, out) of every adapted kernel (a larger rank adds nothing a
    full-rank update could not; it is an error, not silently clipped).
  alpha: rsLoRA's alpha; the scale is alpha / sqrt(rank).
  labels, trainable: a partition label tree (xlt.partition.labels) and the labels whose
    kernels get adapters; None = every attn / mlp kernel.
  """
  if int(rank) != rank or rank < 1:
    raise ValueError(f"LoRA rank must be a positive integer, got {rank}")
  flat = {path_names(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  paths = targets(params, labels, trainable)
  if not paths:
    raise ValueError("LoRA: no kernel gets an adapter (no attn / mlp kernel has a trainable label)")
  out = {"scale": jnp.asarray(scale(rank, alpha), jnp.float32)}
  for i, p in enumerate(paths):
    n_in, n_out = in_out(p, flat[p].shape)
    if rank > min(n_in, n_out):
      raise ValueError(f"LoRA rank {rank} exceeds {path_str(p)}'s {n_out} x {n_in} matrix "
                       f"(at most min(out, in) = {min(n_in, n_out)})")
    a = jax.random.normal(jax.random.fold_in(rng, i), (rank, n_in), jnp.float32) / math.sqrt(n_in)
    node = out
    for k in p[:-1]:
      node = node.setdefault(k, {})
    node[p[-1]] = {"a": a, "b": jnp.zeros((n_out, rank), jnp.float32)}
  return out


def _adapters(adapters) -> dict:
  """{kernel path: (a, b)} of an adapter tree."""
  found = {}
  for p, x in jax.tree_util.tree_flatten_with_path(adapters)[0]:
    names = path_names(p)
    if names[-1] in ("a", "b"):
      found.setdefault(names[:-1], {})[names[-1]] = x
  return {p: (ab["a"], ab["b"]) for p, ab in found.items()}


def merge_into(base, adapters):
  """The base with every adapted kernel replaced by W + s * b @ a (in the [out, in] view),
  in W's dtype; a tree of plain parameters for decoding, saving or merging. Works on
  numpy or jax leaves, inside jit too."""
  ab, s = _adapters(adapters), adapters["scale"]

  def leaf(path, w):
    names = path_names(path)
    if names not in ab:
      return w
    a, b = ab[names]
    if a.shape[1] * b.shape[0] != math.prod(w.shape):
      raise ValueError(f"LoRA adapter of {path_str(names)}: b {b.shape} @ a {a.shape} does not match "
                       f"the kernel {w.shape}")
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    d = s * (b @ a if names[-1] == "weight" else a.T @ b.T)  # [out, in] or [in, out]: the leaf's layout
    return (jnp.asarray(w, jnp.float32) + d.reshape(w.shape)).astype(w.dtype)

  missing = set(ab) - {path_names(p) for p, _ in jax.tree_util.tree_flatten_with_path(base)[0]}
  if missing:
    raise ValueError(f"LoRA adapters for parameters the base lacks: {sorted(path_str(p) for p in missing)[:4]}")
  return jax.tree_util.tree_map_with_path(leaf, base)


def apply(cfg: model_lib.Config, composite, tokens_BxT, cache=None, pos=0, dropout_rng=None):
  """The adapter forward of {"base", "lora"}: every adapted projection computes
  x W + s (x a^T) b^T with W untouched (the base is never combined with the adapters)."""
  base, adapters = composite["base"], composite["lora"]
  ab, s = _adapters(adapters), adapters["scale"]
  dt = jnp.dtype(cfg.dtype)

  def low_rank(next_fun, args, kwargs, context):
    y = next_fun(*args, **kwargs)
    if context.method_name != "__call__" or not isinstance(context.module, (nn.Dense, nn.DenseGeneral, layers.Linear)):
      return y
    path = dense_leaf(context.module.path, ab)
    if path is None:
      return y
    used.add(path)
    a, b = ab[path]
    x = args[0]
    num_in = 2 if path[-3:-1] == ("attn", "proj") else 1  # xlt.param_paths.xlt_row_axes
    lead = x.shape[:x.ndim - num_in]
    x_in = x.reshape(*lead, a.shape[1]).astype(dt)
    # xlt.matmul.dense: the adapters' gradients contract the tokens, which XLA:CPU would run
    # by writing the projection's whole output gradient transposed
    lr = matmul.product(matmul.product(x_in, a.T.astype(dt)), _cotangent_barrier((s * b).T.astype(dt)))
    return y + lr.reshape(y.shape).astype(y.dtype)

  used: set = set()
  with nn.intercept_methods(low_rank):
    # the adapters attach to each projection's own call
    out = model_lib.apply(model_lib.separate_projections(cfg), base, tokens_BxT, cache, pos, dropout_rng)
  if unused := set(ab) - used:  # an adapter the model never reached would be silently lost
    raise ValueError(f"LoRA adapters for no projection of the model: {sorted(path_str(p) for p in unused)[:4]}")
  return out


@jax.custom_vjp
def _cotangent_barrier(x):
  """x; its cotangent behind an optimization barrier, so that XLA cannot fold the transpose
  back to b's [out, r] into the product that computed it (the slow form again)."""
  return x


_cotangent_barrier.defvjp(lambda x: (x, None), lambda _, ct: (jax.lax.optimization_barrier(ct),))


def split(params):
  """(the trainable part, rebuild): for a composite the adapters without their scale,
  and a function that puts trained adapters back beside the untouched base and scale;
  plain parameters are all trainable. The train step differentiates and updates only the
  trainable part, so the base gets no gradient, no optimizer state and no update."""
  if not is_composite(params):
    return params, lambda trained: trained
  adapters = dict(params["lora"])
  s = adapters.pop("scale")
  return adapters, lambda trained: {"base": params["base"], "lora": {**trained, "scale": s}}


def update_args(composite) -> dict:
  """Extra arguments of the optimizer's update (xlt.composite): none, any optax
  transformation trains adapters."""
  del composite
  return {}


def shardings(abstract, param_shardings, replicated):
  """The composite's shardings from the model's: the base as the model, the adapters (small)
  replicated."""
  return {"base": param_shardings, "lora": jax.tree.map(lambda _: replicated, abstract["lora"])}


def base(composite):
  """The frozen base: the model-shaped part."""
  return composite["base"]


def merged(composite):
  """One model's plain parameters: the adapters merged into the base (`merge_into`)."""
  return merge_into(composite["base"], composite["lora"])


def labels(adapters, kernel_labels):
  """A label tree for the adapters (without their scale: `split`'s trainable part) from a
  partition label tree of the model: each a / b takes its kernel's label. With it the
  partition recipes run on adapters: `partition.alternating` (simultaneous LoRA),
  `partition.gated_optimizer`, `partition.freeze`."""
  by_path = {path_names(p): l for p, l in jax.tree_util.tree_flatten_with_path(kernel_labels)[0]}
  return jax.tree_util.tree_map_with_path(lambda p, _: by_path[path_names(p)[:-1]], adapters)


def save(adapters, file: str) -> None:
  """The adapters alone as a safetensors file ("block_0/attn/qkv/kernel/a", ..., "scale")."""
  tensor_files.save(jax.tree.map(np.asarray, adapters), file, {"format": "xlt-lora"})


def load(file: str) -> dict:
  return tensor_files.load(file, lazy=False, nested=True)


def num_params(adapters) -> int:
  return sum(int(np.size(x)) for p, x in jax.tree_util.tree_flatten_with_path(adapters)[0]
             if path_names(p)[-1] in ("a", "b"))
