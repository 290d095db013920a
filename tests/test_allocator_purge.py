"""benchmarks/allocator_purge.py's table from hand-made runs: means, medians, the slow-step share
against the job's median over both settings, and the per-process figures averaged (peak RSS: the
largest)."""

import pytest

from benchmarks import allocator_purge as ap


def test_job_rows():
  runs = {"decommit": [{"times": [0.1, 0.3], "sys_s": 0.02, "minflt": 100.0, "maxrss_mib": 900.0},
                       {"times": [0.1, 0.1], "sys_s": 0.04, "minflt": 50.0, "maxrss_mib": 950.0}],
          "free": [{"times": [0.1, 0.1], "sys_s": 0.0, "minflt": 0.0, "maxrss_mib": 800.0},
                   {"times": [0.1, 0.2], "sys_s": 0.0, "minflt": 2.0, "maxrss_mib": 700.0}]}
  (job, name, mean, median, slow, sys_ms, faults, rss), free = ap.job_rows("j", runs)
  assert (job, name) == ("j", "decommit")
  assert mean == pytest.approx(150.0) and median == pytest.approx(100.0)
  assert slow == 0.25  # 0.3 s only: over 1.5 x 0.1 s, the median of all eight steps
  assert sys_ms == pytest.approx(30.0) and faults == 75.0 and rss == 950.0
  assert free[1] == "free" and free[2:] == [pytest.approx(125.0), pytest.approx(100.0), 0.25, 0.0, 1.0, 800.0]
