"""The structure kind (xlt.experiments.structure, configs/structure.py): xlt.structure's measure
of finished testbed runs, requested by a config and run by the runner like any experiment."""

import json
import os

import pytest

from configs import structure as structure_config
from xlt import runner


def test_the_kind_measures_a_finished_run_into_its_own_workdir(finished_testbed, tmp_path):
  c = structure_config.get_config()
  c.runs, c.problems, c.seeds = (str(finished_testbed),), 4, 1
  before = {f: os.path.getmtime(finished_testbed / f) for f in os.listdir(finished_testbed)}
  rows = runner.run(c, str(tmp_path / "w"), progress=False)
  label = finished_testbed.name
  assert [(r["role"], r["condition"], r["metric"], r["seeds"]) for r in rows] == [
      ("task", f"{label}/finetune", "edge_ratio", 1), ("language", f"{label}/finetune", "edge_ratio", 1)]
  result = json.loads((tmp_path / "w" / f"structure_{label}_finetune.json").read_text())
  assert result["stage"] == "finetune" and result["seeds"] == [0] and len(result["swap"]["goal"]["mean"]) == 4
  assert rows[0]["values"] == result["edge_ratio"]["task expert"]["values"]
  assert rows[1]["values"] == result["edge_ratio"]["language expert"]["values"]
  assert all(v > 0 for r in rows for v in r["values"])  # the experts moved
  assert (tmp_path / "w" / f"structure_{label}_finetune.png").exists()
  assert f"| {label}/finetune | {result['edge_ratio']['task expert']['mean']:.2f} |" in (
      tmp_path / "w" / "table.md").read_text()
  assert {f: os.path.getmtime(finished_testbed / f) for f in os.listdir(finished_testbed)} == before  # only read
  assert runner.run(c, str(tmp_path / "w"), progress=False) == rows  # finished: its rows, nothing measured


def test_the_kind_refuses_runs_it_cannot_measure_before_writing(tmp_path):
  c = structure_config.get_config()
  with pytest.raises(ValueError, match="runs: name at least one"):
    runner.run(c, str(tmp_path / "w"), progress=False)
  c.runs = (str(tmp_path / "nothing"),)
  with pytest.raises(ValueError, match="holds no config.json"):
    runner.run(c, str(tmp_path / "w"), progress=False)
  (tmp_path / "graph").mkdir()
  (tmp_path / "graph" / "config.json").write_text(json.dumps({"kind": "synthetic", "task": "graph"}))
  c.runs = (str(tmp_path / "graph"),)
  with pytest.raises(ValueError, match="a 'synthetic' run of task 'graph'; the structure measure reads testbed runs"):
    runner.run(c, str(tmp_path / "w"), progress=False)
  assert not (tmp_path / "w").exists()
