"""mergekit's `tokenizer:` block (xlt.merge.vocabulary): inputs whose vocabularies differ in words
and ids, aligned token by token, run from a mergekit YAML and compared with mergekit's own
outputs (tests/fixtures/mergekit/vocab/, written by tests/fixtures/make_mergekit_fixtures_vocab.py;
live where mergekit is installed); exact rows on hand-made vocabularies; one-line refusals."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from conftest import load_script, run_mergekit_yaml
from xlt.io import tensor_files as files
from xlt.merge import chat, from_mergekit, tool, vocabulary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADS = ("model.embed_tokens.weight", "lm_head.weight")


def fixture_script():
  return load_script("tests/fixtures/make_mergekit_fixtures_vocab.py")


def _run_yaml(tmp_path, case: str, config: dict) -> str:
  return run_mergekit_yaml(tmp_path, case, config, fixture_script())


def _assert_same_rows(out: str, want: dict, want_vocab: dict, want_rows: int) -> dict:
  """xlt's output `out` against mergekit's tensors: the same row for every token (each under
  its own tool's id), the same padding rows and vocab_size; returns xlt's vocabulary."""
  got, vocab = load_file(os.path.join(out, "model.safetensors")), vocabulary.vocab_of(out)
  assert sorted(vocab) == sorted(want_vocab)
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["vocab_size"] == want_rows
  for k in HEADS:
    assert got[k].shape == want[k].shape == (want_rows, 4), k
    for token, i in want_vocab.items():
      np.testing.assert_allclose(got[k][vocab[token]], want[k][i], rtol=1e-6, atol=1e-6, err_msg=f"{k} {token}")
    np.testing.assert_allclose(got[k][len(vocab):], want[k][len(want_vocab):], rtol=1e-6, atol=1e-6)
  return vocab


CASES = ["union_tokens", "base_tokens", "model_source", "union_source", "base_source"]
# mergekit numbers the union's new tokens in a hash map's order; xlt input by input, in id order
# (the base's tokens keep their ids), then the tokens rules add
UNION_IDS = {"union_tokens": ["<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "d", "e", "x", "y", "z", "w", "q", "<new>"],
             "union_source": ["<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "d", "e", "x", "y", "z", "w", "q"]}


@pytest.mark.parametrize("case", CASES)
def test_a_mergekit_tokenizer_yaml_gives_mergekits_rows(tmp_path, case):
  # union_source, base_source: tokenizer_source alone over tokenizers that number b and c
  # differently (ext swaps them): token by token, as mergekit, where row numbers would mix them
  script = fixture_script()
  file = os.path.join(script.OUT, f"{case}.safetensors")
  with safe_open(file, "np") as f:
    meta = f.metadata()
  assert json.loads(meta["config"]) == script.CASES[case]
  want_vocab = json.loads(meta["vocab"])
  out = _run_yaml(tmp_path, case, script.CASES[case])
  vocab = _assert_same_rows(out, load_file(file), want_vocab, int(meta["vocab_size"]))
  if case in UNION_IDS:
    assert vocab == {t: i for i, t in enumerate(UNION_IDS[case])}
  else:
    assert vocab == want_vocab  # the same ids: the source's, then the added tokens in order
  with open(os.path.join(out, "summary.json")) as f:
    assert json.load(f)["vocab_alignment"] == "tokens"
  # the chat template is the tokenizer source's (model_source: other's, in its
  # tokenizer_config.json, while config.json and ext's chat_template.jinja are the first model's)
  assert chat.template_of(out) == meta["chat_template"] == script.TEMPLATES[
      {"model_source": "other", "base_source": "ext"}.get(case, "base")]


def test_transformers_loads_the_merged_tokenizer(tmp_path):
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  script = fixture_script()
  out = _run_yaml(tmp_path, "union_tokens", script.CASES["union_tokens"])
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok.get_vocab() == vocabulary.vocab_of(out)
  assert tok("a x <new> q").input_ids == [4, 9, 14, 13]
  model = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert model.config.vocab_size == 15


@pytest.mark.parametrize("case", ["union_tokens", "model_source", "union_source"])
def test_vocab_matches_mergekit_live(tmp_path, case):
  pytest.importorskip("mergekit")
  script = fixture_script()
  want, want_vocab, rows, template = script.run_mergekit(script.CASES[case], str(tmp_path / "mk"))
  out = _run_yaml(tmp_path, case, script.CASES[case])
  _assert_same_rows(out, want, want_vocab, rows)
  assert chat.template_of(out) == template


# ---- exact rows on hand-made vocabularies


def _model(tmp_path, name: str, words: list[str], emb: np.ndarray) -> str:
  d = tmp_path / name
  d.mkdir()
  files.save({"model.embed_tokens.weight": emb, "lm_head.weight": -emb,
              "model.norm.weight": np.ones(2, np.float32)}, str(d / "model.safetensors"), metadata={"format": "pt"})
  (d / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                             "vocab_size": len(words)}))
  (d / "tokenizer.json").write_text(json.dumps({"added_tokens": [], "model": {
      "type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": "a"}}))
  return str(d)


def test_rows_of_each_rule_exactly(tmp_path):
  rows = lambda *r: np.array(r, np.float32).reshape(-1, 2)
  base = _model(tmp_path, "base", ["a", "b", "c"], rows(1, 1, 2, 2, 3, 3))
  e1 = _model(tmp_path, "e1", ["c", "a", "n", "m"], rows(30, 30, 10, 10, 40, 40, 50, 50))
  e2 = _model(tmp_path, "e2", ["a", "n", "b", "k"], rows(100, 100, 400, 400, 200, 200, 600, 600))
  inputs = {"base": base, "experts": [e1, e2]}
  block = {"source": "union", "pad_to_multiple_of": 4,
           "tokens": {"k": {"source": {"kind": "zero"}}, "z": {"source": {"kind": "model_token", "model": e1,
                                                                          "token": "m"}},
                      "a": {"source": e2, "force": True}}}
  tool.merge_files(inputs, "soup", str(tmp_path / "o"), {"weights": [0.5, 0.5]}, tokenizer=block, heatmaps=False)
  got = load_file(str(tmp_path / "o" / "model.safetensors"))["model.embed_tokens.weight"]
  assert vocabulary.vocab_of(str(tmp_path / "o")) == {t: i for i, t in enumerate("abcnmkz")}
  # a: forced from e2 in every input; b: e2's, the base's in e1 (the base has it); c: e1's, the
  # base's in e2; n: (e1 + e2) / 2 in the base (the base lacks it); m: e1's alone; k: zero in
  # e1; z: e1's m everywhere; then a padding row, the mean of the rows before (in each input)
  want = np.array([100, 200 / 2 + 2 / 2, 30 / 2 + 3 / 2, (40 + 400) / 2, 50 / 2 + 50 / 2, 600 / 2, 50])
  np.testing.assert_allclose(got[:7], np.stack([want, want], 1), rtol=1e-6)
  np.testing.assert_allclose(got[7], got[:7].mean(axis=0), rtol=1e-6)  # soup of the inputs' means
  assert got.shape == (8, 2) and json.load(open(tmp_path / "o" / "config.json"))["vocab_size"] == 8


def test_the_final_norm_is_not_a_vocabulary_tensor(tmp_path):
  a = _model(tmp_path, "a", ["a", "b"], np.ones((2, 2), np.float32))
  b = _model(tmp_path, "b", ["b", "a"], np.zeros((2, 2), np.float32))
  tool.merge_files({"experts": [a, b]}, "soup", str(tmp_path / "o"), {"weights": [1.0, 1.0]},
                   tokenizer={"source": "base", "tokens": {}}, heatmaps=False)
  got = load_file(str(tmp_path / "o" / "model.safetensors"))
  assert got["model.norm.weight"].shape == (2,)
  np.testing.assert_array_equal(got["model.embed_tokens.weight"], np.full((2, 2), 0.5))


def test_a_model_sources_chat_templates_replace_the_config_models(tmp_path):
  first = _model(tmp_path, "first", ["a", "b"], np.ones((2, 2), np.float32))
  second = _model(tmp_path, "second", ["b", "a"], np.zeros((2, 2), np.float32))
  (tmp_path / "first" / "chat_template.jinja").write_text("{{ 'first' }}")
  (tmp_path / "first" / "additional_chat_templates").mkdir()
  (tmp_path / "first" / "additional_chat_templates" / "tools.jinja").write_text("{{ 'first tools' }}")
  (tmp_path / "second" / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'second' }}"}))
  (tmp_path / "second" / "additional_chat_templates").mkdir()
  (tmp_path / "second" / "additional_chat_templates" / "rag.jinja").write_text("{{ 'second rag' }}")
  summary = tool.merge_files({"experts": [first, second]}, "soup", str(tmp_path / "o"), {"weights": [1.0, 1.0]},
                             tokenizer={"source": second}, heatmaps=False)
  out = tmp_path / "o"
  assert summary["config_from"] == first and chat.template_of(str(out)) == "{{ 'second' }}"
  assert not (out / "chat_template.jinja").exists()
  assert os.listdir(out / "additional_chat_templates") == ["rag.jinja"]
  assert (out / "additional_chat_templates" / "rag.jinja").read_text() == "{{ 'second rag' }}"
  assert "additional_chat_templates" in summary["files"] and "chat_template.jinja" not in summary["files"]
  transformers = pytest.importorskip("transformers")
  # what transformers makes of the output's templates is what it makes of the source's (mergekit
  # saves the source's tokenizer as transformers loads it)
  want = transformers.AutoTokenizer.from_pretrained(second).chat_template
  assert transformers.AutoTokenizer.from_pretrained(str(out)).chat_template == want and "second rag" in str(want)


# ---- a source base|union alone: token by token with every tokenizer, by row number only where unambiguous


def _soup(tmp_path, models: list[str], name: str, **kw) -> tuple[dict, dict]:
  summary = tool.merge_files({"experts": models}, "soup", str(tmp_path / name), {"weights": [1.0] * len(models)},
                             heatmaps=False, **kw)
  return load_file(str(tmp_path / name / "model.safetensors"))["model.embed_tokens.weight"], summary


def test_the_vocab_option_goes_token_by_token_where_every_input_has_a_tokenizer(tmp_path):
  rows = lambda *r: np.array(r, np.float32).reshape(-1, 2)
  a = _model(tmp_path, "a", ["a", "b", "c"], rows(1, 1, 2, 2, 3, 3))
  b = _model(tmp_path, "b", ["b", "a", "c", "d"], rows(20, 20, 10, 10, 30, 30, 40, 40))
  got, summary = _soup(tmp_path, [a, b], "u", vocab="union")
  # by token: a = (1 + 10) / 2, b = (2 + 20) / 2; d is b's alone (row numbers would mix a with b)
  np.testing.assert_allclose(got, rows(5.5, 5.5, 11, 11, 16.5, 16.5, 40, 40))
  assert summary["vocab_alignment"] == "tokens" and vocabulary.vocab_of(str(tmp_path / "u")) == {
      t: i for i, t in enumerate("abcd")}
  got, summary = _soup(tmp_path, [b, a], "o", tokenizer={"source": "base"})  # no base: the first's vocabulary
  np.testing.assert_allclose(got, rows(11, 11, 5.5, 5.5, 16.5, 16.5, 40, 40))


def test_row_numbers_only_where_rows_are_unambiguous(tmp_path):
  rows = lambda n, v: np.full((n, 2), v, np.float32)
  a = _model(tmp_path, "a", ["a", "b", "c"], rows(3, 1))
  same = _model(tmp_path, "same", ["a", "b", "c"], rows(3, 3))
  swapped = _model(tmp_path, "swapped", ["b", "a", "c"], rows(3, 5))
  bare = _model(tmp_path, "bare", ["a", "b", "c"], rows(3, 7))
  longer = _model(tmp_path, "longer", ["a", "b", "c", "d"], rows(4, 9))
  longer2 = _model(tmp_path, "longer2", ["a", "b", "c", "d"], rows(4, 11))
  for d in ("bare", "longer", "longer2"):
    os.remove(tmp_path / d / "tokenizer.json")
  # rows alike, the tokenizers present one vocabulary: nothing to align, by row number
  got, summary = _soup(tmp_path, [a, same, bare], "o1", tokenizer={"source": "union"})
  assert summary["vocab_alignment"] == "rows" and got.shape == (3, 2)
  np.testing.assert_allclose(got, rows(3, 11 / 3), rtol=1e-6)
  with pytest.raises(ValueError, match=r"tokenizer.source: union: .*a and .*swapped have different vocabularies, "
                                       r"and .*bare has no tokenizer.json to match its rows to tokens"):
    _soup(tmp_path, [a, swapped, bare], "o2", tokenizer={"source": "union"})
  ambiguous = r"longer has no tokenizer.json and the inputs' vocabularies differ in rows"
  for kw in ({"vocab": "union"}, {"tokenizer": {"source": "union"}}, {"vocab": "base"}):
    with pytest.raises(ValueError, match=ambiguous):
      _soup(tmp_path, [a, longer], "o3", **kw)
  # no tokenizer at all: xlt's vocab option takes row numbers for tokens; mergekit's source cannot
  got, summary = _soup(tmp_path, [bare, longer], "o4", vocab="union")
  assert summary["vocab_alignment"] == "rows" and got.shape == (4, 2)
  with pytest.raises(ValueError, match=r"tokenizer.source: base: .*bare has no tokenizer.json"):
    _soup(tmp_path, [bare, longer], "o5", tokenizer={"source": "base"})
  got, _ = _soup(tmp_path, [longer, longer2], "o6", tokenizer={"source": "base"})  # rows alike: nothing to align
  np.testing.assert_allclose(got, rows(4, 10))
  assert not any(os.path.exists(tmp_path / f"o{i}") for i in (2, 3, 5))


# ---- one line for what does not map


@pytest.mark.parametrize("tokens, message", [
    ({"x": "ext"}, r"tokenizer.tokens\['x'\]: an entry is \{source"),
    ({"x": {"source": "nowhere"}}, r"tokenizer.tokens\['x'\].source: 'nowhere' is not one of the merge's models"),
    ({"x": {"source": {"kind": "one"}}}, r"tokenizer.tokens\['x'\].source: a model, \{kind: zero\}"),
    ({"x": {"source": {"kind": "model_token", "model": "ext", "token": "a", "token_id": 1}}},
     r"\{kind: model_token, model, token\} or \{..., token_id\} \(one of them\)"),
    ({"x": {"force": True}}, r"tokenizer.tokens\['x'\]: not every input has this token, so it needs a source"),
    ({"x": {"source": "base"}}, r"tokenizer.tokens\['x'\].source: .*base has no token 'x'"),
    ({"x": {"source": {"kind": "model_token", "model": "ext", "token": "nope"}}}, r"ext has no token 'nope'"),
    ({"x": {"source": "ext", "force": "yes"}}, r"tokenizer.tokens\['x'\].force: true or false"),
])
def test_bad_tokens_entries_are_one_line(tmp_path, tokens, message):
  config = {"merge_method": "task_arithmetic", "base_model": "base", "models": [{"model": "ext"}],
            "tokenizer": {"source": "union", "tokens": tokens}}
  with pytest.raises(ValueError, match=message):
    _run_yaml(tmp_path, "bad", config)
  assert not os.path.exists(tmp_path / "bad")


def test_bad_tokenizer_yaml_exits_2_with_one_line(tmp_path):
  script = fixture_script()
  yml = tmp_path / "m.yml"
  yml.write_text(f"merge_method: linear\nmodels:\n  - model: {script.MODELS['ext']}\n"
                 f"  - model: {script.MODELS['other']}\ntokenizer:\n  source: {tmp_path}\n")
  r = subprocess.run([sys.executable, "-m", "xlt.merge", f"--config={yml}", f"--config.output={tmp_path / 'out'}"],
                     cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                     text=True)
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "tokenizer.source:" in r.stderr and "neither base, union nor a model directory" in r.stderr
  assert not os.path.exists(tmp_path / "out")


def test_the_block_maps_to_the_tokenizer_option():
  cfg = {"merge_method": "linear", "models": [{"model": "a"}, {"model": "b"}]}
  tokens = {"<x>": {"source": "a"}}
  got = from_mergekit.from_mergekit(cfg | {"tokenizer": {"tokens": tokens}})  # source: mergekit's default union
  assert "vocab" not in got and got["tokenizer"] == {"source": "union", "tokens": tokens}
  got = from_mergekit.from_mergekit(cfg | {"tokenizer": {"source": "b", "pad_to_multiple_of": 64}})
  assert got["tokenizer"] == {"source": "b", "pad_to_multiple_of": 64}
  assert from_mergekit.from_mergekit(cfg | {"tokenizer": {"source": "base"}})["tokenizer"] == {"source": "base"}
  with pytest.raises(ValueError, match="tokenizer.tokens: a mapping"):
    from_mergekit.from_mergekit(cfg | {"tokenizer": {"tokens": ["<x>"]}})


def test_written_files_replace_or_drop_copied_ones_and_never_weights(tmp_path):
  from xlt.io import hf_dir as hf
  src = _model(tmp_path, "src", ["a", "b"], np.ones((2, 2), np.float32))
  (tmp_path / "src" / "vocab.json").write_text("{}")
  tensors = {"model.embed_tokens.weight": np.ones((2, 2), np.float32)}
  hf.write_model_dir(tensors, str(tmp_path / "o"), source_dir=src, files={"tokenizer.json": "{}\n", "vocab.json": None})
  assert (tmp_path / "o" / "tokenizer.json").read_text() == "{}\n" and not (tmp_path / "o" / "vocab.json").exists()
  for name in ("config.json", "sub/x.jinja", "additional_chat_templates/..", "additional_chat_templates/"):
    with pytest.raises(ValueError, match=f"{name!r} is not a tokenizer file name"):
      hf.write_model_dir(tensors, str(tmp_path / "p"), source_dir=src, files={name: "{}"})
  assert not (tmp_path / "p").exists()
