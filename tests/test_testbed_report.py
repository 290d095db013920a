"""The merge testbed's rows and table (xlt.experiments.testbed.report) on hand-made scores: 95%
intervals, the goal's paired difference to the best expert with its marker, retention; and
xlt.report's results file and render of those fields."""

import json

import pytest

from configs import merge as merge_config
from xlt import report
from xlt.experiments.testbed import report as testbed_report

SETS = {"goal": ["add_digit/letter"], "task": ["add_digit/standard"], "language": ["max/letter"],
        "source_language": ["max/standard"]}
# per model: goal, task, language, source language (per seed, 3 seeds)
SCORES = {"base": ([0, 0, 0], [0, 0, 0], [0.9] * 3, [0.8] * 3),
          "task expert": ([0.1, 0.2, 0.3], [1, 1, 1], [0.45] * 3, [0.6] * 3),
          "language expert": ([0, 0, 0.03], [0, 0, 0], [0.95] * 3, [0.4] * 3),
          "merge up": ([0.5, 0.6, 0.8], [0.5] * 3, [0.9, 0.8, 0.7], [0.8] * 3),
          "merge down": ([0.0, 0.05, 0.2], [0.5] * 3, [0.9] * 3, [0.8] * 3),
          "merge level": ([0.3, 0.1, 0.3], [0.5] * 3, [0.9] * 3, [0.8] * 3)}
TRAINED_ON = {"task expert": ("task",), "language expert": ("language",)}


def _scores():
  out = {}
  for name, (goal, task, lang, src) in SCORES.items():
    out[name] = {"add_digit/letter": {"exact_match": goal, "any_script": goal},
                 "add_digit/standard": {"exact_match": task}, "max/letter": {"exact_match": lang},
                 "max/standard": {"exact_match": src}}
  return out


@pytest.fixture
def rows():
  return testbed_report.rows(merge_config.get_config(), list(SCORES), _scores(), SETS, [0, 1, 2], TRAINED_ON)


def _goal(rows, name):
  return next(r for r in rows if (r["condition"], r["role"], r["metric"]) == (name, "goal", "exact_match"))


def test_rows_carry_intervals_the_difference_to_the_best_expert_and_retention(rows):
  assert len(rows) == len(SCORES) * 5
  te = _goal(rows, "task expert")
  # mean 0.2, sd 0.1, half = t(0.975, 2) 4.3027 * 0.1 / sqrt(3) = 0.24841; the std stays in the row
  assert te["ci95"] == pytest.approx(0.24841, abs=1e-4) and te["std"] == pytest.approx(0.1)
  up = _goal(rows, "merge up")["vs_best_expert"]  # differences 0.4, 0.4, 0.5 to the task expert
  assert up["expert"] == "task expert" and up["values"] == pytest.approx([0.4, 0.4, 0.5])
  assert (up["mean"], up["ci95"], up["low"]) == pytest.approx((0.43333, 0.14342, 0.28991), abs=1e-4)
  assert up["sign"] == "+"
  assert _goal(rows, "merge down")["vs_best_expert"]["sign"] == "-"  # -0.1, -0.15, -0.1
  assert _goal(rows, "merge level")["vs_best_expert"]["sign"] == ""  # 0.2, -0.2, 0: includes 0
  # retention: the task expert keeps 0.45/0.9 of the language and 0.6/0.8 of the source language;
  # the language expert trained on the language: only the source language counts (0.4/0.8)
  assert te["retention"] == {"value": pytest.approx(0.5), "sets": {"language": pytest.approx(0.5),
                                                                   "source_language": pytest.approx(0.75)}}
  assert _goal(rows, "language expert")["retention"] == {"value": pytest.approx(0.5),
                                                          "sets": {"source_language": pytest.approx(0.5)}}
  assert _goal(rows, "merge up")["retention"]["value"] == pytest.approx(0.8 / 0.9)  # a merge: both sets
  assert _goal(rows, "base")["retention"]["value"] is None


def test_table_shows_intervals_markers_and_retention(rows):
  table = testbed_report.table(merge_config.get_config(), rows, list(SCORES), SETS)
  lines = table.splitlines()
  assert ("| model | goal: add_digit/letter | goal − best expert | goal, any script | task: add_digit/standard "
          "| language: max/letter | source language: max/standard | retention |") in lines
  assert "| task expert | 20.00 ± 24.84 | (best expert) | 20.00 ± 24.84 | 100.00 ± 0.00 | 45.00 ± 0.00 | " \
         "60.00 ± 0.00 | 50.0 |" in lines
  up = next(line for line in lines if line.startswith("| merge up |"))
  assert "| +43.33 [+28.99, +57.68] ▲ |" in up and up.endswith("| 88.9 |")
  assert next(line for line in lines if line.startswith("| merge down |")).split(" | ")[2].endswith("▼")
  level = next(line for line in lines if line.startswith("| merge level |")).split(" | ")[2]
  assert level.startswith("+3.33 [") and "▲" not in level and "▼" not in level
  assert next(line for line in lines if line.startswith("| base |")).endswith("| – |")
  assert "over 3 seeds" in lines[0] and "task expert" in lines[1]


def test_results_file_and_render_of_the_new_fields(rows, tmp_path):
  w = tmp_path / "run"
  w.mkdir()
  (w / "results.json").write_text(json.dumps(rows))
  (w / "summary.json").write_text(json.dumps({"wall_s": {"total": 10.0}}))
  got = report.collect(str(w), "configs/merge.py", "toy", results_dir=str(tmp_path / "r"), commit="c",
                       date="d", where="m")
  up = next(m for m in got["measurements"] if m["key"] == "merge up")
  # mean 63.33, sd 15.28: half = 4.3027 * 15.28 / sqrt(3) = 37.95
  assert (up["xlt"]["mean"], up["xlt"]["std"], up["xlt"]["ci"]) == (63.33, 15.28, 37.95)
  also = {a["label"]: a["xlt"] for a in up["also"]}
  assert set(also) == {"any script", "task", "language", "source language", "goal − task expert", "retention"}
  assert also["goal − task expert"] == {"mean": 43.33, "seeds": 3, "values": [40.0, 40.0, 50.0], "ci": 14.34,
                                        "low": 28.99, "high": 57.68, "sign": "+"}
  assert also["retention"] == {"mean": 88.9, "decimals": 1}
  te = next(m for m in got["measurements"] if m["key"] == "task expert")
  assert "goal − task expert" not in {a["label"] for a in te["also"]}  # the best expert itself
  text = report.render(report.load(str(tmp_path / "r")))
  assert "goal − task expert +43.33 [28.99, 57.68] ▲" in text
  assert "retention 88.9" in text
  assert "| task expert: goal (exact_match %) | – | 20.00 ± 10.00 (95% CI ± 24.84) (3 seeds) |" in text


@pytest.mark.parametrize("recorded", ["today", "before c.kind"])
def test_collect_of_the_regime_map_keys_each_regime(rows, tmp_path, recorded):
  w = tmp_path / "run"
  w.mkdir()
  # today the kind is in config.json and the rows carry the data task; runs of older code
  # recorded the kind's former task in the rows and no kind
  task = "arithmetic" if recorded == "today" else "arithmetic_regimes"
  if recorded == "today":
    (w / "config.json").write_text(json.dumps({"kind": "testbed.regimes", "task": "arithmetic"}))
  both = [{**r, "task": task, "regime": i, "peak_lr": lr, "finetune_steps": 800,
           "task_expert_delta": d, "language_expert_delta": d / 2}
          for i, (lr, d) in enumerate(((3e-4, 0.01), (1e-3, 0.04))) for r in rows]
  (w / "results.json").write_text(json.dumps(both))
  (w / "summary.json").write_text(json.dumps({"wall_s": {"total": 10.0}}))
  got = report.collect(str(w), "configs/merge_regimes.py", "toy_regimes", results_dir=str(tmp_path / "r"),
                       commit="c", date="d", where="m")
  keys = [m["key"] for m in got["measurements"]]
  assert keys == [f"r{i}/{name}" for i in (0, 1) for name in SCORES]
  up = next(m for m in got["measurements"] if m["key"] == "r1/merge up")
  assert up["label"] == "r1 (lr 0.001, 800 steps, task expert moved 0.04) merge up: goal"
  assert up["xlt"]["mean"] == 63.33 and not up["summary"]
