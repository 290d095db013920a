"""Merges that combine experts leaf by leaf, wherever the leaf sits in the model:
model soups, task arithmetic and its interference-reducing variants (TIES, DARE), and
the layer-swapping paper's row-level sparsification.

Vocabulary (mergekit's): a *base* is the model every expert was fine-tuned from; an
expert's *delta* (task vector) is expert - base; `lambdas` scale the deltas added back
to the base (mergekit's `weight`); `density` is the fraction of delta entries TIES keeps
(mergekit's `density`); `drop` is the fraction DARE zeroes (mergekit's 1 - density).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from xlt.merge import core, declare
from xlt.param_paths import XLT, Naming, path_str

LAYER_SWAPPING = "Bandarkar et al. 2024, Layer Swapping for Zero-Shot Cross-Lingual Transfer in Large Language Models"


def _expert_names(n: int) -> list[str]:
  return [f"expert {i}" for i in range(n)]


def _soup_weights(n: int, weights):
  weights = core.per_expert(1.0 if weights is None else weights, n, "weights")
  if min(weights) < 0 or sum(weights) <= 0:
    raise ValueError(f"soup weights must be non-negative with a positive sum, got {weights}")
  return {"weights": [w / sum(weights) for w in weights]}


@declare.per_tensor("soup", ("experts+",), mergekit="linear", prepare=_soup_weights,
                    paper="Wortsman et al. 2022, Model soups: averaging weights of multiple fine-tuned models "
                    "improves accuracy without increasing inference time")
def soup(experts, weights: Sequence[float] | None = None):
  """A model soup (Wortsman et al. 2022): the weighted average of the experts.

  weights: one non-negative number per expert, normalised to sum to 1; None = uniform
    (the plain soup). `magnitude_weights` gives the layer-swapping paper's
    magnitude-adjusted soup. A soup of one model is that model.
  naming: unused (a soup ignores paths); accepted so every merge has the same keywords.
  """
  # first + sum_i w_i (x_i - first) = sum_i w_i x_i (the weights sum to 1), written
  # around the first expert so that identical experts give it back exactly.
  first, *rest = experts
  if not rest:
    return first
  anchor = core.as_compute(first)  # may be the caller's array: never written to
  out = anchor.copy()
  for w, x in zip(weights[1:], rest):
    out += w * (core.as_compute(x) - anchor)
  return out


def magnitude_weights(experts, base, *, naming: Naming = XLT) -> list[float]:
  """Soup weights adjusted for how far each expert moved from the base (the
  layer-swapping paper, section 5.1): expert i's weight is 1 / (the mean of the row MAVs
  of expert_i - base over every row of every tensor, each row counted once), normalised
  to sum to 1. An expert that changed little is not drowned by one that changed a lot.
  Rows are `naming.rows` (output units; one row for 1-D tensors)."""
  experts = core.expert_list(experts)
  core.check_compatible([base, *experts], ["base", *_expert_names(len(experts))])
  inverse = []
  for i, expert in enumerate(experts):
    mavs = [m for _, m in core.row_mavs(expert, base, naming)]
    mean = float(np.concatenate(mavs).mean()) if mavs else 0.0
    if not mean > 0:
      raise ValueError(f"expert {i} equals the base (mean row MAV {mean}): its magnitude weight "
                       "would be infinite")
    inverse.append(1.0 / mean)
  return [w / sum(inverse) for w in inverse]


def _restrict(base, experts, masks, naming, what: str):
  """The experts with each delta restricted to its mask's neurons (`core.leaf_mask`):
  expert_i where its mask is True, the base elsewhere (a new tree per masked expert)."""
  if masks is None:
    return experts
  out = []
  for i, e in enumerate(experts):
    m = core.mask_for(masks, i, len(experts), what)
    if m is None:
      out.append(e)
      continue
    flat = core.masked_leaves(m, e)
    out.append(core.map_leaves(
        lambda p, x, b, flat=flat: np.where(core.leaf_mask(p, flat[p], np.shape(x), naming), x, b), e, base))
  return out


def _sum_deltas(base, experts, lambdas, transform):
  """base + sum_i lambda_i * transform(i, expert_i - base) of one tensor (the base itself when
  every lambda is 0)."""
  terms = [(lam, i, x) for i, (lam, x) in enumerate(zip(lambdas, experts)) if lam != 0.0]
  if not terms:
    return base
  b = core.as_compute(base)
  out = b.copy()
  for lam, i, x in terms:
    out += lam * transform(i, core.as_compute(x) - b)
  return out


def _lambdas(what: str):
  """A prepare hook (xlt.merge.declare) that makes `lambdas` one float per expert."""
  def prepare(n: int, lambdas, **options):
    return {"lambdas": core.per_expert(lambdas, n, f"{what} lambdas"), **options}
  return prepare


@declare.per_tensor("task_arithmetic", ("base", "experts+"), mergekit="task_arithmetic", trees=("masks",),
                    prepare=_lambdas("task arithmetic"),
                    paper="Ilharco et al. 2023, Editing models with task arithmetic")
def task_arithmetic(base, experts, lambdas: float | Sequence[float] = 1.0, *, masks=None):
  """Task arithmetic (Ilharco et al. 2023): base + sum_i lambda_i (expert_i - base).

  lambdas: the scale of each task vector, one float for all or one per expert. 0 leaves
    the base; 1 with one expert gives that expert; 1/n for n experts is their soup;
    the paper tunes one value in [0, 1] on validation data; > 1 extrapolates.
  masks: neuron masks (`core.leaf_mask`: per tensor, per row, or per entry), one tree for
    every expert or one per expert (None = no mask): each task vector counts only on its
    mask. The same masks train with `xlt.neurons`.
  naming: how rows are laid out, for row masks.
  """
  return _sum_deltas(base, experts, lambdas, lambda i, d: d)


def _densities(n: int, default: float, given, what: str) -> list[float]:
  """One fraction per expert: `given` (one per expert) or `default` for all, each in (0, 1]."""
  out = core.per_expert(default if given is None else given, n, what)
  for d in out:
    core.check_range(what, d, 0.0, 1.0, low_open=True)
  return out


def _ties_options(n: int, *, density, densities, lambdas, convention, normalize, scale):
  core.check_range("TIES density", density, 0.0, 1.0, low_open=True)
  if not np.isfinite(scale):
    raise ValueError(f"TIES scale must be a finite number, got {scale}")
  return {"density": density, "densities": _densities(n, density, densities, "TIES densities"),
          "lambdas": core.per_expert(lambdas, n, "TIES lambdas"),
          "convention": _convention(convention, "TIES"), "normalize": bool(normalize), "scale": float(scale)}


@declare.per_tensor("ties", ("base", "experts+"), mergekit="ties", trees=("masks",), prepare=_ties_options,
                    paper="Yadav et al. 2023, TIES-Merging: Resolving Interference When Merging Models")
def ties(base, experts, *, density: float = 0.2, lambdas: float | Sequence[float] = 1.0, masks=None,
         convention: str = "mergekit", normalize: bool = True, scale: float = 1.0,
         densities: Sequence[float] | None = None):
  """TIES-merging (Yadav et al. 2023): task arithmetic with interference resolved.

  Per tensor:
    1. trim: each expert keeps the `density` fraction of its delta entries largest in
       magnitude and zeroes the rest (per tensor, as mergekit does; the paper ranks a
       whole model's task vector at once). k = int(density * size), at least one entry;
       entries tied with the k-th largest are all kept.
    2. elect: each entry's sign is the sign of the sum of the (lambda-scaled) trimmed
       deltas: the direction with more total mass wins.
    3. disjoint mean: the mean of the nonzero trimmed deltas that agree with the elected
       sign; an entry where none agree, or whose sum is exactly 0 (no sign elected),
       stays at the base.
  The result is base + the disjoint mean.

  The default convention="mergekit" is mergekit's `ties` (0.1.5; weight = lambdas,
  normalize: true, lambda: 1): on tensors without ties at the k-th magnitude it gives
  mergekit's result to float rounding. convention="xlt" is the rule the merge testbed's
  recorded results were made with, which differs in three ways: (a) k = round(density *
  size) where mergekit floors; (b) an exact 0 sum elects no sign (the entry stays at the
  base) where mergekit elects +; (c) the mean divides by the count of agreeing experts
  (so lambdas scale the result: all lambdas 0.5 give half the TIES delta) where mergekit
  divides by the sum of their weights (so equal weights cancel). Ties at the k-th
  magnitude are kept in both conventions (mergekit keeps exactly k, whichever its sort
  puts first).

  density: in (0, 1], the fraction of each delta kept (mergekit's `density`). The paper
    keeps the top 20% (its default, 0.2); 1.0 skips the trim.
  lambdas: the scale of the merged delta (the paper's lambda; 1 when there is no
    validation data to tune it on), or one scale per expert, applied to its trimmed
    delta before the election (mergekit's per-model `weight`).
  masks: neuron masks restricting each delta before the trim (as in `task_arithmetic`).
  convention: "mergekit" (default: floor, + on a tie, divide by the sum of agreeing
    lambdas) or "xlt" (round, no sign on a tie, divide by the count); see above.
  normalize: take the disjoint mean (default); False sums the agreeing trimmed deltas instead
    (mergekit's `normalize: false`).
  scale: multiplies the merged delta (mergekit's `lambda`, default 1).
  densities: one density per expert instead (mergekit's per-model `density`); None = `density`
    for all.
  naming: how rows are laid out, for row masks.
  """
  b, mergekit = core.as_compute(base), convention == "mergekit"
  trimmed = []
  for lam, x, dens in zip(lambdas, experts, densities):
    d = core.as_compute(x) - b
    keep = magnitude_mask(d, dens) if mergekit else core.top_fraction_mask(np.abs(d), dens)
    trimmed.append(lam * np.where(keep, d, 0))
  trimmed = np.stack(trimmed)
  summed = trimmed.sum(axis=0, dtype=np.float64)
  elected = np.where(summed >= 0, 1.0, -1.0) if mergekit else np.sign(summed)
  agree = (np.sign(trimmed) == elected) & (trimmed != 0)
  total = np.where(agree, trimmed, 0).sum(axis=0, dtype=np.float64)
  if not normalize:
    merged = total
  elif mergekit:
    divisor = np.where(agree, np.reshape(lambdas, (-1,) + (1,) * b.ndim), 0).sum(axis=0)
    merged = total / np.where(divisor == 0, 1, divisor)
  else:
    count = agree.sum(axis=0)
    merged = np.where(count > 0, total / np.maximum(count, 1), 0)
  return b + (merged if scale == 1.0 else scale * merged).astype(b.dtype)


def _convention(convention: str, what: str) -> str:
  if convention not in ("xlt", "mergekit"):
    raise ValueError(f"{what} convention must be 'xlt' or 'mergekit', got {convention!r}")
  return convention


def magnitude_mask(d, density: float) -> np.ndarray:
  """mergekit's magnitude trim: True on the k = max(1, int(density * size)) entries of `d`
  largest in magnitude (all of them when density >= 1); entries tied with the k-th are
  all kept, so the mask never depends on memory order."""
  a = np.abs(np.asarray(d))
  if density >= 1 or a.size == 0:
    return np.ones(a.shape, bool)
  k = max(1, int(density * a.size))  # mergekit's floor; k / size selects exactly k below
  return core.top_fraction_mask(a, k / a.size)


def l1_rescaled(d, kept, eps: float = 1e-7) -> np.ndarray:
  """mergekit's rescale (`rescaled_masked_tensor`, norm l1): `kept` (d with entries
  zeroed) times |d|_1 / |kept|_1, so the tensor keeps its L1 norm; `kept` unchanged when
  either norm is below eps."""
  before, after = np.abs(d).sum(dtype=np.float64), np.abs(kept).sum(dtype=np.float64)
  if before < eps or after < eps:
    return kept
  return (kept * (before / after)).astype(np.asarray(kept).dtype)


def dare_mask(seed: int, expert_index: int, path, shape, drop: float) -> np.ndarray:
  """DARE's keep mask for one (expert, leaf): True with probability 1 - drop. The stream
  is numpy's PCG64 seeded by (seed, expert_index, crc32 of the path), so a mask depends
  only on those, never on device, leaf order or which other leaves exist."""
  key = zlib.crc32(path_str(path).encode())
  rng = np.random.default_rng(np.random.SeedSequence([seed, expert_index, key]))
  return rng.random(shape) >= drop


def _dare_options(n: int, *, drop, drops, seed, lambdas, convention, rescale):
  core.check_range("DARE drop", drop, 0.0, 1.0, high_open=True)
  drops = core.per_expert(drop if drops is None else drops, n, "DARE drops")
  for p in drops:
    core.check_range("DARE drop", p, 0.0, 1.0, high_open=True)
  if int(seed) != seed or seed < 0:
    raise ValueError(f"DARE seed must be a non-negative integer, got {seed}")
  return {"drop": drop, "drops": drops, "seed": int(seed), "lambdas": core.per_expert(lambdas, n, "DARE lambdas"),
          "convention": _convention(convention, "DARE"), "rescale": bool(rescale)}


@declare.per_tensor("dare", ("base", "experts+"), mergekit="dare_linear", trees=("masks",), prepare=_dare_options,
                    paper="Yu et al. 2024, DARE: Language Models are Super Mario: Absorbing Abilities from "
                    "Homologous Models as a Free Lunch")
def dare(base, experts, *, drop: float = 0.9, seed: int = 0, lambdas: float | Sequence[float] = 1.0,
         masks=None, convention: str = "xlt", rescale: bool = True, drops: Sequence[float] | None = None,
         path=None):
  """DARE (Yu et al. 2024, "Language models are Super Mario"): Drop And REscale each
  delta, then task arithmetic.

  Each delta entry is zeroed with probability `drop` and the survivors multiplied by
  1 / (1 - drop), so every entry's expected value is its delta; the sparser deltas of
  several experts then collide less when added.

  This is mergekit's `dare_linear` (density = 1 - drop, weight = lambdas, normalize:
  false) but for two things. The rescale: xlt's default, the paper's, is exactly
  1 / (1 - drop) per entry; mergekit (rescale: true) multiplies each masked tensor by
  |delta|_1 / |masked delta|_1, so it keeps the tensor's L1 norm for the draw it made
  (the same in expectation, exact per tensor, and no rescale when either norm is under
  1e-7). convention="mergekit" rescales that way. The masks: mergekit draws them with
  torch.bernoulli from torch's global generator; xlt from `seed` (`dare_mask`), so the
  same mask only by construction (the parity tests hand mergekit xlt's masks).

  drop: in [0, 1), the drop rate p (mergekit's 1 - density). The paper drops 0.9 for
    SFT deltas (up to 0.99 works for large models); 0 is plain task arithmetic.
  seed: a non-negative integer; the same seed gives the same masks (see `dare_mask`).
  lambdas: the task-arithmetic scale of each rescaled delta (see `task_arithmetic`).
  masks: neuron masks restricting each delta before the drop (as in `task_arithmetic`).
  convention: "xlt" (default: survivors times 1 / (1 - drop)) or "mergekit" (survivors
    rescaled to the delta's L1 norm, per tensor); see above.
  rescale: False keeps the survivors as they are (mergekit's `rescale: false`: a plain random
    drop); True rescales them by the convention's rule.
  drops: one drop rate per expert instead (mergekit's per-model density: 1 - it); None = `drop`.
  naming: how rows are laid out, for row masks.
  """
  def drop_and_rescale(i, d):
    p = drops[i]
    if p == 0.0:
      return d
    keep = dare_mask(seed, i, path, d.shape, p)
    if not rescale:
      return np.where(keep, d, 0).astype(d.dtype)
    if convention == "mergekit":
      return l1_rescaled(d, np.where(keep, d, 0).astype(d.dtype))
    return np.where(keep, d / (1.0 - p), 0).astype(d.dtype)

  return _sum_deltas(base, experts, lambdas, drop_and_rescale)


def _threshold(_, *, threshold):
  if not threshold >= 0:
    raise ValueError(f"sparsify threshold must be >= 0, got {threshold}")
  return {"threshold": threshold}


@declare.per_tensor("magmax", ("base", "experts+"),
                    paper="Marczak et al. 2024, MagMax: Leveraging Model Merging for Seamless Continual Learning")
def magmax(base, experts, *, scale: float = 1.0):
  """MagMax (Marczak et al. 2024): per entry, the base plus the one task vector entry of
  largest magnitude among the experts, times `scale`.

  Unlike a mean, the strongest change to each parameter is kept whole and none is diluted by
  the experts that left it alone; unlike TIES, no trimming or sign election (the sign is the
  chosen expert's). Ties in magnitude go to the first expert. One expert: base + scale * its
  task vector (task arithmetic).

  scale: the factor on the selected task vector (the paper's lambda; 1.0 keeps the experts'
    size, the paper reports 0.5 for its continual-learning sequences).
  naming: unused (entries are independent); accepted so every merge has the same keywords.
  """
  b = core.as_compute(base)
  tvs = np.stack([core.as_compute(x) - b for x in experts])
  pick = np.argmax(np.abs(tvs), axis=0)  # the first of equal magnitudes
  return b + np.asarray(scale, b.dtype) * np.take_along_axis(tvs, pick[None], axis=0)[0]


@declare.per_tensor("sparsify_rows", ("expert", "base"), paper=LAYER_SWAPPING + " (section 3.2, row-level "
                    "sparsification)", layer_aware=True, prepare=_threshold)
def sparsify_rows(expert, base, threshold: float, *, path=None, naming: Naming = XLT):
  """The layer-swapping paper's row-level sparsification (section 3.2): every row whose
  MAV of expert - base is at most `threshold` goes back to the base; other rows keep the
  expert's values. Rows (`naming.rows`) are output units, so a linear map is never half
  updated; a 1-D tensor is one row.

  threshold: >= 0, in the units of the weights. A row is "changed" when its MAV exceeds
    it, as in `analysis.row_change`, so the rows kept here are the ones it counts. The
    paper's figure 2 used 1.9e-5 and 1.0e-5 for its LLAMA 3.1 8B experts;
    `analysis.default_threshold` picks one when you have none.
  """
  changed = core.mean_abs_rows(core.as_compute(expert) - core.as_compute(base), path, naming) > threshold
  return np.where(core.row_mask_to_leaf(path, changed, np.shape(expert), naming), expert, base)
