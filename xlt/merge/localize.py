"""Merges that first localise each task's change to a mask of entries: TALL masks and Consensus
merging (Wang et al. 2024), and Localize-and-Stitch (He et al. 2024). Each a pure function of the
registry (xlt.merge.declare); tests/test_merge_localize.py checks them on hand-made trees and the
TALL / consensus masks against fusion-bench's.

Vocabulary: tau_t = expert_t - base (a task vector); tau_MTL = sum_t tau_t (the multi-task
vector of task arithmetic); a TALL mask m_t = |tau_t| >= lambda |tau_MTL - tau_t|: the entries
where the multi-task vector is closer to expert t than the base is (scaled by lambda).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from xlt.merge import core, declare
from xlt.param_paths import XLT, Naming

_TALL = ("Wang et al. 2024, Localizing Task Information for Improved Model Merging and Compression (TALL masks, "
         "Consensus merging)")
_STITCH = "He et al. 2024, Localize-and-Stitch: Efficient Model Merging via Sparse Task Arithmetic"


def tall_masks(tvs, tall_lambda: float) -> np.ndarray:
  """The TALL masks [T, ...] of the stacked task vectors `tvs` of one tensor: |tau_t| >=
  lambda |tau_MTL - tau_t| (the paper's eq.; fusion-bench and the authors' code compare
  strictly, which differs only where both sides are equal, e.g. entries no expert changed)."""
  mtl = tvs.sum(axis=0)
  return np.abs(tvs) >= tall_lambda * np.abs(mtl - tvs)


def _tall_options(n: int, *, tall_lambda: float, scale: float, **options):
  if not tall_lambda >= 0:
    raise ValueError(f"tall_lambda must be >= 0, got {tall_lambda}")
  if not np.isfinite(scale):
    raise ValueError(f"scale must be a finite number, got {scale}")
  if "expert" in options and not 0 <= options["expert"] < n:
    raise ValueError(f"tall_mask expert must be an index among the {n} experts, got {options['expert']}")
  return {"tall_lambda": tall_lambda, "scale": scale, **options}


@declare.per_tensor("consensus", ("base", "experts+"), paper=_TALL, prepare=_tall_options)
def consensus(base, experts, *, k: int = 2, tall_lambda: float = 0.4, scale: float = 1.0):
  """Consensus merging (Wang et al. 2024): task arithmetic on the entries at least k experts'
  TALL masks keep: base + scale * (consensus mask * tau_MTL), per entry.

  Entries only one expert uses ("selfish", k = 2) and those no expert uses ("catastrophic",
  k >= 1) are dropped; k = 0 is task arithmetic with every lambda = scale.

  k: how many TALL masks must keep an entry (the paper's default 2).
  tall_lambda: the masks' lambda (the paper tunes it in [0.2, 0.6] per task; 0.4 here).
  scale: the task-arithmetic scale of the masked multi-task vector (the paper's alpha, tuned
    on validation data; 1.0 here).
  """
  b = core.as_compute(base)
  tvs = np.stack([core.as_compute(x) - b for x in experts])
  keep = tall_masks(tvs, tall_lambda).sum(axis=0) >= k
  return b + scale * np.where(keep, tvs.sum(axis=0), 0).astype(b.dtype)


@declare.per_tensor("tall_mask", ("base", "experts+"), paper=_TALL, prepare=_tall_options)
def tall_mask(base, experts, *, expert: int = 0, tall_lambda: float = 0.4, scale: float = 1.0):
  """One expert recovered from the multi-task vector by its TALL mask (Wang et al. 2024):
  base + scale * (m_expert * tau_MTL), per entry, the paper's compression: every expert is the
  one merged vector plus a binary mask.

  expert: the index of the expert to recover (0 = the first).
  tall_lambda: the mask's lambda (the paper tunes it in [0.2, 0.6] per task; 0.4 here).
  scale: the scale of the masked multi-task vector (1.0, the paper's).
  """
  b = core.as_compute(base)
  tvs = np.stack([core.as_compute(x) - b for x in experts])
  keep = tall_masks(tvs, tall_lambda)[expert]
  return b + scale * np.where(keep, tvs.sum(axis=0), 0).astype(b.dtype)


def _stitch(b, tvs, masks):
  """base + sum_t (m_t / sum_s m_s) * tau_t: each entry the mean of the masked task vectors that
  keep it (the paper's stitching; the base where none does)."""
  count = np.sum(masks, axis=0)
  total = np.sum(np.where(masks, tvs, 0), axis=0)
  return b + (total / np.maximum(count, 1)).astype(b.dtype)


def _top_masks(tvs_by_leaf: list, sparsity: float, scope: str) -> list:
  """Each expert's localised mask per leaf: its task vector's largest-magnitude `sparsity`
  fraction of entries, ranked over the whole model (scope "model", the paper's) or per tensor."""
  if scope == "tensor":
    return [np.stack([core.top_fraction_mask(np.abs(t), sparsity) for t in tvs]) for tvs in tvs_by_leaf]
  out = [np.zeros(tvs.shape, bool) for tvs in tvs_by_leaf]
  for i in range(len(tvs_by_leaf[0]) if tvs_by_leaf else 0):
    flat = np.concatenate([np.abs(tvs[i]).ravel() for tvs in tvs_by_leaf])
    keep = core.top_fraction_mask(flat, sparsity)
    start = 0
    for leaf, tvs in enumerate(tvs_by_leaf):
      out[leaf][i] = keep[start:start + tvs[i].size].reshape(tvs[i].shape)
      start += tvs[i].size
  return out


@declare.method("localize_and_stitch", ("base", "experts+"), paper=_STITCH, python_only=("losses",))
def localize_and_stitch(base, experts, *, sparsity: float = 0.01, scope: str = "model",
                        losses: Sequence[Callable] | None = None, steps: int = 20, learning_rate: float = 0.1,
                        l1: float = 1.0, naming: Naming = XLT):
  """Localize-and-Stitch (He et al. 2024): each expert's change kept only on a small mask of
  entries (localize), the masked changes added to the base, averaged where masks overlap
  (stitch).

  Localize: each expert's mask starts as the `sparsity` fraction of its task vector largest in
  magnitude (the paper's data-free variant, and its initialisation). With `losses` (one
  function of a parameter tree per expert, e.g. its loss on a few examples), the mask is then
  searched: logits S (+3 on the initial mask, -3 elsewhere) are trained with Adam (optax) for
  `steps` steps on loss_t(base + sigmoid(S) * tau_t) + l1 * mean(sigmoid(S)), and the mask is
  sigmoid(S) > 0.5 (the paper penalises the sum; the mean keeps l1 free of the model's size).
  Stitch: every entry is base + the mean of the task vectors whose masks keep it.

  sparsity: in (0, 1], the fraction of each task vector kept at first (the paper's 1%: 0.01).
  scope: rank the entries over the whole model ("model", the paper's) or within each tensor
    ("tensor").
  losses: None (data-free), or one function per expert from a parameter tree (jax arrays, the
    structure of base) to a scalar loss; Python only.
  steps: the optimisation steps of the mask search (with losses).
  learning_rate: Adam's step size on the mask logits (with losses).
  l1: the weight of the mask-size penalty (with losses).
  naming: unused (entries are ranked by magnitude); accepted so every merge has the same keywords.
  """
  core.check_range("localize_and_stitch sparsity", sparsity, 0.0, 1.0, low_open=True)
  if scope not in ("model", "tensor"):
    raise ValueError(f"localize_and_stitch scope must be 'model' or 'tensor', got {scope!r}")
  experts = core.expert_list(experts)
  if losses is not None and len(losses) != len(experts):
    raise ValueError(f"localize_and_stitch: {len(losses)} losses for {len(experts)} experts")
  flat_tvs = []  # per leaf, the experts' task vectors stacked [T, ...], in the compute dtype
  core.over_leaves(lambda _, b, xs: flat_tvs.append(np.stack([core.as_compute(x) - core.as_compute(b) for x in xs]))
                   or b, {"base": base, "experts": experts}, lists=("experts",))
  masks = _top_masks(flat_tvs, sparsity, scope)
  if losses is not None:
    masks = _search_masks(base, flat_tvs, masks, losses, steps, learning_rate, l1)
  stitched = iter([_stitch(core.as_compute(b), t, m)
                   for (_, b), t, m in zip(core.leaves_with_paths(base), flat_tvs, masks)])
  return core.map_leaves(lambda *_: next(stitched), base)


def _search_masks(base, flat_tvs, masks, losses, steps: int, learning_rate: float, l1: float) -> list:
  """The masks after the paper's search (see localize_and_stitch), expert by expert."""
  import jax
  import jax.numpy as jnp
  import optax  # only for this search: the merge library's import stays free of it

  treedef = jax.tree_util.tree_structure(base)
  base_leaves = [jnp.asarray(core.as_compute(b)) for _, b in core.leaves_with_paths(base)]
  size = sum(b.size for b in base_leaves)
  found, opt = [m.copy() for m in masks], optax.adam(learning_rate)
  for i, loss in enumerate(losses):
    tau = [jnp.asarray(t[i]) for t in flat_tvs]

    def objective(logits, tau=tau, loss=loss):
      gates = [jax.nn.sigmoid(s) for s in logits]
      params = jax.tree_util.tree_unflatten(treedef, [b + g * t for b, g, t in zip(base_leaves, gates, tau)])
      return loss(params) + l1 * sum(g.sum() for g in gates) / size

    logits = [jnp.where(m[i], 3.0, -3.0).astype(jnp.float32) for m in masks]
    state = opt.init(logits)
    step = jax.jit(lambda s, st, objective=objective: _adam_step(objective, opt, s, st))
    for _ in range(int(steps)):
      logits, state = step(logits, state)
    for leaf, s in enumerate(logits):
      found[leaf][i] = np.asarray(jax.nn.sigmoid(s)) > 0.5
  return found


def _adam_step(objective, opt, logits, state):
  import jax
  import optax
  grads = jax.grad(objective)(logits)
  updates, state = opt.update(grads, state, logits)
  return optax.apply_updates(logits, updates), state
