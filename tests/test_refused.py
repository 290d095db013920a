"""Nonsense refused before the first step: a negative or NaN learning rate, a NaN LoRA alpha, a
graph edge_prob of 2.0 (xlt.experiments.numbers, before the workdir is claimed), slerp's t=5 (the
merge registry's declared range), num_fewshot=-5 (xlt.eval.scores.Options), and xlt.generate's
--match=task without --answers. Each is one line (exit 2 from a command), and nothing is written."""

import contextlib
import io
import json
import math
import os
import subprocess
import sys

import pytest

from xlt.experiments import numbers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "llama")
LLAMA_B = os.path.join(REPO, "tests", "fixtures", "hf", "llama_b")


def _graph(**changes):
  from configs import graph
  c = graph.get_config()
  for key, value in changes.items():
    node = c
    *path, last = key.split(".")
    for part in path:
      node = node[part]
    node[last] = value
  return c


@pytest.mark.parametrize("changes, says", [
    ({"opt.peak_lr": -1e-3}, "opt.peak_lr must be a positive number (a negative one trains by gradient ascent)"),
    ({"opt.peak_lr": math.nan}, "opt.peak_lr must be a positive number"),
    ({"opt.b2": 1.5}, "opt.b2 must be in [0, 1)"),
    ({"graph.edge_prob": 2.0}, "graph.edge_prob must be a probability in [0, 1], got 2.0"),
    ({"train.min_delta": math.inf}, "train.min_delta must be a finite number, got inf"),
])
def test_a_nonsense_number_is_refused_before_the_workdir(tmp_path, changes, says):
  from xlt import runner
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    runner.run(_graph(**changes), str(workdir))
  assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)
  assert not workdir.exists()


def test_the_checks_find_nested_configs():
  from configs import finetune
  c = finetune.get_config()
  numbers.check(c)  # the shipped configs pass (every configs/*.py: test_every_shipped_config_passes)
  c.lora.alpha = math.nan
  with pytest.raises(ValueError, match=r"^lora.alpha must be a positive number, got nan"):
    numbers.check(c)
  c = finetune.get_config()
  c.lora.opt.peak_lr = -2e-4
  with pytest.raises(ValueError, match=r"^lora.opt.peak_lr must be a positive number"):
    numbers.check(c)


def test_every_shipped_config_passes():
  import importlib
  import pkgutil

  import configs
  for info in pkgutil.iter_modules(configs.__path__):
    module = importlib.import_module(f"configs.{info.name}")
    if hasattr(module, "get_config"):
      numbers.check(module.get_config())


def test_a_grid_point_with_a_nonsense_number_fails_before_any_point(tmp_path):
  from xlt import grid
  c = _graph()
  with c.unlocked():
    c.grid = ({"name": "ok", "opt.peak_lr": 1e-3}, {"name": "bad", "opt.peak_lr": -1.0})
  with pytest.raises(ValueError, match=r"^grid point 'bad': opt.peak_lr must be a positive number"):
    grid.run(c, str(tmp_path / "grid"))
  assert not (tmp_path / "grid" / "ok").exists()


def test_main_exits_2_with_one_line(tmp_path):
  from conftest import child_env
  out = subprocess.run([sys.executable, "-m", "xlt.main", "--config=configs/graph.py", f"--workdir={tmp_path / 'w'}",
                        "--config.opt.peak_lr=nan"], cwd=REPO, env=child_env(PYTHONPATH=REPO), capture_output=True,
                       text=True, timeout=300)
  lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith("xlt: error: opt.peak_lr must be a positive number"), lines
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("t, says", [(5, "option t must be between 0 and 1, got 5"),
                                     ([0.2, 1.5], "option t must be between 0 and 1, got 1.5"),
                                     (math.nan, "option t must be a finite number, got nan")])
def test_slerp_t_outside_0_1_is_refused(tmp_path, t, says):
  from xlt import merge
  from xlt.merge import registry
  with pytest.raises(ValueError, match=f"^merge method slerp: {says}"):
    registry.check_among("slerp", {"t": t}, ("base", "other"), "slerp")
  from configs import merge_files
  from xlt.merge.__main__ import merge_config
  c = merge_files.get_config()
  c.method, c.output, c.heatmaps = "slerp", str(tmp_path / "out"), False
  c.inputs = {"base": LLAMA, "other": LLAMA_B}
  c.options = {"t": t}
  with pytest.raises(ValueError, match=says):
    merge_config(c)
  assert not (tmp_path / "out").exists()
  assert merge.registry.check("slerp", {"base": None, "other": None}, {"t": 0.3})  # in range: fine


def test_num_fewshot_below_minus_one_is_refused(tmp_path):
  import ml_collections

  from configs import common
  from xlt.eval import __main__ as eval_main
  from xlt.eval import scores
  e = common.lm_eval()
  assert scores.Options.from_config(e).num_fewshot is None  # -1: the task's own
  e.num_fewshot = -5
  with pytest.raises(ValueError, match=r"^num_fewshot must be 0 or more .* got -5"):
    scores.Options.from_config(e)
  with pytest.raises(ValueError, match="^num_fewshot must be 0 or more"):
    scores.kind_options(ml_collections.ConfigDict({"eval": {"lm_eval": e}}))
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    status = eval_main.main(["--model", LLAMA, "--tasks=x", "--num_fewshot=-5", f"--output={tmp_path / 's.json'}"])
  assert status == 2 and err.getvalue().startswith("xlt.eval: error: num_fewshot must be 0 or more")
  assert err.getvalue().count("\n") == 1 and not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("match", ["task", "number"])
def test_generate_match_without_answers_is_refused(tmp_path, match):
  from xlt import generate
  prompts = tmp_path / "p.jsonl"
  prompts.write_text(json.dumps({"prompt": "w1"}) + "\n")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    status = generate.main(["--model", LLAMA, "--prompts", str(prompts), "--output", str(tmp_path / "o.jsonl"),
                            f"--match={match}"])
  assert status == 2 and err.getvalue() == (f"xlt.generate: error: --match={match} scores continuations against "
                                            "--answers: give --answers=FILE\n")
  assert not (tmp_path / "o.jsonl").exists()
