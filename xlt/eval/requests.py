"""lm-evaluation-harness's three request kinds, answered by one xlt model (xlt.decode), with
no lm-eval import: the lm-eval model class (xlt.eval.harness) is a thin adapter over these,
and tests run them without lm-eval installed.

  loglikelihood_tokens(model, [(context_ids, continuation_ids), ...]) -> [(logprob, is_greedy)]
  rolling_windows(ids, prefix_id, max_length) -> [(context_ids, continuation_ids), ...]
  generate(model, [context_ids, ...], until=[...], max_gen_toks=N) -> [text, ...]

Each follows lm-eval's `hf` backend (lm_eval/models/huggingface.py, 0.4.x) so the numbers are
the same: a request longer than max_length + 1 tokens loses its left end; rolling windows
are `get_rolling_token_windows` + `make_disjoint_window` with one token of context;
a generation's context keeps its last max_length - max_gen_toks tokens, stops at the model's
stop ids, and its text is cut at the first of `until`.

A loglikelihood request is scored as a prefix (its context but the last token) and a window
(that token and the continuation) by decode.continuation_logprobs: logits only for the
windows, and one prefix run once for every request that has it (a question's choices).
Requests are sorted by prefix length (longest first, as lm-eval does, so a batch's rows are of
similar length) and batched with left padding to a few lengths (`_bucket`: under 1/8 of
padding), windows to a power of two, so a run over many lengths compiles a few programs.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from xlt import decode
from xlt import model as model_lib
from xlt import sharding

LENGTH_BUCKET = 16
# A scoring batch's windows' float32 logits and KV caches stay under this per device: its rows
# are cut to fit (`_window_rows`; a rolling window is as long as the context)
LOGITS_BYTES = 4 << 30


@dataclasses.dataclass
class Model:
  """What answers requests: a loaded model, its tokenizer (xlt.hf_tokenizer) and how to run it."""

  cfg: model_lib.Config
  params: object
  tokenizer: object = None
  mesh: object = None
  batch: int = 16
  max_length: int | None = None  # default: the model's context (cfg.block_size), as hf's

  @property
  def context(self) -> int:
    return self.max_length or self.cfg.block_size


def tok_encode(tokenizer, text: str, prefix_id: int | None = None, add_special_tokens: bool | None = None) -> list[int]:
  """lm-eval's `tok_encode`: the tokenizer's special tokens (BOS where it adds one), unless
  the text already starts with the prefix token's text."""
  if add_special_tokens is None:
    prefix = tokenizer.decode([prefix_id], skip_special_tokens=False) if prefix_id is not None else None
    add_special_tokens = not (prefix and text.startswith(prefix))
  return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def encode_pair(tokenizer, context: str, continuation: str, prefix_id: int) -> tuple[list[int], list[int]]:
  """lm-eval's (context ids, continuation ids): the context's trailing spaces move to the
  continuation, the whole is encoded and split at the context's length; an empty context is
  the prefix token alone."""
  if not context:
    cont = tok_encode(tokenizer, continuation, add_special_tokens=False)
    return ([prefix_id], cont) if cont[:1] != [prefix_id] else (cont[:1], cont[1:])
  spaces = len(context) - len(context.rstrip())
  if spaces:
    context, continuation = context[:-spaces], context[-spaces:] + continuation
  whole, ctx = tok_encode(tokenizer, context + continuation, prefix_id), tok_encode(tokenizer, context, prefix_id)
  return ctx, whole[len(ctx):]


def prefix_id(tokenizer) -> int:
  """The token an empty context (and a document's first rolling window) starts from: BOS, else EOS."""
  return tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id


def _bucket(n: int, limit: int) -> int:
  """`n` rounded up to a step of 1/8 of its power of two (at least LENGTH_BUCKET): under
  12.5% padding, and a few lengths (programs) per doubling."""
  step = max(LENGTH_BUCKET, 1 << max((n - 1).bit_length() - 3, 0))
  return min(sharding.round_up(n, step), limit)


def _window_bucket(n: int) -> int:
  """A window's padded length: a power of two up to 32 (lm-eval's continuations are mostly a
  few tokens: one program), then a multiple of 32 (rolling windows)."""
  return max(8, 1 << (n - 1).bit_length()) if n <= 32 else sharding.round_up(n, 32)


def _window_rows(m: Model, prefix: int, window: int) -> int:
  """Most window rows of one scoring batch: their float32 logits [rows, window, V] and KV
  caches [rows, prefix + window] kept under LOGITS_BYTES per device (a 128k vocabulary: 16
  windows of 512 tokens), a multiple of the mesh's data shards."""
  multiple = decode.rows_multiple(m.mesh)
  devices = 1 if m.mesh is None else m.mesh.size
  c = m.cfg
  cache = 2 * c.num_layers * c.kv_heads * c.head_width * jnp.dtype(c.dtype).itemsize * (prefix + window)
  fit = LOGITS_BYTES * devices // (window * c.vocab_size * 4 + cache) // multiple * multiple
  return max(multiple, fit)


def _rows_bucket(n: int, batch: int, cap: int) -> int:
  """Window rows of a batch: `batch` times a power of two (a few programs), at most `cap`."""
  return min(batch << max(-(-n // batch) - 1, 0).bit_length(), max(cap, n))


def _batches(order: list[int], batch: int):
  for start in range(0, len(order), batch):
    yield order[start:start + batch]


def loglikelihood_tokens(m: Model, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
                         ) -> list[tuple[float, bool]]:
  """(sum of log p(continuation | context), whether every continuation token is the argmax)
  per (context ids, continuation ids); the context must be non-empty (lm-eval gives the
  prefix token for an empty one).

  Each request is cut (lm-eval's left truncation) into a prefix, all its context but the last
  token, and a window, that token and the continuation (decode.continuation_logprobs): logits
  are computed for the windows only, and requests with one prefix (the choices of a question)
  run it once. Batches hold up to `m.batch` prefixes, longest first, and their windows."""
  prefixes, windows = [], []
  for i, (ctx, cont) in enumerate(requests):
    if not ctx or not cont:
      raise ValueError(f"request {i}: the context and the continuation need a token each")
    if len(cont) > m.context:
      raise ValueError(f"request {i}: a continuation of {len(cont)} tokens is longer than the context {m.context}")
    row = (list(ctx) + list(cont))[-(m.context + 1):]
    prefixes.append(tuple(row[:-len(cont) - 1]))
    windows.append(row[-len(cont) - 1:])
  # longest prefix first (as lm-eval), so a batch's prefixes are of similar length; one
  # prefix's requests side by side
  order = sorted(range(len(requests)), key=lambda i: (-len(prefixes[i]), prefixes[i], len(windows[i])))
  multiple = decode.rows_multiple(m.mesh)
  batch = sharding.round_up(m.batch, multiple)
  out: list = [None] * len(requests)
  start = 0
  while start < len(order):
    p = _bucket(len(prefixes[order[start]]), m.context) if prefixes[order[start]] else 0
    idx, owners, w = _take(order[start:], prefixes, windows, m, batch, p)
    start += len(idx)
    w = _window_bucket(w)
    unique = list(dict.fromkeys(prefixes[i] for i in idx))
    rows = _rows_bucket(len(idx), batch, _window_rows(m, p, w))
    prefix, prefix_valid = decode.left_pad([list(u) for u in unique], p, multiple=batch)
    prefix_valid[len(unique):, -1:] = True  # filler rows: a token, so no row is all padding
    window, window_valid = np.zeros((rows, w), np.int32), np.zeros((rows, w), bool)
    for r, i in enumerate(idx):
      window[r, :len(windows[i])], window_valid[r, :len(windows[i])] = windows[i], True
    window_valid[len(idx):, :2] = True  # filler rows: a token and its target
    owner = np.zeros(rows, np.int32)
    owner[:len(idx)] = owners
    logp, greedy = decode.continuation_logprobs(m.cfg, m.params, prefix, prefix_valid, owner, window, window_valid,
                                                mesh=m.mesh)
    for r, i in enumerate(idx):
      n = len(windows[i]) - 1
      out[i] = (float(logp[r, :n].astype(np.float64).sum()), bool(greedy[r, :n].all()))
  return out


def _take(order, prefixes, windows, m: Model, batch: int, p: int) -> tuple[list[int], list[int], int]:
  """The requests of the next batch from `order`: up to `batch` distinct prefixes (none
  longer than `p`), their windows within the rows' budget. (requests, prefix row of each,
  the longest window)."""
  idx, owners, unique, longest = [], [], {}, 0
  for i in order:
    new = prefixes[i] not in unique
    w = max(longest, len(windows[i]))
    if idx and ((new and len(unique) == batch) or len(idx) + 1 > _window_rows(m, p, _window_bucket(w))):
      break
    if new:
      unique[prefixes[i]] = len(unique)
    idx.append(i)
    owners.append(unique[prefixes[i]])
    longest = w
  return idx, owners, longest


def rolling_windows(ids: Sequence[int], prefix_id: int, max_length: int) -> list[tuple[list, list]]:
  """lm-eval's disjoint rolling windows with one token of context: every token of `ids` is
  predicted once, the first from `prefix_id`, each window at most `max_length` tokens."""
  ids = list(ids)
  if not ids:
    return []
  first = min(max_length, len(ids))
  windows = [([prefix_id] + ids[:first - 1], ids[:first])]
  done = first
  while done < len(ids):
    end = done + min(len(ids) - done, max_length)
    windows.append((ids[max(end - max_length - 1, 0):end - 1], ids[done:end]))
    done = end
  # make_disjoint_window: the context stops where the predicted tokens start
  return [(ctx[:len(ctx) - (len(cont) - 1)], cont) for ctx, cont in windows]


def loglikelihood_rolling(m: Model, documents: Sequence[Sequence[int]], prefix_id: int) -> list[float]:
  """The total log-likelihood of each document (token ids), over its rolling windows."""
  windows, owner = [], []
  for d, ids in enumerate(documents):
    for w in rolling_windows(ids, prefix_id, m.context):
      windows.append(w)
      owner.append(d)
  totals = [0.0] * len(documents)
  for d, (logp, _) in zip(owner, loglikelihood_tokens(m, windows)):
    totals[d] += logp
  return totals


def generate(m: Model, contexts: Sequence[Sequence[int]], *, until: Sequence[str] = (), max_gen_toks: int = 256
             ) -> list[str]:
  """Greedy continuations (text) of token-id contexts: each context keeps its last
  context - max_gen_toks tokens; decoding ends at the tokenizer's stop ids, after
  `max_gen_toks` tokens, or once a row's text holds a string of `until`, where it is cut."""
  if max_gen_toks >= m.context:
    raise ValueError(f"max_gen_toks={max_gen_toks} leaves no room for a context in {m.context} tokens")
  until = [u for u in until if u]
  tok = m.tokenizer
  keep = m.context - max_gen_toks
  contexts = [list(c)[-keep:] for c in contexts]
  order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))
  out: list = [None] * len(contexts)
  multiple = decode.rows_multiple(m.mesh)
  batch = sharding.round_up(m.batch, multiple)
  for idx in _batches(order, batch):
    prompts = [contexts[i] for i in idx]
    stop = (lambda r, ids: any(u in tok.decode(ids) for u in until)) if until else None
    length = max(len(p) for p in prompts)
    # bucket the padded length where the context leaves room (positions count real tokens only)
    length = max(length, min(_bucket(length, m.cfg.block_size), m.cfg.block_size - max_gen_toks))
    result = decode.greedy(m.cfg, m.params, prompts, max_new=max_gen_toks, stop_ids=tok.stop_ids, stop=stop,
                           mesh=m.mesh, length=length, batch=batch)
    for r, i in enumerate(idx):
      out[i] = cut(tok.decode(result.ids[r]), until)
  return out


def cut(text: str, until: Sequence[str]) -> str:
  """`text` before the first occurrence of each stop string in turn (lm-eval's postprocessing)."""
  for u in until:
    if u:
      text = text.split(u)[0]
  return text
