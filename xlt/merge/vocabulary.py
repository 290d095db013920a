"""mergekit's `tokenizer:` block: inputs whose tokenizers differ, aligned token by token before
the merge (mergekit/tokenizer/build.py and embed.py, whose rules this follows).

The output's vocabulary comes from `source`: "base" (the base's tokenizer; tokens only other
inputs know are dropped), "union" (the base's, then every other input's tokens it lacks) or a
model directory (that model's tokenizer); the keys of `tokens` it lacks are added. Each input's
embedding and head are then re-indexed to that vocabulary: a token the input has keeps the
input's row (under its own id there); a token it lacks gets a default row, the same for every
input lacking it:
  - the token's `tokens` rule: `source: <model>` (that model's row of the token), `source: {kind:
    model_token, model, token | token_id}` (that model's row of another token, or its raw row
    `token_id`), `source: {kind: zero}`; with `force: true` every input takes the rule's row,
    those that have the token too;
  - else (mergekit's defaults): the row of the one input that has the token; the base's row
    when the base has it; the mean of the rows of the inputs that have it; zero when none has it.
Rows past the vocabulary (`pad_to_multiple_of`) are each input's mean row. The merge method
then merges the aligned tensors as any others.

The vocabularies are read from the inputs' tokenizer.json (no tokenizer library): the model's
vocab (a map, or Unigram's list of pieces) and its added tokens; ids at or past config.json's
vocab_size are unused rows, not tokens. The union's new tokens are numbered input by input, in
each input's id order (mergekit numbers them in the order of a hash map, which can change from
one run to the next: its rows per token are the same, its ids may differ). The output's
tokenizer.json is the source's with the new tokens appended as added tokens (as transformers'
add_tokens does for mergekit), and its other tokenizer files and chat template are the source's
(mergekit saves the source's tokenizer, template and all).

A source base|union alone (mergekit's `tokenizer_source`, xlt's vocab option) goes token by token
whenever every input has tokenizer.json; where one lacks it, `by_rows` allows row numbers only
where they cannot mix tokens, and refuses in one line where they could.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from xlt.io import fileio

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SOURCES = ("base", "union")
_TEMPLATES_DIR = "additional_chat_templates"  # transformers' named chat templates (hf_dir.TOKENIZER_DIRS)
_MAX_BYTES = 256 << 20  # a tokenizer.json of a 1M-token vocabulary is well under this
# outside the blocks but not a row per token: final norms, position embeddings
_NOT_PER_TOKEN = re.compile(r"norm|(^|[._/])ln_f([._/]|$)|wpe|position")


@dataclasses.dataclass(frozen=True)
class Rule:
  """A `tokens:` entry: where the token's default row comes from, and whether every input takes it."""
  kind: str | None  # "model" (the token's own row), "model_token" (another row), "zero", None (no source)
  model: str | None = None
  token: str | None = None
  token_id: int | None = None
  force: bool = False


def _same(a: str, b: str) -> bool:
  return os.path.normpath(str(a)) == os.path.normpath(str(b))


def parse_rules(tokens, models: list[str]) -> dict[str, Rule]:
  """{token: Rule} of mergekit's `tokens:` mapping; ValueError (one line) naming the entry."""
  if tokens is None:
    return {}
  if not isinstance(tokens, dict):
    raise ValueError(f"tokenizer.tokens: a mapping {{token: {{source, force}}}}, got {tokens!r}")
  rules = {}
  for token, entry in tokens.items():
    where = f"tokenizer.tokens[{token!r}]"
    if not isinstance(token, str) or not token:
      raise ValueError(f"{where}: a token is a non-empty string")
    if not isinstance(entry, dict) or set(entry) - {"source", "force"}:
      raise ValueError(f"{where}: an entry is {{source: <model> | {{kind: zero}} | {{kind: model_token, model, "
                       f"token | token_id}}, force: true|false}}, got {entry!r}")
    force = entry.get("force", False)
    if not isinstance(force, bool):
      raise ValueError(f"{where}.force: true or false, got {force!r}")
    rules[token] = _rule(entry.get("source"), force, models, where)
  return rules


def _rule(source, force: bool, models: list[str], where: str) -> Rule:
  if source is None:
    return Rule(None, force=force)
  if isinstance(source, str):
    return Rule("model", _model(source, models, where), force=force)
  if not isinstance(source, dict) or source.get("kind") not in ("zero", "model_token"):
    raise ValueError(f"{where}.source: a model, {{kind: zero}} or {{kind: model_token, ...}}, got {source!r}")
  if source["kind"] == "zero":
    if set(source) != {"kind"}:
      raise ValueError(f"{where}.source: {{kind: zero}} takes nothing else, got {source!r}")
    return Rule("zero", force=force)
  if set(source) - {"kind", "model", "token", "token_id"} or ("token" in source) == ("token_id" in source):
    raise ValueError(f"{where}.source: {{kind: model_token, model, token}} or {{..., token_id}} (one of them), "
                     f"got {source!r}")
  token_id = source.get("token_id")
  if token_id is not None and (isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0):
    raise ValueError(f"{where}.source.token_id: a row number, got {token_id!r}")
  token = source.get("token")
  if token is not None and not isinstance(token, str):
    raise ValueError(f"{where}.source.token: a token (a string), got {token!r}")
  return Rule("model_token", _model(source.get("model"), models, where), token, token_id, force)


def _model(ref, models: list[str], where: str) -> str:
  match = next((m for m in models if isinstance(ref, str) and _same(ref, m)), None)
  if match is None:
    raise ValueError(f"{where}.source: {ref!r} is not one of the merge's models ({', '.join(models)})")
  return match


def _tokenizer_json(model: str) -> dict:
  path = os.path.join(str(model).partition("+")[0], TOKENIZER)
  if not os.path.isfile(path):
    raise ValueError(f"{model} has no {TOKENIZER}: the tokenizer block reads each input's vocabulary from it")
  fileio.check_size(path, _MAX_BYTES)
  try:
    with open(path, encoding="utf-8") as f:
      tok = json.load(f)
    if not isinstance(tok["model"]["vocab"], (dict, list)):
      raise TypeError
  except (ValueError, KeyError, TypeError):
    raise ValueError(f"{path} is not a tokenizers file (JSON with model.vocab)") from None
  return tok


def has_tokenizer(model: str) -> bool:
  return os.path.isfile(os.path.join(str(model).partition("+")[0], TOKENIZER))


def by_rows(models: list[str], sizes: list[int | None], what: str, rows_differ: bool, rows_asserted: bool) -> bool:
  """Whether a tokenizer source base|union (`what` names it in messages) aligns the inputs
  `models` by row number (tool.fit_vocab) rather than token by token (`align`; `sizes`: their
  config.json vocab_size; `rows_differ`: whether their vocabulary tensors differ in rows).

  Token by token (False) whenever every input has tokenizer.json: mergekit's semantics, right
  whatever ids the tokenizers give their shared tokens. By row number (True) only where the rows
  are unambiguous without every tokenizer: the vocabulary tensors have the same rows and the
  tokenizers present are one vocabulary (an input without one is taken to have it, as mergekit
  takes a tokenizer it cannot load to be the base's), or no input has a tokenizer and the caller
  takes row numbers for tokens (`rows_asserted`: xlt's vocab option). ValueError (one line)
  otherwise: a tokenizer is missing where rows would be ambiguous."""
  missing = [m for m in models if not has_tokenizer(m)]
  if not missing:
    return False
  present = [(m, n) for m, n in zip(models, sizes) if has_tokenizer(m)]
  vocabs = [{t: i for t, i in vocab_of(m).items() if n is None or i < n} for m, n in present]
  if differ := next((m for (m, _), v in zip(present, vocabs) if v != vocabs[0]), None):
    raise ValueError(f"{what}: {present[0][0]} and {differ} have different vocabularies, and {missing[0]} has no "
                     f"{TOKENIZER} to match its rows to tokens; give every input its {TOKENIZER}")
  if rows_differ and (present or not rows_asserted):
    raise ValueError(f"{what}: {missing[0]} has no {TOKENIZER} and the inputs' vocabularies differ in rows, so "
                     f"which token each of its rows holds is unknown; give every input its {TOKENIZER}")
  return True


def vocab_of(model: str) -> dict[str, int]:
  """{token: id} of a model directory's tokenizer.json (its model's vocab and added tokens), as
  transformers' get_vocab gives it."""
  return _vocab(_tokenizer_json(model), model)


def _vocab(tok: dict, model: str) -> dict[str, int]:
  vocab = tok["model"]["vocab"]
  try:
    out = dict(vocab) if isinstance(vocab, dict) else {piece[0]: i for i, piece in enumerate(vocab)}
    out |= {a["content"]: a["id"] for a in tok.get("added_tokens") or []}
  except (KeyError, TypeError, IndexError):
    raise ValueError(f"{model}/{TOKENIZER}: model.vocab or added_tokens is not a tokenizers vocabulary") from None
  if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in out.values()):
    raise ValueError(f"{model}/{TOKENIZER}: a token id is not a non-negative integer")
  return out


@dataclasses.dataclass
class Plan:
  """The output vocabulary and, per input, where each of its output rows comes from."""
  vocab: dict[str, int]  # the output's {token: id}
  rows: int  # the output's rows (past the vocabulary: padding)
  take: list[np.ndarray]  # per input, [rows]: the input's own row for each output row, -1 for none
  fill: dict[int, tuple]  # output row -> ((input, row), ...) averaged for the inputs without one; () = zero
  added: list[str]  # tokens appended to the source tokenizer, in id order
  tokenizer_dir: str  # the model whose tokenizer the output's extends
  input_rows: list[int]  # each input's vocabulary rows: config.json's vocab_size, else its tokenizer's


def plan(models: list[str], base: int | None, source: str, rules: dict[str, Rule],
         sizes: list[int | None], pad_to_multiple_of: int | None = None) -> Plan:
  """The alignment of `models` (paths; `base`: the base's index, None when the merge has none)
  for mergekit's tokenizer `source` ("base", "union" or a model directory) and `rules`
  (`parse_rules`); `sizes`: each input's config.json vocab_size (None: its tokenizer's size)."""
  raw = [vocab_of(m) for m in models]
  # ids at or past vocab_size are unused rows of the model, not tokens (mergekit strips them)
  vocabs = [{t: i for t, i in v.items() if n is None or i < n} for v, n in zip(raw, sizes)]
  first = 0 if base is None else base  # mergekit builds on the first model when there is no base
  if source in SOURCES and len(vocabs[first]) < len(raw[first]):
    raise ValueError(f"tokenizer.source: {source}: {models[first]}'s tokenizer has tokens at or past its config's "
                     f"vocab_size {sizes[first]} (mergekit strips them from a BPE tokenizer; xlt does not)")
  if source in SOURCES:
    tokenizer_dir, out = models[first], dict(vocabs[first])
  else:
    tokenizer_dir, out = source, vocab_of(source)
  held, n = dict(out), _next_id(out)  # the tokens the output's tokenizer file already holds
  extra = [t for v in [vocabs[first]] + vocabs for t in sorted(v, key=v.get)] if source == "union" else []
  for token in extra + list(rules):
    if token not in out:
      out[token], n = n, n + 1
  added = [t for t in out if t not in held]
  rows = -(-n // pad_to_multiple_of) * pad_to_multiple_of if pad_to_multiple_of else n
  take = [np.full(rows, -1, np.int64) for _ in models]
  for t, v in zip(take, vocabs):
    at = np.fromiter((out.get(token, -1) for token in v), np.int64, len(v))
    rows_in = np.fromiter(v.values(), np.int64, len(v))
    t[at[at >= 0]] = rows_in[at >= 0]
  present = np.stack([t[:len(out)] >= 0 for t in take])
  ids = {i: token for token, i in out.items()}
  fill = {}
  # the rows some input lacks, and the forced ones: each a default row (vectorised: a real
  # vocabulary has 10^5 tokens, of which these are a few)
  for i in sorted(set(np.flatnonzero(~present.all(axis=0)).tolist()) | {out[t] for t, r in rules.items() if r.force}):
    token, rule = ids[i], rules.get(ids[i])
    have = np.flatnonzero(present[:, i]).tolist()
    if rule is None:
      rule = _default_rule(have, base, models)
    fill[i] = _rows_of(rule, token, i, have, take, models, vocabs)
    if rule.force:
      for t in take:
        t[i] = -1
  input_rows = [n if n is not None else _next_id(v) for v, n in zip(raw, sizes)]
  return Plan(out, rows, take, fill, added, tokenizer_dir, input_rows)


def _next_id(vocab: dict) -> int:
  return max(vocab.values(), default=-1) + 1


def _default_rule(have: list[int], base: int | None, models: list[str]) -> Rule:
  """mergekit's default for a token some inputs lack (embed.py's assign_embedding_sources)."""
  if len(have) == 1:
    return Rule("model", models[have[0]])
  if not have:
    return Rule("zero")
  if base is not None and base in have:
    return Rule("model", models[base])
  return Rule("mean")


def _rows_of(rule: Rule, token: str, i: int, have: list[int], take: list, models: list[str], vocabs: list) -> tuple:
  """((input, row), ...) whose mean is the default row of output row i; () for zero."""
  where = f"tokenizer.tokens[{token!r}]"
  if rule.kind == "mean":
    return tuple((j, int(take[j][i])) for j in have)
  if rule.kind == "zero":
    return ()
  if rule.kind is None:
    raise ValueError(f"{where}: not every input has this token, so it needs a source (mergekit fails here too)")
  j = models.index(rule.model)
  if rule.kind == "model":
    if take[j][i] < 0:
      raise ValueError(f"{where}.source: {rule.model} has no token {token!r}")
    return ((j, int(take[j][i])),)
  if rule.token is not None:
    if rule.token not in vocabs[j]:
      raise ValueError(f"{where}.source: {rule.model} has no token {rule.token!r}")
    return ((j, vocabs[j][rule.token]),)
  return ((j, rule.token_id),)


def align(labelled: list[tuple[str, dict]], base: int | None, block: dict, is_vocab, sizes: list) -> tuple:
  """(trees, plan): the inputs' flat trees (labelled by their paths, `base` the base's index or
  None) with every vocabulary tensor (`is_vocab(name)`: embedding and head) re-indexed to the
  vocabulary of mergekit's tokenizer `block` ({source, tokens, pad_to_multiple_of}), lazily."""
  models = [path for path, _ in labelled]
  source, pad = block.get("source", "union"), block.get("pad_to_multiple_of")
  if not isinstance(source, str) or not source:
    raise ValueError(f"tokenizer.source: base, union or a model directory, got {source!r}")
  if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 1):
    raise ValueError(f"tokenizer.pad_to_multiple_of: a positive integer, got {pad!r}")
  if source not in SOURCES and not os.path.isfile(os.path.join(source.partition("+")[0], TOKENIZER)):
    raise ValueError(f"tokenizer.source: {source!r} is neither base, union nor a model directory with {TOKENIZER}")
  p = plan(models, base, source, parse_rules(block.get("tokens"), models), sizes, pad)
  trees = [dict(t) for _, t in labelled]
  # an embedding or head tensor with a row per token in every input (not the final norm)
  names = [k for k in labelled[0][1] if is_vocab(k) and not _NOT_PER_TOKEN.search(k) and all(
      k in t and len(t[k].shape) and t[k].shape[0] == n for t, n in zip(trees, p.input_rows))]
  if not names:
    raise ValueError("tokenizer: no embedding or head tensor found to re-index (pass naming=...)")
  for name in names:
    xs = [t[name] for t in trees]
    for i, t in enumerate(trees):
      t[name] = Aligned(xs, i, p, name)
  return trees, p


class Aligned:
  """Input `index`'s vocabulary tensor re-indexed to the plan's rows as it is read: its own rows
  where `take` has one, the mean of the `fill` rows (read from every input's tensor of this
  name, `tensors`) where not, and past the vocabulary the mean of the rows before."""

  def __init__(self, tensors: list, index: int, p: Plan, name: str):
    self.tensors, self.index, self.plan = tensors, index, p
    x = tensors[index]
    self.shape, self.dtype = (p.rows,) + tuple(x.shape[1:]), x.dtype
    self.ndim, self.size = len(self.shape), int(np.prod(self.shape, dtype=np.int64))
    self.nbytes = self.size * np.dtype(self.dtype).itemsize
    for j, y in enumerate(tensors):  # every row the plan reads must exist
      last = max([int(p.take[j].max())] + [r for src in p.fill.values() for k, r in src if k == j])
      if last >= y.shape[0]:
        raise ValueError(f"tensor {name}: row {last} of input {j} is read, but it has {y.shape[0]} rows "
                         "(a token id past the tensor)")

  def __array__(self, dtype=None, copy=None):
    p, a = self.plan, np.asarray(self.tensors[self.index])
    compute = np.promote_types(a.dtype, np.float32)
    out = np.zeros(self.shape, compute)
    own = p.take[self.index]
    out[own >= 0] = a[own[own >= 0]]
    read = {self.index: a}
    for i, src in p.fill.items():
      if own[i] >= 0:
        continue
      for j, _ in src:
        if j not in read:
          read[j] = np.asarray(self.tensors[j])
      if src:  # summed in order then divided, as mergekit does
        total = np.zeros(self.shape[1:], compute)
        for j, r in src:
          total = total + read[j][r].astype(compute)
        out[i] = total / len(src)
    n = _next_id(p.vocab)
    if self.shape[0] > n:
      out[n:] = out[:n].mean(axis=0)
    out = out.astype(self.dtype)
    return out if dtype is None else out.astype(dtype)


def tokenizer_files(p: Plan, config_dir: str | None) -> dict[str, str | None]:
  """{file: text, or None to drop a copied one} that make the output's tokenizer the plan's: the
  source's tokenizer.json with the new tokens appended as added tokens (and in tokenizer_config.json's
  added_tokens_decoder when it has one), and the source's other tokenizer files (its chat template
  among them; None where it has none) when the tokenizer comes from another model than the config."""
  model = str(p.tokenizer_dir).partition("+")[0]
  files: dict[str, str | None] = {}
  if config_dir is None or not _same(model, config_dir):
    # the chat template too: mergekit saves the source's tokenizer, template and all
    for name in ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                 "added_tokens.json", "chat_template.jinja", "chat_template.json"):
      files[name] = _read(os.path.join(model, name))
    # transformers' named extra templates: the source's folder in place of the config model's
    files[_TEMPLATES_DIR] = None
    folder = os.path.join(model, _TEMPLATES_DIR)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
      if name.endswith(".jinja") and os.path.isfile(os.path.join(folder, name)):
        files[f"{_TEMPLATES_DIR}/{name}"] = _read(os.path.join(folder, name))
  tok = _tokenizer_json(model)
  tok["added_tokens"] = list(tok.get("added_tokens") or [])
  entries = [{"id": p.vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": True, "special": False} for t in p.added]
  tok["added_tokens"] += entries
  files[TOKENIZER] = json.dumps(tok, indent=2, ensure_ascii=False) + "\n"
  config_text = files[TOKENIZER_CONFIG] if TOKENIZER_CONFIG in files else _read(os.path.join(model, TOKENIZER_CONFIG))
  try:
    config = json.loads(config_text) if config_text else None
  except ValueError:
    config = None
  if isinstance(config, dict) and isinstance(config.get("added_tokens_decoder"), dict) and entries:
    for e in entries:
      config["added_tokens_decoder"][str(e["id"])] = {k: v for k, v in e.items() if k != "id"}
    files[TOKENIZER_CONFIG] = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
  return files


def _read(path: str) -> str | None:
  if not os.path.isfile(path):
    return None
  fileio.check_size(path, _MAX_BYTES)
  with open(path, encoding="utf-8") as f:
    return f.read()
