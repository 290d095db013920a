"""Merges weighted by statistics of each expert's data: RegMean (Jin et al. 2023), RegMean++
(Nguyen et al. 2025) and Fisher merging (Matena & Raffel 2022). Each a pure function of the
registry over the experts and their statistics, given as Python-only tree options;
xlt.merge_statistics computes the statistics from forward and backward passes of xlt's model over
token batches. tests/test_merge_data_aware.py checks them by hand and against fusion-bench's
merging functions.

  grams    one {kernel path ("block_0/attn/q/kernel", or a tuple of names): G} per expert, G the
           mean Gram matrix X^T X / tokens of the inputs X that kernel saw, [in, in] in the order
           of the kernel's input axes flattened (xlt.param_paths rows: the rest of the axes)
  measure  RegMean++'s: a function of models to their grams, so it can measure the model merged
           so far (xlt.merge_data makes one from xlt.merge_statistics.grams)
  fishers  one tree per expert with the experts' structure: the diagonal (empirical) Fisher of
           each parameter, the mean squared per-example gradient of the loss
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xlt.merge import core, declare
from xlt.param_paths import XLT, Naming, path_str

_REGMEAN = "Jin et al. 2023, Dataless Knowledge Fusion by Merging Weights of Language Models (RegMean)"
_REGMEAN_PP = ("Nguyen et al. 2025, RegMean++: Enhancing Effectiveness and Generalization of Regression Mean for "
               "Model Merging")
_FISHER = "Matena & Raffel 2022, Merging Models with Fisher-Weighted Averaging"


def _by_path(grams, n: int, method: str = "regmean") -> list[dict]:
  if not isinstance(grams, (list, tuple)) or len(grams) != n:
    raise ValueError(f"{method}: grams must be one mapping per expert ({n}), got {type(grams).__name__}")
  # kept in their own dtype: each kernel's are upcast to float64 only while it is merged, since
  # every expert's Grams in float64 at once would double their memory (1 GB on 2 x 400 MiB models)
  out = [{(k if isinstance(k, str) else path_str(k)): v for k, v in dict(g).items()} for g in grams]
  if any(set(o) != set(out[0]) for o in out):
    raise ValueError(f"{method}: every expert's grams must cover the same kernels")
  return out


def _merge_leaf(path, xs, by_path: list[dict], alpha: float, naming: Naming, method: str = "regmean"):
  """One tensor's RegMean: the least-squares merge of a kernel `by_path` has Grams of, else the mean."""
  key = path_str(path)
  xs = [core.as_compute(x) for x in xs]
  if key not in by_path[0]:
    return sum(xs[1:], xs[0].copy()) / len(xs)
  rows = [naming.rows(path, x).astype(np.float64) for x in xs]  # [out, in]
  gs = [g * (alpha + (1 - alpha) * np.eye(len(g))) for g in (np.asarray(b[key], np.float64) for b in by_path)]
  if gs[0].shape != (rows[0].shape[1],) * 2:
    raise ValueError(f"{method}: {key}'s Gram matrix is {gs[0].shape}, its input has {rows[0].shape[1]} units")
  # W G = sum_i W_i G_i with G symmetric: G W^T = sum_i G_i W_i^T
  merged = np.linalg.solve(sum(gs), sum(g @ r.T for g, r in zip(gs, rows))).T
  return naming.from_rows(path, merged, xs[0].shape)


@declare.method("regmean", ("experts+",), paper=_REGMEAN, python_only=("grams",), layer_aware=True)
def regmean(experts, *, grams, alpha: float = 0.9, naming: Naming = XLT):
  """RegMean (Jin et al. 2023): each linear map merged to minimise the experts' summed squared
  output error on their own inputs, W = (sum_i W_i G_i) (sum_i G_i)^-1 in the [out, in] view, G_i
  expert i's Gram matrix of that map's inputs; every other tensor is the experts' mean.

  grams: one mapping per expert from a kernel's path to its inputs' Gram matrix [in, in] (see
    the module docstring; xlt.merge_statistics.grams computes them); Python only.
  alpha: in [0, 1], the scale of each Gram matrix's off-diagonal entries (the paper's alpha,
    which it tunes; 1 is the exact least-squares merge, 0 a per-input-unit weighted mean); 0.9.
  naming: where each kernel's rows (output units) are.
  """
  experts = core.expert_list(experts)
  core.check_range("regmean alpha", alpha, 0.0, 1.0)
  by_path = _by_path(grams, len(experts))

  def merge(path, xs):
    return _merge_leaf(path, xs, by_path, alpha, naming)

  return core.over_leaves(merge, {"experts": experts}, lists=("experts",))


def _stage(naming: Naming, path, num_blocks: int) -> int:
  """Where a tensor is in the order the model runs: 0 the embedding (and anything else outside
  the blocks but the head), b + 1 block b, num_blocks + 1 the head (final norm, lm_head)."""
  block, kind = naming.block_kind(path)
  if block is not None:
    return block + 1
  return num_blocks + 1 if kind == "head" else 0


@declare.method("regmean_plusplus", ("experts+",), paper=_REGMEAN_PP, python_only=("measure",), layer_aware=True)
def regmean_plusplus(experts, *, measure, alpha: float = 0.9, naming: Naming = XLT):
  """RegMean++ (Nguyen et al. 2025): RegMean stage by stage in the order the model runs (the
  embedding, each block, the head), each expert's Gram matrices of a stage's inputs measured on
  the model merged so far: expert i's data through the merged stages before, then its own stage,
  so each merge sees the inputs the merged model gives it, not the expert's own (RegMean's).

  measure: measure(models, paths) -> grams: one model per expert (the merged stages before this
    one, expert i's own from it on) to one mapping per expert, as regmean's grams, of the
    kernels among `paths` (this stage's, as strings) that it measures, each from expert i's data
    through models[i] (xlt.merge_data builds it on xlt.merge_statistics.grams); Python only.
  alpha: in [0, 1], the scale of each Gram matrix's off-diagonal entries, as regmean's
    (fusion-bench's reduce_non_diagonal_ratio: 0.95 in its config); 0.9.
  naming: where each kernel's rows are, and the blocks (the stages).
  """
  experts = core.expert_list(experts)
  core.check_range("regmean_plusplus alpha", alpha, 0.0, 1.0)
  core.check_compatible(experts, [f"expert {i}" for i in range(len(experts))])
  flat = [dict(core.leaves_with_paths(e)) for e in experts]
  num_blocks = 1 + max((b for b in (naming.block_kind(p)[0] for p in flat[0]) if b is not None), default=-1)
  stage = {p: _stage(naming, p, num_blocks) for p in flat[0]}
  merged: dict = {}
  for s in sorted(set(stage.values())):
    here = [p for p in flat[0] if stage[p] == s]
    models = [core.map_leaves(lambda p, x, s=s: merged[p] if stage[p] < s else x, e) for e in experts]
    by_path = _by_path(measure(models, [path_str(p) for p in here]), len(experts), "regmean_plusplus")
    if outside := sorted(set(by_path[0]) - {path_str(p) for p in here}):
      raise ValueError(f"regmean_plusplus: measure gave grams of {outside[0]}, outside the stage it was asked for")
    for p in here:  # in the expert's dtype, as the merged model the next stage measures holds it
      merged[p] = np.asarray(_merge_leaf(p, [f[p] for f in flat], by_path, alpha, naming, "regmean_plusplus"),
                             core.dtype_of(flat[0][p]))
  return core.map_leaves(lambda p, x: merged[p], experts[0])


@declare.method("fisher", ("experts+",), paper=_FISHER, python_only=("fishers",))
def fisher(experts, *, fishers, weights: Sequence[float] | None = None, normalize: bool = False,
           eps: float = 1e-6, naming: Naming = XLT):
  """Fisher merging (Matena & Raffel 2022): each parameter the experts' mean weighted by their
  diagonal Fisher information, sum_i w_i (F_i + eps) theta_i / sum_i w_i (F_i + eps).

  fishers: one tree per expert, the experts' structure, of each parameter's diagonal Fisher
    (xlt.merge_statistics.diagonal_fisher computes them); Python only.
  weights: one weight per expert (the paper's lambda_i); None = equal.
  normalize: also weight expert i by 1 / |F_i| (the L2 norm of its whole Fisher), normalised
    over the experts: fusion-bench's default, not the paper's (False).
  eps: added to every Fisher entry (fusion-bench's minimal_fisher_weight), so an entry no
    expert's data reaches takes the plain mean.
  naming: unused (entries are independent); accepted so every merge has the same keywords.
  """
  experts = core.expert_list(experts)
  if not isinstance(fishers, (list, tuple)) or len(fishers) != len(experts):
    raise ValueError(f"fisher: fishers must be one tree per expert ({len(experts)})")
  w = np.asarray(core.per_expert(1.0 if weights is None else weights, len(experts), "fisher weights"))
  flat = [dict(core.leaves_with_paths(f)) for f in fishers]
  if normalize:
    norms = np.array([np.sqrt(sum(float(np.sum(np.square(x, dtype=np.float64))) for x in f.values())) for f in flat])
    inverse = 1.0 / (norms + eps)
    w = w * inverse / inverse.sum()

  def merge(path, xs):
    if any(path not in f for f in flat):
      raise ValueError(f"fisher: no Fisher for {path_str(path)} in every expert's fishers")
    fs = [np.asarray(f[path], np.float64) + eps for f in flat]
    num = sum(wi * f * core.as_compute(x) for wi, f, x in zip(w, fs, xs))
    return num / sum(wi * f for wi, f in zip(w, fs))

  return core.over_leaves(merge, {"experts": experts}, lists=("experts",))
