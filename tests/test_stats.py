"""xlt.stats: the t quantile against the printed table, intervals and paired differences on hand
values."""

import math

import pytest

from xlt import stats


@pytest.mark.parametrize("df,want", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)])
def test_t_quantile_matches_the_table(df, want):
  assert stats.t_quantile(0.975, df) == pytest.approx(want, abs=5e-4)
  assert stats.t_quantile(0.025, df) == pytest.approx(-want, abs=5e-4)
  assert stats.t_cdf(stats.t_quantile(0.975, df), df) == pytest.approx(0.975, abs=1e-9)


def test_t_quantile_refuses_bad_arguments():
  with pytest.raises(ValueError, match="0 < p < 1"):
    stats.t_quantile(1.0, 3)
  with pytest.raises(ValueError, match="degrees of freedom"):
    stats.t_quantile(0.9, 0)


def test_interval_of_a_mean():
  # mean 2.5, sd sqrt(5/3) = 1.2910, half = t(0.975, 3) 3.1824 * 1.2910 / 2 = 2.0543
  got = stats.interval([1.0, 2.0, 3.0, 4.0])
  assert got["mean"] == 2.5 and got["n"] == 4
  assert got["std"] == pytest.approx(math.sqrt(5 / 3))
  assert got["half"] == pytest.approx(2.0543, abs=1e-4)
  assert (got["low"], got["high"]) == pytest.approx((2.5 - got["half"], 2.5 + got["half"]))
  one = stats.interval([0.4])  # one seed: a mean, no interval
  assert one == {"mean": 0.4, "std": 0.0, "half": None, "low": None, "high": None, "n": 1}
  assert stats.interval([0.25, 0.25, 0.25])["half"] == 0.0


def test_paired_difference_by_hand():
  # differences 0.4, 0.4, 0.5: mean 0.4333, sd 0.05774, half = 4.303 * 0.05774 / sqrt(3) = 0.14342
  got = stats.paired([0.5, 0.6, 0.7], [0.1, 0.2, 0.2])
  assert got["mean"] == pytest.approx(0.43333, abs=1e-5)
  assert got["half"] == pytest.approx(0.14342, abs=1e-4)
  assert got["low"] == pytest.approx(0.28991, abs=1e-4) and got["sign"] == "+"
  assert stats.paired([0.1, 0.2, 0.2], [0.5, 0.6, 0.7])["sign"] == "-"
  # differences 0.3, -0.1: mean 0.1, interval 0.1 ± 12.706 * 0.2828 / 1.414 = ±2.54: includes 0
  wide = stats.paired([0.5, 0.1], [0.2, 0.2])
  assert wide["half"] == pytest.approx(2.5412, abs=1e-3) and wide["sign"] == ""
  assert stats.paired([0.5], [0.1])["sign"] == ""  # one seed: no interval, no claim
  with pytest.raises(ValueError, match="one value per seed"):
    stats.paired([0.1, 0.2], [0.1])


def test_welch_matches_scipy():
  from scipy import stats as scipy_stats  # scipy comes with jax: a peer no one here wrote

  a, b = [0.1, 0.25, 0.2, 0.4], [0.3, 0.2, 0.5, 0.45, 0.6]
  got, want = stats.welch(a, b), scipy_stats.ttest_ind(b, a, equal_var=False)
  assert got["t"] == pytest.approx(float(want.statistic)) and got["p"] == pytest.approx(float(want.pvalue))
  assert got["diff"] == pytest.approx(0.41 - 0.2375)
  assert stats.welch([0.25, 0.25], [0.25, 0.25, 0.25])["p"] == 1.0  # constant and equal: nothing moved
  assert stats.welch([0.25, 0.25], [0.5, 0.5])["p"] == 0.0
  with pytest.raises(ValueError, match="two values or more"):
    stats.welch([0.1], [0.2, 0.3])


def test_holm_steps_down():
  # sorted 0.01 <= 0.05/4; then 0.03 > 0.05/3: it and every larger p stand
  assert stats.holm([0.01, 0.04, 0.03, 0.2]) == [True, False, False, False]
  assert stats.holm([0.001, 0.012, 0.02]) == [True, True, True]  # 0.0167, 0.025, 0.05
  assert stats.holm([0.3, 0.5]) == [False, False] and stats.holm([]) == []


def test_capture_probability_by_simulation():
  import numpy as np

  rng = np.random.default_rng(0)
  for n in (3, 5, 12):
    first, second = rng.normal(size=(2, 200_000, n))
    half = stats.t_quantile(0.975, n - 1) * first.std(axis=1, ddof=1) / math.sqrt(n)
    inside = np.abs(second.mean(axis=1) - first.mean(axis=1)) <= half
    assert stats.capture(n) == pytest.approx(inside.mean(), abs=0.004)
  from scipy import stats as scipy_stats  # many seeds: the normal limit 2 Phi(1.96 / sqrt 2) - 1

  assert stats.capture(10_000) == pytest.approx(2 * scipy_stats.norm.cdf(1.959964 / math.sqrt(2)) - 1, abs=1e-3)
