"""xlt.eval.scores: lm-eval task scores of models in memory, as the kinds' result rows. The
plumbing is checked without lm-eval; the live test (where lm-eval is installed) scores the tiny
Llama fixture on the local tasks and holds it to lm-eval's own `hf` backend's scores."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from configs import common as config_common
from xlt import pretrained, results
from xlt import hf_tokenizer
from xlt.eval import scores

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None

RESULTS = {"results": {
    "xlt_words_mc": {"alias": "xlt_words_mc", "acc,none": 0.25, "acc_stderr,none": 0.1, "acc_norm,none": 0.5,
                     "sample_len": 10},
    "xlt_words_gen": {"alias": "g", "exact_match,first_word": 0.125, "exact_match_stderr,first_word": "N/A"},
    "xlt_words_rolling": {"word_perplexity,none": 113.5, "bits_per_byte_stderr,none": "N/A", "flag": True}}}


def test_metrics_keep_every_score_but_the_errors():
  assert scores.metrics(RESULTS) == {"xlt_words_mc": {"acc": 0.25, "acc_norm": 0.5},
                                     "xlt_words_gen": {"exact_match/first_word": 0.125},
                                     "xlt_words_rolling": {"word_perplexity": 113.5}}


def test_rows_a_row_per_model_and_task_metric():
  by_model = {"a": {"t": {"acc": [0.5, 0.25]}}, "b": {"t": {"acc": [1.0, 0.0]}, "u": {"em": [0.5, 0.5]}}}
  rows = scores.rows(by_model, results.make_row, experiment="x", task="finetune")
  assert [(r["condition"], r["metric"], r["values"]) for r in rows] == [
      ("a", "t/acc", [0.5, 0.25]), ("b", "t/acc", [1.0, 0.0]), ("b", "u/em", [0.5, 0.5])]
  assert all(r["role"] == "lm_eval" and r["experiment"] == "x" for r in rows)
  assert rows[0]["mean"] == 0.375 and rows[0]["seeds"] == 2
  assert (rows[2]["lm_eval_task"], rows[2]["lm_eval_metric"]) == ("u", "em")
  table = scores.table(rows)
  assert "| model | t/acc | u/em |" in table and "| a | 0.3750 | – |" in table
  assert scores.table([]) == ""


def test_check_refuses_tasks_without_lm_eval(monkeypatch):
  monkeypatch.setattr(scores, "available", lambda: False)
  assert scores.check(()) is None  # no tasks: nothing to check, lm-eval or not
  with pytest.raises(ValueError, match=r"eval.tasks=\['arc_easy'\] needs lm-eval, which is not installed"):
    scores.check(["arc_easy"])


def test_options_from_config():
  e = config_common.lm_eval()
  assert scores.Options.from_config(e) == scores.Options()
  e.num_fewshot, e.limit, e.metadata, e.include_path = 2, 0.5, '{"mgsm_dir": "/d"}', "/t"
  o = scores.Options.from_config(e)
  assert (o.num_fewshot, o.limit, o.metadata, o.include_path) == (2, 0.5, {"mgsm_dir": "/d"}, "/t")
  e.metadata = "{oops"
  with pytest.raises(ValueError, match="eval.lm_eval.metadata is not JSON"):
    scores.Options.from_config(e)


@pytest.mark.skipif(not HAVE_LM_EVAL, reason="lm-eval is not installed")
def test_scores_in_memory_equal_hf_backend():
  d = str(FIXTURES / "hf" / "llama")
  cfg, params = pretrained.load(d)
  options = scores.Options(batch=4, include_path=str(FIXTURES / "lm_eval_tasks"))
  got = scores.score(cfg, params, hf_tokenizer.load(d), ["xlt_words_mc", "xlt_words_gen"], options)
  want = json.loads((FIXTURES / "lm_eval_hf" / "llama.json").read_text())["results"]
  assert got["xlt_words_mc"] == {"acc": want["xlt_words_mc"]["acc,none"],
                                 "acc_norm": want["xlt_words_mc"]["acc_norm,none"]}
  assert got["xlt_words_gen"] == {"exact_match/first_word": want["xlt_words_gen"]["exact_match,first_word"]}
  with pytest.raises(ValueError, match="unknown task 'no_such_task_43'"):
    scores.check(["no_such_task_43"], options)
