"""mergekit's `chat_template:` for a merge's output: the Jinja text itself, or "auto" (the
template most of the inputs carry, as mergekit picks it). The template is rendered once on a
sample conversation in the bounded sandbox chat models' templates render in (xlt.io.chat_template)
before any merge work: a syntax error, a sandbox escape, a `raise_exception` or a template that
builds past the bounds (`range(10**9)`, `'x' * 10**10`) is one line, never an output that fails
for its users. It is written as the output's chat_template.jinja, which transformers reads; a chat_template
entry of the copied tokenizer_config.json is dropped so the two cannot disagree. mergekit's
named templates (chatml, llama3, ...) are its own files: give their text instead.
"""

from __future__ import annotations

import collections
import json
import os

from xlt.io import chat_template, fileio

JINJA = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
_MAX_BYTES = 1 << 20


def _read(path: str) -> str | None:
  if not os.path.isfile(path):
    return None
  fileio.check_size(path, _MAX_BYTES)
  with open(path) as f:
    return f.read()


def template_of(model: str) -> str | None:
  """The chat template a model directory carries: chat_template.jinja, else tokenizer_config.json's
  chat_template (its "default" one when it names several); None when it has none."""
  text = _read(os.path.join(model, JINJA))
  if text:
    return text
  raw = _read(os.path.join(model, TOKENIZER_CONFIG))
  try:
    template = json.loads(raw).get("chat_template") if raw else None
  except (ValueError, AttributeError):
    return None
  if isinstance(template, list):  # transformers' [{name, template}] form
    template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
  return template if isinstance(template, str) and template else None


def resolve(template: str, models: list[str]) -> str | None:
  """The Jinja text of mergekit's chat_template setting: "auto" is the plurality template of
  `models` (None when none has one), anything else the template's own text, checked."""
  if template == "auto":
    found = [t.strip() for t in (template_of(m) for m in models) if t]
    return check(collections.Counter(found).most_common(1)[0][0]) if found else None
  if "{" not in template:
    raise ValueError(f"chat_template: {template!r} is neither Jinja text nor auto (mergekit's named templates "
                     "are its own files: give the template's text)")
  return check(template)


def check(template: str) -> str:
  """`template`, after it rendered a sample conversation in the bounded sandbox (ValueError, one
  line, where it does not)."""
  import jinja2
  try:
    compiled = chat_template.compile(template)
  except jinja2.TemplateSyntaxError as e:
    raise ValueError(f"chat_template: a syntax error at its line {e.lineno}: {e.message}") from None
  try:
    chat_template.render(compiled, messages=chat_template.SAMPLE, add_generation_prompt=True, bos_token="<s>",
                         eos_token="</s>")
  except Exception as e:  # noqa: BLE001  (whatever the template does wrong is one line naming it)
    message = (str(getattr(e, "message", None) or e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f"chat_template: it fails on a sample conversation (user, assistant, user): {message}") from None
  return template


def write(output: str, template: str) -> None:
  """Sets `output`'s chat template: chat_template.jinja, none left in tokenizer_config.json."""
  config_path = os.path.join(output, TOKENIZER_CONFIG)
  raw = _read(config_path)
  if raw:
    config = json.loads(raw)
    if isinstance(config, dict) and "chat_template" in config:
      del config["chat_template"]
      fileio.write_text(config_path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
  fileio.write_text(os.path.join(output, JINJA), template)
