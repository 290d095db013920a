"""A Hugging Face model directory's tokenizer, without transformers: encode, decode, chat template.

  tok = hf_tokenizer.load("path/to/model")
  ids = tok.encode("Hello")                         # with the model's BOS where it adds one
  text = tok.decode(ids)                            # special tokens skipped
  prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])   # a string

`tokenizer.json` runs through the `tokenizers` package (what transformers' fast tokenizers
are); a directory with only `tokenizer.model` runs through sentencepiece (Llama / Gemma
style: BOS added, EOS not). Special tokens are resolved as transformers resolves them:
tokenizer_config.json, overridden by special_tokens_map.json when the config has no
`added_tokens_decoder` (the legacy layout); ids missing there fall back to
generation_config.json, then config.json. `stop_ids` are the ids that end a generation:
generation_config.json's `eos_token_id` (an int or a list: chat models often stop on
several) and the tokenizer's EOS.

Model directories are untrusted downloads: files are read as JSON, text or a sentencepiece
protobuf (never pickle), each size-checked before it is read, and chat templates render in
jinja2's immutable sandbox, bounded in what they may build (xlt.io.chat_template: `'x' * 10**10`
is one line, not the machine's memory), with the helpers transformers gives them
(`raise_exception`, `strftime_now`, a `tojson` that does not escape HTML).
"""

from __future__ import annotations

import json
import os
import re

from xlt.io import fileio

# A tokenizer.json of a 256k vocabulary (Gemma) is ~33 MB; configs and templates are KBs
# (a config listing every added token, ~1 MB). Anything far larger is not a tokenizer.
MAX_TOKENIZER_BYTES = 256 << 20
MAX_CONFIG_BYTES = 32 << 20
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# sentencepiece-only tokenizers whose transformers class adds BOS by default
_ADDS_BOS = ("Llama", "Gemma", "CodeLlama", "Mistral", "Mixtral", "Baichuan")


class TokenizerError(ValueError):
  """A model directory's tokenizer files are missing, too large or malformed (one line)."""


def _read(path: str, limit: int, binary: bool = False):
  fileio.check_size(path, limit, TokenizerError, " for tokenizer files")
  with open(path, "rb") as f:
    data = f.read(limit + 1)
  if binary:
    return data
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise TokenizerError(f"{path} is not UTF-8 text: {e}") from None


def _json(model_dir: str, name: str, limit: int = MAX_CONFIG_BYTES):
  path = os.path.join(model_dir, name)
  if not os.path.isfile(path):
    return None
  try:
    out = json.loads(_read(path, limit))
  except json.JSONDecodeError as e:
    what, line, column = fileio.json_fault(e)
    raise TokenizerError(f"{path} is not valid JSON: {what} at line {line} column {column}") from None
  if not isinstance(out, dict):  # every file read here is an object of settings
    raise TokenizerError(f"{path} holds a JSON {type(out).__name__}, not an object ({{\"key\": value, ...}})")
  return out


def _content(token):
  """A special token's string: configs hold a string or an AddedToken dict {"content": ...}."""
  if isinstance(token, dict):
    token = token.get("content")
  return token if isinstance(token, str) else None


def _ids(value) -> list[int]:
  if value is None:
    return []
  return [int(v) for v in (value if isinstance(value, list) else [value])]


def special_tokens(model_dir: str) -> dict:
  """(tokenizer config with special_tokens_map.json merged in as transformers does, {name: str})."""
  cfg = _json(model_dir, "tokenizer_config.json") or {}
  if "added_tokens_decoder" not in cfg:  # legacy layout: the map file overrides the config
    cfg = {**cfg, **(_json(model_dir, "special_tokens_map.json") or {})}
  return cfg, {name: _content(cfg.get(name)) for name in SPECIAL if _content(cfg.get(name)) is not None}


def chat_template(model_dir: str, cfg: dict, name: str | None = None) -> str | None:
  """The model's chat template: chat_template.jinja (and additional_chat_templates/*.jinja)
  take priority over tokenizer_config.json's `chat_template` (a string, or a list of
  {"name", "template"}), then chat_template.json. With several, `name` picks one, else
  "default"."""
  found = chat_template_and_file(model_dir, cfg, name)
  return None if found is None else found[0]


def chat_template_and_file(model_dir: str, cfg: dict, name: str | None = None) -> tuple[str, str] | None:
  """(template, the file it came from) of `chat_template`, or None."""
  templates = {}
  jinja = os.path.join(model_dir, "chat_template.jinja")
  if os.path.isfile(jinja):
    templates["default"] = (_read(jinja, MAX_CONFIG_BYTES), jinja)
  extra = os.path.join(model_dir, "additional_chat_templates")
  if os.path.isdir(extra):
    for f in sorted(os.listdir(extra)):
      if f.endswith(".jinja"):
        templates[f.removesuffix(".jinja")] = (_read(os.path.join(extra, f), MAX_CONFIG_BYTES), os.path.join(extra, f))
  if not templates:
    value, where = cfg.get("chat_template"), os.path.join(model_dir, "tokenizer_config.json")
    if value is None:
      value, where = (_json(model_dir, "chat_template.json") or {}).get("chat_template"), os.path.join(
          model_dir, "chat_template.json")
    if isinstance(value, list):
      templates = {t["name"]: (t["template"], f"{where} ({t['name']})") for t in value}
    elif isinstance(value, str):
      templates["default"] = (value, where)
  if not templates:
    return None
  if name is None and len(templates) > 1 and "default" not in templates:
    raise TokenizerError(f"{model_dir} has chat templates {sorted(templates)} and none named 'default': pick one")
  key = name or ("default" if "default" in templates else next(iter(templates)))
  if key not in templates:
    raise TokenizerError(f"{model_dir} has no chat template {key!r} (has {sorted(templates)})")
  return templates[key]


def template_error(source: str, error: Exception) -> TokenizerError:
  """One line for a chat template that fails: the file it came from and what failed (a
  syntax error and its line, the template's own raise_exception, the sandbox refusing an
  attribute), never the renderer's trace."""
  import jinja2
  import jinja2.sandbox

  message = (str(getattr(error, "message", None) or error).strip().splitlines() or [type(error).__name__])[0]
  if isinstance(error, jinja2.TemplateSyntaxError):
    return TokenizerError(f"{source}: the chat template has a syntax error at its line {error.lineno}: {message}")
  if isinstance(error, jinja2.sandbox.SecurityError):
    return TokenizerError(f"{source}: the chat template was stopped by the sandbox: {message}")
  if isinstance(error, jinja2.TemplateError):
    return TokenizerError(f"{source}: the chat template refused the conversation: {message}")
  return TokenizerError(f"{source}: the chat template failed on the conversation: {message}")


def compile_template(template: str):
  """`template` compiled in the bounded immutable sandbox (xlt.io.chat_template: templates can
  read what they are given, not change it, reach Python's internals or build past a size bound)."""
  import jinja2

  if tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3]) < (3, 1, 6):
    # older versions have known sandbox escapes (transformers refuses them too)
    raise TokenizerError(f"chat templates need jinja2 >= 3.1.6, found {jinja2.__version__}")
  from xlt.io import chat_template as bounded
  return bounded.compile(template)


class Tokenizer:
  """encode / decode / apply_chat_template of one model directory (`load` builds it).

  Attributes: `bos_id`, `eos_id`, `pad_id` (None where the model has none), `stop_ids` (the
  ids that end a generation), `vocab_size`, `special` ({"bos_token": "<s>", ...}),
  `template` (the chat template or None).
  """

  def __init__(self, backend, special: dict, template: str | None, ids: dict, stop_ids: list[int],
               clean_up: bool = False, template_file: str = "the chat template"):
    self._backend, self.special, self.template = backend, special, template
    self.template_file = template_file
    self.bos_id, self.eos_id, self.pad_id = ids.get("bos_token"), ids.get("eos_token"), ids.get("pad_token")
    self.stop_ids = stop_ids
    self._clean_up = clean_up
    self._compiled = None  # the chat template, compiled on first use
    self.vocab_size = backend.vocab_size

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return self._backend.encode(text, add_special_tokens)

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    text = self._backend.decode([int(i) for i in ids], skip_special_tokens)
    return _clean_up_spaces(text) if self._clean_up else text

  def token_id(self, token: str) -> int | None:
    return self._backend.token_id(token)

  def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> str:
    """The conversation as the model's chat template writes it (a string: `encode` it with
    add_special_tokens=False, since the template writes BOS itself where the model wants it).
    `kwargs` reach the template (tools, documents, enable_thinking, ...), over the special
    token strings (`bos_token`, ...) that it also sees, as in transformers."""
    if self.template is None:
      raise TokenizerError("this model has no chat template (tokenizer_config.json, chat_template.jinja)")
    if not messages:
      raise ValueError("cannot apply a chat template to an empty conversation")
    try:
      if self._compiled is None:
        self._compiled = compile_template(self.template)
      from xlt.io import chat_template as bounded
      return bounded.render(self._compiled, messages=list(messages), **{**self.special, **kwargs,
                                                                        "add_generation_prompt": add_generation_prompt})
    except TokenizerError:
      raise
    except Exception as e:  # noqa: BLE001  (whatever a template does wrong is one line naming it)
      raise template_error(self.template_file, e) from None

  def encode_chat(self, messages, add_generation_prompt: bool = True, **kwargs) -> list[int]:
    return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs), add_special_tokens=False)


def _clean_up_spaces(text: str) -> str:
  """transformers' `clean_up_tokenization` (for configs that ask for it on non-BPE models)."""
  for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
               (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
    text = text.replace(a, b)
  return text


class _Fast:
  """tokenizer.json through `tokenizers`, set up as transformers' TokenizersBackend sets it."""

  def __init__(self, text: str, cfg: dict, special: dict):
    import tokenizers
    from tokenizers import processors

    try:
      self.tok = tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # the Rust parser's errors carry no common base class
      raise TokenizerError(f"tokenizer.json does not parse: {str(e).splitlines()[0]}") from None
    self.tok.encode_special_tokens = False
    # special tokens the config names but tokenizer.json lacks are added, as transformers adds them
    added = {int(k): _content(v) for k, v in (cfg.get("added_tokens_decoder") or {}).items()}
    missing = [s for s in [*added.values(), *special.values()] if s and self.tok.token_to_id(s) is None]
    if missing:
      self.tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in missing])
    # transformers drops add_bos/eos_token when tokenizer.json exists (its post-processor
    # decides), and writes a plain "$A" template only where tokenizer.json has none
    if self.tok.post_processor is None:
      self.tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
    self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text, add_special_tokens):
    return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids, skip_special_tokens):
    return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

  def token_id(self, token):
    return self.tok.token_to_id(token)


class _SentencePiece:
  """tokenizer.model through sentencepiece. Special tokens written in the text are split out
  first (as transformers does); text after one gets no dummy-prefix space unless the config
  says `legacy: true` (transformers' non-legacy default)."""

  def __init__(self, data: bytes, cfg: dict, special: dict, add_bos: bool, add_eos: bool):
    import sentencepiece as spm

    self.sp = spm.SentencePieceProcessor()
    try:
      self.sp.LoadFromSerializedProto(data)
    except Exception as e:  # a RuntimeError or a protobuf DecodeError
      raise TokenizerError(f"tokenizer.model is not a sentencepiece model: {str(e).splitlines()[0]}") from None
    self.add_bos, self.add_eos, self.legacy = add_bos, add_eos, bool(cfg.get("legacy", False))
    self.unk = self.sp.id_to_piece(self.sp.unk_id())
    self.dummy_prefix = self.sp.encode("a", out_type=str)[0].startswith("\u2581")
    # tokens the config adds beyond the model's pieces keep the config's ids (as transformers
    # adds them); special tokens that are pieces keep the piece's id
    added = {_content(v): int(k) for k, v in (cfg.get("added_tokens_decoder") or {}).items() if _content(v)}
    self.specials = {}
    for s in dict.fromkeys([*added, *special.values()]):
      i = self.sp.piece_to_id(s)
      if i != self.sp.unk_id() or s == self.sp.id_to_piece(i):
        self.specials[s] = i
      elif s in added:
        self.specials[s] = added[s]
    self.extra = {i: s for s, i in self.specials.items() if i >= self.sp.get_piece_size()}
    self.split = (re.compile("(" + "|".join(re.escape(s) for s in sorted(self.specials, key=len, reverse=True)) + ")")
                  if self.specials else None)
    self.special_ids = set(self.specials.values()) | {
        i for i in range(self.sp.get_piece_size()) if self.sp.is_control(i)}
    self.vocab_size = max([self.sp.get_piece_size(), *(i + 1 for i in self.extra)])

  def encode(self, text, add_special_tokens):
    ids, first = [], True
    for part in (self.split.split(text) if self.split else [text]):
      if part in self.specials:
        ids.append(self.specials[part])
      elif part:
        if first or self.legacy:
          # tokenizers' Metaspace (transformers' conversion) adds no prefix space where the
          # text starts with one; sentencepiece would add a second
          ids += self.sp.encode(part[1:] if self.dummy_prefix and part.startswith(" ") else part)
        else:  # no dummy prefix: encode after the unknown token's text and drop its pieces
          ids += self.sp.encode(self.unk + part)[len(self.sp.encode(self.unk)):]
      first = False
    bos, eos = self.sp.bos_id(), self.sp.eos_id()
    if add_special_tokens:
      ids = ([bos] if self.add_bos and bos >= 0 else []) + ids + ([eos] if self.add_eos and eos >= 0 else [])
    return ids

  def decode(self, ids, skip_special_tokens):
    if skip_special_tokens:
      ids = [i for i in ids if i not in self.special_ids]
    out, run = [], []
    for i in [*ids, None]:
      if i is not None and i not in self.special_ids:
        run.append(i)
        continue
      if run:
        # sentencepiece drops a run's leading space; transformers' decoder strips only the
        # text's first one, so a run after a special token keeps it
        space = out and self.dummy_prefix and self.sp.id_to_piece(run[0]).startswith("\u2581")
        out.append(" " * bool(space) + self.sp.decode(run))
        run = []
      if i is not None:
        out.append(self.extra[i] if i in self.extra else self.sp.id_to_piece(i))
    return "".join(out)

  def token_id(self, token):
    if token in self.specials:
      return self.specials[token]
    i = self.sp.piece_to_id(token)
    return None if i == self.sp.unk_id() and token != self.sp.id_to_piece(i) else i


def load(model_dir: str, template_name: str | None = None) -> Tokenizer:
  """The tokenizer of a Hugging Face model directory (see the module docstring)."""
  if not os.path.isdir(model_dir):
    raise TokenizerError(f"no model directory {model_dir}")
  cfg, special = special_tokens(model_dir)
  fast, spm_file = os.path.join(model_dir, "tokenizer.json"), os.path.join(model_dir, "tokenizer.model")
  if os.path.isfile(fast):
    backend = _Fast(_read(fast, MAX_TOKENIZER_BYTES), cfg, special)
  elif os.path.isfile(spm_file):
    cls = str(cfg.get("tokenizer_class") or "")
    add_bos = cfg.get("add_bos_token", cls.startswith(_ADDS_BOS))
    backend = _SentencePiece(_read(spm_file, MAX_TOKENIZER_BYTES, binary=True), cfg, special, bool(add_bos),
                             bool(cfg.get("add_eos_token", False)))
  else:
    raise TokenizerError(f"{model_dir} has no tokenizer.json or tokenizer.model")
  ids = {name: backend.token_id(s) for name, s in special.items()}
  # ids the tokenizer files do not name: the model's generation / model config may
  gen, model_cfg = _json(model_dir, "generation_config.json") or {}, _json(model_dir, "config.json") or {}
  for name in ("bos_token", "eos_token", "pad_token"):
    if ids.get(name) is None:
      fallback = _ids(gen.get(f"{name}_id")) or _ids(model_cfg.get(f"{name}_id"))
      ids[name] = fallback[0] if fallback else None
  stop = _ids(gen.get("eos_token_id")) or _ids(model_cfg.get("eos_token_id"))
  stop = list(dict.fromkeys(stop + _ids(ids.get("eos_token"))))
  clean_up = bool(cfg.get("clean_up_tokenization_spaces", False)) and not (
      isinstance(backend, _Fast) and type(backend.tok.model).__name__ == "BPE")
  template, template_file = chat_template_and_file(model_dir, cfg, template_name) or (None, "")
  return Tokenizer(backend, special, template, ids, stop, clean_up, template_file)
