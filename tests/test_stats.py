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
