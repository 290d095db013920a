"""The regime map (configs/merge_regimes.py, xlt.experiments.testbed.regimes) end to end on a tiny
config: one fine-tune stage per regime from the same base, the experts' relative deltas, rows
with their regime, table.md and regime_map.png; the family lines; a bad regime fails first."""

import json
import os

import jax
import numpy as np
import pytest

from configs import merge_regimes
from xlt import runner
from xlt.experiments.testbed import experiment as testbed
from xlt.experiments.testbed import regimes as testbed_regimes
from xlt.experiments.testbed import regimes_report as testbed_regimes_report


@pytest.fixture
def tiny(shrink_testbed):
  c = shrink_testbed(merge_regimes.get_config())
  c.num_seeds = 1
  c.regimes = ((1e-4, 6), (1e-2, 6))
  return c


def test_regime_map_trains_each_regime_from_one_base_and_writes_the_map(tiny, tmp_path, monkeypatch):
  seen = {}
  train_stage = runner.train_stage

  def spy(c, stage, workdir, **kw):
    params, out = train_stage(c, stage, workdir, **kw)
    seen[stage.name] = (stage, params)
    return params, out

  monkeypatch.setattr(runner, "train_stage", spy)
  rows = runner.run(tiny, str(tmp_path), progress=False)
  assert list(seen) == ["base", "finetune_r0", "finetune_r1"]
  for name in ("finetune_r0", "finetune_r1"):
    assert (tmp_path / name).is_dir()
  base = jax.tree.leaves(seen["base"][1])
  members = len(testbed.plan(tiny))
  for i, (lr, steps) in enumerate(((1e-4, 6), (1e-2, 6))):
    stage = seen[f"finetune_r{i}"][0]
    assert len(stage.members) == members and (stage.config.opt.peak_lr, stage.config.train.steps) == (lr, steps)
    for leaf, b in zip(jax.tree.leaves(stage.init_params), base):  # every member starts from the one base
      np.testing.assert_array_equal(leaf, np.broadcast_to(b, leaf.shape))
  summary = json.load(open(tmp_path / "summary.json"))
  for expert in ("task expert", "language expert"):
    small, large = (summary["regimes"][i]["relative_delta"][expert]["mean"] for i in (0, 1))
    assert 0 < small < large, expert
  assert {r["regime"] for r in rows} == {0, 1}
  per = {i: [r for r in rows if r["regime"] == i] for i in (0, 1)}
  assert [(r["condition"], r["role"], r["metric"]) for r in per[0]] == [
      (r["condition"], r["role"], r["metric"]) for r in per[1]]
  for r in rows:
    assert r["peak_lr"] == (1e-4, 1e-2)[r["regime"]] and r["finetune_steps"] == 6
    assert r["task_expert_delta"] == summary["regimes"][r["regime"]]["relative_delta"]["task expert"]["mean"]
  for name in ("table.md", "regime_map.png", "results.csv", "table_r0.md", "table_r1.md", "predictions_r0.jsonl",
               "predictions_r1.jsonl", "delta_task_expert_r0.png", "delta_language_expert_r1.png"):
    assert (tmp_path / name).exists(), name
  table = (tmp_path / "table.md").read_text()
  assert "| model | r0 | r1 |" in table and "| *peak lr* | 0.0001 | 0.01 |" in table
  presets = len(tiny.partition.presets)
  for want in ("| task arithmetic λ=1.0 |", "| layer swap (mean of 2) |", f"| freeze-then-train (best of {presets}) |",
               "| MAET |"):
    assert want in table, want
  labels = [line["label"] for line in summary["regime_map"]]
  assert labels[:2] == ["task expert", "language expert"] and "layer swap (best of 2)" in labels
  assert runner.run(tiny, str(tmp_path), progress=False) == rows  # finished: reused


def test_family_lines_take_the_mean_and_the_best_member():
  def row(k, name, values):
    return {"regime": k, "condition": name, "role": "goal", "metric": "exact_match", "values": values,
            "mean": float(np.mean(values)), "task_expert_delta": [0.01, 0.1][k]}

  rows = [row(0, "a", [0.0, 0.2]), row(0, "b", [0.4, 0.4]), row(1, "a", [0.6, 0.8]), row(1, "b", [0.2, 0.0])]
  lines = testbed_regimes_report.lines(rows, [("swap", "best/mean", ["a", "b"]), ("one", "each", ["a", "missing"])])
  best, mean, each = lines
  assert [p["model"] for p in best["points"]] == ["b", "a"] and [p["x"] for p in best["points"]] == [0.01, 0.1]
  np.testing.assert_allclose([p["values"] for p in mean["points"]], [[0.2, 0.3], [0.4, 0.4]])
  np.testing.assert_allclose([p["mean"] for p in each["points"]], [0.1, 0.7])
  assert each["label"] == "a" and mean["aggregate"] and not each["aggregate"]
  assert all(p["ci95"] is not None for line in lines for p in line["points"])


@pytest.mark.parametrize("regimes, match", [
    ((), "regimes is empty"),
    (((1e-4,),), r"regimes entry 0 \(\(0.0001,\)\) is not a \(peak_lr, steps\) pair"),
    (((1e-4, 6), (0.0, 6)), r"regimes entry 1 .*peak_lr must be a positive number"),
    (((1e-4, 2.5),), "steps a positive integer"),
    (((1e-4, 6), (1e-4, 6)), "repeats an earlier regime"),
])
def test_a_bad_regime_fails_before_training(tiny, tmp_path, regimes, match):
  tiny.regimes = regimes
  with pytest.raises(ValueError, match=match):
    runner.run(tiny, str(tmp_path), progress=False)
  assert not os.path.exists(tmp_path / "base")


def test_the_regime_config_and_its_stages(tiny):
  c = merge_regimes.get_config()
  lrs = [lr for lr, _ in c.regimes]
  assert lrs == sorted(lrs) and 3e-4 in lrs and not c.lora.enabled and not c.maet_neurons.enabled
  r = testbed_regimes.regime_config(c, 0)
  assert (r.finetune.opt.peak_lr, r.finetune.train.steps, r.finetune.opt.total_steps) == (1e-4, 400, 400)
  assert c.finetune.opt.peak_lr == 3e-4  # the config itself is left as it was
  tiny.lora.enabled = True
  with pytest.raises(ValueError, match="lora.enabled: the regime map runs the full fine-tunes only"):
    testbed_regimes.prepare(tiny, "")
