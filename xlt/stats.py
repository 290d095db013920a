"""Intervals over seeds: the mean with its 95% Student-t confidence interval, and the paired
difference of two per-seed score vectors (seeds pair models that share a base).

  interval([0.1, 0.3, 0.2])         {"mean", "std", "half", "low", "high", "n"}
  paired([.3, .4, .5], [.1, .1, .2])  the same for the per-seed differences a - b, and "sign":
                                    "+" when the interval lies above 0, "-" below, "" otherwise
  welch(a, b)                       two independent samples: Welch's t test of equal means
  holm(p_values)                    which of several tests reject at family-wise level 5%
  capture(n)                        how often a replication's mean falls in the first's interval

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


def welch(a: Sequence[float], b: Sequence[float]) -> dict:
  """Welch's two-sided t test of equal means for two independent samples (two runs that drew
  their seeds afresh): the difference mean(b) - mean(a), t, the Welch-Satterthwaite degrees of
  freedom and the p-value. Two constant samples: p = 1 when equal, 0 when not."""
  a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if a.size < 2 or b.size < 2:
    raise ValueError(f"a two-sample test needs two values or more on each side, got {a.size} and {b.size}")
  diff = float(np.mean(b) - np.mean(a))
  va, vb = float(np.var(a, ddof=1)) / a.size, float(np.var(b, ddof=1)) / b.size
  if va + vb == 0.0:
    return {"diff": diff, "t": None, "df": None, "p": 1.0 if diff == 0.0 else 0.0}
  t = diff / math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
  return {"diff": diff, "t": t, "df": df, "p": 2.0 * (1.0 - t_cdf(abs(t), df))}


def holm(p_values: Sequence[float], alpha: float = 1.0 - LEVEL) -> list[bool]:
  """Holm's step-down procedure: which of the tests reject with a family-wise error of `alpha`
  (the smallest p against alpha / m, the next against alpha / (m - 1), ... until one does not)."""
  order = sorted(range(len(p_values)), key=lambda i: p_values[i])
  rejected = [False] * len(p_values)
  for rank, i in enumerate(order):
    if p_values[i] > alpha / (len(p_values) - rank):
      break
    rejected[i] = True
  return rejected


def capture(n: int, level: float = LEVEL) -> float:
  """The probability that a replication's mean (n fresh seeds of the same normal population)
  falls inside the first run's `level` t interval over n seeds. (m2 - m1) / (s1 / sqrt(n)) is
  sqrt(2) times a t variable with n - 1 degrees of freedom, so this is P(|T| <= t_crit / sqrt(2)):
  0.88 for n = 5, falling towards 0.83 as n grows. A 95% interval is not 95% sure to hold the
  next run's mean: a row of a rerun with fresh seeds is outside it 12-17% of the time."""
  if n < 2:
    raise ValueError(f"an interval needs two seeds or more, got {n}")
  crit = t_quantile(0.5 + level / 2.0, n - 1)
  return 2.0 * t_cdf(crit / math.sqrt(2.0), n - 1) - 1.0
