"""xlt's recipes on a pretrained model (xlt.experiments.finetune) end to end, with no download:
the tiny Llama fixture as the base, two small jsonl datasets in its vocabulary, a few steps."""

import contextlib
import io
import json
import os
import shutil

import jax
import numpy as np
import pytest

from conftest import built_once, child_env
from configs import finetune as finetune_config
from xlt import model, partition, pretrained, runner
from xlt.eval import scores as eval_scores
from xlt.experiments import finetune
from xlt.param_paths import path_names

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama")


def _write_jsonl(path, records):
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  return str(path)


def _data(tmp_path, write: bool = True):
  """task: prompt/completion "w4 wI" -> "wI+1"; language: chat turns "w5 wI" -> "wI wI"
  (the fixture's tokenizer knows w0 .. w59 and has a chat template); `write`=False: only
  their paths (written before)."""
  task = [{"prompt": f"w4 w{i}", "completion": f"w{i + 1}"} for i in range(6, 46)]
  lang = [{"messages": [{"role": "user", "content": f"w5 w{i}"}, {"role": "assistant", "content": f"w{i} w{i}"}]}
          for i in range(6, 46)]
  prompts = [{"prompt": f"w4 w{i}", "answer": f"w{i + 1}"} for i in range(6, 10)]
  files = {"task.jsonl": task, "language.jsonl": lang, "prompts.jsonl": prompts}
  return tuple(_write_jsonl(tmp_path / n, r) if write else str(tmp_path / n) for n, r in files.items())


def _config(tmp_path, write: bool = True):
  """The tiny run's config, its base and data in `tmp_path` (`write`=False: written before)."""
  base = tmp_path / "base"
  if write:
    shutil.copytree(FIXTURE, base)
  c = finetune_config.get_config()
  c.base = str(base)
  c.data.task, c.data.language, prompts = _data(tmp_path, write)
  c.data.block_size, c.data.val_fraction = 24, 0.2
  c.train.steps, c.train.eval_every, c.train.batch_size, c.train.checkpoint_every = 4, 2, 4, 2
  c.opt.peak_lr, c.opt.warmup_steps = 1e-2, 1
  c.together = True  # one compiled step for the four recipes
  c.partition.presets, c.partition.bottom, c.partition.top = ("C",), 1, 0  # block_0 language, block_1 task
  c.merges = ("layer_swap bottom=1 top=0",)
  c.eval.prompts, c.eval.max_new, c.eval.batch_size = (prompts,), 2, 8
  c.lora.enabled, c.lora.rank = True, 2
  c.lora.train.steps, c.lora.train.eval_every, c.lora.train.batch_size, c.lora.train.checkpoint_every = 4, 2, 4, 2
  c.lora.opt.peak_lr, c.lora.opt.warmup_steps = 1e-2, 1
  c.mesh.devices = 1
  return c


@pytest.fixture
def tiny(tmp_path):
  return _config(tmp_path)


def _build_finished(folder):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    runner.run(_config(folder), str(folder / "run"), progress=False)
  (folder / "stdout.txt").write_text(out.getvalue())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """One run shared by the tests that read its workdir, trained once per session
  (conftest.built_once): (config, workdir, rows, its stdout)."""
  folder = built_once(tmp_path_factory, "finetune", _build_finished)
  with open(folder / "run" / "results.json", encoding="utf-8") as f:  # the rows runner.run returned
    rows = json.load(f)
  return _config(folder, write=False), str(folder / "run"), rows, (folder / "stdout.txt").read_text()


def _leaves(tree):
  return {path_names(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


NAMES = ["task expert", "language expert", "partial task expert [C]", "partial language expert [C]",
         "LoRA task expert", "LoRA language expert", "freeze-then-train [C]", "train-then-revert [C]", "layer_swap bottom=1 top=0"]


def test_finetune_end_to_end(finished, capsys):
  c, workdir, rows, stdout = finished
  assert {r["condition"] for r in rows} == {"base", *NAMES}
  assert {(r["metric"], r["role"]) for r in rows} == {("val_loss", "task"), ("val_loss", "language"),
                                                      ("exact_match", "prompts")}
  for name in NAMES:
    d = os.path.join(workdir, "models", finetune.slug(name))
    assert os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "tokenizer.json")), d
  for f in ("table.md", "summary.json", "results.json"):
    assert os.path.isfile(os.path.join(workdir, f))
  assert "opt_state" in stdout  # the memory estimate is printed before training

  # the saved experts are the trained ones, bit for bit: their best-validation parameters
  _, base = pretrained.load(c.base)
  with np.load(os.path.join(workdir, "finetune", "best_params.npz")) as f:
    best = [f[f"leaf_{k}"] for k in range(len(f.files) - 1)]
  trained = [jax.tree.unflatten(jax.tree.structure(base), [x[m] for x in best]) for m in range(4)]
  load = lambda name: pretrained.load(os.path.join(workdir, "models", finetune.slug(name)))[1]
  for m, name in enumerate(NAMES[:4]):
    got, want = _leaves(load(name)), _leaves(trained[m])
    assert all(np.array_equal(got[p], want[p]) for p in want), name

  # the experts moved; the partial task expert moved only its task label (block_1)
  b = _leaves(base)
  labels = _leaves(partition.labels(base, partition.preset_rules("C", 2, 1, 0)))
  for name in NAMES[:2]:
    assert any(not np.array_equal(x, b[p]) for p, x in _leaves(load(name)).items()), name
  partial = _leaves(load("partial task expert [C]"))
  assert all(np.array_equal(partial[p], b[p]) for p in b if labels[p] == "language")
  assert any(not np.array_equal(partial[p], b[p]) for p in b if labels[p] == "task")

  # a LoRA expert changed the projections' kernels only (its adapters merged in)
  lora_expert = _leaves(load("LoRA task expert"))
  moved = {p for p in b if not np.array_equal(lora_expert[p], b[p])}
  assert moved and all(p[-1] == "weight" and p[1] in ("attn", "mlp") for p in moved), moved

  # the same command again reuses the finished workdir
  again = runner.run(c, workdir, progress=False)
  assert again == rows and "finished earlier" in capsys.readouterr().out


def test_merged_model_loads_in_transformers(finished):
  """Live: transformers reads the merged model xlt wrote and computes xlt's logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  path = os.path.join(finished[1], "models", finetune.slug("layer_swap bottom=1 top=0"))
  cfg, params = pretrained.load(path)
  ids = np.asarray([[1, 8, 9, 10, 11, 12]], np.int32)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  with torch.no_grad():
    want = hf_model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
  logits, _ = model.apply(cfg, params, ids)
  assert np.abs(np.asarray(logits) - want).max() <= 1e-4


def test_over_the_device_budget_fails_before_the_weights_load(tiny, tmp_path, monkeypatch):
  """The estimate comes from config.json and the safetensors headers: a model over the budget
  is refused before a weight is read, and the workdir is left free."""
  tiny.lora.enabled = False
  tiny.device_memory_gb = 1e-4  # ~100 KiB: under the four models' ~4 MiB
  monkeypatch.setattr(pretrained, "load", lambda *a, **k: pytest.fail("read the weights before the estimate"))
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(ValueError, match="per device") as e:
    runner.run(tiny, str(tmp_path / "run"), progress=False)
  assert "\n" not in str(e.value) and "opt_state" in out.getvalue()  # the estimate was printed first
  assert not os.path.exists(tmp_path / "run")


def test_config_errors_fail_before_training(tiny):
  tiny.simultaneous.presets = ("A",)
  with pytest.raises(ValueError, match="simultaneous.presets"):
    finetune.check(tiny, 2)
  tiny.simultaneous.presets = ()
  tiny.merges = ("layer_swap bottom=3 top=0",)
  with pytest.raises(ValueError):
    finetune.check(tiny, 2)
  tiny.merges = ("maet",)
  with pytest.raises(ValueError, match="no input"):
    finetune.check(tiny, 2)
  tiny.merges = ()
  tiny.data.val_fraction = 0.0
  with pytest.raises(ValueError, match="val_fraction"):
    finetune.check(tiny, 2)


def test_preset_ends_scale_to_the_depth(tiny):
  tiny.partition.bottom = tiny.partition.top = -1
  assert finetune.ends(tiny, 32) == (6, 2)
  assert finetune.ends(tiny, 16) == (3, 1)
  assert finetune.ends(tiny, 2) == (0, 0)  # the task label keeps a block


def test_declared_rules_and_the_recipes_they_add(tiny):
  """A declared rule set is a partition like a preset: its partial experts, compositions and
  (when named) its simultaneous recipe."""
  tiny.partition.presets = ()
  tiny.partition.rules = {"attn_language": (
      {"label": "language", "kinds": ("embedding", "head", "attn")},
      {"label": "language", "kinds": ("norm",), "names": ("ln_1",)},
      {"label": "task", "blocks": "all", "kinds": "all"})}
  tiny.simultaneous.presets, tiny.simultaneous.steps_per_switch = ("attn_language",), (2,)
  tiny.lora.enabled = False
  assert [r.name for r in finetune.plan(tiny)] == [
      "task expert", "language expert", "partial task expert [attn_language]",
      "partial language expert [attn_language]", "simultaneous [attn_language] k=2"]
  _, base = pretrained.load(tiny.base)
  labels = finetune.label_trees(tiny, base)["attn_language"]
  assert labels["block_1"]["attn"]["q"]["weight"] == "language" and labels["block_1"]["mlp"]["up"]["weight"] == "task"
  tiny.partition.rules = {"all_task": ({"label": "task", "kinds": ("embedding", "head")},)}
  tiny.partition.rest = "task"
  with pytest.raises(ValueError, match="needs both labels"):
    finetune.label_trees(tiny, base)


def test_a_preempted_run_resumes_to_the_same_models(finished, tmp_path):
  """Stopped mid-stage (as a preemption or kill -9 would leave it) and started again with the
  same config, the run ends with the models and rows of the uninterrupted one."""
  c, workdir, rows, _ = finished
  again = _config(tmp_path)
  again.base = c.base  # the same base directory: its path is part of the recorded config
  resumed = str(tmp_path / "resumed")
  with contextlib.redirect_stdout(io.StringIO()):
    assert runner.run(again, resumed, progress=False, stop_after=3) == []
    assert not os.path.exists(os.path.join(resumed, "results.json"))
    assert runner.run(again, resumed, progress=False) == rows
  for name in ("task expert", "partial language expert [C]", "layer_swap bottom=1 top=0"):
    slug = finetune.slug(name)
    _, want = pretrained.load(os.path.join(workdir, "models", slug))
    _, got = pretrained.load(os.path.join(resumed, "models", slug))
    for (p, x), y in zip(_leaves(want).items(), _leaves(got).values()):
      np.testing.assert_array_equal(x, y, err_msg=f"{name} {p}")


def test_a_run_failing_on_its_input_leaves_the_workdir_free(tiny, tmp_path):
  """A bad data line fails the run before anything trains: nothing is left behind, and the
  corrected command is not refused as "another config"."""
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "w4 w6", "completion": "w7"}\n{"prompt": "w4 w7", "completion": }\n')
  c, good = _config_like(tiny), tiny.data.task
  c.data.task = str(bad)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match="bad.jsonl:2"):
    runner.run(c, str(workdir), progress=False)
  assert not workdir.exists()
  c.data.task = good  # the corrected command claims the workdir afresh
  assert runner.claim_workdir(c, str(workdir.mkdir() or workdir)) == "new"


def test_adds_recipes_accepts_only_new_recipes(tiny):
  recorded = json.loads(json.dumps(tiny.to_dict()))
  diff = lambda c: runner.common.config_changes(recorded, c)
  more = _config_like(tiny)
  more.merges = (*tiny.merges, "ties density=0.5")
  more.neurons.enabled = True
  assert finetune.adds_recipes(recorded, more, diff(more))
  for field, value in (("train.steps", 8), ("lora.rank", 4), ("merges", ()), ("simultaneous.presets", ("C",))):
    other = _config_like(tiny)
    other.update_from_flattened_dict({field: value})  # together=True: an alternation changes the ensemble
    assert not finetune.adds_recipes(recorded, other, diff(other)), field
  alone = _config_like(tiny)
  alone.together, alone.lora.enabled = False, False
  recorded_alone = json.loads(json.dumps(alone.to_dict()))
  alone.simultaneous.presets = ("C",)  # a stage of its own
  alone.lora.enabled, alone.lora.presets, alone.lora.rank = True, ("C",), 4  # LoRA where the run had none
  assert finetune.adds_recipes(recorded_alone, alone, runner.common.config_changes(recorded_alone, alone))


def _config_like(c):
  return c.copy_and_resolve_references()


def test_a_config_adding_a_merge_keeps_the_finished_stages(finished, tmp_path, capsys):
  c, workdir, rows, _ = finished
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  more = _config_like(c)
  more.merges = (*c.merges, "ties density=0.5")
  metrics = os.path.join(copy, "finetune", "metrics.jsonl")
  before = open(metrics).read()
  got = runner.run(more, copy, progress=False)
  assert "the finished stages are kept" in capsys.readouterr().out
  assert open(metrics).read() == before  # no step trained again
  assert {r["condition"] for r in got} == {r["condition"] for r in rows} | {"ties density=0.5"}
  assert [r for r in got if r["condition"] == "task expert"] == [r for r in rows if r["condition"] == "task expert"]
  assert runner.run(more, copy, progress=False) == got  # and the workdir is finished again


def _fake_lm_eval(calls):
  """A scorer standing in for lm-eval (xlt.eval.scores.score): a number of the model's own
  parameters (the mean of its first leaf), so each row can be traced to its model."""
  def score(cfg, params, tok, tasks, options, name="model", manager=None):
    calls.append((name, tuple(tasks), options.num_fewshot))
    first = float(np.mean(np.asarray(jax.tree.leaves(params)[0], np.float64)))
    return {t: {"acc": first, "exact_match/strict": 0.5} for t in tasks}
  return score


def test_eval_tasks_score_every_model_into_the_rows(finished, tmp_path, monkeypatch, capsys):
  """`eval.tasks` added to a finished run: no step trains again, every model (the base too) is
  scored by the lm-eval scorer on the parameters it wrote, a row per model x task metric."""
  c, workdir, rows, _ = finished
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  calls, checked = [], []
  monkeypatch.setattr(eval_scores, "check", lambda tasks, options, **_: checked.append(list(tasks)))
  monkeypatch.setattr(eval_scores, "score", _fake_lm_eval(calls))
  more = _config_like(c)
  more.eval.tasks, more.eval.lm_eval.num_fewshot = ("fake_a", "fake_b"), 2
  metrics = os.path.join(copy, "finetune", "metrics.jsonl")
  before = open(metrics).read()
  got = runner.run(more, copy, progress=False)
  assert "the finished stages are kept" in capsys.readouterr().out and open(metrics).read() == before
  assert checked and checked[0] == ["fake_a", "fake_b"]
  assert sorted(n for n, _, _ in calls) == sorted(["base", *NAMES]) and {k for _, _, k in calls} == {2}
  assert [r for r in got if r["role"] != "lm_eval"] == rows  # the kind's own rows as they were
  lm = {(r["condition"], r["metric"]): r for r in got if r["role"] == "lm_eval"}
  assert set(lm) == {(n, f"{t}/{m}") for n in ["base", *NAMES] for t in ("fake_a", "fake_b")
                     for m in ("acc", "exact_match/strict")}
  for name in NAMES:  # each row is its model's: the directory written holds those parameters
    _, params = pretrained.load(os.path.join(copy, "models", finetune.slug(name)))
    want = float(np.mean(np.asarray(jax.tree.leaves(params)[0], np.float64)))
    assert lm[(name, "fake_b/acc")]["values"] == [want] and lm[(name, "fake_b/acc")]["lm_eval_task"] == "fake_b"
  assert "| model | fake_a/acc |" in open(os.path.join(copy, "table.md")).read()


def test_eval_tasks_without_lm_eval_fail_before_training(tiny, tmp_path, monkeypatch):
  monkeypatch.setattr(eval_scores, "available", lambda: False)
  tiny.eval.tasks = ("arc_easy",)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"eval.tasks=\['arc_easy'\] needs lm-eval"):
    runner.run(tiny, str(workdir), progress=False)
  assert not workdir.exists()


@pytest.mark.skipif(not eval_scores.available(), reason="lm-eval is not installed")
def test_eval_tasks_live(finished, tmp_path):
  """Live: lm-eval's local task scored in-process on every model, equal to `python -m xlt.eval`
  on the directory the run wrote."""
  from xlt.eval import __main__ as cli

  c, workdir, _, _ = finished
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  more = _config_like(c)
  tasks = os.path.join(os.path.dirname(__file__), "fixtures", "lm_eval_tasks")
  more.eval.tasks, more.eval.lm_eval.include_path, more.eval.lm_eval.batch_size = ("xlt_words_mc",), tasks, 4
  with contextlib.redirect_stdout(io.StringIO()):
    got = runner.run(more, copy, progress=False)
    d = os.path.join(copy, "models", finetune.slug("task expert"))
    want = cli.run([f"--model={d}", "--tasks=xlt_words_mc", f"--include_path={tasks}", "--batch=4"])["results"]
  row = next(r for r in got if r["condition"] == "task expert" and r["metric"] == "xlt_words_mc/acc_norm")
  assert row["values"] == [want["xlt_words_mc"]["acc_norm,none"]]


def test_merge_search_on_the_run_s_experts(finished, tmp_path):
  """xlt.merge_search on the models the run wrote: TIES over its two experts and the base,
  picked on half of the run's prompt file, reported on the other half."""
  from xlt import merge_search

  c, workdir, _, _ = finished
  experts = [os.path.join(workdir, "models", finetune.slug(n)) for n in ("task expert", "language expert")]
  out = tmp_path / "search"
  argv = ["--method=ties", f"--input=base={c.base}", f"--input=experts={','.join(experts)}",
          "--space=density=float:0.2:0.9", f"--prompts={c.eval.prompts[0]}", "--max_new=2", "--batch=8",
          "--trials=2", "--sampler=random", "--bootstrap=100", f"--output={out}"]
  with contextlib.redirect_stdout(io.StringIO()):
    assert merge_search.main(argv) == 0
  report = json.load(open(out / "report.json"))
  assert report["trials"] == 2 and report["held_out"]["n"] == 2
  assert set(report["inputs_held_out"]) == {c.base, *experts}
  assert os.path.isfile(out / "best" / "model.safetensors")


def test_generate_agrees_with_the_table(finished, tmp_path):
  """`python -m xlt.generate --answers --match=exact` on a model and prompt file of the table
  gives the table's exact match."""
  from xlt import generate

  c, workdir, rows, _ = finished
  prompts = c.eval.prompts[0]
  for name in ("task expert", "layer_swap bottom=1 top=0"):
    summary = generate.run([f"--model={os.path.join(workdir, 'models', finetune.slug(name))}",
                            f"--prompts={prompts}", f"--output={tmp_path / 'out.jsonl'}", f"--answers={prompts}",
                            "--match=exact", f"--max_new={c.eval.max_new}"])
    table = next(r for r in rows if r["condition"] == name and r["metric"] == "exact_match")
    assert summary["accuracy"] == table["values"][0], name


def test_model_cards_record_base_data_recipe_and_steps(finished):
  c, workdir, _, stdout = finished
  card = lambda name: open(os.path.join(workdir, "models", finetune.slug(name), "README.md")).read()
  front = lambda text: text.split("---\n")[1]
  expert = card("partial task expert [C]")
  assert "- merge" not in front(expert) and "- xlt" in front(expert)
  assert f"- base: `{c.base}`" in expert and c.data.task in expert and c.data.language in expert
  assert "the task data trains the task part of [C] (the rest frozen)" in expert
  assert "- best step: `" in expert and "- stopped at step: `" in expert
  swap = card("layer_swap bottom=1 top=0")
  assert "- merge" in front(swap) and "- method: `layer_swap`" in swap
  # the run's log: the data counts as a table, the stage in words
  assert "finetune: data" in stdout and "response tokens" in stdout and "{'train'" not in stdout
  assert "4 models trained together" in stdout and "partition cells" not in stdout


def _main(tmp_path, c, workdir):
  """python -m xlt.main on the finetune config with `c`'s base and data: (exit status, stderr lines)."""
  import subprocess
  import sys

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = child_env(PYTHONPATH=repo, XLT_CPU_DEVICES="1")
  cmd = [sys.executable, "-m", "xlt.main", "--config=configs/finetune.py", f"--workdir={workdir}",
         f"--config.base={c.base}", f"--config.data.task={c.data.task}", f"--config.data.language={c.data.language}",
         "--config.data.block_size=24", "--config.data.val_fraction=0.2"]
  out = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
  return out.returncode, [ln for ln in out.stderr.splitlines() if ln.strip()]


@pytest.mark.parametrize("bad", ["role", "template"])
def test_bad_inputs_end_main_with_one_line_and_leave_the_workdir_free(tiny, tmp_path, bad):
  if bad == "role":  # a typo'd role in the middle of a conversation
    tiny.data.language = _write_jsonl(tmp_path / "lang.jsonl", [{"messages": [
        {"role": "user", "content": "w5 w6"}, {"role": "wizard", "content": "w6"},
        {"role": "assistant", "content": "w6 w6"}]}] * 10)
    says = f"xlt: error: {tiny.data.language}:1: message 1 has the role 'wizard'"
  else:  # a chat template's own raise_exception, as Llama-2's and Mistral's have
    with open(os.path.join(tiny.base, "chat_template.jinja"), "w") as f:
      f.write("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    says = (f"xlt: error: {tiny.data.language}:1: {os.path.join(tiny.base, 'chat_template.jinja')}: the chat "
            "template refused the conversation: Conversation roles must alternate user/assistant")
  workdir = tmp_path / "run"
  status, lines = _main(tmp_path, tiny, workdir)
  assert status == 2 and len(lines) == 1 and lines[0].startswith(says), lines
  assert not workdir.exists()
