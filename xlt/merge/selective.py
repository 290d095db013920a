"""Merges that choose, entry by entry, which model's change to the base to keep, as mergekit has
them: arcee_fusion (where the change matters most), ram and ramplus_tl (changes only one model
made kept whole, shared ones averaged). Each a pure function over pytrees, per tensor,
each declared next to its function (xlt.merge.declare), and tests/test_merge_geometric.py
checks each against mergekit's output.

Rows, as in xlt.merge.geometric: output units as `naming.rows` lays them out (for Hugging Face
[out, in] weights, mergekit's vectors along the last axis).
"""

from __future__ import annotations

import numpy as np

from xlt.merge import core, declare
from xlt.param_paths import XLT, Naming

_RAM = "Yuan et al. 2026, Behavior Knowledge Merge in Reinforced Agentic Models"


def _softmax_rows(x, dtype=np.float64) -> np.ndarray:
  x = np.asarray(x, dtype)
  e = np.exp(x - x.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def fusion_importance(path, base, other, naming: Naming = XLT, dtype=np.float64) -> np.ndarray:
  """Arcee Fusion's importance of each entry of one tensor (in `dtype`, the tensor's rows view):
  |other - base| times the KL divergence KL(softmax(other row) || softmax(base row)) of its row,
  each softmax plus 1e-8 (mergekit's)."""
  a, b = naming.rows(path, core.as_compute(base)), naming.rows(path, core.as_compute(other))
  p, q = _softmax_rows(b, dtype) + dtype(1e-8), _softmax_rows(a, dtype) + dtype(1e-8)
  kl = np.sum(p * np.log(p / q), axis=1, keepdims=True)
  return np.abs(b.astype(dtype) - a.astype(dtype)) * kl


def fusion_threshold(importance) -> float:
  """median + 1.5 * (q3 - q1) of the importances (Tukey's upper fence), each quartile the sorted
  value at index floor(q * (n - 1)) as mergekit takes it (no interpolation)."""
  s = np.sort(np.asarray(importance).ravel())
  q1, median, q3 = (float(s[int(f * (s.size - 1))]) for f in (0.25, 0.5, 0.75))
  return median + 1.5 * (q3 - q1)


@declare.per_tensor("arcee_fusion", ("base", "other"), mergekit="arcee_fusion", layer_aware=True,
                    paper="Arcee AI, Arcee Fusion (no paper: mergekit's arcee_fusion.py)")
def arcee_fusion(base, other, *, precision: str = "float64", path=None, naming: Naming = XLT):
  """Arcee Fusion (Arcee AI, mergekit's "arcee_fusion"; no paper: mergekit's source): the
  base with the other model's values where the change is an outlier of importance, per tensor.

  Importance (`fusion_importance`) is the size of an entry's change times how much its row's
  softmax distribution moved (a KL divergence); entries at or above the tensor's upper fence
  (`fusion_threshold`: median + 1.5 IQR of the importances) take the other model's value, the
  rest keep the base's. mergekit estimates the quartiles of a tensor of over 10^6 entries from
  10^6 entries drawn at random (torch's global generator); xlt sorts them all, so its merge is
  deterministic and, on such tensors, can differ from mergekit's near the threshold.

  precision: "float64" (default: xlt's, so the entries at the threshold do not depend on
    rounding) or "float32" (mergekit's: its softmax and KL run in float32, which moves a few
    entries per model across the threshold against float64).
  naming: where the rows of each tensor are (the softmax runs along each row).
  """
  if precision not in ("float64", "float32"):
    raise ValueError(f"arcee_fusion precision must be 'float64' or 'float32', got {precision!r}")
  a, b = core.as_compute(base), core.as_compute(other)
  if a.size == 0:
    return a
  importance = fusion_importance(path, a, b, naming, np.dtype(precision).type)
  keep = naming.from_rows(path, importance >= fusion_threshold(importance), a.shape)
  return a + (b - a) * keep.astype(a.dtype)


def _task_vectors(b, xs, epsilon: float):
  """(the task vectors zeroed where |.| <= epsilon, stacked [n, ...]; their nonzero masks; the
  number of models changing each entry)."""
  tvs = np.stack([x - b for x in xs])
  changed = np.abs(tvs) > epsilon
  return np.where(changed, tvs, 0).astype(b.dtype), changed, changed.sum(axis=0)


@declare.per_tensor("ram", ("base", "experts+"), paper=_RAM, mergekit="ram")
def ram(base, experts, *, epsilon: float = 1e-5):
  """Reinforced Agent Merging (Yuan et al. 2026, RAM): the base plus each entry's change kept
  whole where one expert alone changed it and averaged over the experts that changed it where
  several did, per entry.

  An expert changed an entry when |expert - base| > epsilon; entries no expert changed stay at
  the base. Unlike a mean of task vectors, a change only one expert made is not diluted by the
  experts that left the entry alone (RL fine-tunes change few, different entries).

  epsilon: the smallest change that counts (mergekit's default 1e-5), in the weights' units.
  naming: unused (entries are independent); accepted so every merge has the same keywords.
  """
  b = core.as_compute(base)
  tvs, _, count = _task_vectors(b, [core.as_compute(x) for x in experts], epsilon)
  return b + tvs.sum(axis=0) / np.maximum(count, 1).astype(b.dtype)


@declare.per_tensor("ramplus_tl", ("base", "experts+"), paper=_RAM + " (RAM+, tensor-local as mergekit has it)",
                    mergekit="ramplus_tl")
def ramplus_tl(base, experts, *, r: float = 0.1, alpha: float = 0.2, epsilon: float = 1e-5):
  """RAM+ tensor-local (Yuan et al. 2026, mergekit's "ramplus_tl"): `ram` with each expert's
  unique changes scaled up by how much of its change the other experts share, per tensor.

  For expert i in a tensor, rho_i = (entries it changed that others changed too) / (entries
  only it changed, at least epsilon) and its unique changes are multiplied by
  1 + r * clip(rho_i, 0, alpha); shared entries are averaged as in `ram`.

  r: the rescaling strength (mergekit's default 0.1).
  alpha: the cap on rho (mergekit's default 0.2): the largest scale is 1 + r * alpha.
  epsilon: the smallest change that counts (mergekit's default 1e-5), in the weights' units.
  naming: unused (entries are independent); accepted so every merge has the same keywords.
  """
  b = core.as_compute(base)
  tvs, changed, count = _task_vectors(b, [core.as_compute(x) for x in experts], epsilon)
  axes = tuple(range(1, tvs.ndim))
  shared = (changed & (count > 1)).sum(axis=axes)
  unique = (changed & (count == 1)).sum(axis=axes)
  scale = 1 + r * np.clip(shared / np.maximum(unique, epsilon), 0, alpha)
  out = b.copy()
  for tv, s in zip(tvs, scale):
    out += np.where(count == 1, tv * np.asarray(s, b.dtype), tv / np.maximum(count, 1).astype(b.dtype))
  return out

