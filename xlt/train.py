"""Training: optimizers, the masked loss, and a jitted step over an *ensemble* of models.

Small models underuse a machine, so xlt trains several models (seeds, and grid cells
whose shapes agree) together: every leaf of the train state has a leading ensemble
axis E, and the step maps the single-model step over it (xlt.ensemble: vmap on
accelerators, lax.map on CPU; `ensemble_step` can vmap the optimizer's update after the map).
E=1 is a plain run.

Batches are dicts: tokens [E, B, T] int32 and loss_mask [E, B, T-1] float32 (1 on
targets after the delimiter). The step takes any optax transformation, so a
`optax.multi_transform` over a label pytree (partitions) drops in. What a gated optimizer
freezes (xlt.partition) is data, so its step still differentiates every parameter; a
transformation from `static_freeze` declares what it freezes when the step is built, and the
step differentiates only the trained leaves (no weight gradients, no optimizer state for the
frozen ones).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from xlt import composite
from xlt import cross_entropy
from xlt import ensemble as ensemble_lib
from xlt import model as model_lib
from xlt import sharding
from xlt.param_paths import path_names

# {"step": int32[E], "params": tree, "opt_state": tree, "active": bool[E]}, and with dropout
# "dropout_key": uint32[E, 2] (each member's key data)
State = dict


def make_schedule(c) -> optax.Schedule:
  """`c.schedule`: cosine (linear warmup then cosine decay), linear (warmup then
  constant: the reference addition "Lin. Incr."), or constant."""
  peak, warmup, steps = c.peak_lr, int(c.warmup_steps), int(c.total_steps)
  if c.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(steps, warmup + 1),
                                              end_value=peak * c.get("end_lr_ratio", 0.1))
  if c.schedule == "linear":
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, max(warmup, 1)), optax.constant_schedule(peak)], [warmup])
  if c.schedule == "constant":
    return optax.constant_schedule(peak)
  raise ValueError(f"unknown opt.schedule {c.schedule!r}; expected cosine, linear or constant")


def with_state_dtype(tx, dtype: str | None) -> optax.GradientTransformationExtraArgs:
  """`tx` run in `dtype` (e.g. "float32") on parameters of any dtype: its state (Adam's
  moments) is `dtype`, the gradients and parameters are cast to it before `tx` and the
  updates back to each parameter's dtype (bf16 parameters, fp32 moments). Extra update
  arguments (a gated optimizer's `trainable=`, a neuron mask) pass through. None or "":
  `tx` itself, its state in the parameters' dtype."""
  if not dtype:
    return tx
  try:
    dt = jnp.dtype(dtype)
  except TypeError:
    dt = None
  if dt is None or not jnp.issubdtype(dt, jnp.floating):
    raise ValueError(f"opt.state_dtype must be a float dtype (float32, bfloat16, ...), got {dtype!r}")
  tx = optax.with_extra_args_support(tx)
  cast = lambda tree: jax.tree.map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

  def update(updates, state, params=None, **extra):
    new, state = tx.update(cast(updates), state, None if params is None else cast(params), **extra)
    return jax.tree.map(lambda n, u: n.astype(u.dtype), new, updates), state

  return optax.GradientTransformationExtraArgs(lambda params: tx.init(cast(params)), update)


def make_optimizer(c) -> optax.GradientTransformation:
  """AdamW (or Adam/SGD) with global-norm clipping; `c` is the `opt` config. `c.state_dtype`
  ("" by default: the parameters' dtype) runs it in another dtype (`with_state_dtype`:
  "float32" keeps Adam's moments in float32 for bf16 parameters)."""
  lr = make_schedule(c)
  if c.name == "adamw":
    opt = optax.adamw(lr, b1=c.b1, b2=c.b2, weight_decay=c.weight_decay,
                      mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p))  # no decay on biases/LN
  elif c.name == "adam":
    opt = optax.adam(lr, b1=c.b1, b2=c.b2)
  elif c.name == "sgd":
    opt = optax.sgd(lr, momentum=c.get("momentum", 0.9))
  else:
    raise ValueError(f"unknown opt.name {c.name!r}; expected adamw, adam or sgd")
  tx = optax.chain(optax.clip_by_global_norm(c.clip), opt) if c.clip else opt
  return with_state_dtype(tx, c.get("state_dtype"))


class StaticFreeze(NamedTuple):
  """An optax transformation (init, update) that trains `inner` on the leaves whose `frozen`
  flag is False; see `static_freeze`."""

  init: Callable
  update: Callable
  inner: Any
  frozen: Any


def _holes(tree, frozen):
  """(`tree` with None at its `frozen` leaves, fill: such a tree -> a whole one, the frozen
  leaves taken from `tree`). `frozen` None: (`tree`, identity)."""
  if frozen is None:
    return tree, lambda live: live
  treedef = jax.tree.structure(tree)
  leaves, flags = treedef.flatten_up_to(tree), treedef.flatten_up_to(frozen)
  live = treedef.unflatten([None if f else x for x, f in zip(leaves, flags)])

  def fill(live_tree):
    return treedef.unflatten([x if f else y for x, y, f in zip(leaves, treedef.flatten_up_to(live_tree), flags)])

  return live, fill


def static_freeze(tx, frozen) -> StaticFreeze:
  """`tx` on the leaves whose `frozen` flag is False (a tree of Python bools over what the
  optimizer trains: the params, or a composite's trained part), fixed when the step is built.

  As an optax transformation it is `partition.freeze`: `tx` keeps state only for the trained
  leaves (its tree has None at the frozen ones) and sees, clip included, only their gradients;
  the frozen leaves get zero updates. `train_step` goes further: it differentiates only the
  trained leaves, so the frozen leaves' weight gradients are never formed, and leaves the
  frozen leaves as they are, bit for bit. For recipes whose flags change over time, or
  ensemble members with different recipes, use `partition.gated_optimizer`. Wrap `tx` (e.g.
  `with_state_dtype`) before, not after: a wrapper would hide the mask from the step."""
  frozen = jax.tree.map(bool, frozen)
  inner = optax.with_extra_args_support(tx)

  def init(params):
    return inner.init(_holes(params, frozen)[0])

  def update(updates, state, params=None, **extra):
    live = None if params is None else _holes(params, frozen)[0]
    new, state = inner.update(_holes(updates, frozen)[0], state, live, **extra)
    return _holes(jax.tree.map(jnp.zeros_like, updates), frozen)[1](new), state

  return StaticFreeze(init, update, inner, frozen)


def _static_part(tx, trained):
  """(the transformation the step updates with, the leaves it differentiates, fill: those
  leaves -> the whole trained part): a `static_freeze` tx's trained leaves, else all."""
  if isinstance(tx, StaticFreeze):
    return (tx.inner, *_holes(trained, tx.frozen))
  return tx, trained, lambda live: live


def loss_sums(cfg: model_lib.Config, params, batch, dropout_rng=None) -> tuple[jax.Array, jax.Array]:
  """(sum of masked token cross-entropies, number of masked tokens) of plain or composite
  params (xlt.composite); with `dropout_rng`, the model's dropout is on (training)."""
  tokens_BxT = batch["tokens"]
  logits_BxTxV, _ = composite.apply(cfg, params, tokens_BxT[:, :-1], dropout_rng)
  ce_BxT = cross_entropy.tokens(logits_BxTxV, tokens_BxT[:, 1:], cross_entropy.residual_dtype(cfg))
  mask_BxT = batch["loss_mask"]
  return (ce_BxT * mask_BxT).sum(), mask_BxT.sum()


def _grad_sums(cfg, params, batch, accum: int, rebuild=lambda p: p, dropout_rng=None):
  """(sum of masked token losses, their count, the sum's gradient with respect to `params`;
  the model is `rebuild(params)`); with `accum` > 1 the batch is split into micro-batches under
  `lax.scan` (same result, a fraction of the activation memory; each micro-batch its own
  dropout masks)."""

  def sums(p, b, rng):
    return loss_sums(cfg, rebuild(p), b, rng)

  grad_fn = jax.value_and_grad(sums, has_aux=True)
  if accum == 1:
    (total, count), g = grad_fn(params, batch, dropout_rng)
    return total, count, g
  micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)
  rngs = None if dropout_rng is None else jax.random.split(dropout_rng, accum)

  def body(carry, xs):
    (t, n), g = grad_fn(params, *xs)
    return jax.tree.map(jnp.add, carry, (t, n, g)), None

  zeros = (jnp.zeros(()), jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
  return jax.lax.scan(body, zeros, (micro, rngs))[0]


def _mean(total, count, grads):
  """(mean masked loss, its gradient) from `_grad_sums`."""
  count = jnp.maximum(count, 1.0)
  return total / count, jax.tree.map(lambda x: x / count, grads)


def member_grads(state: State, batch, *, cfg, tx, accum: int = 1):
  """One member's (sum of masked token losses, their count, the sum's gradients): with respect
  to the trained part (composite.split), and with a `static_freeze` tx to its trained leaves
  only. Sums, not means: `apply_grads` divides them, so that under a vmapped update the division
  fuses into the clip's and Adam's reads instead of being one more pass over every gradient."""
  batch = {k: batch[k] for k in ("tokens", "loss_mask")}
  trained, rebuild, _ = composite.split(state["params"])
  _, live, fill = _static_part(tx, trained)
  # dropout masks from the member's key and the step: the same on a resumed run
  rng = (jax.random.fold_in(jax.random.wrap_key_data(state["dropout_key"]), state["step"])
         if "dropout_key" in state else None)
  return _grad_sums(cfg, live, batch, accum, lambda p: rebuild(fill(p)), rng)


def apply_grads(state: State, batch, sums, *, tx):
  """One member's optimizer update from `member_grads`' sums: the new state and the step's
  metrics. A batch with `trainable` flags (partition training) passes them to the gated
  optimizer; with a `static_freeze` tx the frozen leaves pass through untouched."""
  loss, grads = _mean(*sums)
  extra = {"trainable": batch["trainable"]} if "trainable" in batch else {}
  trained, rebuild, more = composite.split(state["params"])
  tx, live, fill = _static_part(tx, trained)
  updates, opt_state = tx.update(grads, state["opt_state"], live, **extra, **more)
  new = {**state, "step": state["step"] + 1, "params": rebuild(fill(optax.apply_updates(live, updates))),
         "opt_state": opt_state}
  return new, {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def train_step(state: State, batch, *, cfg, tx, accum: int = 1):
  """One model's step. (Members that stopped early never reach it: the loop drops them
  from the ensemble, and `active` only records which ones still train.) A batch with
  `trainable` flags (partition training) passes them to the gated optimizer. With a
  `static_freeze` tx only the trained leaves are differentiated (grad_norm is theirs) and the
  frozen ones pass through untouched."""
  return apply_grads(state, batch, member_grads(state, batch, cfg=cfg, tx=tx, accum=accum), tx=tx)


def ensemble_step(state: State, batch, *, cfg, tx, accum: int = 1, strategy: str = "map", update: str = "map"):
  """`train_step` over the stacked members [E, ...], computed as `strategy` says
  (xlt.ensemble). Under "map", `update` says where the optimizer's update runs: "map", in the
  map with the gradients, or "vmap", vmapped over the whole stacked state after it (the
  gradients per member as before; the same values to float rounding: XLA simplifies the mean's
  and the clip's scalar divisions differently). "auto" vmaps it, except for a gated optimizer
  (a batch with `trainable` flags), whose per-cell `lax.cond` would become a select computing
  both branches. The default is "map": the committed experiments' results are reproduced bit
  for bit, and training amplifies a rounding difference into another model (docs/testbed.md,
  "A base trained again is another base"); `train.update="auto"` opts in.

  Why: with the update in the map XLA:CPU fused Adam's update so that each parameter's
  fusion recomputed the new moments from the old ones, and copied every leaf's old moments
  and new parameters each step (the small Llama's full step: 171 parameter-sized copies; one
  member too, where the map is inlined), where on the stacked arrays each moment and parameter
  is updated in place by one fusion (tests/test_train.py counts the copies). The loss sums are
  divided in the update (`apply_grads`): dividing before the forward pass made some LoRA and
  frozen-partition steps slower in wall time (docs/speed.md)."""
  if update not in ("auto", "map", "vmap"):
    raise ValueError(f"update {update!r}; expected auto, map or vmap")
  if strategy != "map" or update == "map" or (update == "auto" and "trainable" in batch):
    return ensemble_lib.over_members(functools.partial(train_step, cfg=cfg, tx=tx, accum=accum), strategy)(state, batch)
  sums = ensemble_lib.over_members(functools.partial(member_grads, cfg=cfg, tx=tx, accum=accum), strategy)(state, batch)
  return jax.vmap(functools.partial(apply_grads, tx=tx))(state, batch, sums)


def init_state(cfg: model_lib.Config, tx, seeds, params=None) -> State:
  """Stacked train state for one model per seed, initialised at random or, when `params`
  (stacked [E, ...]) are given, from them (fine-tuning)."""

  def one(seed, params):
    if params is None:
      params = model_lib.init_params(cfg, jax.random.key(seed))
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(composite.split(params)[0]),
             "active": jnp.ones((), bool)}
    if cfg.dropout > 0:  # raw key data (uint32), which checkpoints store as any array
      state["dropout_key"] = jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1))
    return state

  return jax.vmap(one)(jnp.asarray(seeds, jnp.uint32), params)


def state_shardings(cfg: model_lib.Config, tx, mesh, rules, abstract_state):
  """Shardings for the stacked state: parameter-shaped optimizer leaves follow the
  parameter's sharding, everything else is replicated."""
  rep = sharding.replicated(mesh)
  params = abstract_state["params"]
  param_sh = composite.shardings(params, sharding.param_shardings(model_lib.logical_axes(cfg), mesh, rules), rep)
  sharding.check_divisible(params, param_sh)
  # optax states hold parameter-shaped copies (Adam's mu and nu, also inside the masked
  # states of a partitioned optimizer) whose key path ends with the parameter's path: those
  # follow the parameter's sharding; counts and other leaves are replicated. The optimizer
  # sees a composite's trained part (composite.split), whose paths differ from the whole's.
  by_path = {}
  for tree, sh in ((params, param_sh), (composite.split(params)[0], composite.split(param_sh)[0])):
    by_path |= {path_names(p): (x.shape, s) for (p, x), s in zip(
        jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(sh))}

  def opt_leaf(path, x):
    names = path_names(path)
    for k in range(len(names)):
      shape, sh = by_path.get(names[k:], (None, None))
      if shape == x.shape:
        return sh
    return rep

  opt_sh = jax.tree_util.tree_map_with_path(opt_leaf, abstract_state["opt_state"])
  return {"step": rep, "params": param_sh, "opt_state": opt_sh, "active": rep,
          **({"dropout_key": rep} if "dropout_key" in abstract_state else {})}


def make_step(cfg: model_lib.Config, tx, mesh, rules, abstract_state, accum: int = 1,
              gated: bool = False, strategy: str = "auto", update: str = "map"):
  """The jitted ensemble step (`ensemble_step`) with explicit in/out shardings; the state is
  donated. `strategy` (xlt.ensemble): how the members are computed; auto suits the mesh's
  platform. `update`: where a mapped step's optimizer update runs (`ensemble_step`).
  `gated`: batches carry `trainable` flags (partition.gated_optimizer). A `static_freeze` tx
  makes a step that differentiates only its trained leaves (`abstract_state` from
  `init_state` with the same tx)."""
  st_sh = state_shardings(cfg, tx, mesh, rules, abstract_state)
  strategy = ensemble_lib.resolve(strategy, mesh.devices.flat[0].platform)
  rep = sharding.replicated(mesh)
  rows = sharding.batch_sharding(mesh, 3)
  b_sh = {"tokens": rows, "loss_mask": rows}
  if gated:  # partition training: [E, cells] flags per step
    b_sh["trainable"] = rep
  step = functools.partial(ensemble_step, cfg=cfg, tx=tx, accum=accum, strategy=strategy, update=update)
  return jax.jit(step, in_shardings=(st_sh, b_sh), out_shardings=(st_sh, rep),
                 donate_argnums=0), st_sh, b_sh


def eval_loss(cfg: model_lib.Config, params, batch, strategy: str = "auto"):
  """Mean masked loss of each ensemble member on a batch [E, B, T]."""
  fn = ensemble_lib.over_members(functools.partial(loss_sums, cfg), ensemble_lib.resolve(strategy))
  total, count = fn(params, batch)
  return total / jnp.maximum(count, 1.0)
