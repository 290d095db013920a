"""xlt.hf_tokenizer against transformers' AutoTokenizer: the outputs stored in
tests/fixtures/tokenizer_reference.json (tests/fixtures/make_tokenizer_reference.py), and
transformers itself where it is installed; the sandbox and the file checks."""

import base64
import contextlib
import io
import json
import os

import pytest

from xlt import hf_tokenizer

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
with open(os.path.join(FIXTURES, "tokenizer_reference.json")) as _f:
  REFERENCE = json.load(_f)["tokenizers"]


def materialize(name, root):
  """The directory of reference tokenizer `name`: the fixture's, or its stored files written under `root`."""
  ref = REFERENCE[name]
  if "dir" in ref:
    return os.path.join(FIXTURES, ref["dir"])
  d = os.path.join(root, name)
  os.makedirs(d, exist_ok=True)
  for file, content in ref["files"].items():
    with open(os.path.join(d, file), "wb") as f:
      f.write(base64.b64decode(content["base64"]) if isinstance(content, dict) else content.encode())
  return d


@pytest.fixture(params=sorted(REFERENCE))
def case(request, tmp_path):
  return request.param, materialize(request.param, str(tmp_path))


def test_special_ids(case):
  name, d = case
  tok, ref = hf_tokenizer.load(d), REFERENCE[name]
  assert (tok.bos_id, tok.eos_id, tok.pad_id if ref["pad_id"] is not None else None) == (
      ref["bos_id"], ref["eos_id"], ref["pad_id"])
  assert tok.eos_id in tok.stop_ids


def test_encode_decode(case):
  name, d = case
  tok = hf_tokenizer.load(d)
  for r in REFERENCE[name]["encode"]:
    assert tok.encode(r["text"]) == r["ids"], r["text"]
    assert tok.encode(r["text"], add_special_tokens=False) == r["ids_plain"], r["text"]
  for r in REFERENCE[name]["decode"]:
    assert tok.decode(r["ids"]) == r["text"], r["ids"]
    assert tok.decode(r["ids"], skip_special_tokens=False) == r["text_special"], r["ids"]


def test_chat_template(case):
  name, d = case
  tok = hf_tokenizer.load(d)
  for r in REFERENCE[name]["chat"]:
    if "template" in r:  # a named template, as transformers picks it when tools are passed
      named = hf_tokenizer.load(d, template_name=r["template"])
      assert named.apply_chat_template(r["messages"], r["add_generation_prompt"], tools=r["tools"]) == r["text"]
      continue
    assert tok.apply_chat_template(r["messages"], r["add_generation_prompt"]) == r["text"]
    assert tok.encode_chat(r["messages"], r["add_generation_prompt"]) == r["ids"]


def test_against_transformers_live(case):
  """The same comparisons on other text, where transformers is installed."""
  transformers = pytest.importorskip("transformers")
  name, d = case
  ours, theirs = hf_tokenizer.load(d), transformers.AutoTokenizer.from_pretrained(d)
  texts = ["Zwölf Äpfel kosten 3,50 €.", "  two  spaces ", "w3 w4 </s> w9", "x<s>y", "ünïcödé 🙂 done"]
  for t in texts:
    ids = theirs.encode(t)
    assert ours.encode(t) == ids, t
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), t
    assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids, skip_special_tokens=False), t
  messages = [{"role": "user", "content": "Zwölf Äpfel?"}, {"role": "assistant", "content": "Ja."},
              {"role": "user", "content": "Und 3?"}]
  assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
      messages, add_generation_prompt=True, tokenize=False)


def write(d, name, text):
  with open(os.path.join(d, name), "w") as f:
    f.write(text)


@pytest.fixture
def word_dir(tmp_path):
  """The llama fixture's tokenizer.json with a config written by the test."""
  with open(os.path.join(FIXTURES, "hf", "llama", "tokenizer.json")) as f:
    write(tmp_path, "tokenizer.json", f.read())
  return tmp_path


def test_template_sandbox(word_dir):
  # a template reaching for Python internals is stopped by the sandbox, not run
  write(word_dir, "tokenizer_config.json", json.dumps({
      "bos_token": "<s>", "eos_token": "</s>",
      "chat_template": "{{ messages.__class__.__mro__[1].__subclasses__() }}"}))
  config = os.path.join(str(word_dir), "tokenizer_config.json")
  with pytest.raises(hf_tokenizer.TokenizerError, match=f"^{config}: the chat template was stopped by the sandbox"):
    hf_tokenizer.load(str(word_dir)).apply_chat_template([{"role": "user", "content": "w1"}])
  # the immutable sandbox: templates cannot mutate the caller's messages
  write(word_dir, "tokenizer_config.json", json.dumps({"chat_template": "{{ messages.append(1) }}"}))
  with pytest.raises(hf_tokenizer.TokenizerError, match="sandbox"):
    hf_tokenizer.load(str(word_dir)).apply_chat_template([{"role": "user", "content": "w1"}])


@pytest.mark.parametrize("template, says", [
    ("{% for m in messages %}{{ m.content }", "syntax error at its line 1: unexpected '}'"),
    ("{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}",
     "refused the conversation: Conversation roles must alternate"),
    ("{{ ''.__class__.__base__.__subclasses__() }}", "stopped by the sandbox"),
])
def test_template_failures_are_one_line_naming_the_file(tmp_path, template, says):
  """python -m xlt.generate on a model whose chat template fails: exit 2, one line naming
  chat_template.jinja and the template's message."""
  import shutil

  from xlt import generate

  word_dir = tmp_path / "model"
  shutil.copytree(os.path.join(FIXTURES, "hf", "llama"), word_dir)
  write(word_dir, "chat_template.jinja", template)
  prompts = word_dir / "prompts.jsonl"
  prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "w1"}]}) + "\n")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    status = generate.main([f"--model={word_dir}", f"--prompts={prompts}", f"--output={word_dir / 'out.jsonl'}"])
  assert status == 2
  lines = err.getvalue().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"xlt.generate: error: {word_dir / 'chat_template.jinja'}: "), lines
  assert says in lines[0] and not (word_dir / "out.jsonl").exists()


def test_template_helpers(word_dir):
  write(word_dir, "tokenizer_config.json", json.dumps({"bos_token": "<s>", "chat_template": (
      "{{ bos_token }}{{ messages | tojson }}{{ strftime_now('%Y') | length }}"
      "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}")}))
  tok = hf_tokenizer.load(str(word_dir))
  m = [{"role": "user", "content": "<b>ü</b>"}]
  assert tok.apply_chat_template(m) == '<s>[{"role": "user", "content": "<b>ü</b>"}]4'
  with pytest.raises(hf_tokenizer.TokenizerError, match="tokenizer_config.json: the chat template refused the "
                     "conversation: one message only$"):
    tok.apply_chat_template(m * 2)
  # transformers' {% generation %} block (assistant masks) renders as its body
  write(word_dir, "tokenizer_config.json", json.dumps({"chat_template": (
      "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
      "{% else %}{{ m.content }}{% endif %}|{% endfor %}")}))
  m = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
  assert hf_tokenizer.load(str(word_dir)).apply_chat_template(m) == "a|b|"


def test_template_sources(word_dir):
  d = str(word_dir)
  write(d, "tokenizer_config.json", json.dumps({"chat_template": "config"}))
  assert hf_tokenizer.load(d).template == "config"
  write(d, "tokenizer_config.json", json.dumps({}))
  write(d, "chat_template.json", json.dumps({"chat_template": "json file"}))
  assert hf_tokenizer.load(d).template == "json file"
  write(d, "chat_template.jinja", "jinja file")  # the .jinja file wins over both
  write(d, "tokenizer_config.json", json.dumps({"chat_template": "config"}))
  assert hf_tokenizer.load(d).template == "jinja file"
  os.remove(os.path.join(d, "chat_template.jinja"))
  write(d, "tokenizer_config.json", json.dumps({"chat_template": [{"name": "a", "template": "A"},
                                                                  {"name": "b", "template": "B"}]}))
  assert hf_tokenizer.load(d, template_name="b").template == "B"
  with pytest.raises(hf_tokenizer.TokenizerError, match="none named 'default'"):
    hf_tokenizer.load(d)


def test_special_tokens_resolution(word_dir):
  d = str(word_dir)
  # legacy layout (no added_tokens_decoder): special_tokens_map.json overrides the config
  write(d, "tokenizer_config.json", json.dumps({"eos_token": "<s>"}))
  write(d, "special_tokens_map.json", json.dumps({"eos_token": {"content": "</s>", "special": True}}))
  tok = hf_tokenizer.load(d)
  assert tok.eos_id == 2 and tok.bos_id is None
  # ids the tokenizer files lack come from generation_config.json; it may stop on several ids
  write(d, "generation_config.json", json.dumps({"bos_token_id": 1, "eos_token_id": [5, 2]}))
  tok = hf_tokenizer.load(d)
  assert tok.bos_id == 1 and tok.stop_ids == [5, 2]


def test_bad_files(tmp_path, monkeypatch):
  with pytest.raises(hf_tokenizer.TokenizerError, match="no tokenizer.json or tokenizer.model"):
    hf_tokenizer.load(str(tmp_path))
  with pytest.raises(hf_tokenizer.TokenizerError, match="no model directory"):
    hf_tokenizer.load(str(tmp_path / "missing"))
  write(tmp_path, "tokenizer.json", "{not json")
  with pytest.raises(hf_tokenizer.TokenizerError, match="does not parse"):
    hf_tokenizer.load(str(tmp_path))
  write(tmp_path, "tokenizer_config.json", "[1,")
  with pytest.raises(hf_tokenizer.TokenizerError, match="not valid JSON"):
    hf_tokenizer.load(str(tmp_path))
  write(tmp_path, "tokenizer_config.json", "{}")
  monkeypatch.setattr(hf_tokenizer, "MAX_TOKENIZER_BYTES", 4)
  with pytest.raises(hf_tokenizer.TokenizerError, match="over the 4-byte limit"):
    hf_tokenizer.load(str(tmp_path))
  os.remove(tmp_path / "tokenizer.json")
  write(tmp_path, "tokenizer.model", "xx")
  monkeypatch.setattr(hf_tokenizer, "MAX_TOKENIZER_BYTES", 1 << 20)
  with pytest.raises(hf_tokenizer.TokenizerError, match="not a sentencepiece model"):
    hf_tokenizer.load(str(tmp_path))
