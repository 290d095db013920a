"""The statistics the data-aware merges (xlt.merge.data_aware) weigh experts by, from forward and
backward passes of xlt's model over token batches:

  grams(cfg, params, batches)            RegMean's Gram matrix of each attn / mlp kernel's inputs
                                         (and the untied head's: `head`)
  diagonal_fisher(cfg, params, batches)  Fisher merging's diagonal Fisher: `fisher="empirical"`
                                         (the data's own next tokens) or "model" (fusion-bench's)

Each batch is int tokens [B, T], run through one expert's own parameters: every position counts,
or a pair (tokens, mask) whose 0/1 mask says which do (for `grams` [B, T], the input positions,
e.g. not the padding; for `diagonal_fisher` [B, T - 1], the targets of the loss, as training's
loss_mask: position j predicts token j + 1). The statistics are means (over counted tokens for a
Gram matrix, over sequences for a Fisher), so experts measured on different amounts of data weigh
alike. Memory: a Gram matrix
per kernel ([in, in], float32) beside the model; a Fisher holds B per-sequence gradients at once
(jax.vmap), so B bounds it. With a mesh, each batch is split over its data axes as training's are
(the parameters replicated): each device holds its share of the B gradients.

The head. fusion-bench's RegMean measures every linear map, the untied head (lm_head) included;
`grams(head=True)`, the default here and of `python -m xlt.merge_data`, does the same. A tied
head is the embedding, which is no linear map of measured inputs: it takes the experts' mean.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from xlt import lora, sharding
from xlt import model as model_lib
from xlt.param_paths import DENSE_LEAVES, XLT, dense_leaf, path_names, path_str


def num_inputs(path, shape) -> int:
  """How many of a dense leaf's axes are its inputs (xlt.param_paths rows: the others): a
  kernel's leading axes, a weight's trailing ones, the activation's trailing ones alike."""
  return len(shape) - len(XLT.row_axes(path, tuple(shape)))


def _split(batch, mask_width) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(tokens [B, T] int32, mask float32) of a batch given as tokens or (tokens, mask); the
  mask all ones [B, mask_width(T)] when none is given."""
  tokens, mask = batch if isinstance(batch, (tuple, list)) else (batch, None)
  tokens = jnp.asarray(tokens, jnp.int32)
  want = (tokens.shape[0], mask_width(tokens.shape[1]))
  mask = jnp.ones(want, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
  if mask.shape != want:
    raise ValueError(f"a batch's mask is {mask.shape}, its tokens {tokens.shape}: the mask must be {want}")
  return tokens, mask


@functools.partial(jax.jit, static_argnums=(0, 2))
def _batch_grams(cfg, params, targets: tuple, tokens_BxT, mask_BxT):
  """{kernel path: X^T X} of one batch, over the positions `mask_BxT` keeps (a kernel applied
  per head or expert sees the position's mask alike); targets: ((path, kernel shape), ...)."""
  shapes, found = dict(targets), {}

  def capture(next_fun, args, kwargs, context):
    path = dense_leaf(context.module.path, shapes)
    if context.method_name == "__call__" and path is not None:
      x = args[0]
      n_in = math.prod(x.shape[x.ndim - num_inputs(path, shapes[path]):])
      x = x.reshape(-1, n_in).astype(jnp.float32)
      # rows are positions in order; a kernel mapping [B, T, ...] inputs repeats each position's mask
      w = jnp.repeat(mask_BxT.reshape(-1), x.shape[0] // mask_BxT.size)
      found[path] = found.get(path, 0.0) + (x * w[:, None]).T @ x
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(capture):
    model_lib.apply(model_lib.separate_projections(cfg), params, tokens_BxT)  # each kernel's own input
  return found


def _replicate(params, mesh: Mesh | None):
  return params if mesh is None else jax.device_put(params, sharding.replicated(mesh))


def _place(tokens, mask, mesh: Mesh | None) -> tuple:
  """(tokens, mask) split over the mesh's data axes (data x fsdp) with the parameters replicated,
  as training's batches are; rows of mask 0 pad the batch to a multiple of those axes' size, so
  they count for nothing. The statistics sum over the batch: XLA adds the shards' parts."""
  if mesh is None:
    return tokens, mask
  n = sharding.batch_ways(mesh)
  pad = -tokens.shape[0] % n
  tokens, mask = (jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)) for x in (tokens, mask))
  return tuple(jax.device_put(x, sharding.batch_sharding(mesh, x.ndim, ensemble=False)) for x in (tokens, mask))


FISHERS = ("empirical", "model")


def input_mask(loss_mask) -> np.ndarray:
  """[N, T] 0/1: the positions up to each sequence's last target, from a loss_mask [N, T - 1]
  (position j predicts token j + 1): every real token of a right-padded row (its prompt, answer
  and EOS), not the padding after, for `grams`."""
  targets = np.pad(np.asarray(loss_mask) > 0, ((0, 0), (1, 0)))  # [N, T]: token j is a target
  return np.flip(np.maximum.accumulate(np.flip(targets, 1), axis=1), 1).astype(np.float32)


def regmean_kernels(params, head: bool = True) -> list[tuple[str, ...]]:
  """The kernels RegMean measures: every attn / mlp kernel (as xlt.lora adapts), and with
  `head` the untied head's (the module docstring)."""
  names = {path_names(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  heads = [p for p in (("lm_head", leaf) for leaf in DENSE_LEAVES) if p in names]  # either layout's leaf
  return lora.targets(params) + (heads if head else [])


def grams(cfg: model_lib.Config, params, batches, kernels=None, mesh: Mesh | None = None,
          head: bool = True) -> dict[str, np.ndarray]:
  """{kernel path ("block_0/attn/q/kernel"): G} with G = X^T X / tokens, X the inputs the kernel
  saw over `batches` ([tokens, in] float32, the input axes flattened in order; tokens: the
  positions a batch's mask keeps, all without one): what xlt.merge.data_aware.regmean takes per
  expert. kernels: the kernel paths to measure (default: `regmean_kernels(params, head)`, every
  attn / mlp kernel and the untied head's). mesh: each batch split over the mesh's data axes, the parameters replicated
  (`_place`); the same statistics to float rounding."""
  shapes = {path_names(p): tuple(np.shape(x)) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  targets = tuple(sorted((tuple(k), shapes[tuple(k)]) for k in (kernels if kernels is not None
                                                                else regmean_kernels(params, head))))
  params, totals, count = _replicate(params, mesh), {}, 0
  for batch in batches:
    tokens, mask = _split(batch, lambda t: t)
    count += float(mask.sum())
    for path, g in _batch_grams(cfg, params, targets, *_place(tokens, mask, mesh)).items():
      totals[path] = totals.get(path, 0.0) + np.asarray(g, np.float64)
  if missing := sorted({p for p, _ in targets} - set(totals)):
    raise ValueError(f"no input reached {path_str(missing[0])} (is it a kernel of the model's forward?)")
  return {path_str(p): (g / max(count, 1)).astype(np.float32) for p, g in totals.items()}


def _sequence_nll(cfg, params, tokens_T, mask_T=None):
  """The mean next-token negative log-likelihood of one sequence (over the targets `mask_T`
  [T - 1] keeps: training's loss of the sequence; all without one)."""
  logits, _ = model_lib.apply(cfg, params, tokens_T[None])
  logp = jax.nn.log_softmax(logits[0, :-1].astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, tokens_T[1:, None], axis=-1)[:, 0]
  if mask_T is None:
    return jnp.mean(nll)
  return jnp.sum(nll * mask_T) / jnp.maximum(jnp.sum(mask_T), 1.0)


def _model_expectation(cfg, params, tokens_T, mask_T):
  """fusion-bench's Fisher objective for one sequence: the sum over its target positions (`mask_T`)
  of sum_v sqrt(p_v) log p_v, p the model's next-token distribution held constant, so the squared
  gradient weighs each token v by the model's own p_v (MergeLM's estimate of the Fisher under the
  model's distribution; fusion-bench's classifier loss, one row per position, a sequence a batch)."""
  logits, _ = model_lib.apply(cfg, params, tokens_T[None])
  logp = jax.nn.log_softmax(logits[0, :-1].astype(jnp.float32))
  terms = jnp.sum(jnp.sqrt(jax.lax.stop_gradient(jnp.exp(logp))) * logp, axis=-1)
  return jnp.sum(terms * mask_T)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _batch_fisher(cfg, params, tokens_BxT, mask_BxT, fisher="empirical"):
  """The sum over the batch's sequences of each parameter's squared per-sequence gradient."""
  objective = _sequence_nll if fisher == "empirical" else _model_expectation
  grads = jax.vmap(jax.grad(lambda p, t, m: objective(cfg, p, t, m)), in_axes=(None, 0, 0))(
      params, tokens_BxT, mask_BxT)
  return jax.tree.map(lambda g: jnp.sum(jnp.square(g.astype(jnp.float32)), axis=0), grads)


def diagonal_fisher(cfg: model_lib.Config, params, batches, mesh: Mesh | None = None, fisher: str = "empirical"):
  """The diagonal Fisher of every parameter, the mean over sequences of a squared per-sequence
  gradient (`params`' structure, float32): what xlt.merge.data_aware.fisher takes per expert.

  fisher: "empirical" (the default; Matena & Raffel's empirical Fisher): the gradient of the
    sequence's mean next-token loss on its own tokens (over its mask's targets, when given);
    "model" (fusion-bench's): the gradient of `_model_expectation`, the model's own distribution
    over each target position's next token in place of the data's token, summed over them.
  mesh: each batch split over its data axes (`_place`), as for `grams`."""
  if fisher not in FISHERS:
    raise ValueError(f"fisher {fisher!r}: the Fisher is one of {', '.join(FISHERS)}")
  params = _replicate(params, mesh)
  totals, count = None, 0
  for batch in batches:
    tokens, mask = _split(batch, lambda t: t - 1)
    count += int(tokens.shape[0])
    squared = jax.tree.map(lambda g: np.asarray(g, np.float64),
                           _batch_fisher(cfg, params, *_place(tokens, mask, mesh), fisher))
    totals = squared if totals is None else jax.tree.map(np.add, totals, squared)
  if totals is None:
    raise ValueError("diagonal_fisher: no batches")
  return jax.tree.map(lambda t: (t / count).astype(np.float32), totals)
