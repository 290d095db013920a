"""The testbed's data-aware merges (xlt.experiments.testbed.statistics) and the re-merge of a
finished run's experts (xlt.experiments.testbed.remerge), on a tiny testbed run."""

import json
import os

import numpy as np
import pytest

from conftest import DATA_AWARE_MERGES, finished_testbed_config
from configs import merge as merge_config
from xlt.experiments.testbed import remerge
from xlt.experiments.testbed import statistics as testbed_statistics

NEW = DATA_AWARE_MERGES


def test_input_mask_keeps_the_positions_up_to_the_last_target():
  loss_mask = np.array([[0, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]], np.float32)  # [N, T - 1]
  np.testing.assert_array_equal(testbed_statistics.input_mask(loss_mask),
                                [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])


def test_sample_draws_without_replacement_and_the_same_each_time():
  enc = {"tokens": np.arange(20)[:, None] * np.ones((1, 3), int), "loss_mask": np.ones((20, 2))}
  a, b = testbed_statistics.sample(enc, 8, [0, 1]), testbed_statistics.sample(enc, 8, [0, 1])
  np.testing.assert_array_equal(a["tokens"], b["tokens"])
  assert len(set(a["tokens"][:, 0])) == 8 and a["loss_mask"].shape == (8, 2)
  np.testing.assert_array_equal(testbed_statistics.sample(enc, 50, 0)["tokens"], enc["tokens"])


def test_statistics_settings_and_placeholders():
  c = merge_config.get_config()
  assert testbed_statistics.settings(c) == testbed_statistics.DEFAULTS
  c.merge.statistics = {"examples": 0}
  with pytest.raises(ValueError, match="examples must be a positive integer"):
    testbed_statistics.settings(c)
  assert testbed_statistics.needs_data("regmean", {}) and not testbed_statistics.needs_data("localize_and_stitch", {})
  assert testbed_statistics.placeholder("fisher", {}, 2) == {"fishers": [None, None]}
  assert testbed_statistics.placeholder("localize_and_stitch", {"losses": "data"}, 2) == {"losses": None}


@pytest.fixture(scope="module")
def finished(finished_testbed, shrink_testbed):
  """The session's tiny finished testbed run (conftest.finished_testbed), whose merges include
  every method of NEW as a row: (config, workdir, its rows)."""
  with open(finished_testbed / "results.json", encoding="utf-8") as f:  # the rows runner.run returned
    return finished_testbed_config(shrink_testbed), str(finished_testbed), json.load(f)


def test_every_new_method_is_a_testbed_row(finished):
  _, _, rows = finished
  conditions = {r["condition"] for r in rows}
  assert set(NEW) <= conditions
  goal = {r["condition"]: r for r in rows if r["role"] == "goal" and r["metric"] == "exact_match"}
  for name in NEW:
    assert goal[name]["seeds"] == 2 and goal[name]["vs_best_expert"]["expert"] in ("task expert", "language expert")


def _listing(path):
  return sorted((os.path.relpath(os.path.join(d, f), path), os.stat(os.path.join(d, f)).st_mtime_ns)
                for d, _, fs in os.walk(path) for f in fs)


def test_remerge_rescores_the_run_and_pairs_each_merge(finished, tmp_path):
  c, workdir, rows = finished
  before = _listing(workdir)
  out = tmp_path / "out.json"
  merges = ["iso_c", "regmean", "localize_and_stitch losses='data' steps=2"]
  argv = [f"--workdir={workdir}", "--stage=finetune", *[f"--merge={m}" for m in merges], f"--out={out}"]
  assert remerge.main(argv) == 0
  assert _listing(workdir) == before  # read only
  result = json.loads(out.read_text())
  assert result["exploratory"] and not result["preregistered"] and result["seeds"] == [0, 1]
  # every model the run scored too (its extra rows hold the new merges) rescored as the run scored it
  assert set(result["recorded"]) == {"base", "task expert", "language expert", "task arithmetic λ=1.0", *merges}
  assert max(result["recorded"].values()) == 0.0
  # the testbed's own rows of the same merges, computed with the run's statistics settings, agree
  goal = lambda rs, name: next(r["values"] for r in rs if (r["condition"], r["role"], r["metric"]) ==
                               (name, "goal", "exact_match"))
  for m in merges:
    assert goal(result["rows"], m) == goal(rows, m), m
  s = {x["merge"]: x for x in result["summary"]}
  assert list(s) == ["task arithmetic λ=1.0", *merges] and s["task arithmetic λ=1.0"]["vs_reference"] is None
  for m in merges:
    d = np.subtract(goal(rows, m), goal(rows, "task arithmetic λ=1.0"))
    assert s[m]["vs_reference"]["mean"] == pytest.approx(float(np.mean(d)))
    assert 0 <= s[m]["vs_reference"]["p"] <= 1 and isinstance(s[m]["vs_reference"]["holm_rejects"], bool)
  doc = tmp_path / "doc.md"
  doc.write_text(f"intro\n\n{remerge.BEGIN}\nold\n{remerge.END}\n\nafter\n")
  assert remerge.main(["render", f"--results={out}", f"--doc={doc}"]) == 0
  text = doc.read_text()
  assert "old" not in text and text.endswith("after\n") and "| regmean |" in text and "Exploratory" in text
  assert remerge.main([f"--workdir={workdir}", "--merge=no_such_method", f"--out={out}"]) == 2
  assert remerge.main([f"--workdir={workdir}", f"--out={workdir}/x.json"]) == 2


def test_docs_rows_are_rendered_from_the_results_file():
  import glob
  if not glob.glob(remerge.RESULTS_GLOB):
    pytest.skip("no results file yet")
  with open(remerge.DOC, encoding="utf-8") as f:
    assert f.read() == remerge.render(write=False), "run: python -m xlt.experiments.testbed.remerge render"
