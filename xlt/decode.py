"""Scoring, greedy decoding and sampling of one model (xlt.pretrained.load's, or any params
without an ensemble axis) on left-padded batches, on one device or sharded over a mesh like
training's (xlt.sharding: rows over `data` x `fsdp`, heads / MLP / vocabulary over `tensor`).

Which module for what: this one for one model's tokens (lm-eval's requests, xlt.generate's
continuations, an experiment's samples); xlt.perplexity for the perplexity of packed rows (one
model or an ensemble); xlt.ensemble_decode for an ensemble's answers to a task's evaluation sets
and their scores (the experiments' exact match); xlt.generate for the command line over a Hugging
Face model directory.

  mesh = decode.make_mesh("data=4,tensor=2")           # None: one device
  cfg, params = pretrained.load(DIR, mesh=mesh)         # or decode.place(cfg, params, mesh)
  tokens, valid = decode.left_pad([[5, 6, 7], [8, 9]])
  logits_BxTxV = decode.logits(cfg, params, tokens, valid, mesh=mesh)
  logp_BxT, greedy_BxT = decode.token_logprobs(cfg, params, tokens, valid, mesh=mesh)
  logp_BxW, greedy_BxW = decode.continuation_logprobs(cfg, params, prefix, prefix_valid, owner_B,
                                                   window, window_valid, mesh=mesh)
  out = decode.greedy(cfg, params, [[5, 6, 7], [8, 9]], max_new=16, stop_ids=[2], mesh=mesh)
  out.ids[r], out.stopped[r]   # row r's new tokens (without its stop), and what stopped it

Positions are explicit: a row's tokens sit at positions 0, 1, ... counting its real tokens only
(`positions`: padding takes 0 and no query attends to it), as transformers' generate derives
position_ids from the attention mask, so a left-padded row scores as it would alone.

`token_logprobs` gives, at each position t < T - 1, log p(token t+1 | tokens <= t) and whether
token t+1 is the argmax there: lm-eval's loglikelihood and its `is_greedy`, computed on the
device, so only [B, T-1] numbers come back, not the logits.

`continuation_logprobs` gives the same for rows cut into a prefix and a short window after it:
each distinct prefix runs once into a KV cache (no logits: at a 4k-128k vocabulary the head
and its log-softmax cost a quarter or more of a small model's scoring), the windows read the
caches of their prefixes, and only the windows' logits are computed. lm-eval's loglikelihood
is such a row (xlt.eval.requests), and a multiple-choice question's choices share its prefix.

`greedy` decodes with the KV cache (model.init_cache(padded=True)) in chunks of steps, each one
jitted `lax.while_loop` that ends once every row has written a stop id. Between chunks a host
function `stop(row, ids)` may end rows too (stop *strings*, which only the decoded text shows:
lm-eval's `until`); `stopped[r]` is the stop id a row wrote, "stop" for a row `stop` ended, or
None when it ran out of `max_new` tokens. Greedy tokens are argmaxes, so a sharded run writes
the same ids as the one-device run (tests/test_decode.py) unless two logits tie to rounding.

`sample` continues prompts of one length with temperature / top-k sampling (temperature 0 =
greedy), one jitted function: a prefill of the prompt into the KV cache, then `lax.scan` over
new tokens; temperature and top_k are traced, so changing them does not recompile.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from xlt import distributed
from xlt import model as model_lib
from xlt import sharding

# Steps per jitted decoding chunk when a host `stop` function is given: it reads the text after
# each chunk, so a shorter chunk decodes fewer tokens past a stop string, a longer one syncs less.
CHUNK = 16
# The layout the decoding entry points (xlt.generate, the lm-eval model) load a checkpoint in
# (model.Config.dense_layout): XLA:CPU multiplies decoding's few rows against [in, out]
# kernels faster than against torch's [out, in] weights (benchmarks/decode_speed.py, the
# lm-eval benchmark's generate_until), which is worth one transpose per weight on load.
DENSE_LAYOUT = "kernel"


def parse_mesh(spec: str | None) -> dict | None:
  """{"data": 4, "tensor": 2} of "data=4,tensor=2" (axes of xlt.sharding.AXES; one may be -1:
  the remaining devices); None or "" -> None (one device)."""
  if not spec:
    return None
  out = {}
  for part in spec.split(","):
    name, _, size = part.partition("=")
    name = name.strip()
    if name not in sharding.AXES + ("devices",) or not size.strip().lstrip("-").isdigit():
      raise ValueError(f"mesh {spec!r}: each part is AXIS=SIZE with AXIS one of {', '.join(sharding.AXES)}")
    out[name] = int(size)
  return out


def make_mesh(spec: str | dict | None):
  """A jax Mesh from "data=4,tensor=2" or a dict (xlt.sharding.make_mesh), or None."""
  spec = parse_mesh(spec) if isinstance(spec, str) or spec is None else spec
  return None if spec is None else sharding.make_mesh(spec)


def cpu_data_mesh() -> str | None:
  """"data=N" over this process's N CPU devices (xlt.cpu_devices makes one per core), or None
  (one device, or an accelerator's): each batch's rows split over the cores, where one device
  leaves some of them idle in a decoding step's small products (docs/evaluate.md, "Speed")."""
  if jax.default_backend() != "cpu" or jax.device_count() == 1:
    return None
  return f"data={jax.device_count()}"


def place(cfg: model_lib.Config, params, mesh, rules=sharding.DEFAULT_RULES):
  """`params` (no ensemble axis) laid out on `mesh` as training lays them out; as they are
  when `mesh` is None."""
  if mesh is None:
    return params
  shardings = sharding.param_shardings(model_lib.logical_axes(cfg), mesh, rules, ensemble=False)
  sharding.check_divisible(jax.eval_shape(lambda: params), shardings)
  return jax.device_put(params, shardings)


def rows_multiple(mesh) -> int:
  """Rows of a batch must be a multiple of this: the mesh's data x fsdp size (1 without a mesh)."""
  return 1 if mesh is None else sharding.batch_ways(mesh)


def _rows(x: np.ndarray, mesh):
  """Host array `x` with its rows split over the mesh's batch axes (replicated over tensor)."""
  if mesh is None:
    return jnp.asarray(x)
  spec = NamedSharding(mesh, P(sharding.BATCH, *([None] * (x.ndim - 1))))
  return jax.make_array_from_callback(x.shape, spec, lambda idx: x[idx])


def left_pad(rows: Sequence[Sequence[int]], length: int | None = None, *, multiple: int = 1,
             pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [B, L], valid [B, L]) of token lists, each right-aligned (padding on the left);
  L = `length` or the longest row; B rounded up to `multiple` with empty rows (all padding)."""
  length = max((len(r) for r in rows), default=1) if length is None else length
  b = sharding.round_up(max(len(rows), 1), multiple)
  tokens, valid = np.full((b, length), pad_id, np.int32), np.zeros((b, length), bool)
  for i, r in enumerate(rows):
    if len(r) > length:
      raise ValueError(f"row {i} has {len(r)} tokens, more than the padded length {length}")
    if len(r):
      tokens[i, length - len(r):], valid[i, length - len(r):] = r, True
  return tokens, valid


def positions(valid_BxT) -> np.ndarray:
  """The position of each token in its row (its count of earlier real tokens; padding 0)."""
  valid_BxT = np.asarray(valid_BxT, bool)
  return np.maximum(np.cumsum(valid_BxT, axis=1) - 1, 0).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _logits(cfg, params, tokens_BxT, valid_BxT):
  return model_lib.apply(cfg, params, tokens_BxT, valid_BxT=valid_BxT)[0]


@functools.partial(jax.jit, static_argnames=("cfg",))
def _token_logprobs(cfg, params, tokens_BxT, valid_BxT):
  logits_BxTxV = model_lib.apply(cfg, params, tokens_BxT[:, :-1], valid_BxT=valid_BxT[:, :-1])[0]
  logp_BxTxV = jax.nn.log_softmax(logits_BxTxV, axis=-1)
  target_BxT = tokens_BxT[:, 1:]
  logp_BxT = jnp.take_along_axis(logp_BxTxV, target_BxT[..., None], axis=-1)[..., 0]
  return logp_BxT, jnp.argmax(logits_BxTxV, axis=-1) == target_BxT


def _check(cfg, tokens_BxT, valid_BxT, mesh, limit: int):
  tokens_BxT = np.asarray(tokens_BxT, np.int32)
  valid_BxT = np.ones(tokens_BxT.shape, bool) if valid_BxT is None else np.asarray(valid_BxT, bool)
  if tokens_BxT.ndim != 2 or valid_BxT.shape != tokens_BxT.shape:
    raise ValueError(f"need tokens [B, T] and valid [B, T], got {tokens_BxT.shape} and {valid_BxT.shape}")
  if valid_BxT.sum(1).max(initial=0) > limit:
    raise ValueError(f"a row has {valid_BxT.sum(1).max()} tokens, over {limit} (the model's context is "
                     f"{cfg.block_size})")
  if len(tokens_BxT) % rows_multiple(mesh):
    raise ValueError(f"{len(tokens_BxT)} rows do not split over the mesh's {rows_multiple(mesh)} data shards "
                     "(left_pad(..., multiple=rows_multiple(mesh)))")
  return _rows(tokens_BxT, mesh), _rows(valid_BxT, mesh)


def logits(cfg: model_lib.Config, params, tokens_BxT, valid_BxT=None, *, mesh=None) -> np.ndarray:
  """float32 logits [B, T, V] of left-padded rows (`valid_BxT` False on padding; None: none)."""
  return np.asarray(distributed.to_host(_logits(cfg, params, *_check(cfg, tokens_BxT, valid_BxT, mesh, cfg.block_size))))


def token_logprobs(cfg: model_lib.Config, params, tokens_BxT, valid_BxT=None, *, mesh=None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(log p(token t+1 | tokens <= t) [B, T-1] float32, is-argmax [B, T-1] bool) of left-padded rows."""
  # the last token is only a target: rows of block_size + 1 tokens fit
  logp, greedy_ = _token_logprobs(cfg, params, *_check(cfg, tokens_BxT, valid_BxT, mesh, cfg.block_size + 1))
  logp, greedy_ = distributed.to_host((logp, greedy_))
  return np.asarray(logp, np.float32), np.asarray(greedy_, bool)


@functools.partial(jax.jit, static_argnames=("cfg", "gather"))
def _continuation_logprobs(cfg, params, prefix_UxP, prefix_valid_UxP, owner_B, window_BxW, window_valid_BxW, *,
                           gather: bool):
  u, p = prefix_UxP.shape
  # the window's last token is only a target (as token_logprobs'): rows of block_size + 1 fit
  cache = model_lib.init_cache(cfg, u, p + window_BxW.shape[1] - 1, padded=True)
  if p:  # the prefix's logits are unused: XLA computes no [U, P, V] head (a large vocabulary's cost)
    _, cache = model_lib.apply(cfg, params, prefix_UxP, cache, 0, valid_BxT=prefix_valid_UxP)
  if gather:  # each window row continues its own prefix's cache
    cache = jax.tree.map(lambda x: jnp.take(x, owner_B, axis=0), cache)
  # so each row's last real token is fed as padding (the window is right-padded): shifted mask
  logits_BxWxV, _ = model_lib.apply(cfg, params, window_BxW[:, :-1], cache, p, valid_BxT=window_valid_BxW[:, 1:])
  target_BxW = window_BxW[:, 1:]
  picked_BxW = jnp.take_along_axis(logits_BxWxV, target_BxW[..., None], axis=-1)[..., 0]
  logp_BxW = picked_BxW - jax.nn.logsumexp(logits_BxWxV, axis=-1)
  return logp_BxW, jnp.argmax(logits_BxWxV, axis=-1) == target_BxW


def continuation_logprobs(cfg: model_lib.Config, params, prefix_UxP, prefix_valid_UxP, owner_B, window_BxW,
                          window_valid_BxW, *, mesh=None) -> tuple[np.ndarray, np.ndarray]:
  """`token_logprobs` of rows that are a shared prefix followed by a short window, computing
  logits for the windows only: (log p(window[b, t+1] | prefix[owner[b]], window[b, :t+1])
  [B, W-1] float32, is-argmax [B, W-1] bool).

  Prefixes [U, P] are left-padded (`prefix_valid_UxP` False on padding; P may be 0), and run
  once each into a KV cache; window row b continues prefix owner_B[b] (several rows may name
  one prefix: the choices of a multiple-choice question read their context once). Windows
  [B, W] are right-padded (`window_valid_BxW` True on a prefix of each row): a later slot is
  never attended to by an earlier one, so the padding changes nothing before it. lm-eval's
  loglikelihood is a window of the context's last token and the continuation."""
  prefix_UxP, prefix_valid_UxP = np.asarray(prefix_UxP, np.int32), np.asarray(prefix_valid_UxP, bool)
  window_BxW, window_valid_BxW = np.asarray(window_BxW, np.int32), np.asarray(window_valid_BxW, bool)
  owner_B = np.asarray(owner_B, np.int32)
  u, b = len(prefix_UxP), len(window_BxW)
  if prefix_valid_UxP.shape != prefix_UxP.shape or window_valid_BxW.shape != window_BxW.shape or owner_B.shape != (b,):
    raise ValueError(f"need prefixes [U, P] with their valid mask, windows [B, W] with theirs and owner [B]; got "
                     f"{prefix_UxP.shape}, {prefix_valid_UxP.shape}, {window_BxW.shape}, {window_valid_BxW.shape}, "
                     f"{owner_B.shape}")
  if b and (owner_B.min() < 0 or owner_B.max() >= u):
    raise ValueError(f"owner names a prefix outside 0..{u - 1}")
  if window_BxW.shape[1] < 2:
    raise ValueError("a window needs a token and its target (W >= 2)")
  if (prefix_valid_UxP.sum(1)[owner_B] + window_valid_BxW.sum(1)).max(initial=0) > cfg.block_size + 1:
    raise ValueError(f"a row has more than the model's context {cfg.block_size} tokens (+ 1 target)")
  if u % rows_multiple(mesh) or b % rows_multiple(mesh):
    raise ValueError(f"{u} prefixes and {b} windows must both split over the mesh's {rows_multiple(mesh)} data shards")
  gather = u != b or bool((owner_B != np.arange(b)).any())
  logp, greedy_ = _continuation_logprobs(
      cfg, params, _rows(prefix_UxP, mesh), _rows(prefix_valid_UxP, mesh), _rows(owner_B, mesh),
      _rows(window_BxW, mesh), _rows(window_valid_BxW, mesh), gather=gather)
  logp, greedy_ = distributed.to_host((logp, greedy_))
  return np.asarray(logp, np.float32), np.asarray(greedy_, bool)


# ------------------------------------------------------------------------------ greedy decoding


class Decoding(NamedTuple):
  """A batch's decoding so far (device arrays): the KV cache, the new tokens written (the
  first `step`), the pending argmax, and which rows are done (a stop id written, or ended)."""

  cache: model_lib.PaddedCache
  new_BxN: jax.Array
  next_B: jax.Array
  step: jax.Array
  done_B: jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "max_new"))
def _start(cfg, params, prompts_BxP, valid_BxP, *, max_new):
  b, p = prompts_BxP.shape
  cache = model_lib.init_cache(cfg, b, p + max_new, padded=True)
  # every row's last prompt token is real (left padding), so the prefill stops one short and
  # the last token runs as a decoding step: the prefill's logits are unused, so XLA computes
  # no [B, P, V] logits (a large vocabulary's dominant cost), only the step's [B, 1, V]
  if p > 1:
    _, cache = model_lib.apply(cfg, params, prompts_BxP[:, :-1], cache, 0, valid_BxT=valid_BxP[:, :-1])
  logits_Bx1xV, cache = model_lib.apply(cfg, params, prompts_BxP[:, -1:], cache, jnp.int32(p - 1))
  next_B = jnp.argmax(logits_Bx1xV[:, 0], axis=-1).astype(jnp.int32)
  new_BxN = jnp.zeros((b, max_new), jnp.int32)
  return Decoding(cache, new_BxN, next_B, jnp.int32(0), ~valid_BxP.any(axis=1))  # empty rows are done


@functools.partial(jax.jit, static_argnames=("cfg", "steps", "stop_ids"), donate_argnames=("state",))
def _advance(cfg, params, state: Decoding, *, steps: int, stop_ids: tuple[int, ...]):
  """Up to `steps` more tokens: each step writes the pending token of every row that is not
  done, then runs it through the model for the next; stops early once every row is done."""
  p = state.cache.valid_BxS.shape[1] - state.new_BxN.shape[1]
  limit = jnp.minimum(state.step + steps, state.new_BxN.shape[1])

  def body(s: Decoding) -> Decoding:
    tok_B = jnp.where(s.done_B, 0, s.next_B)
    new_BxN = jax.lax.dynamic_update_slice(s.new_BxN, tok_B[:, None], (jnp.int32(0), s.step))
    done_B = s.done_B | jnp.isin(tok_B, jnp.asarray(stop_ids or (-1,), jnp.int32))
    logits_Bx1xV, cache = model_lib.apply(cfg, params, tok_B[:, None], s.cache, p + s.step)
    next_B = jnp.argmax(logits_Bx1xV[:, 0], axis=-1).astype(jnp.int32)
    return Decoding(cache, new_BxN, next_B, s.step + 1, done_B)

  return jax.lax.while_loop(lambda s: (s.step < limit) & ~s.done_B.all(), body, state)


class Greedy(NamedTuple):
  ids: list  # per row, its new tokens up to (not including) the stop id
  stopped: list  # per row: the stop id it wrote, "stop" (ended by `stop`), or None (max_new reached)


def greedy(cfg: model_lib.Config, params, prompts: Sequence[Sequence[int]], *, max_new: int,
           stop_ids: Sequence[int] = (), stop: Callable[[int, list], bool] | None = None,
           mesh=None, length: int | None = None, batch: int | None = None, chunk: int = CHUNK) -> Greedy:
  """Greedy continuations of one batch of prompts (token lists, left-padded here to `length`,
  default the longest; the batch is padded with empty rows to `batch` rows, a multiple of the
  mesh's data shards: one program for batches of one shape).

  Each row ends at its first id in `stop_ids` (left out of `ids`, named in `stopped`), when
  `stop(row, ids_so_far)` says so after a chunk (what it read is kept: the caller cuts the
  text), or after `max_new` tokens. Prompt + max_new must fit the model's context."""
  n = len(prompts)
  if n == 0:
    return Greedy([], [])
  if min(len(p) for p in prompts) == 0:
    raise ValueError("a prompt has no tokens")
  if max(len(p) for p in prompts) + max_new > cfg.block_size:
    raise ValueError(f"a prompt of {max(len(p) for p in prompts)} tokens + {max_new} new ones exceeds the model's "
                     f"context {cfg.block_size}")
  if batch is not None and (batch < n or batch % rows_multiple(mesh)):
    raise ValueError(f"batch={batch} must hold the {n} prompts and split over {rows_multiple(mesh)} data shards")
  tokens, valid = left_pad(prompts, length, multiple=batch or rows_multiple(mesh))
  state = _start(cfg, params, _rows(tokens, mesh), _rows(valid, mesh), max_new=max_new)
  stop_ids = tuple(sorted({int(s) for s in stop_ids}))
  ends: dict[int, int] = {}  # row -> its length when `stop` ended it
  while True:
    state = _advance(cfg, params, state, steps=chunk if stop is not None else max_new, stop_ids=stop_ids)
    new, step, done = distributed.to_host((state.new_BxN, state.step, state.done_B))
    new, step, done = np.asarray(new), int(step), np.asarray(done).copy()
    if stop is not None:
      for r in range(n):
        if not done[r] and stop(r, _cut(new[r, :step].tolist(), stop_ids)):
          done[r], ends[r] = True, step
      state = state._replace(done_B=_rows(done, mesh))
    if step >= max_new or done.all():
      break
  ids = [_cut(new[r, :ends.get(r, step)].tolist(), stop_ids) for r in range(n)]
  stopped = ["stop" if r in ends else int(new[r, len(ids[r])]) if len(ids[r]) < step else None for r in range(n)]
  return Greedy(ids, stopped)


def _cut(ids: list[int], stop_ids) -> list[int]:
  """`ids` up to its first stop id."""
  for k, t in enumerate(ids):
    if t in stop_ids:
      return ids[:k]
  return ids


# ------------------------------------------------------------------------------------ sampling

def _pick(logits_BxV, key, temperature, top_k, greedy: bool):
  if greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits_BxV = logits_BxV / temperature
  # k-th largest logit by a sort, so k is traced (one compile for every top_k); 0 = no cut.
  sorted_BxV = jnp.sort(logits_BxV, axis=-1)
  kth_Bx1 = sorted_BxV[:, jnp.maximum(logits_BxV.shape[-1] - top_k, 0)][:, None]
  logits_BxV = jnp.where((top_k > 0) & (logits_BxV < kth_Bx1), -jnp.inf, logits_BxV)
  return jax.random.categorical(key, logits_BxV, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "greedy"))
def _sample(cfg, params, prompt_BxP, rng, temperature, top_k, *, max_new, greedy):
  b, p = prompt_BxP.shape
  cache = model_lib.init_cache(cfg, b, p + max_new)
  logits_Bx1xV, cache = model_lib.apply(cfg, params, prompt_BxP, cache, 0, last_only=True)
  keys = jax.random.split(rng, max_new)
  pick = lambda logits_BxV, key: _pick(logits_BxV, key, temperature, top_k, greedy)
  first_B = pick(logits_Bx1xV[:, -1], keys[0])

  def body(carry, xs):
    cache, tok_B = carry
    i, key = xs
    logits_Bx1xV, cache = model_lib.apply(cfg, params, tok_B[:, None], cache, p + i)
    return (cache, pick(logits_Bx1xV[:, 0], key)), tok_B

  # The last new token needs no forward pass of its own.
  (_, last_B), toks_NxB = jax.lax.scan(body, (cache, first_B),
                                       (jnp.arange(max_new - 1), keys[1:]))
  return jnp.concatenate([prompt_BxP, toks_NxB.T, last_B[:, None]], axis=1)


def sample(cfg: model_lib.Config, params, prompt_ids, *, max_new: int, temperature: float = 1.0,
           top_k: int = 0, rng=None):
  """Prompts [B, P] (or one prompt [P]) followed by `max_new` sampled tokens: [B, P + max_new].

  One model's params (slice an ensemble first). temperature 0 is greedy (argmax; rng unused);
  top_k > 0 samples among the k most likely tokens. Prompts in one call share a length.
  """
  prompt = np.asarray(prompt_ids, np.int32)
  single = prompt.ndim == 1
  prompt = prompt[None] if single else prompt
  if prompt.ndim != 2 or prompt.shape[1] == 0:
    raise ValueError(f"prompt_ids must be [P] or [B, P] with P > 0, got shape {prompt.shape}")
  if max_new < 1 or prompt.shape[1] + max_new > cfg.block_size:
    raise ValueError(f"prompt {prompt.shape[1]} + max_new {max_new} must be in "
                     f"(prompt, block_size={cfg.block_size}]")
  if top_k < 0 or top_k > cfg.vocab_size or temperature < 0:
    raise ValueError(f"need temperature >= 0 and 0 <= top_k <= vocab, got {temperature}, {top_k}")
  rng = jax.random.key(0 if rng is None else rng) if rng is None or isinstance(rng, int) else rng
  greedy = temperature == 0
  out = _sample(cfg, params, prompt, rng, np.float32(1.0 if greedy else temperature),
                np.int32(top_k), max_new=int(max_new), greedy=bool(greedy))
  return np.asarray(out[0] if single else out)
