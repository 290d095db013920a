"""A base the user brings (xlt.experiments.testbed.text): the merge testbed run end to end from a
tiny Hugging Face Llama directory made here (random weights, configs/llama_base.py's tokenizer),
the task rendered as text in its tokenizer; nothing downloaded."""

import contextlib
import io
import json
import os
import re

import jax
import numpy as np
import pytest

from configs import llama_base
from configs import merge as merge_config
from xlt import generate, hf_tokenizer, model, pretrained, runner
from xlt.data import arithmetic
from xlt.eval import scores as eval_scores
from xlt.experiments import pretrain_hf
from xlt.experiments.testbed import text as testbed_text


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
  """A 3-block Llama-shaped model with random weights and the word-piece tokenizer of the
  testbed's vocabulary, saved as a Hugging Face directory."""
  out = str(tmp_path_factory.mktemp("hf_base") / "hf")
  tok_dir = out + "_tokenizer"
  ids = pretrain_hf.write_tokenizer(tok_dir, 64)
  m = {**llama_base.get_config().model.to_dict(), "num_layers": 3, "num_heads": 2, "num_kv_heads": 1,
       "d_model": 16, "mlp_dim": 32, "block_size": 64}
  cfg = model.config_from(m, hf_tokenizer.load(tok_dir).vocab_size)
  params = jax.tree.map(np.asarray, model.init_params(cfg, jax.random.key(0)))
  pretrained.save(cfg, params, out, source_dir=tok_dir,
                  hf_config={"model_type": "llama", "architectures": [pretrained.ARCHITECTURES["llama"]], **ids})
  return out


@pytest.fixture(scope="module")
def text_config(shrink_testbed):
  """configs/merge.py on a Hugging Face base as it is, at half the tests' usual tiny sizes:
  one seed, [C] only, no simultaneous, LoRA or trained-neuron recipes, one layer swap."""
  def make(base_model: str):
    c = shrink_testbed(merge_config.get_config(), examples=20, tests=8, steps=4)
    c.base_model, c.base_fluency = base_model, False
    c.num_seeds = 1
    c.partition.presets = ("C",)
    c.simultaneous.presets, c.simultaneous.steps_per_switch = (), (1,)
    c.lora.enabled = c.maet_neurons.enabled = False
    c.merge.swaps = ("1,1,0",)
    return c

  return make


def test_render_and_parse_round_trip():
  ex = arithmetic.make_example("add", 327, 8, "letter")
  assert testbed_text.render(ex) == ("[let] 3 2 7 + 8 =", " F D D")
  assert testbed_text.render(ex, "glued") == ("[let] 327 + 8 =", " FDD")
  for style in testbed_text.RENDERS:
    assert testbed_text.parse(testbed_text.render(ex, style)[1]) == list(ex.answer)
  assert testbed_text.parse(" 12 x") == ["1", "2", "x"]
  with pytest.raises(ValueError, match="base_render"):
    testbed_text.render(ex, "joined")


def test_text_tokenizer_encodes_as_sft_does(hf_base):
  hf = hf_tokenizer.load(hf_base)
  tok = testbed_text.TextTokenizer(hf, "spaced")
  ex = arithmetic.make_example("max", 12, 40, "letter")
  data, length = testbed_text.encode_sets({"a": [ex]}, tok)
  prompt = tok.encode(ex.prompt)
  answer = hf.encode(" " + " ".join(ex.answer), add_special_tokens=False)
  assert prompt[0] == hf.bos_id and length == len(prompt) + len(answer) + 1
  assert data["a"]["tokens"][0].tolist() == prompt + answer + [hf.eos_id]
  # the loss on the completion and EOS only
  assert data["a"]["loss_mask"][0].tolist() == [0.0] * (len(prompt) - 1) + [1.0] * (len(answer) + 1)
  assert tok.decode(answer + [hf.eos_id, answer[0]]) == list(ex.answer)


LM_EVAL_CALLS = []


def _fake_lm_eval(cfg, params, tok, tasks, options, name="model", manager=None):
  """Stands in for lm-eval (xlt.eval.scores.score): a number of the model's own parameters."""
  LM_EVAL_CALLS.append((name, tuple(tasks), tok.vocab_size))
  return {t: {"acc": float(np.mean(np.asarray(jax.tree.leaves(params)[0], np.float64)))} for t in tasks}


@pytest.fixture(scope="module")
def finished(hf_base, text_config, tmp_path_factory):
  """The run, with `eval.tasks` scored by a fake lm-eval scorer (no lm-eval needed)."""
  workdir = tmp_path_factory.mktemp("testbed_hf")
  c = text_config(hf_base)
  c.eval.tasks = ("fake_task",)
  with contextlib.redirect_stdout(io.StringIO()), pytest.MonkeyPatch.context() as patch:
    patch.setattr(eval_scores, "check", lambda tasks, options, **_: LM_EVAL_CALLS.append(("check", tuple(tasks))))
    patch.setattr(eval_scores, "score", _fake_lm_eval)
    rows = runner.run(c, str(workdir), progress=False)
  return rows, workdir


def test_eval_tasks_rows_for_every_model(hf_base, finished):
  rows, workdir = finished
  methods = list(dict.fromkeys(r["condition"] for r in rows if r["role"] != "lm_eval"))
  lm = {r["condition"]: r for r in rows if r["role"] == "lm_eval"}
  assert LM_EVAL_CALLS[0] == ("check", ("fake_task",))  # at config-check time, before anything trains
  assert sorted(lm) == sorted(methods) and all(r["metric"] == "fake_task/acc" for r in lm.values())
  scored = [call for call in LM_EVAL_CALLS if call[0] != "check"]
  assert sorted(n for n, *_ in scored) == sorted(methods)  # one call per model and seed
  assert {v for *_, v in scored} == {hf_tokenizer.load(hf_base).vocab_size}  # the model's own tokenizer
  _, base = pretrained.load(hf_base)  # base_fluency False: the base scored is the loaded model
  assert lm["base"]["values"] == [float(np.mean(np.asarray(jax.tree.leaves(base)[0], np.float64)))]
  assert "| base | " in open(workdir / "table.md").read().split("lm-eval (eval.tasks)")[1]


def test_eval_tasks_need_a_text_model(shrink_testbed, tmp_path):
  c = shrink_testbed(merge_config.get_config(), examples=20, tests=8, steps=4)
  c.eval.tasks = ("arc_easy",)
  with pytest.raises(ValueError, match="lm-eval scores text models; set base_model"):
    runner.run(c, str(tmp_path / "run"), progress=False)


def test_testbed_runs_from_a_hugging_face_base(hf_base, finished):
  rows, workdir = finished
  methods = list(dict.fromkeys(r["condition"] for r in rows))
  for want in ("base", "task expert", "language expert", "source-language expert", "data mixing",
               "partial task expert [C]", "freeze-then-train [C]", "train-then-revert [C]", "layer swap b=1 u=1 t=0",
               "soup", "task arithmetic λ=1.0", "TIES density=0.2", "DARE drop=0.5", "MAET"):
    assert want in methods, want
  for m in methods:
    assert {(r["role"], r["metric"]) for r in rows if r["condition"] == m} >= {
        ("goal", "exact_match"), ("goal", "any_script"), ("task", "exact_match"), ("language", "exact_match")}
  summary = json.load(open(workdir / "summary.json"))
  assert summary["members"]["base"] == 1 and summary["base_steps"] == 0
  assert not os.path.exists(workdir / "base")  # nothing trained the base

  # the base scored is the loaded model: its recorded answers are xlt.generate's greedy
  # answers of the loaded model to the rendered prompts
  cfg, params = pretrained.load(hf_base)
  hf = hf_tokenizer.load(hf_base)
  records = [json.loads(line) for line in open(workdir / "predictions.jsonl")]
  base = [r for r in records if r["member"] == "base/seed_0" and r["set"] == "add_digit/letter"]
  assert len(base) == 8
  got = generate.decode(cfg, params, hf, [r["prompt"] for r in base], max_new=testbed_text.TextTokenizer(
      hf, "spaced").max_new(3), batch=8)
  assert [" ".join(testbed_text.parse(g["continuation"])) for g in got] == [r["answer"] for r in base]
  # every model answered every prompt the base did
  assert len([r for r in records if r["member"] == "MAET/seed_0"]) == len(
      [r for r in records if r["member"] == "base/seed_0"])


def test_base_fluency_fine_tunes_the_loaded_model(hf_base, text_config, tmp_path):
  c = text_config(hf_base)
  c.base_fluency = True
  with contextlib.redirect_stdout(io.StringIO()):
    rows = runner.run(c, str(tmp_path), progress=False)
  assert os.path.isdir(tmp_path / "base") and json.load(open(tmp_path / "summary.json"))["base_steps"] == 4
  assert {r["condition"] for r in rows} >= {"base", "task expert", "soup"}


def test_a_wrong_base_model_is_one_clear_error(tmp_path, hf_base, text_config):
  (tmp_path / "empty").mkdir()
  for k, (path, why) in enumerate(((tmp_path / "nowhere", "no such directory"), (tmp_path / "empty", "config.json"))):
    with pytest.raises(ValueError, match=rf"base_model={re.escape(repr(str(path)))}: .*{why}"):
      runner.run(text_config(str(path)), str(tmp_path / f"run{k}"), progress=False)
    assert not os.path.exists(tmp_path / f"run{k}" / "base")
  c = text_config(hf_base)
  c.merge.swaps = ("1,1,1",)  # 4 blocks in a 3-block model: checked before the weights are read
  with pytest.raises(ValueError, match="exceeds the model's 3"):
    runner.run(c, str(tmp_path / "run2"), progress=False)
