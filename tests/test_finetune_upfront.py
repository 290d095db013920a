"""The fine-tuning kind refuses before the first step what would fail only after every expert
trained (a merge option the method refuses, eval.prompts missing or without answers), and a
run that did fail in its outputs takes the corrected command in the same workdir (issue 69)."""

import json

import pytest

from test_finetune import _config, _write_jsonl
from xlt import runner
from xlt.experiments import finetune


def _never_trains(*args, **kwargs):
  raise AssertionError("a stage trained before the config was refused")


@pytest.mark.parametrize("bad", ["ties density=1.5", "dare drop=1.5", "missing prompts", "no answer"])
def test_what_fails_after_training_is_refused_before_the_first_step(tmp_path, monkeypatch, bad):
  c = _config(tmp_path)
  if bad == "missing prompts":
    c.eval.prompts, says = (str(tmp_path / "nowhere.jsonl"),), "eval.prompts: .*nowhere.jsonl is not a file"
  elif bad == "no answer":
    c.eval.prompts = (_write_jsonl(tmp_path / "p.jsonl", [{"prompt": "w4 w6", "answer": "w7"}, {"prompt": "w4"}]),)
    says = 'eval.prompts: .*p.jsonl: prompt 1 has no "answer"'
  else:
    c.merges, says = (bad,), f"merges '{bad}': .*(density|drop) must be"
  monkeypatch.setattr(runner, "train_stage", _never_trains)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=says):
    runner.run(c, str(workdir), progress=False)
  assert not workdir.exists()  # released: the corrected command starts there


def test_a_run_that_failed_in_its_outputs_takes_the_corrected_command(tmp_path):
  c = _config(tmp_path)
  workdir = tmp_path / "run"
  workdir.mkdir()
  assert runner.claim_workdir(c, str(workdir), finetune) == "new"  # trained, then failed in the outputs
  fixed = c.copy_and_resolve_references()
  fixed.merges = ("ties density=0.5",)  # the bad merge replaced
  fixed.eval.prompts = (_write_jsonl(tmp_path / "fixed.jsonl", [{"prompt": "w4 w6", "answer": "w7"}]),)
  assert runner.claim_workdir(fixed, str(workdir), finetune) == "added"
  assert json.loads((workdir / "config.json").read_text())["merges"] == ["ties density=0.5"]
  (workdir / "results.json").write_text("[]")  # a finished run: a merge dropped is another experiment
  dropped = fixed.copy_and_resolve_references()
  dropped.merges = ()
  with pytest.raises(ValueError, match="use a fresh workdir"):
    runner.claim_workdir(dropped, str(workdir), finetune)
