"""Supervised fine-tuning data from a user's jsonl: the loss on the responses only, rows packed.

  tok = hf_tokenizer.load("path/to/model")
  data = sft.load("train.jsonl", tok, block_size=1024, val_fraction=0.05, seed=0)
  member = loop.Member("sft/seed_0", 0, train=data.train)   # {"tokens", "loss_mask"}
  print(data.counts)        # examples, truncated, dropped, rows, response tokens per split

Each line of the file is one example, either

  {"prompt": "...", "completion": "..."}          the loss on the completion (+ EOS)
  {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}, ...]}

Blank lines are skipped; every other line must be a JSON object of one of the two kinds.

Prompt / completion: the prompt is encoded as the tokenizer encodes a text (with the BOS the
model adds, if any), the completion without special tokens, and the two are concatenated
(TRL's prompt-completion rule), then the tokenizer's EOS is appended (`add_eos`). Encoding
them apart makes the boundary exact: the first completion token is what the model would
generate after the prompt.

Messages (a conversation): rendered through the model's chat template, and the loss covers
the assistant turns only, found by rendering the conversation prefix by prefix, as TRL's and
transformers' assistant masks do. For each assistant message i,

  P_i = template(messages[:i], add_generation_prompt=True)    what generation would be given
  Q_i = template(messages[:i+1], add_generation_prompt=False)  ... and what it should write

Q_i must start with P_i and the full conversation's text with Q_i; the characters between
len(P_i) and len(Q_i) are turn i's trained text (its content and whatever the template
writes after it, e.g. the end-of-turn token). The text is cut at these offsets and each piece
is encoded on its own without special tokens (the template writes BOS where the model wants
one), so the trained tokens are exactly those a generation from P_i would produce. A template
that rewrites earlier turns when later ones follow (some drop an earlier turn's reasoning) is
not prefix-stable and is an error naming the line. With `add_eos`, an assistant turn whose
tokens hold none of the tokenizer's stop ids gets the EOS appended (as a target): real chat
templates end every turn with one (e.g. <|eot_id|>) and get nothing added.

Targets. An example is ids [L] with target flags [L]: flag k says the loss scores predicting
ids[k] from ids[:k]. An example's first token is never a target (nothing in the example
predicts it), so in a packed row the boundary (last token of one example -> first of the next)
is never scored, and neither is any prompt, template or padding token.

Packing. Rows hold block_size + 1 tokens: inputs tokens[:-1], targets tokens[1:], and
loss_mask[j] = flag of tokens[j+1]. With `packing=True` several examples share a row
(best fit in file order: each example goes to the open row with the least room that holds
it), padded with the pad id at the end. xlt's model has no segment masking: in a packed row
an example attends to the examples before it in the row, and its positions continue theirs
(TRL's packing without padding-free attention does the same); the loss never scores a token
of another example, but what the model conditions on does include them. `packing=False`
gives one example per row, right-padded: no cross-example attention, more padding.

Too long. An example longer than block_size + 1 tokens is truncated (its first
block_size + 1 tokens kept) or dropped (`too_long`); a truncated example left without a
target is dropped too. `counts` reports both, per split.

Validation. `val_fraction` of the examples go to the validation split by a seeded rule:
examples are ordered by sha256(seed, the example's canonical JSON) and the first
round(val_fraction * N) are validation, extended over ties, so identical lines always land in
the same split (never the same example in both), and the split of an example does not depend
on the file's line order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from bisect import bisect_left, insort
from typing import Sequence

import numpy as np

from xlt.io import fileio

# A jsonl far above this is not meant to be read into memory in one go; pass max_bytes to
# read one anyway.
MAX_FILE_BYTES = 4 << 30
TOO_LONG = ("truncate", "drop")
# the roles chat templates know (OpenAI's and Llama 3.1's); any other is a typo that a
# template would render as a turn of its own, or silently drop
ROLES = ("system", "user", "assistant", "tool", "developer", "function", "ipython")


class SFTError(ValueError):
  """A bad fine-tuning file or example (one line, naming the file and line)."""


@dataclasses.dataclass(frozen=True)
class Data:
  """train / val: {"tokens": int32 [N, block_size + 1], "loss_mask": float32 [N, block_size]}
  (val is None without a validation split); counts: {"train": {...}, "val": {...}} (val only
  with a validation split) of
  examples, truncated, dropped, rows, tokens and response_tokens (the targets scored)."""

  train: dict
  val: dict | None
  counts: dict


# ------------------------------------------------------------------------ reading


def _check_record(rec, where: str) -> dict:
  if not isinstance(rec, dict):
    raise SFTError(f"{where}: expected a JSON object, got {type(rec).__name__}")
  if "messages" in rec:
    msgs = rec["messages"]
    if not isinstance(msgs, list) or not msgs:
      raise SFTError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for i, m in enumerate(msgs):
      if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
        raise SFTError(f"{where}: message {i} needs a string 'role' and a string 'content', got {m!r:.80}")
      if m["role"] not in ROLES:
        raise SFTError(f"{where}: message {i} has the role {m['role']!r}; a chat message's role is one of "
                       f"{', '.join(ROLES)}")
    if not any(m["role"] == "assistant" for m in msgs):
      found = ", ".join(dict.fromkeys(m["role"] for m in msgs))
      raise SFTError(f"{where}: no assistant message (its roles: {found}), so nothing to train on")
    return {"messages": msgs}
  if "prompt" in rec and "completion" in rec:
    if not isinstance(rec["prompt"], str) or not isinstance(rec["completion"], str):
      raise SFTError(f"{where}: 'prompt' and 'completion' must be strings")
    return {"prompt": rec["prompt"], "completion": rec["completion"]}
  raise SFTError(f"{where}: needs 'prompt' and 'completion', or 'messages'; has keys {sorted(rec)}")


check_record = _check_record  # one line's kind, checked: xlt.merge_data reads these beside plain text


def read_jsonl(path: str, max_bytes: int = MAX_FILE_BYTES) -> list[dict]:
  """The file's examples, each checked (`_check_record`); blank lines skipped. The file is
  size-checked before it is read."""
  if not os.path.isfile(path):
    raise SFTError(f"{path}: no such file")
  fileio.check_size(path, max_bytes, SFTError, " (pass max_bytes to read it)")
  records = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        what, _, column = fileio.json_fault(e)
        raise SFTError(f"{where}: not valid JSON ({what} at column {column})") from None
      records.append({**_check_record(rec, where), "line": lineno})
  if not records:
    raise SFTError(f"{path} has no examples")
  if all(not _response(r).strip() for r in records):
    raise SFTError(f"{path}: all {len(records)} completions are empty (the first on line {records[0]['line']}): "
                   "the model would learn only to end its answer")
  return records


def _response(rec: dict) -> str:
  """What an example trains on: its completion, or its assistant messages' text."""
  if "messages" in rec:
    return "".join(m["content"] for m in rec["messages"] if m["role"] == "assistant")
  return rec["completion"]


# ------------------------------------------------------------------------ encoding


def _prompt_completion(tok, rec, add_eos: bool):
  prompt = tok.encode(rec["prompt"])
  completion = tok.encode(rec["completion"], add_special_tokens=False)
  if add_eos and tok.eos_id is not None:
    completion = completion + [tok.eos_id]
  return [(prompt, False), (completion, True)]


def _chat_pieces(tok, msgs, where: str) -> list[tuple[str, bool]]:
  """The conversation's text cut into (text, trained) pieces by prefix rendering."""
  try:
    return _rendered_pieces(tok, msgs, where)
  except SFTError:
    raise
  except ValueError as e:  # the template's own one-line error (xlt.hf_tokenizer.TokenizerError)
    raise SFTError(f"{where}: {e}") from None


def _rendered_pieces(tok, msgs, where: str) -> list[tuple[str, bool]]:
  full = tok.apply_chat_template(msgs, add_generation_prompt=False)
  pieces, at = [], 0
  for i, m in enumerate(msgs):
    if m["role"] != "assistant":
      continue
    before = tok.apply_chat_template(msgs[:i], add_generation_prompt=True) if i else ""
    upto = tok.apply_chat_template(msgs[:i + 1], add_generation_prompt=False)
    if not (upto.startswith(before) and full.startswith(upto) and len(before) >= at):
      raise SFTError(f"{where}: the chat template does not render the conversation prefix by prefix at "
                     f"message {i}, so its assistant turns cannot be found")
    pieces += [(full[at:len(before)], False), (full[len(before):len(upto)], True)]
    at = len(upto)
  return pieces + [(full[at:], False)]


def _chat(tok, rec, add_eos: bool, where: str):
  stops = set(getattr(tok, "stop_ids", None) or []) | ({tok.eos_id} if tok.eos_id is not None else set())
  out = []
  for text, trained in _chat_pieces(tok, rec["messages"], where):
    ids = tok.encode(text, add_special_tokens=False) if text else []
    if trained and add_eos and tok.eos_id is not None and not stops.intersection(ids):
      ids = ids + [tok.eos_id]
    out.append((ids, trained))
  return out


def encode(tok, rec: dict, add_eos: bool = True, where: str = "example") -> tuple[np.ndarray, np.ndarray]:
  """(ids int32 [L], targets bool [L]) of one example (see the module doc): targets[k] says the
  loss scores ids[k]; targets[0] is always False."""
  pieces = _chat(tok, rec, add_eos, where) if "messages" in rec else _prompt_completion(tok, rec, add_eos)
  ids = np.asarray([i for p, _ in pieces for i in p], np.int32)
  targets = np.asarray([t for p, t in pieces for _ in p], bool)
  if len(targets):
    targets[0] = False
  return ids, targets


# ------------------------------------------------------------------------ split and pack


def split(records: Sequence[dict], val_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
  """(train, val): the seeded rule of the module doc. Each keeps the file's order."""
  if not 0.0 <= val_fraction < 1.0:
    raise SFTError(f"val_fraction must be in [0, 1), got {val_fraction}")
  content = lambda r: json.dumps({k: v for k, v in r.items() if k != "line"}, sort_keys=True, ensure_ascii=False)
  keys = [hashlib.sha256(f"{seed}\n{content(r)}".encode()).hexdigest() for r in records]
  n_val = round(val_fraction * len(records))
  if n_val == 0:
    return list(records), []
  cut = sorted(keys)[n_val - 1]  # examples with a key up to the n_val-th smallest; ties follow
  val = [k <= cut for k in keys]
  return [r for r, v in zip(records, val) if not v], [r for r, v in zip(records, val) if v]


def _fit(examples, row_len: int, too_long: str):
  """Examples cut to row_len (or dropped), and how many of the kept were cut and how many were
  dropped; an example left with no target is dropped."""
  kept, truncated, dropped = [], 0, 0
  for ids, targets in examples:
    cut = len(ids) > row_len
    if cut and too_long == "truncate":
      ids, targets = ids[:row_len], targets[:row_len]
    if (cut and too_long == "drop") or not targets.any():
      dropped += 1
      continue
    truncated += cut
    kept.append((ids, targets))
  return kept, truncated, dropped


def _assign_rows(lengths: Sequence[int], row_len: int, packing: bool) -> list[list[int]]:
  """Example indices per row: best fit in order (the open row with the least room that holds
  the example), or one per row."""
  if not packing:
    return [[i] for i in range(len(lengths))]
  rows: list[list[int]] = []
  room: list[tuple[int, int]] = []  # (free tokens, row), sorted
  for i, n in enumerate(lengths):
    k = bisect_left(room, (n, -1))
    if k == len(room):
      rows.append([i])
      r, free = len(rows) - 1, row_len - n
    else:
      free, r = room.pop(k)
      rows[r].append(i)
      free -= n
    if free > 0:
      insort(room, (free, r))
  return rows


def pack(examples, block_size: int, pad_id: int, *, packing: bool = True,
         too_long: str = "truncate") -> tuple[dict, dict]:
  """({"tokens": [N, block_size + 1], "loss_mask": [N, block_size]}, counts) of encoded
  examples [(ids, targets), ...]."""
  if too_long not in TOO_LONG:
    raise SFTError(f"too_long must be one of {TOO_LONG}, got {too_long!r}")
  if block_size < 1:
    raise SFTError(f"block_size must be positive, got {block_size}")
  row_len = block_size + 1
  kept, truncated, dropped = _fit(examples, row_len, too_long)
  rows = _assign_rows([len(ids) for ids, _ in kept], row_len, packing)
  tokens = np.full((len(rows), row_len), pad_id, np.int32)
  targets = np.zeros((len(rows), row_len), bool)
  for r, members in enumerate(rows):
    at = 0
    for i in members:
      ids, t = kept[i]
      tokens[r, at:at + len(ids)], targets[r, at:at + len(ids)] = ids, t
      at += len(ids)
  loss_mask = targets[:, 1:].astype(np.float32)
  counts = {"examples": len(examples), "truncated": truncated, "dropped": dropped, "rows": len(rows),
            "tokens": int(sum(len(ids) for ids, _ in kept)), "response_tokens": int(loss_mask.sum())}
  return {"tokens": tokens, "loss_mask": loss_mask}, counts


def load(path: str, tok, *, block_size: int, val_fraction: float = 0.0, seed: int = 0, packing: bool = True,
         too_long: str = "truncate", add_eos: bool = True, pad_id: int | None = None,
         max_bytes: int = MAX_FILE_BYTES) -> Data:
  """The file's examples, split, encoded with `tok` (an xlt.hf_tokenizer.Tokenizer, or anything
  with encode / apply_chat_template / eos_id / pad_id), and packed (module doc).

  pad_id: the id that fills rows (never scored); default the tokenizer's pad, else its EOS,
  else 0."""
  records = read_jsonl(path, max_bytes)
  train, val = split(records, val_fraction, seed)
  if pad_id is None:
    pad_id = next((i for i in (tok.pad_id, tok.eos_id) if i is not None), 0)
  out, counts = {}, {}
  for name, recs in (("train", train), ("val", val)):
    if not recs:
      continue
    examples = [encode(tok, r, add_eos, f"{path}:{r['line']}") for r in recs]
    out[name], counts[name] = pack(examples, block_size, pad_id, packing=packing, too_long=too_long)
    if not counts[name]["rows"]:
      raise SFTError(f"{path}: none of the {len(recs)} {name} examples has a response token within "
                     f"block_size + 1 = {block_size + 1} tokens")
  return Data(out["train"], out.get("val"), counts)
