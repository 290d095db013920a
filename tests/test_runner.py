"""xlt.runner: a workdir holds one experiment's config, and a finished one is not run again."""

import json

import ml_collections
import pytest

from xlt import results, runner


def config(**train):
  c = ml_collections.ConfigDict()
  c.name = "pair"
  c.train = ml_collections.ConfigDict({**dict(steps=100, log_every=10, checkpoint_every=50), **train})
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  c.conditions = ("alone", "mixed")
  return c


def test_the_first_run_records_its_config_and_the_same_one_resumes(tmp_path):
  runner.claim_workdir(config(), str(tmp_path))
  recorded = json.loads((tmp_path / "config.json").read_text())
  assert recorded["train"]["steps"] == 100 and recorded["conditions"] == ["alone", "mixed"]
  runner.claim_workdir(config(), str(tmp_path))


def test_logging_saving_and_the_mesh_may_change(tmp_path):
  runner.claim_workdir(config(), str(tmp_path))
  c = config()
  c.train.log_every, c.train.checkpoint_every, c.mesh.data = 1, 5, 2
  runner.claim_workdir(c, str(tmp_path))


def test_another_recipe_in_the_same_workdir_is_an_error_naming_the_fields(tmp_path):
  runner.claim_workdir(config(), str(tmp_path))
  with pytest.raises(ValueError, match=r"train.steps: 100 there, 300 now.*fresh workdir"):
    runner.claim_workdir(config(steps=300), str(tmp_path))
  with pytest.raises(ValueError, match=r"train.patience: '<unset>' there, 4 now"):
    runner.claim_workdir(config(patience=4), str(tmp_path))
  assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 100  # untouched


@pytest.mark.parametrize("config", ["graph", "addition", "tinystories", "merge"])
def test_a_finished_workdir_returns_its_rows_without_preparing_or_training(config, tmp_path, monkeypatch):
  # every kind resumes a finished workdir the same way: its results.json, nothing rebuilt
  import importlib

  from xlt import experiments

  c = importlib.import_module(f"configs.{config}").get_config()
  rows = [results.make_row(experiment=c.name, task=c.task, language="l", role="target", condition="alone",
                           metric="m", samples=1, values=[0.5])]
  workdir, done = runner.open_workdir(c, str(tmp_path))
  assert done is None
  runner.write_outputs(workdir, rows, "table\n", {"wall_s": 1.0})
  monkeypatch.setattr(experiments.kind(c), "prepare", lambda *a: pytest.fail("prepared a finished workdir"))
  assert runner.run(c, str(tmp_path), progress=False) == rows
  config_b = importlib.import_module(f"configs.{config}").get_config()
  with config_b.unlocked():
    config_b.seed = 7
  with pytest.raises(ValueError, match="another config"):  # a finished workdir is still claimed first
    runner.run(config_b, str(tmp_path), progress=False)

