"""xlt.merge_search: a search over a merge method's options on tiny models made here from the
Llama fixture (the base, and an expert that is the base moved by noise). The objective is
xlt.generate's exact match against the expert's own greedy answers, so trials differ: slerp's
t near 1 (the expert) scores best. Checked: the report and the best model, the split (the
held-out prompts never reach a trial), resume after a kill (the same trials), bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import jax
import numpy as np
import pytest

from xlt import generate, hf_tokenizer, merge_search, pretrained

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama")
HAVE_OPTUNA = importlib.util.find_spec("optuna") is not None
SAMPLERS = ["random", pytest.param("tpe", marks=pytest.mark.skipif(not HAVE_OPTUNA, reason="optuna is not installed"))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """(base dir, expert dir, prompts file): 8 prompts answered by the expert's greedy words."""
  root = tmp_path_factory.mktemp("search")
  base = str(root / "base")
  shutil.copytree(FIXTURE, base)
  cfg, params = pretrained.load(base)
  leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, params))
  rng = np.random.default_rng(0)
  moved = [x + rng.normal(0, 0.5 * (float(np.std(x)) or 1.0), x.shape).astype(x.dtype) for x in leaves]
  expert = str(root / "expert")
  pretrained.save(cfg, jax.tree.unflatten(tree, moved), expert, source_dir=base)
  prompts = [f"w4 w{i} w{i + 3}" for i in range(6, 14)]
  tok = hf_tokenizer.load(base)
  answers = [g["continuation"] for g in generate.decode(cfg, jax.tree.unflatten(tree, moved), tok, prompts,
                                                        max_new=2, batch=8)]
  path = root / "prompts.jsonl"
  path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in zip(prompts, answers)))
  return base, expert, str(path)


def _argv(models, out, sampler="random", trials=3, *more):
  base, expert, prompts = models
  return ["--method=slerp", f"--input=base={base}", f"--input=other={expert}", "--space=t=float:0:1",
          f"--prompts={prompts}", "--max_new=2", "--batch=8", f"--trials={trials}", f"--sampler={sampler}",
          "--bootstrap=200", f"--output={out}", *more]


class Recording(merge_search.PromptObjective):
  """The prompts objective, recording the items each call scores."""

  calls: list = []

  def __call__(self, cfg, params, items):
    Recording.calls.append(list(items))
    return super().__call__(cfg, params, items)


def test_search_reports_the_best_trial_on_the_held_out_split(models, tmp_path):
  Recording.calls = []
  out = tmp_path / "s"
  report = merge_search.search(merge_search.parse(_argv(models, out)), Recording)
  trials = [json.loads(line) for line in open(out / "trials.jsonl")]
  assert [t["number"] for t in trials] == [0, 1, 2]
  best = max(trials, key=lambda t: t["value"])
  assert report["best"] == {"number": best["number"], "params": best["params"], "validation": best["value"]}
  assert json.load(open(out / "report.json")) == report

  # the split is honoured: the trials saw the validation prompts only, the report the rest only
  recorded = json.load(open(out / "search.json"))
  val, held = recorded["val_items"], recorded["held_out_items"]
  assert not set(val) & set(held) and sorted(val + held, key=int) == [str(i) for i in range(8)]
  assert Recording.calls == [val] * 3 + [held] * 3  # the trials, then the best merge and the two inputs
  assert {r["role"] for r in report["inputs_held_out"].values()} == {"base", "other"}
  assert report["inputs_held_out"][models[1]]["mean"] == 1.0  # the expert gives the answers it gave

  # the held-out score is the best model's, as written, with its bootstrap interval
  cfg, params = pretrained.load(str(out / "best"))
  records, prompts = generate.read_prompts(models[2])
  got = generate.decode(cfg, params, hf_tokenizer.load(str(out / "best")), [prompts[int(i)] for i in held],
                        max_new=2, batch=8)
  correct = [g["continuation"].strip() == records[int(i)]["answer"].strip() for g, i in zip(got, held)]
  h = report["held_out"]
  assert h["mean"] == pytest.approx(np.mean(correct)) and h["n"] == len(held)
  assert h["low"] <= h["mean"] <= h["high"]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_killed_search_resumes_to_the_same_trials(models, tmp_path, monkeypatch, sampler):
  whole = tmp_path / "whole"
  merge_search.search(merge_search.parse(_argv(models, whole, sampler, 4)))
  want = open(whole / "trials.jsonl").read()

  killed = tmp_path / "killed"
  write = merge_search._write_trials

  def kill_after_two(output, trials):
    write(output, trials)
    if len(trials) == 2:
      raise KeyboardInterrupt  # as a kill between trials leaves it: two trials in the journal
  monkeypatch.setattr(merge_search, "_write_trials", kill_after_two)
  with pytest.raises(KeyboardInterrupt):
    merge_search.search(merge_search.parse(_argv(models, killed, sampler, 4)))
  monkeypatch.setattr(merge_search, "_write_trials", write)
  Recording.calls = []
  merge_search.search(merge_search.parse(_argv(models, killed, sampler, 4)), Recording)
  assert len(Recording.calls) == 2 + 3  # trials 2 and 3, then the held-out report (the best merge, two inputs)
  assert open(killed / "trials.jsonl").read() == want
  assert json.load(open(killed / "report.json")) == json.load(open(whole / "report.json"))


def test_bad_input_is_one_line_and_exit_2(models, tmp_path, capsys, monkeypatch):
  out = tmp_path / "s"
  cases = [
      (["--method=nope"], "unknown merge method 'nope'"),
      (["--space=depth=float:0:1"], "slerp has no option 'depth'"),
      (["--space=t=float:1:0"], "LOW must be below HIGH"),
      (["--space=t=cube:0:1"], "expected name=float:LOW:HIGH"),
      (["--val_fraction=1"], "--val_fraction must be in (0, 1)"),
      (["--input=other=/no/such/dir"], "no model directory /no/such/dir"),
      (["--option=t=0.5"], "both searched (--space) and fixed (--option)"),
      (["--tasks=x"], "give one objective"),
  ]
  for more, message in cases:
    assert merge_search.main(_argv(models, out, "random", 2, *more)) == 2, more
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, (more, err)
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else object())
  assert merge_search.main(_argv(models, out, "tpe", 2)) == 2
  assert "needs optuna" in capsys.readouterr().err
  monkeypatch.undo()
  assert merge_search.main(_argv(models, out, "random", 1)) == 0
  assert merge_search.main(_argv(models, out, "random", 1, "--seed=5")) == 2  # another search, same folder
  assert "holds another search (seed differ)" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_lm_eval_tasks_as_the_objective(models, tmp_path):
  """Live: lm-eval's local multiple-choice task as the objective; an item is a document, and
  the trials score the validation documents only."""
  class Tasks(merge_search.TaskObjective):
    calls: list = []

    def __call__(self, cfg, params, items):
      Tasks.calls.append(list(items))
      return super().__call__(cfg, params, items)

  out = tmp_path / "s"
  tasks = os.path.join(os.path.dirname(__file__), "fixtures", "lm_eval_tasks")
  argv = [a for a in _argv(models, out, "random", 2) if not a.startswith("--prompts")]
  report = merge_search.search(merge_search.parse(argv + ["--tasks=xlt_words_mc", f"--include_path={tasks}",
                                                          "--metric=acc_norm"]), Tasks)
  recorded = json.load(open(out / "search.json"))
  val, held = recorded["val_items"], recorded["held_out_items"]
  assert sorted(val + held) == sorted(f"xlt_words_mc/{k}" for k in range(10))
  assert Tasks.calls == [val, val, held, held, held]
  assert 0 <= report["held_out"]["mean"] <= 1 and report["held_out"]["n"] == len(held)
