"""xlt's lm-eval backend against lm-eval's own `hf` backend (torch + transformers) on the tiny
Hugging Face checkpoints and the local tasks (tests/fixtures/lm_eval_tasks): every
loglikelihood to 1e-4, every greedy generation exactly, every task score exactly.

The hf answers are fixtures (tests/fixtures/make_lm_eval_fixtures.py writes them); the
requests' arguments come with them, so these tests need neither lm-eval nor torch. Where
lm-eval is installed, the live tests at the end run `python -m xlt.eval` and lm-eval's own
evaluator on the local tasks and compare every score with the hf backend's."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import sys

import numpy as np
import pytest

from conftest import load_script
from xlt import decode
from xlt import hf_tokenizer
from xlt import pretrained
from xlt.eval import requests as req

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
# the fixtures' script (torch is imported only when it runs), for model_dir: the hf run's directories
make = load_script("tests/fixtures/make_lm_eval_fixtures.py")
HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None

FAMILIES = make.FAMILIES
TOL = 1e-4


def _hf(family):
  return json.loads((FIXTURES / "lm_eval_hf" / f"{family}.json").read_text())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """family -> a requests.Model on one device, batch 4 (so several batches and one filler row)."""
  tmp = tmp_path_factory.mktemp("lm_eval_models")
  out = {}
  for family in FAMILIES:
    d = make.model_dir(family, str(tmp))
    cfg, params = pretrained.load(d)
    out[family] = req.Model(cfg, params, hf_tokenizer.load(d), batch=4)
  return out


def _loglikelihoods(m, samples):
  """(xlt's, hf's) loglikelihood and is_greedy of every request of a multiple-choice task."""
  pairs = [tuple(a) for s in samples for a in s["arguments"]]
  hf = [r[0] for s in samples for r in s["resps"]]
  p = req.prefix_id(m.tokenizer)
  ours = req.loglikelihood_tokens(m, [req.encode_pair(m.tokenizer, c, x, p) for c, x in pairs])
  assert all(math.isfinite(x[0]) for x in ours)  # a NaN would pass the max(...) < TOL comparisons
  return ours, hf


def _accuracy(samples, lls):
  """acc and acc_norm (by characters, as lm-eval) from per-choice loglikelihoods."""
  acc, acc_norm, k = [], [], 0
  data = json.loads((FIXTURES / "lm_eval_tasks" / "words.json").read_text())["mc"]["test"]
  for s in samples:
    n = len(s["arguments"])
    ll = np.array([x[0] for x in lls[k:k + n]])
    lengths = np.array([len(a[1]) - 1 for a in s["arguments"]], float)  # the choice, without the " " before it
    label = data[s["doc_id"]]["label"]
    acc.append(float(np.argmax(ll) == label))
    acc_norm.append(float(np.argmax(ll / lengths) == label))
    k += n
  return np.mean(acc), np.mean(acc_norm)


@pytest.mark.parametrize("family", FAMILIES)
def test_loglikelihood_matches_hf(models, family):
  hf = _hf(family)
  samples = hf["samples"]["xlt_words_mc"]
  ours, theirs = _loglikelihoods(models[family], samples)
  diff = max(abs(a[0] - b[0]) for a, b in zip(ours, theirs))
  assert diff < TOL, diff
  assert [a[1] for a in ours] == [b[1] for b in theirs]
  acc, acc_norm = _accuracy(samples, ours)
  assert acc == hf["results"]["xlt_words_mc"]["acc,none"]
  assert acc_norm == hf["results"]["xlt_words_mc"]["acc_norm,none"]


@pytest.mark.parametrize("family", FAMILIES)
def test_loglikelihood_rolling_matches_hf(models, family):
  m, hf = models[family], _hf(family)
  samples = hf["samples"]["xlt_words_rolling"]
  docs = [m.tokenizer.encode(s["arguments"][0][0]) for s in samples]
  assert max(len(d) for d in docs) > 2 * m.context  # several windows
  ours = req.loglikelihood_rolling(m, docs, req.prefix_id(m.tokenizer))
  theirs = [s["resps"][0][0] for s in samples]
  assert np.abs(np.subtract(ours, theirs)).max() < TOL  # NaN fails it
  words = sum(len(s["arguments"][0][0].split()) for s in samples)
  assert math.isclose(math.exp(-sum(ours) / words), hf["results"]["xlt_words_rolling"]["word_perplexity,none"],
                      rel_tol=1e-5)


def _generations(m, samples):
  contexts, until, max_gen = [], None, None
  for s in samples:
    text, kwargs = s["arguments"][0]
    contexts.append(m.tokenizer.encode(text))
    until, max_gen = kwargs["until"] + ["</s>"], kwargs["max_gen_toks"]
  return req.generate(m, contexts, until=until, max_gen_toks=max_gen)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_until_matches_hf(models, family):
  hf = _hf(family)
  samples = hf["samples"]["xlt_words_gen"]
  ours = _generations(models[family], samples)
  assert ours == [s["resps"][0][0] for s in samples]
  assert any(len(t.split()) > 1 for t in ours) and any(len(t.split()) < 12 for t in ours)  # stops and runs


def test_generate_until_chat_template_matches_hf(models):
  """The chat-templated prompts (rendered by lm-eval through the tokenizer's template)."""
  m = models["llama"]
  samples = _hf("llama")["chat"]["samples"]["xlt_words_gen"]
  rendered = m.tokenizer.apply_chat_template([{"role": "user", "content": "w5 w6"}])
  assert rendered == "w5 w6 "  # the fixture's template, rendered in jinja2's sandbox
  assert _generations(m, samples) == [s["resps"][0][0] for s in samples]


def test_rolling_windows_cover_every_token_once():
  ids = list(range(10, 20))
  windows = req.rolling_windows(ids, 1, 4)
  assert windows == [([1], [10, 11, 12, 13]), ([13], [14, 15, 16, 17]),
                     ([15, 16, 17], [18, 19])]
  assert sum((w[1] for w in windows), []) == ids
  assert req.rolling_windows([], 1, 4) == []


def test_encode_pair_moves_trailing_spaces(models):
  tok = models["llama"].tokenizer
  assert req.encode_pair(tok, "w5 w6 ", "w7", 1) == (tok.encode("w5 w6"), tok.encode("w7"))
  assert req.encode_pair(tok, "", "w7 w8", 1) == ([1], tok.encode("w7 w8"))


def test_sharded_requests_equal_one_device(models):
  """Every loglikelihood and generation on a data=2 x fsdp=2 x tensor=2 mesh of the 8 CPU devices
  equals the one-device run's."""
  one = models["llama"]
  mesh = decode.make_mesh("data=2,fsdp=2,tensor=2")
  sharded = req.Model(one.cfg, decode.place(one.cfg, one.params, mesh), one.tokenizer, mesh, batch=4)
  samples = _hf("llama")["samples"]
  a, _ = _loglikelihoods(one, samples["xlt_words_mc"])
  b, _ = _loglikelihoods(sharded, samples["xlt_words_mc"])
  assert max(abs(x[0] - y[0]) for x, y in zip(a, b)) < 1e-5 and [x[1] for x in a] == [y[1] for y in b]
  assert _generations(sharded, samples["xlt_words_gen"]) == _generations(one, samples["xlt_words_gen"])


# ------------------------------------------------------------------------------ live, with lm-eval


def _live_scores(results):
  return {t: {k: v for k, v in r.items() if k not in ("alias", "name", "sample_len") and "stderr" not in k}
          for t, r in results.items()}


def test_python_m_xlt_eval_scores_equal_hf(tmp_path):
  pytest.importorskip("lm_eval")
  from xlt.eval import __main__ as cli

  d = make.model_dir("llama", str(tmp_path))
  out = tmp_path / "scores.json"
  assert cli.main([f"--model={d}", f"--tasks={','.join(make.TASKS)}", f"--include_path={make.TASKS_DIR}",
                   "--batch=4", f"--output={out}"]) == 0
  ours, theirs = _live_scores(json.loads(out.read_text())["results"]), _live_scores(_hf("llama")["results"])
  assert ours.keys() == theirs.keys()
  for task in theirs:
    for metric, value in theirs[task].items():
      assert ours[task][metric] == pytest.approx(value, rel=1e-5, abs=0), (task, metric)


def test_eval_cli_user_errors(tmp_path, capsys):
  from xlt.eval import __main__ as cli

  assert cli.main([f"--model={tmp_path / 'none'}", "--tasks=x"]) == 2
  assert "no model directory" in capsys.readouterr().err
  assert cli.main(["--tasks=x"]) == 2
  if HAVE_LM_EVAL:
    d = make.model_dir("llama", str(tmp_path))
    assert cli.main([f"--model={d}", "--tasks=no_such_task_43"]) == 2
    assert "unknown task" in capsys.readouterr().err


def test_eval_cli_default_mesh_is_the_cpu_devices(tmp_path, capsys, monkeypatch):
  """`python -m xlt.eval` (cpu_devices=True: it made the cores devices) splits rows over the 8
  CPU devices when --mesh is not given; called in-process without that, one device."""
  from xlt.eval import __main__ as cli

  def evaluate(model_dir, tasks, *, mesh, **kwargs):
    raise ValueError(f"mesh {mesh}")  # what run() passes on, reported as a user error

  monkeypatch.setattr(cli, "evaluate", evaluate)
  for argv, cpu_devices, mesh in (([], True, "data=8"), ([], False, None), (["--mesh=data=2"], True, "data=2")):
    assert cli.main([f"--model={tmp_path}", "--tasks=x", *argv], cpu_devices=cpu_devices) == 2
    assert f"mesh {mesh}" in capsys.readouterr().err


def test_lm_eval_registry_knows_xlt():
  pytest.importorskip("lm_eval")
  from lm_eval.api.registry import get_model

  from xlt.eval import harness

  assert get_model("xlt") is harness.XltLM


if os.environ.get("XLT_LM_EVAL_LIVE_HF"):  # the hf side live too (slow: torch): tests/fixtures' script
  def test_fixtures_are_current(tmp_path):
    pytest.importorskip("transformers")
    record = make.run(make.model_dir("llama", str(tmp_path)), make.TASKS)
    assert _live_scores(record["results"]) == _live_scores(_hf("llama")["results"])


def test_lm_eval_command_line_with_model_xlt(tmp_path):
  """lm-eval's own command line (`python -m xlt.eval.harness` is lm-eval's CLI with "xlt" registered)."""
  pytest.importorskip("lm_eval")
  import subprocess

  d = make.model_dir("llama", str(tmp_path))
  r = subprocess.run([sys.executable, "-m", "xlt.eval.harness", "--model", "xlt", "--model_args",
                      f"pretrained={d}", "--batch_size", "4", "--tasks", "xlt_words_mc", "--include_path", make.TASKS_DIR,
                      "--output_path", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                     cwd=pathlib.Path(__file__).resolve().parent.parent)
  assert r.returncode == 0, r.stderr[-2000:]
  files = list((tmp_path / "out").rglob("results_*.json"))
  assert len(files) == 1
  scores = _live_scores(json.loads(files[0].read_text())["results"])
  assert scores["xlt_words_mc"] == pytest.approx(_live_scores(_hf("llama")["results"])["xlt_words_mc"], rel=1e-5)


def test_backend_imports_no_lm_eval_or_torch():
  """xlt.decode, xlt.eval.requests, xlt.eval's command line and xlt.generate load without lm-eval."""
  import subprocess

  code = ("import sys, xlt.decode, xlt.eval.requests, xlt.eval.__main__, xlt.generate; "
          "bad = sorted(m for m in ('lm_eval', 'torch', 'transformers', 'datasets') if m in sys.modules); "
          "print(bad); sys.exit(1 if bad else 0)")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                     cwd=pathlib.Path(__file__).resolve().parent.parent, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0, r.stdout + r.stderr


def test_mgsm_two_shot_configs_run(tmp_path):
  """xlt's MGSM configs (direct and native CoT) over files in MGSM's layout: 2-shot, every problem."""
  pytest.importorskip("lm_eval")
  from xlt.eval import __main__ as cli

  d = make.model_dir("llama", str(tmp_path))
  out = tmp_path / "mgsm.json"
  metadata = json.dumps({"mgsm_dir": str(FIXTURES / "mgsm")})
  assert cli.main([f"--model={d}", "--tasks=xlt_mgsm_direct_de,xlt_mgsm_native_cot_de", f"--metadata={metadata}",
                   "--max_gen_toks=8", f"--output={out}"]) == 0
  results = json.loads(out.read_text())["results"]
  assert set(results) == {"xlt_mgsm_direct_de", "xlt_mgsm_native_cot_de"}
  assert all(r["sample_len"] == 3 for r in results.values())
  assert "exact_match,flexible-extract" in results["xlt_mgsm_direct_de"]
  assert json.loads(out.read_text())["configs"]["xlt_mgsm_direct_de"]["num_fewshot"] == 2


def test_merge_then_evaluate(tmp_path):
  """python -m xlt.merge ... --evaluate=<tasks>: the merged model's scores beside it (live), or,
  without lm-eval, the merged model kept and one error line with exit status 2."""
  import subprocess

  repo = pathlib.Path(__file__).resolve().parent.parent
  a, b = make.model_dir("llama", str(tmp_path / "a")), make.model_dir("llama_b", str(tmp_path / "b"))
  out = tmp_path / "merged"
  r = subprocess.run([sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py", "--config.method=soup",
                      f"--config.inputs.experts={a},{b}", f"--config.output={out}", "--evaluate=xlt_words_mc",
                      f"--evaluate_args=--include_path={make.TASKS_DIR} --batch=4"],
                     cwd=repo, capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
  if not HAVE_LM_EVAL:
    assert r.returncode == 2 and "lm-eval is not installed" in r.stderr and r.stderr.strip().count("\n") == 0
    return
  assert r.returncode == 0, r.stderr[-2000:]
  scores = json.loads((out / "eval.json").read_text())["results"]["xlt_words_mc"]
  assert 0.0 <= scores["acc,none"] <= 1.0 and scores["sample_len"] == 10


def test_logits_budget_cuts_batches_not_answers(models, monkeypatch):
  """Scoring batches shrink to keep the windows' float32 logits [rows, window, V] and KV caches
  under LOGITS_BYTES; the answers stay the same."""
  m = models["llama"]
  samples = _hf("llama")["samples"]["xlt_words_mc"]
  full, _ = _loglikelihoods(m, samples)
  c = m.cfg
  assert req._window_rows(m, 32, 8) > 4
  row = 8 * c.vocab_size * 4 + 2 * c.num_layers * c.kv_heads * c.head_width * 4 * (32 + 8)
  monkeypatch.setattr(req, "LOGITS_BYTES", row * 3)  # 3 windows of 8 tokens after 32
  assert req._window_rows(m, 32, 8) == 3 and req._window_rows(m, 64, 64) == 1
  cut, _ = _loglikelihoods(m, samples)
  assert max(abs(a[0] - b[0]) for a, b in zip(full, cut)) < 1e-5 and [a[1] for a in full] == [b[1] for b in cut]


def test_buckets():
  """Prefix lengths padded by under 1/8 (at least to a multiple of LENGTH_BUCKET), windows to a
  power of two from 8, window rows to the batch times a power of two."""
  assert [req._bucket(n, 4096) for n in (1, 16, 17, 129, 200, 257, 1000)] == [16, 16, 32, 160, 224, 320, 1024]
  assert req._bucket(1000, 600) == 600
  assert [req._window_bucket(n) for n in (2, 5, 9, 32, 33, 65)] == [8, 8, 16, 32, 64, 96]
  assert [req._rows_bucket(n, 4, 100) for n in (1, 4, 5, 9, 13, 17)] == [4, 4, 8, 16, 16, 32]
  assert req._rows_bucket(17, 4, 20) == 20
