"""Intervals over seeds: the mean with its 95% Student-t confidence interval, and the paired
difference of two per-seed score vectors (seeds pair models that share a base).

  interval([0.1, 0.3, 0.2])         {"mean", "std", "half", "low", "high", "n"}
  paired([.3, .4, .5], [.1, .1, .2])  the same for the per-seed differences a - b, and "sign":
                                    "+" when the interval lies above 0, "-" below, "" otherwise

The half-width is t_{0.975, n-1} · sd / sqrt(n) (sd with n - 1 degrees of freedom); with one
seed there is no interval (half, low, high None). The t quantile is found by bisection on the
t distribution's CDF, written with the regularized incomplete beta function
(scipy.special.betainc; scipy comes with jax). numpy and scipy only: no jax.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

LEVEL = 0.95


def t_cdf(t: float, df: float) -> float:
  """P(T <= t) for Student's t with `df` degrees of freedom:
  1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 for t >= 0, by symmetry below."""
  from scipy import special  # only when an interval is computed

  tail = 0.5 * float(special.betainc(df / 2.0, 0.5, df / (df + t * t)))
  return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float, tol: float = 1e-10) -> float:
  """The t with P(T <= t) = p (0 < p < 1), by bisection on `t_cdf`."""
  if not 0.0 < p < 1.0:
    raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
  if df <= 0:
    raise ValueError(f"degrees of freedom must be positive, got {df}")
  if p < 0.5:
    return -t_quantile(1.0 - p, df, tol)
  lo, hi = 0.0, 1.0
  while t_cdf(hi, df) < p:  # t(0.975, 1) = 12.7: a few doublings
    lo, hi = hi, 2.0 * hi
  while hi - lo > tol * max(1.0, hi):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
  return 0.5 * (lo + hi)


def interval(values: Sequence[float], level: float = LEVEL) -> dict:
  """The mean of `values` (one per seed) and its two-sided `level` t interval."""
  x = np.asarray(values, dtype=np.float64)
  if x.ndim != 1 or x.size == 0:
    raise ValueError(f"an interval needs a non-empty list of values, got shape {x.shape}")
  n, mean = int(x.size), float(np.mean(x))
  if n < 2:
    return {"mean": mean, "std": 0.0, "half": None, "low": None, "high": None, "n": n}
  std = float(np.std(x, ddof=1))
  half = t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
  return {"mean": mean, "std": std, "half": half, "low": mean - half, "high": mean + half, "n": n}


def paired(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> dict:
  """The paired difference a - b (a[i] and b[i] of the same seed): its mean, t interval, and
  sign: "+" when the interval's lower end is above 0 (a significantly above b), "-" when its
  upper end is below 0, "" otherwise (or with one seed)."""
  a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if a.shape != b.shape:
    raise ValueError(f"paired scores need one value per seed on both sides, got {a.shape} and {b.shape}")
  out = interval(a - b, level)
  out["sign"] = "" if out["half"] is None else "+" if out["low"] > 0 else "-" if out["high"] < 0 else ""
  return out
