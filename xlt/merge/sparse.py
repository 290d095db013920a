"""Sparsifying merges of task vectors beyond TIES and DARE, as mergekit has them (dare_ties,
breadcrumbs, breadcrumbs_ties, della, della_linear, sce): each a pure function over pytrees.

All but SCE are mergekit's *generalized task arithmetic* (`_gta`), per tensor:

  d_i   = sparsify_i(expert_i - base)            each method its own sparsifier
  d_i  *= weight_i
  keep  = sign(d_i) == elected sign              consensus methods only ("ties" in the name,
          elected = + where sum_i d_i >= 0       and della): zero entries never agree
  mixed = sum_i keep * d_i
  mixed /= sum_i keep * weight_i                 when normalize (1 where that sum is 0; without
                                                 consensus: sum_i weight_i, 1 if |.| < 1e-8)
  out   = base + scale * mixed

with mergekit's defaults for normalize and rescale per method, its keep counts (floor:
int(density * size)), and its rescale (rescale: true multiplies a sparsified tensor by
|delta|_1 / |sparsified|_1). Where xlt differs it says so in the method's docstring.
Vocabulary: `weights` is mergekit's per-model `weight` (xlt's ties and dare call theirs
`lambdas`: there no normalize divides them out); `scale` is mergekit's `lambda`; `density`
is the fraction of each delta kept, per model.

Random sparsifiers (dare_ties, della) draw their masks from `seed` with `combine.dare_mask`
(expert i, the leaf's path), so dare_ties and dare with the same seed and density share masks;
mergekit draws from torch's global generator, so its results equal xlt's only when handed
the same masks (tests/test_merge_sparse.py does that).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np

from xlt.merge import combine, core, declare
from xlt.param_paths import XLT, Naming

_YU = "Yu et al. 2024, DARE: Language Models are Super Mario: Absorbing Abilities from Homologous Models as a Free Lunch"
_YADAV = "Yadav et al. 2023, TIES-Merging: Resolving Interference When Merging Models"
_DAVARI = "Davari & Belilovsky 2023, Model Breadcrumbs: Scaling Multi-Task Model Merging with Sparse Masks"
_DEEP = "Deep et al. 2024, DELLA-Merging: Reducing Interference in Model Merging through Magnitude-Based Sampling"

_OPTIONS = {  # help of the options several methods share, appended to their docstrings by _document
    "weights": """weights: the weight of each expert's sparsified delta, one float for all or one
  per expert (mergekit's per-model `weight`, which mergekit requires; 1 here).""",
    "normalize": """normalize: divide the merged delta by the sum of the weights of the experts
  that contribute to each entry (with consensus: those that agree with the elected sign).""",
    "scale": """scale: multiplies the merged delta, after normalize (mergekit's `lambda`).""",
    "seed": """seed: the masks' seed, a non-negative integer (the same seed draws the same masks, as
  combine.dare_mask does for dare).""",
    "masks": """masks: neuron masks restricting each delta before sparsifying (as in task_arithmetic).""",
    "naming": """naming: how rows are laid out, for row masks (and DELLA's per-row ranks).""",
    "breadcrumbs": """density: in (0, 1], the fraction of each delta kept, one for all or one per
  expert: int(density * size) entries just below the outliers (mergekit's `density`; xlt's
  default 0.1 keeps 10%; mergekit's default 1.0 keeps everything, outliers included).
gamma: in [0, 1), the fraction of each delta's largest-magnitude entries dropped as
  outliers, one for all or one per expert (mergekit's `gamma`, default 0.01).
rescale: True or "l1" (each sparsified tensor times |delta|_1 / |kept|_1, as mergekit's
  rescale), False or "none" (default, as mergekit's).""",
    "della": """density: in (0, 1], the mean fraction of each delta kept, one for all or one
  per expert (mergekit's `density`; xlt's default 0.5; mergekit's 1.0 keeps everything).
epsilon: the spread of the keep probabilities, from density - epsilon (smallest entry) to
  density + epsilon (largest), both in (0, 1), one for all or one per expert (mergekit's
  `epsilon`, default 0.15).
rescale: True or "l1" (mergekit's default: each sparsified tensor times |delta|_1 /
  |kept|_1), "inverse" (the paper's: each survivor times 1 / its keep probability),
  False or "none".""",
}


def _document(*options: str):
  """A decorator appending the help of `options` (keys of _OPTIONS) to the function's
  docstring, where its declaration (below it: applied first) reads each option's help."""
  def document(fn):
    fn.__doc__ = "\n".join([inspect.cleandoc(fn.__doc__), *(_OPTIONS[o] for o in options)])
    return fn
  return document


def _rescale_mode(rescale, what: str, random: bool) -> str:
  """True / "l1" (mergekit's), False / "none", or (random sparsifiers) "inverse"."""
  mode = ("l1" if rescale else "none") if isinstance(rescale, bool) else rescale
  allowed = ("l1", "none", "inverse") if random else ("l1", "none")
  if mode not in allowed:
    raise ValueError(f"{what} rescale must be True, False or one of {', '.join(allowed)}; got {rescale!r}")
  return mode


def _fractions(values, n: int, what: str, low: float, high: float, **open_ends) -> list[float]:
  values = core.per_expert(values, n, what)
  for v in values:
    core.check_range(what, v, low, high, **open_ends)
  return values


def _gta(base, experts, sparsify, weights, *, consensus: bool, normalize: bool, scale: float, masks,
         naming: Naming, what: str):
  """mergekit's generalized task arithmetic (see the module docstring): `sparsify(i, path,
  delta)` sparsifies expert i's delta of one leaf."""
  weights = core.per_expert(weights, len(core.expert_list(experts)), f"{what} weights")
  if not np.isfinite(scale):
    raise ValueError(f"{what} scale must be a finite number, got {scale}")

  def merge(path, b, xs):
    b = core.as_compute(b)
    deltas = np.stack([w * sparsify(i, path, core.as_compute(x) - b) for i, (w, x) in enumerate(zip(weights, xs))])
    per_entry = np.reshape(np.asarray(weights, b.dtype), (-1,) + (1,) * b.ndim)
    if consensus:
      elected = np.where(deltas.sum(axis=0, dtype=np.float64) >= 0, 1, -1)
      agree = np.sign(deltas) == elected  # a zero entry has sign 0: never agrees
      mixed = np.where(agree, deltas, 0).sum(axis=0)
      divisor = np.where(agree, per_entry, 0).sum(axis=0)
      divisor = np.where(divisor == 0, 1, divisor)
    else:
      mixed = deltas.sum(axis=0)
      divisor = sum(weights) if abs(sum(weights)) >= 1e-8 else 1.0
    if normalize:
      mixed = mixed / divisor
    return b + (scale * mixed).astype(b.dtype)

  return core.over_leaves(merge, {"base": base, "experts": experts}, lists=("experts",), masks=masks,
                          naming=naming)


# ---- sparsifiers of one delta tensor


def outlier_mask(d, density: float, gamma: float) -> np.ndarray:
  """Breadcrumbs' mask (mergekit's `magnitude_outliers`): drop the n_top = int(gamma * size)
  entries largest in magnitude, keep the target = int(density * size) entries below them
  (fewer outliers dropped when target + n_top > size), drop the rest. Entries tied with
  either end of the kept range are kept (mergekit keeps exactly `target`, in its sort's
  order). density >= 1 keeps everything, outliers too (as mergekit)."""
  a = np.abs(np.asarray(d))
  n = a.size
  if density >= 1:
    return np.ones(a.shape, bool)
  target, top = int(density * n), int(gamma * n)
  if target == 0:
    return np.zeros(a.shape, bool)
  bottom = max(0, n - target - top)
  ordered = np.sort(a.ravel())
  return (a >= ordered[bottom]) & (a <= ordered[bottom + target - 1])


def della_keep_prob(path, d, density: float, epsilon: float, naming: Naming = XLT) -> np.ndarray:
  """DELLA's MagPrune keep probabilities (float32, d's shape): within each row (`naming.rows`:
  an output unit; a 1-D tensor is one row) entries ranked by magnitude r = 0 .. L-1 keep with
  probability density - epsilon + 2 epsilon r / (L - 1), so the smallest keeps with
  density - epsilon and the largest with density + epsilon (mergekit's `della_magprune`;
  a one-entry row keeps with `density`, where mergekit divides 0 by 0). Equal magnitudes
  rank in memory order."""
  rows = naming.rows(path, np.abs(np.asarray(d)))
  ranks = np.argsort(np.argsort(rows, axis=1, kind="stable"), axis=1).astype(np.float32)
  length = rows.shape[1]
  norm = ranks / np.float32(length - 1) if length > 1 else np.full_like(ranks, 0.5)
  probs = (density - epsilon) + norm * 2 * epsilon  # float32 arithmetic, as mergekit's
  return naming.from_rows(path, probs, np.shape(d))


def _random_sparsify(seed: int, densities, rescale: str, keep_prob):
  """A sparsify(i, path, d) that keeps each entry with keep_prob(i, path, d) (drawn by
  combine.dare_mask) and rescales the kept ones: "l1" to d's L1 norm, "inverse" by
  1 / their keep probability, "none" not at all. Density >= 1 leaves d as it is."""
  def sparsify(i, path, d):
    if densities[i] >= 1:
      return d
    p = keep_prob(i, path, d)
    keep = combine.dare_mask(seed, i, path, d.shape, 1 - p)
    if rescale == "inverse":
      return np.where(keep, d / p, 0).astype(d.dtype)
    kept = np.where(keep, d, 0).astype(d.dtype)
    return combine.l1_rescaled(d, kept) if rescale == "l1" else kept
  return sparsify


def _deterministic_sparsify(mask_of, rescale: str):
  def sparsify(i, path, d):
    kept = np.where(mask_of(i, d), d, 0).astype(d.dtype)
    return combine.l1_rescaled(d, kept) if rescale == "l1" else kept
  return sparsify


def _seed(seed, what: str) -> int:
  if int(seed) != seed or seed < 0:
    raise ValueError(f"{what} seed must be a non-negative integer, got {seed}")
  return int(seed)


# ---- the methods


@declare.method("dare_ties", ("base", "experts+"), paper=f"{_YU} + {_YADAV}", mergekit="dare_ties", trees=("masks",))
@_document("weights", "normalize", "scale", "seed", "masks", "naming")
def dare_ties(base, experts, *, density: float | Sequence[float] = 0.1, weights: float | Sequence[float] = 1.0,
              normalize: bool = False, rescale: bool | str = True, scale: float = 1.0, seed: int = 0, masks=None,
              naming: Naming = XLT):
  """DARE's random drop, then TIES's sign consensus (Yu et al. 2024, DARE; Yadav et al. 2023,
  TIES): mergekit's `dare_ties`.

  Each delta entry survives with probability `density` (the mask of `dare` with drop =
  1 - density and the same seed), survivors are rescaled, weighted, and only those agreeing
  with the elected sign are summed (normalize: false, mergekit's default, sums them; true
  takes their weighted mean). Differs from mergekit only in the random draw (see the module
  docstring) and in offering rescale="inverse", the paper's exact 1 / density.

  density: in (0, 1], the fraction of each delta kept in expectation, one for all or one
    per expert (mergekit's `density`; DARE's 1 - drop: 0.1, xlt's default, is the paper's
    drop 0.9; mergekit's default 1.0 drops nothing).
  rescale: True or "l1" (mergekit's default: each sparsified tensor times |delta|_1 /
    |kept|_1), "inverse" (the paper's: survivors times 1 / density), False or "none".
  """
  n = len(core.expert_list(experts))
  densities = _fractions(density, n, "dare_ties density", 0.0, 1.0, low_open=True)
  sparsify = _random_sparsify(_seed(seed, "dare_ties"), densities, _rescale_mode(rescale, "dare_ties", True),
                              lambda i, path, d: densities[i])
  return _gta(base, experts, sparsify, weights, consensus=True, normalize=normalize, scale=scale, masks=masks,
              naming=naming, what="dare_ties")



def _breadcrumbs(base, experts, density, gamma, weights, normalize, rescale, scale, masks, naming, what,
                 consensus):
  n = len(core.expert_list(experts))
  densities = _fractions(density, n, f"{what} density", 0.0, 1.0, low_open=True)
  gammas = _fractions(gamma, n, f"{what} gamma", 0.0, 1.0, high_open=True)
  sparsify = _deterministic_sparsify(lambda i, d: outlier_mask(d, densities[i], gammas[i]),
                                     _rescale_mode(rescale, what, False))
  return _gta(base, experts, sparsify, weights, consensus=consensus, normalize=normalize, scale=scale,
              masks=masks, naming=naming, what=what)


@declare.method("breadcrumbs", ("base", "experts+"), paper=_DAVARI, mergekit="breadcrumbs", trees=("masks",))
@_document("breadcrumbs", "weights", "normalize", "scale", "masks", "naming")
def breadcrumbs(base, experts, *, density: float | Sequence[float] = 0.1, gamma: float | Sequence[float] = 0.01,
                weights: float | Sequence[float] = 1.0, normalize: bool = False, rescale: bool | str = False,
                scale: float = 1.0, masks=None, naming: Naming = XLT):
  """Model Breadcrumbs (Davari & Belilovsky 2023): each delta loses its largest entries
  (outliers) and its smallest (noise), then task arithmetic: mergekit's `breadcrumbs`.

  Per tensor (as mergekit; the paper masks per layer too). Differs from mergekit only where
  magnitudes tie at the ends of the kept range (`outlier_mask`).
  """
  return _breadcrumbs(base, experts, density, gamma, weights, normalize, rescale, scale, masks, naming,
                      "breadcrumbs", consensus=False)


@declare.method("breadcrumbs_ties", ("base", "experts+"), paper=f"{_DAVARI} + {_YADAV}", mergekit="breadcrumbs_ties", trees=("masks",))
@_document("breadcrumbs", "weights", "normalize", "scale", "masks", "naming")
def breadcrumbs_ties(base, experts, *, density: float | Sequence[float] = 0.1,
                     gamma: float | Sequence[float] = 0.01, weights: float | Sequence[float] = 1.0,
                     normalize: bool = False, rescale: bool | str = False, scale: float = 1.0, masks=None,
                     naming: Naming = XLT):
  """Model Breadcrumbs' sparsification with TIES's sign consensus (Davari & Belilovsky 2023;
  Yadav et al. 2023): mergekit's `breadcrumbs_ties`.

  As `breadcrumbs`, then only the entries agreeing with the elected sign are summed
  (normalize: false, mergekit's default; true takes their weighted mean).
  """
  return _breadcrumbs(base, experts, density, gamma, weights, normalize, rescale, scale, masks, naming,
                      "breadcrumbs_ties", consensus=True)



def _della(base, experts, density, epsilon, weights, normalize, rescale, scale, seed, masks, naming, what,
           consensus):
  n = len(core.expert_list(experts))
  densities = _fractions(density, n, f"{what} density", 0.0, 1.0, low_open=True)
  epsilons = _fractions(epsilon, n, f"{what} epsilon", 0.0, 1.0)
  for d, e in zip(densities, epsilons):
    if d < 1 and not (d - e > 0 and d + e < 1):
      raise ValueError(f"{what}: density +/- epsilon must lie in (0, 1), got density {d}, epsilon {e}")
  keep_prob = lambda i, path, d: della_keep_prob(path, d, densities[i], epsilons[i], naming)
  sparsify = _random_sparsify(_seed(seed, what), densities, _rescale_mode(rescale, what, True), keep_prob)
  return _gta(base, experts, sparsify, weights, consensus=consensus, normalize=normalize, scale=scale,
              masks=masks, naming=naming, what=what)


@declare.method("della", ("base", "experts+"), paper=_DEEP, mergekit="della", trees=("masks",), layer_aware=True)
@_document("della", "weights", "normalize", "scale", "seed", "masks", "naming")
def della(base, experts, *, density: float | Sequence[float] = 0.5, epsilon: float | Sequence[float] = 0.15,
          weights: float | Sequence[float] = 1.0, normalize: bool = True, rescale: bool | str = True,
          scale: float = 1.0, seed: int = 0, masks=None, naming: Naming = XLT):
  """DELLA-Merging (Deep et al. 2024): MagPrune (a random drop whose keep probability
  grows with an entry's magnitude rank in its row), then TIES's sign consensus and a
  weighted mean: mergekit's `della` (normalize: true).

  Differs from mergekit in the random draw (see the module docstring), in ranking within
  `naming.rows` (output units: mergekit's dim-1 ranks for [out, in] weights, not for
  GPT-2's Conv1D [in, out]) and in offering rescale="inverse", the paper's.
  """
  return _della(base, experts, density, epsilon, weights, normalize, rescale, scale, seed, masks, naming,
                "della", consensus=True)


@declare.method("della_linear", ("base", "experts+"), paper=_DEEP, mergekit="della_linear", trees=("masks",), layer_aware=True)
@_document("della", "weights", "normalize", "scale", "seed", "masks", "naming")
def della_linear(base, experts, *, density: float | Sequence[float] = 0.5, epsilon: float | Sequence[float] = 0.15,
                 weights: float | Sequence[float] = 1.0, normalize: bool = False, rescale: bool | str = True,
                 scale: float = 1.0, seed: int = 0, masks=None, naming: Naming = XLT):
  """DELLA's MagPrune without sign consensus (Deep et al. 2024): mergekit's `della_linear`,
  the weighted sum of the pruned deltas (normalize: false, mergekit's default).

  As `della` otherwise.
  """
  return _della(base, experts, density, epsilon, weights, normalize, rescale, scale, seed, masks, naming,
                "della_linear", consensus=False)



def _select_topk(_, *, select_topk):
  core.check_range("SCE select_topk", select_topk, 0.0, 1.0, low_open=True)
  return {"select_topk": select_topk}


@declare.per_tensor("sce", ("base", "experts+"), mergekit="sce", trees=("masks",), prepare=_select_topk,
                    paper="Wan et al. 2024, FuseChat: Knowledge Fusion of Chat Models (SCE: select, calculate, erase)")
def sce(base, experts, *, select_topk: float = 1.0, masks=None):
  """SCE (Wan et al. 2024, FuseChat): Select the entries where the experts' deltas vary most,
  Calculate each expert's weight from its delta's energy, Erase minority signs: mergekit's `sce`.

  Per tensor: keep the k = int(select_topk * m) entries of largest variance across experts
  (m: entries of nonzero variance; ties with the k-th kept); weight expert i by the mean
  square of its selected delta over their sum; elect each entry's sign from the sum of the
  deltas (+ on 0); the result is base + the weighted mean of the agreeing deltas.
  Differs from mergekit where mergekit's absolute thresholds would decide by the weights'
  units: weights are uniform only when every selected delta is 0 (mergekit: when the sum of
  mean squares is under 1e-6, i.e. for any fine-tune whose RMS delta is under ~1e-3), and the
  weighted mean divides by the agreeing weights' sum when it is positive (mergekit: by at
  least 1e-6); on deltas of ordinary size the two agree to float rounding.

  select_topk: in (0, 1], the fraction of varying entries kept (mergekit's `select_topk`,
    default 1.0: no selection).
  masks: neuron masks restricting each delta first (as in task_arithmetic).
  naming: how rows are laid out, for row masks.
  """
  b = core.as_compute(base)
  tvs = np.stack([core.as_compute(x) - b for x in experts])
  if select_topk < 1:
    var = tvs.var(axis=0)
    k = int(np.count_nonzero(var) * select_topk)
    tvs = np.where(core.top_fraction_mask(var, k / var.size) if k else False, tvs, 0).astype(b.dtype)
  energy = np.mean(np.square(tvs.reshape(len(experts), -1), dtype=np.float64), axis=1)
  w = energy / energy.sum() if energy.sum() > 0 else np.full(len(experts), 1 / len(experts))
  agree = np.sign(tvs) == np.where(tvs.sum(axis=0, dtype=np.float64) >= 0, 1, -1)
  erased = np.where(agree, np.reshape(w, (-1,) + (1,) * b.ndim), 0)
  total = erased.sum(axis=0)
  mean = (tvs * erased).sum(axis=0) / np.where(total > 0, total, 1)
  return b + mean.astype(b.dtype)
