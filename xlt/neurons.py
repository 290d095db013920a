"""Neuron-level masks: training and merging selected rows (or any entries) inside tensors,
not only whole tensors, e.g. MAET's key neurons (Chen et al., eq. 1).

A *mask tree* has the parameters' structure; each leaf is a bool (the whole tensor or
none of it), a bool per row ([num_rows]: output units, `xlt.param_paths`'s rows) or a
bool per entry (the leaf's shape: any rows or columns). `expand` turns one into per-entry
masks and rejects a leaf whose shape fits neither its tensor nor its rows.

Training with a mask: the ensemble trains the *neuron composite* {"params": params,
"neuron_mask": per-entry masks} (one of xlt.composite's kinds), so every member carries its
own mask (the train step hands it to the optimizer; the loss runs the params), under
`masked(tx)`: the gradient is zeroed off the mask before `tx` (a clip sees only selected
entries), the update is zero off the mask (no weight decay there either), and every
optimizer-state leaf shaped like a parameter keeps its old value off the mask. Unselected
entries and their Adam moments stay bit for bit; only shared scalars (Adam's step count)
advance. The merge functions take the same trees (`masks=` of task_arithmetic, ties, dare;
`ability_neurons=`, `source_neurons=` of maet).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xlt import model as model_lib
from xlt import merge
from xlt.param_paths import XLT, Naming, path_names

MASK_KEY = "neuron_mask"


def expand(masks, params, naming: Naming = XLT):
  """Per-entry bool masks (numpy) with the structure and shapes of `params`."""
  flat = merge.masked_leaves(masks, params)
  return merge.map_leaves(lambda p, x: merge.leaf_mask(p, flat[p], np.shape(x), naming), params, keep_dtype=False)


def locate(model, base, fraction: float, naming: Naming = XLT):
  """The top `fraction` of all the model's rows (neurons) by the L2 norm of their change
  from `base`, ranked over the whole model (MAET eq. 1, after a short run): a mask tree
  of per-row bools."""
  merge.check_range("neuron fraction", fraction, 0.0, 1.0, low_open=True)
  rows = merge.key_rows(jax.tree.map(np.asarray, model), jax.tree.map(np.asarray, base), fraction, naming=naming)
  return merge.map_leaves(lambda p, _: rows[p], jax.tree.map(np.asarray, base), keep_dtype=False)


def union(params, *masks, naming: Naming = XLT):
  """The per-entry union of mask trees (MAET trains its ability model on N_A u N_L0)."""
  if not masks:
    raise ValueError("union of no masks")
  full = [expand(m, params, naming) for m in masks]
  return jax.tree.map(lambda *ms: np.logical_or.reduce(ms), *full)


def count(masks) -> int:
  """Selected entries of a per-entry mask tree."""
  return int(sum(np.sum(m) for m in jax.tree.leaves(masks)))


def composite(params, masks, naming: Naming = XLT) -> dict:
  """{"params", "neuron_mask"}: what an ensemble member trains under `masked(tx)`."""
  return {"params": params, MASK_KEY: expand(masks, jax.tree.map(np.asarray, params), naming)}


def is_composite(params) -> bool:
  return isinstance(params, dict) and set(params) == {"params", MASK_KEY}


def split(composite):
  """(the trainable params, rebuild: trained params -> the composite with the same mask)."""
  mask = composite[MASK_KEY]
  return composite["params"], lambda p: {"params": p, MASK_KEY: mask}


def update_args(composite) -> dict:
  """Extra arguments of the optimizer's update: the mask, which `masked(tx)` reads."""
  return {MASK_KEY: composite[MASK_KEY]}


def apply(cfg: model_lib.Config, composite, tokens_BxT, cache=None, pos=0, dropout_rng=None):
  """The model's forward of the composite's params (the mask only steers training)."""
  return model_lib.apply(cfg, composite["params"], tokens_BxT, cache, pos, dropout_rng)


def shardings(abstract, param_shardings, replicated):
  """The composite's shardings from the model's: a mask is sharded as its parameter."""
  del abstract, replicated
  return {"params": param_shardings, MASK_KEY: param_shardings}


def base(composite):
  """The params: the model-shaped part."""
  return composite["params"]


def merged(composite):
  """One model's plain parameters: the params (the mask is not part of the model)."""
  return composite["params"]


def masked(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """`tx` restricted to the entries of the per-entry mask passed as `neuron_mask=` to
  update (the train step passes the composite's); see the module docstring."""
  tx = optax.with_extra_args_support(tx)

  def init(params):
    return tx.init(params)

  def update(updates, state, params=None, **extra):
    mask = extra.pop(MASK_KEY, None)
    if mask is None:
      raise ValueError(f"neurons.masked: update needs {MASK_KEY}= (train a neurons.composite)")
    if jax.tree.structure(mask) != jax.tree.structure(updates):
      raise ValueError("neurons.masked: the mask tree does not have the parameters' structure")
    mask = jax.tree.map(lambda m: jnp.asarray(m, bool), mask)
    grads = jax.tree.map(lambda g, m: jnp.where(m, g, jnp.zeros_like(g)), updates, mask)
    out, new_state = tx.update(grads, state, params, **extra)
    by_path = {path_names(p): m for p, m in jax.tree_util.tree_flatten_with_path(mask)[0]}

    def keep_old(path, new, old):  # a parameter-shaped state leaf ends with its parameter's path
      names = path_names(path)
      for k in range(len(names)):
        m = by_path.get(names[k:])
        if m is not None and m.shape == jnp.shape(new):
          return jnp.where(m, new, old)
      return new

    new_state = jax.tree_util.tree_map_with_path(keep_old, new_state, state)
    return jax.tree.map(lambda u, m: jnp.where(m, u, jnp.zeros_like(u)), out, mask), new_state

  return optax.GradientTransformationExtraArgs(init, update)


def describe(masks) -> str:
  """"N of M entries (x%)" of a per-entry mask tree, for logs."""
  total = sum(np.size(m) for m in jax.tree.leaves(masks))
  n = count(masks)
  return f"{n:,} of {total:,} entries ({100 * n / max(total, 1):.1f}%)"

