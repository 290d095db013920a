"""xlt.runner.claim_workdir: a workdir holds one experiment's config."""

import json

import ml_collections
import pytest

from xlt import runner


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
