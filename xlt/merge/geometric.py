"""Merges that interpolate or average on the sphere, as mergekit has them: slerp, nuslerp,
multislerp, karcher, model_stock and nearswap here; arcee_fusion, ram and ramplus_tl, which
choose per entry which model's change to keep, in xlt.merge.selective. Each a pure function over
pytrees, computed tensor by tensor as mergekit computes it (its 0.1.5 source is the reference
where a method has no paper; tests/test_merge_geometric.py checks each against mergekit's output).

Conventions (mergekit's): a tensor is one vector (flattened) unless a method's option says
rows; norms, dot products and angles accumulate in float64 (mergekit: float32), which changes
results by float32 rounding only. *Rows* are output units as `naming.rows` lays them out: for
Hugging Face [out, in] weights, mergekit's vectors along the last axis; for xlt's [in, out]
kernels and GPT-2's Conv1D the same units (mergekit, reading raw axes, takes the input units
there). A list of floats for t (slerp, nearswap) is mergekit's gradient over the blocks
(`per_block`); mergekit's name filters (`filter: self_attn`) are not supported.

nuslerp and multislerp take a base or not (mergekit's optional base_model): the registry has
each under its name with a base (merging the task vectors) and as <name>_nobase (merging the
models themselves), so leaving out the base is a choice of method, never a missing input; on
the command line a `base` given to a _nobase method only draws the heatmaps (xlt.merge.tool).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import numpy as np

from xlt.merge import core, declare
from xlt.param_paths import XLT, Naming

_MERGEKIT = "Goddard et al. 2024, Arcee's MergeKit: A Toolkit for Merging Large Language Models"
_MULTISLERP = "Goddard, Multi-SLERP (blog post: goddard.blog/posts/multislerp-wow-what-a-cool-idea; mergekit's source)"
_per_block_t = lambda o: np.ndim(o.get("t", 0)) > 0  # a list of t reads the blocks
_row_wise = lambda o: not o.get("flatten", True)  # nuslerp reads rows unless it flattens


def _norm(x) -> float:
  x = np.asarray(x, np.float64)
  return float(np.sqrt(np.vdot(x, x)))


def _dot(x, y) -> float:
  return float(np.vdot(np.asarray(x, np.float64), np.asarray(y, np.float64)))


def without_base(fn):
  """fn(base, experts, ...) as a method of the models alone (base None), for the registry: the
  same options and docstring, the models its first parameter."""

  def merge(models, **options):
    return fn(None, models, **options)

  params = list(inspect.signature(fn).parameters.values())[2:]
  first = inspect.Parameter("models", inspect.Parameter.POSITIONAL_OR_KEYWORD)
  merge.__signature__ = inspect.Signature([first, *params])
  merge.__doc__, merge.__name__ = fn.__doc__, f"{fn.__name__}_nobase"
  return merge


def per_block(value, tree, naming: Naming, what: str):
  """path -> the value of a float option at that path: `value` itself, or for a list of
  floats mergekit's gradient: block i of n sits at i / (n - 1) (1 when n = 1) along the list,
  linearly interpolated between its neighbours, and every tensor outside the blocks
  (embeddings, final norm, head) takes the first value, as mergekit's planner gives them."""
  if np.ndim(value) == 0:
    constant = float(value)
    return lambda path: constant
  values = [float(v) for v in value]
  if not values:
    raise ValueError(f"{what}: an empty list of per-block values")
  blocks = [naming.block_kind(p)[0] for p, _ in core.leaves_with_paths(tree)]
  n = max((b for b in blocks if b is not None), default=-1) + 1

  def at(path) -> float:
    block = naming.block_kind(path)[0]
    position = 0.0 if block is None else (block / (n - 1) if n > 1 else 1.0)
    scaled = position * (len(values) - 1)
    i0 = int(scaled)
    i1 = min(len(values) - 1, i0 + 1)
    return (1 - (scaled - i0)) * values[i0] + (scaled - i0) * values[i1]

  return at


def _slerp_coefficients(t: float, cos, linear):
  """(c0, c1) with slerp = c0 v0 + c1 v1: sin((1-t) theta) / sin(theta) and sin(t theta) /
  sin(theta), or 1 - t and t where `linear` (float64, elementwise over cos)."""
  theta = np.arccos(np.where(linear, 0.0, cos))
  sin = np.where(linear, 1.0, np.sin(theta))
  return (np.where(linear, 1 - t, np.sin((1 - t) * theta) / sin),
          np.where(linear, t, np.sin(t * theta) / sin))


@declare.method("slerp", ("base", "other"), paper="Shoemake 1985, Animating rotation with quaternion curves",
                mergekit="slerp", layer_aware=_per_block_t, ranges={"t": (0.0, 1.0)})
def slerp(base, other, *, t: float | Sequence[float], dot_threshold: float = 0.9995, naming: Naming = XLT):
  """Spherical linear interpolation (Shoemake 1985) from the base to the other model, per tensor.

  Each tensor of either model is one vector; with theta the angle between them, the merge is
  sin((1-t) theta) / sin(theta) * base + sin(t theta) / sin(theta) * other: the arc between
  their directions, the norm following it. Where the directions are nearly parallel or
  opposite (|cos theta| > dot_threshold) it is the linear interpolation (1-t) base + t other,
  as mergekit does (norm scales, nearly equal tensors). A zero vector's norm counts as 1.

  t: 0 gives the base, 1 the other model (mergekit's `t`, required as there); or a list of
    floats, mergekit's gradient over the blocks (`per_block`: block i of n at i / (n - 1)
    along it; embeddings, final norm and head take the first value).
  dot_threshold: |cos theta| above which the lerp is used (mergekit's fixed 0.9995).
  naming: finds each tensor's block, for a list of t values.
  """
  t_at = per_block(t, base, naming, "slerp t")

  def merge(path, a, b):
    a, b, t = core.as_compute(a), core.as_compute(b), t_at(path)
    if a.size == 0:
      return a
    na, nb = _norm(a), _norm(b)
    na, nb = (na if na > 1e-8 else 1.0), (nb if nb > 1e-8 else 1.0)
    cos = float(np.clip(_dot(a, b) / (na * nb), -1.0, 1.0))
    c0, c1 = _slerp_coefficients(t, cos, abs(cos) > dot_threshold)
    return float(c0) * a + float(c1) * b

  return core.over_leaves(merge, {"base": base, "other": other})


def _nuslerp_leaf(t, v0, v1, path, row_wise: bool, flatten: bool, naming: Naming):
  """mergekit's nuslerp of two tensors: slerp of each vector (the whole tensor, its rows or
  its columns) with a lerp where they are exactly colinear."""
  shape = v0.shape
  if flatten or v0.ndim < 2:
    x, y = v0.reshape(1, -1), v1.reshape(1, -1)
  else:
    x, y = naming.rows(path, v0), naming.rows(path, v1)
    x, y = (x.T, y.T) if row_wise else (x, y)
  rows64 = lambda u, w: np.einsum("ij,ij->i", u, w, dtype=np.float64)
  nx, ny = np.sqrt(rows64(x, x)), np.sqrt(rows64(y, y))
  cos = np.clip(rows64(x, y) / (np.maximum(nx, 1e-7) * np.maximum(ny, 1e-7)), -1.0, 1.0)
  c0, c1 = _slerp_coefficients(t, cos, (1 - cos ** 2) <= 1e-16)
  out = c0[:, None].astype(x.dtype) * x + c1[:, None].astype(x.dtype) * y
  if flatten or v0.ndim < 2:
    return out.reshape(shape)
  return naming.from_rows(path, out.T if row_wise else out, shape)


@declare.method("nuslerp", ("base", "experts+"), paper=f"{_MERGEKIT} (nuslerp: mergekit's source)",
                mergekit="nuslerp", layer_aware=_row_wise)
def nuslerp(base, experts, *, weights: Sequence[float], row_wise: bool = False, flatten: bool = True,
            naming: Naming = XLT):
  """NuSLERP (mergekit's "nuslerp"): the slerp of two models' task vectors, or of the models
  themselves when base is None, per tensor, per row or per column.

  It interpolates at t = weights[1] / (weights[0] + weights[1]) (0.5 when the sum is 0); with a
  base the merge is base + slerp(t, expert_0 - base, expert_1 - base). Unlike `slerp`
  there is no dot threshold: only exactly colinear vectors are lerped, as in mergekit. The
  `_nobase` registry entry calls it with base None.

  weights: two relative weights, one per expert (mergekit's per-model `weight`, required).
  row_wise: with flatten False, slerp each column (input unit) instead of each row (output unit,
    `naming.rows`); mergekit's `nuslerp_row_wise` (its "rows" are the vectors along axis 0).
  flatten: slerp each tensor as one vector (mergekit's `nuslerp_flatten`, default true); 1-D
    tensors are one vector either way.
  naming: where the rows of each tensor are, for flatten False.
  """
  experts = core.expert_list(experts)
  if len(experts) != 2:
    raise ValueError(f"nuslerp merges exactly two models, got {len(experts)}")
  w = core.per_expert(weights, 2, "nuslerp weights")
  t = 0.5 if abs(w[0] + w[1]) < 1e-6 else w[1] / (w[0] + w[1])

  def merge(path, b, xs):
    xs = [core.as_compute(x) for x in xs]
    if b is None:
      return _nuslerp_leaf(t, xs[0], xs[1], path, row_wise, flatten, naming)
    b = core.as_compute(b)
    return b + _nuslerp_leaf(t, xs[0] - b, xs[1] - b, path, row_wise, flatten, naming)

  return core.over_leaves(merge, {"base": base, "experts": experts}, lists=("experts",))

# without a base: a choice of method, never a missing input (the module docstring)
declare.register("nuslerp_nobase", without_base(nuslerp), ("models+",), f"{_MERGEKIT} (nuslerp: mergekit's source)",
                 mergekit="nuslerp", layer_aware=_row_wise)



def _multislerp_leaf(xs, weights, eps: float):
  """mergekit's multislerp of the vectors xs (tensors of one shape)."""
  norms = np.array([_norm(x) for x in xs])
  units = [x / np.asarray(n + eps, x.dtype) for x, n in zip(xs, norms)]
  mean = sum(w * u for w, u in zip(weights, units))
  mean_norm = _norm(mean)
  if mean_norm < eps:
    if len(xs) == 2:
      return weights[0] * xs[0] + weights[1] * xs[1]
    raise ValueError("multislerp: the weighted sum of the unit tensors is zero (antipodal tensors whose "
                     "weights balance out); change the weights")
  mean = mean / np.asarray(mean_norm, mean.dtype)
  tangent = sum(w * (u - _dot(u, mean) * mean) for w, u in zip(weights, units))
  tn = _norm(tangent) + eps
  out = math.cos(tn) * mean + tangent * (math.sin(tn) / tn)
  return out * float(np.dot(norms, weights))


@declare.method("multislerp", ("base", "experts+"), paper=_MULTISLERP, mergekit="multislerp")
def multislerp(base, experts, *, weights: float | Sequence[float], normalize_weights: bool = True,
               eps: float = 1e-8, naming: Naming = XLT):
  """Multi-SLERP (Goddard, mergekit's "multislerp"): a weighted barycentre on the sphere of any
  number of models (of their task vectors, with a base), per tensor.

  Each tensor (its delta to the base when there is one) is projected to the unit sphere; their
  weighted mean direction m is the tangent point; the weighted mean of the unit vectors'
  tangent components at m is mapped back by the exponential map and scaled by the weighted
  mean norm. One model gives that model; two models whose weighted unit mean is zero give
  their weighted sum; more such models are a ValueError (as in mergekit). The `_nobase`
  registry entry calls it with base None.

  weights: one weight per model, or one for all (mergekit's per-model `weight`, required).
  normalize_weights: divide the weights by their sum first (mergekit's default, true); false
    keeps them, so the result's norm is their weighted sum of norms.
  eps: added to the norms before dividing by them (mergekit's 1e-8).
  naming: unused (each tensor is one vector); accepted so every merge has the same keywords.
  """
  experts = core.expert_list(experts)
  w = core.per_expert(weights, len(experts), "multislerp weights")
  if normalize_weights and sum(w) == 0:
    raise ValueError(f"multislerp weights {w} sum to 0: they cannot be normalised")
  w = [x / sum(w) for x in w] if normalize_weights else w

  def merge(_, b, xs):
    if len(xs) == 1:
      return xs[0]
    xs = [core.as_compute(x) for x in xs]
    if b is None:
      return _multislerp_leaf(xs, w, eps)
    b = core.as_compute(b)
    return b + _multislerp_leaf([x - b for x in xs], w, eps)

  return core.over_leaves(merge, {"base": base, "experts": experts}, lists=("experts",))

declare.register("multislerp_nobase", without_base(multislerp), ("models+",), _MULTISLERP, mergekit="multislerp")



def _karcher_leaf(xs, alphas, max_iter: int, tol: float):
  """mergekit's weighted Karcher mean of the tensors xs on the unit sphere, times the
  alpha-weighted mean norm."""
  norms = [_norm(x) for x in xs]
  valid = [i for i, n in enumerate(norms) if n > tol]
  if not valid:
    return np.zeros_like(xs[0])
  units = [xs[i] / np.asarray(norms[i], xs[i].dtype) for i in valid]
  a = [alphas[i] / sum(alphas[i] for i in valid) for i in valid]
  mean = sum(w * u for w, u in zip(a, units))
  mean_norm = _norm(mean)
  mean = units[0].copy() if mean_norm < tol else mean / np.asarray(mean_norm, mean.dtype)
  for _ in range(max_iter):
    tangent = np.zeros_like(mean)
    for w, u in zip(a, units):
      cos = float(np.clip(_dot(mean, u), -1.0, 1.0))
      theta = math.acos(cos)
      if theta >= tol:
        tangent += (w * theta / math.sin(theta)) * (u - cos * mean)
    tn = _norm(tangent)
    if tn < tol:
      break
    mean = math.cos(tn) * mean + math.sin(tn) * (tangent / tn)
    unit_norm = _norm(mean)
    mean = mean / unit_norm if unit_norm > tol else mean
  return mean * float(sum(w * n for w, n in zip(alphas, norms)))


def _karcher_weights(n: int, *, weights, max_iter, tol):
  w = core.per_expert(1.0 if weights is None else weights, n, "karcher weights")
  if min(w) < 0 or sum(w) <= 0:
    raise ValueError(f"karcher weights must be non-negative with a positive sum, got {w}")
  return {"weights": [x / sum(w) for x in w], "max_iter": max_iter, "tol": tol}


@declare.per_tensor("karcher", ("models+",), mergekit="karcher", prepare=_karcher_weights,
                    paper="Karcher 1977, Riemannian center of mass and mollifier smoothing (mergekit cites "
                    "arXiv:2603.04972)")
def karcher(models, *, weights: Sequence[float] | None = None, max_iter: int = 10, tol: float = 1e-5):
  """The Karcher mean (Karcher 1977; mergekit's "karcher"): the weighted Riemannian centre of the
  models' directions on the unit sphere, per tensor, scaled by their weighted mean norm.

  Each tensor is one vector. From the normalised weighted mean direction, each step moves along
  the weighted mean of the log maps (theta / sin(theta) (u - cos(theta) mean)) of the unit
  vectors, until that step is shorter than tol or after max_iter steps. Tensors of norm <= tol
  take no part in the direction; all zero gives zeros. Identical models give that model.

  weights: one weight per model (normalised to sum to 1); None = uniform, as mergekit (which
    has no weights: an xlt extension).
  max_iter: the most steps of the iteration (mergekit's default 10).
  tol: the step length at which it stops, the angle below which a model counts as at the mean,
    and the norm below which a tensor is left out (mergekit's default 1e-5).
  naming: unused (each tensor is one vector); accepted so every merge has the same keywords.
  """
  if len(models) == 1:
    return models[0]
  return _karcher_leaf([core.as_compute(x) for x in models], weights, max_iter, tol)


def _two_experts(n: int, **options):
  if n < 2:
    raise ValueError(f"model_stock needs at least two experts besides the base, got {n}")
  return options


@declare.per_tensor("model_stock", ("base", "experts+"), mergekit="model_stock", prepare=_two_experts,
                    layer_aware=lambda o: bool(o.get("filter_wise", False)),
                    paper="Jang et al. 2024, Model Stock: All we need is just a few fine-tuned models")
def model_stock(base, experts, *, filter_wise: bool = False, path=None, naming: Naming = XLT):
  """Model Stock (Jang et al. 2024): the experts' average pulled toward the base by how much their
  task vectors agree, per tensor (or per row).

  With N >= 2 experts and cos the mean cosine between their task vectors (expert_i - base, over
  all pairs), t = N cos / (1 + (N - 1) cos) and the merge is t * mean(experts) + (1 - t) * base:
  experts that agree keep their average, orthogonal ones fall back toward the base. Where
  1 + (N - 1) cos is ~0 (|.| < 1e-6) the base is kept (mergekit's choice: no finite estimate).
  Norm products are clamped at 1e-6 (mergekit's).

  filter_wise: one t per row (output unit, `naming.rows`; mergekit's `filter_wise`, rows along
    the last axis) instead of one per tensor; 1-D tensors are one row either way.
  naming: where the rows of each tensor are, for filter_wise.
  """
  b, xs, n = core.as_compute(base), [core.as_compute(x) for x in experts], len(experts)
  rows = (lambda x: naming.rows(path, x)) if filter_wise else (lambda x: x.reshape(1, -1))
  offsets = [rows(x) - rows(b) for x in xs]
  rows64 = lambda u, v: np.einsum("ij,ij->i", u, v, dtype=np.float64)
  norms = [np.sqrt(rows64(o, o)) for o in offsets]
  cos = np.mean([np.clip(rows64(offsets[i], offsets[j]) / np.maximum(norms[i] * norms[j], 1e-6), -1, 1)
                 for i in range(n) for j in range(i + 1, n)], axis=0)
  denominator = 1 + (n - 1) * cos
  singular = np.abs(denominator) < 1e-6
  t = np.where(singular, 0.0, n * cos / np.where(singular, 1.0, denominator))[:, None].astype(b.dtype)
  average = sum(rows(x) for x in xs) / np.asarray(n, b.dtype)
  out = t * average + (1 - t) * rows(b)
  return naming.from_rows(path, out, b.shape) if filter_wise else out.reshape(b.shape)


@declare.method("nearswap", ("base", "other"), mergekit="nearswap", layer_aware=_per_block_t,
                paper="alchemonaut 2024, QuartetAnemoi-70B-t0.0001 (huggingface.co/alchemonaut), nearswap")
def nearswap(base, other, *, t: float | Sequence[float], naming: Naming = XLT):
  """NearSwap (alchemonaut 2024, mergekit's "nearswap"): the other model's value where it is near
  the base's, the base's where the two are far apart, per entry.

  With d = |base - other| per entry, the merge is w * other + (1 - w) * base with
  w = clip(t / max(d, 1e-6), 0, 1): entries closer than t take the other model's value,
  farther ones move toward it by t / d (an absolute step of t).

  t: the distance below which an entry is swapped whole (mergekit's `t`, required), in the
    weights' units; or a list of floats over the blocks (as slerp's t: `per_block`).
  naming: finds each tensor's block, for a list of t values.
  """
  t_at = per_block(t, base, naming, "nearswap t")

  def merge(path, a, b):
    a, b = core.as_compute(a), core.as_compute(b)
    w = np.clip(t_at(path) / np.maximum(np.abs(a - b), np.asarray(1e-6, a.dtype)), 0, 1).astype(a.dtype)
    return w * b + (1 - w) * a

  return core.over_leaves(merge, {"base": base, "other": other})

