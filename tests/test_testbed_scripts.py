"""benchmarks/testbed_stability.py and testbed_chaos.py on hand-made runs: which rows moved,
whether two runs share their bases, what a fresh draw predicts, and a loss split's first step."""

import json

import numpy as np
import pytest

from benchmarks import testbed_chaos, testbed_stability
from xlt import stats


def write_run(path, goal: dict, language: list, bases: bytes | None):
  """A finished testbed workdir: per model its goal values (and a paired sign), the task
  expert's language values, and base/best_params.npz holding `bases`."""
  path.mkdir()
  expert = goal["task expert"][0]
  row = lambda model, role, values, sign=None: {
      "experiment": "merge_testbed", "task": "arithmetic", "language": "letter", "role": role, "condition": model,
      "metric": "exact_match", "mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)),
      "seeds": len(values), "values": values, "ci95": stats.interval(values)["half"],
      **({"vs_best_expert": {"sign": sign, "expert": "task expert",
                             "values": [v - e for v, e in zip(values, expert)]}} if role == "goal" else {})}
  rows = [row(m, "goal", v, s) for m, (v, s) in goal.items()] + [row("task expert", "language", language)]
  (path / "results.json").write_text(json.dumps(rows))
  (path / "summary.json").write_text("{}")
  if bases is not None:
    (path / "base").mkdir()
    (path / "base" / "best_params.npz").write_bytes(bases)
  return str(path)


def test_stability_with_shared_and_with_redrawn_bases(tmp_path, capsys):
  first = write_run(tmp_path / "a", {"task expert": ([0.2, 0.3, 0.25], None), "merge": ([0.4, 0.5, 0.45], "+")},
                    [0.9, 0.92, 0.91], b"bases")
  # the merge's mean moves by 0.05 (its interval: 4.303 * 0.05 / sqrt(3) = 0.124): within;
  # the language row moves by 0.1, far outside its 0.025
  second = write_run(tmp_path / "b", {"task expert": ([0.2, 0.3, 0.25], None), "merge": ([0.45, 0.55, 0.5], "+")},
                     [0.8, 0.82, 0.81], b"bases")
  assert testbed_stability.main([first, second, f"--out={tmp_path / 'out.json'}"]) == 1
  got = json.loads((tmp_path / "out.json").read_text())
  assert got["shared_bases"] and got["same_significant_set"] and "fresh_draw" not in got
  assert got["significant_first"] == got["significant_second"] == ["merge"] and got["below_first"] == []
  assert [(e["model"], e["role"]) for e in got["moved"]] == [("task expert", "language")]
  assert "share their bases" in capsys.readouterr().out
  other = write_run(tmp_path / "c", {"task expert": ([0.2, 0.3, 0.25], None), "merge": ([0.45, 0.55, 0.5], "")},
                    [0.9, 0.92, 0.91], b"other bases")
  result = testbed_stability.compare(testbed_stability.load_rows(first), testbed_stability.load_rows(other),
                                     shared_bases=False)
  assert not result["same_significant_set"] and not result["holds"]
  fresh = result["fresh_draw"]  # 3 rows with a spread, each outside with 1 - capture(3)
  assert fresh["rows_with_spread"] == 3 and fresh["expected_outside"] == pytest.approx(3 * (1 - stats.capture(3)))
  assert fresh["differ"] == [] and fresh["replicates"]
  # both runs' 6 bases as one sample: the merge's differences 0.2 (x3) and 0.25, 0.25, 0.25
  merge = fresh["pooled"]["merge"]
  assert merge["n"] == 6 and merge["mean"] == pytest.approx(0.225) and merge["sign"] == "+"
  assert testbed_stability.bases_digest(first) == testbed_stability.bases_digest(second) != \
      testbed_stability.bases_digest(other)
  assert testbed_stability.bases_digest(str(tmp_path)) is None


def test_chaos_divergence_finds_the_first_split():
  a = {50: 2.0, 100: 1.0, 150: 0.5, 200: 0.4}
  b = {50: 2.0, 100: 1.0005, 150: 0.503, 200: 0.3}  # 0.05%, 0.6%, 25%
  got = testbed_chaos.divergence(a, b)
  assert got["relative"][50] == 0.0 and got["relative"][100] == pytest.approx(5e-4)
  assert (got["first_above_0.1%"], got["first_above_1%"], got["identical"]) == (150, 200, False)
  assert testbed_chaos.divergence(a, dict(a))["identical"]
