"""mergekit's `chat_template:` and `tokenizer: {source: ...}` / `tokenizer_source` from a mergekit YAML
(xlt.merge.chat, xlt.merge.from_mergekit): the output carries the template given (or the inputs' plurality one for
"auto") as chat_template.jinja, checked in jinja2's sandbox before the merge; transformers reads
it where installed."""

import json
import os
import shutil

import pytest

from xlt.merge import chat, from_mergekit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "llama")
LLAMA_B = os.path.join(REPO, "tests", "fixtures", "hf", "llama_b")
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def run_yaml(tmp_path, text: str) -> str:
  from configs import merge_files
  from xlt.merge.__main__ import merge_config, with_yaml
  yml = tmp_path / "merge.yml"
  yml.write_text(text)
  out = str(tmp_path / "out")
  merge_config(with_yaml(merge_files.get_config(), str(yml)) | {"output": out, "heatmaps": False}, overwrite=True)
  return out


def test_a_jinja_chat_template_is_the_outputs(tmp_path):
  out = run_yaml(tmp_path, f"merge_method: linear\nmodels:\n  - model: {LLAMA}\n  - model: {LLAMA_B}\n"
                           f"chat_template: {json.dumps(TEMPLATE)}\n")
  with open(os.path.join(out, "chat_template.jinja")) as f:
    assert f.read() == TEMPLATE
  with open(os.path.join(out, "tokenizer_config.json")) as f:
    assert "chat_template" not in json.load(f)
  transformers = pytest.importorskip("transformers")
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<user>hi"


def test_auto_takes_the_plurality_template(tmp_path):
  models = []
  for i, template in enumerate((TEMPLATE, "{{ 'other' }}", TEMPLATE)):
    path = tmp_path / f"m{i}"
    shutil.copytree(LLAMA, path)
    (path / "chat_template.jinja").write_text(template)
    models.append(str(path))
  assert chat.resolve("auto", models) == TEMPLATE
  (tmp_path / "m0" / "chat_template.jinja").unlink()
  (tmp_path / "m0" / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'other' }}"}))
  assert chat.resolve("auto", models) == "{{ 'other' }}"  # from tokenizer_config.json: 2 against 1
  out = run_yaml(tmp_path, "merge_method: linear\nmodels:\n" + "".join(f"  - model: {m}\n" for m in models)
                 + "chat_template: auto\n")
  with open(os.path.join(out, "chat_template.jinja")) as f:
    assert f.read() == "{{ 'other' }}"


def test_bad_templates_fail_before_the_merge(tmp_path):
  with pytest.raises(ValueError, match="chat_template: 'chatml' is neither Jinja text nor auto"):
    chat.resolve("chatml", [LLAMA])
  with pytest.raises(ValueError, match="chat_template: a syntax error at its line 1"):
    chat.resolve("{% for m in messages %}", [LLAMA])
  with pytest.raises(ValueError, match="syntax error"):
    run_yaml(tmp_path, f"merge_method: linear\nmodels:\n  - model: {LLAMA}\n  - model: {LLAMA_B}\n"
                       "chat_template: '{{ oops'\n")
  assert not os.path.exists(tmp_path / "out")


def test_tokenizer_source_maps_to_the_tokenizer_option():
  # token by token (xlt.merge.vocabulary) where every input has tokenizer.json, mergekit's
  # semantics; by row number only where rows are unambiguous (tests/test_merge_vocab.py)
  cfg = {"merge_method": "linear", "models": [{"model": "a"}, {"model": "b"}]}
  for source in ("union", "base", "b"):
    for given in ({"tokenizer": {"source": source}}, {"tokenizer_source": source}):
      got = from_mergekit.from_mergekit(cfg | given)
      assert got["tokenizer"] == {"source": source} and "vocab" not in got, given
  assert "tokenizer" not in from_mergekit.from_mergekit(cfg)
  with pytest.raises(ValueError, match="tokenizer_source: base, union or a model directory, got 3"):
    from_mergekit.from_mergekit(cfg | {"tokenizer_source": 3})
  with pytest.raises(ValueError, match="tokenizer / tokenizer_source: give one of them"):
    from_mergekit.from_mergekit(cfg | {"tokenizer": {"source": "base"}, "tokenizer_source": "base"})
