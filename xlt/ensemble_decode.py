"""An ensemble's answers to a task's evaluation sets: batched greedy decoding of every member
with a KV cache (`decode_answers`, `greedy_decode`), and each member's scores (`score_members`,
what the experiments report as exact match).

Which module for what: this one for an ensemble's answers (params with a leading member axis);
xlt.decode for one model's tokens (logits, log-probabilities, greedy with stops, sampling);
xlt.perplexity for the perplexity of packed rows; xlt.generate for the command line over a
Hugging Face model directory.

Prompts of different lengths share one batch: the cache is prefilled up to the
shortest prompt, then each step either copies the next prompt token (rows whose prompt
is longer) or appends the model's argmax. Decoding maps over the ensemble axis
(xlt.ensemble: lax.map on CPU, vmap on accelerators), each device its own rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from xlt import distributed
from xlt import ensemble as ensemble_lib
from xlt import model as model_lib
from xlt import sharding
from xlt.data import common


def greedy_decode(cfg: model_lib.Config, params, prompts_BxP, prompt_len_B, *, max_new: int,
                  min_prompt: int, eos_id: int | None = None):
  """Returns tokens [B, P + max_new]: each prompt followed by its greedy continuation.

  `min_prompt` (static) is the shortest prompt length in the batch. With `eos_id`, decoding
  stops once every row has written EOS after its prompt (later positions stay 0): the
  answers up to EOS are the same, and evaluation, a large share of an early-stopped run,
  no longer pays for the longest possible answer on every batch.
  """
  b, p = prompts_BxP.shape
  length = p + max_new
  if length > cfg.block_size:
    raise ValueError(f"prompt {p} + {max_new} new tokens exceeds the block size {cfg.block_size}")
  buf_BxL = jnp.zeros((b, length), jnp.int32).at[:, :p].set(prompts_BxP)
  cache = model_lib.init_cache(cfg, b, length)
  logits_BxTxV, cache = model_lib.apply(cfg, params, buf_BxL[:, :min_prompt], cache, 0)
  next_B = jnp.argmax(logits_BxTxV[:, -1], axis=-1).astype(jnp.int32)

  def finished(i, next_B):  # is the token for position i an EOS after the prompt?
    if eos_id is None:
      return jnp.zeros((b,), bool)
    return (i >= prompt_len_B) & (next_B == eos_id)

  def body(carry):
    i, buf_BxL, cache, next_B, done_B = carry
    tok_B = jnp.where(i < prompt_len_B, buf_BxL[:, i], next_B)
    buf_BxL = buf_BxL.at[:, i].set(tok_B)
    logits_Bx1xV, cache = model_lib.apply(cfg, params, tok_B[:, None], cache, i)
    next_B = jnp.argmax(logits_Bx1xV[:, 0], axis=-1).astype(jnp.int32)
    return i + 1, buf_BxL, cache, next_B, done_B | finished(i + 1, next_B)

  # Stops at the last position (it needs no forward pass, only its token written) or when
  # every row's pending token or an earlier one is its EOS; that pending token is written last.
  i, buf_BxL, _, next_B, _ = jax.lax.while_loop(
      lambda c: (c[0] < length - 1) & ~c[4].all(), body,
      (jnp.int32(min_prompt), buf_BxL, cache, next_B, finished(min_prompt, next_B)))
  return buf_BxL.at[:, i].set(jnp.where(i < prompt_len_B, buf_BxL[:, i], next_B))


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "min_prompt", "strategy", "eos_id"))
def ensemble_decode(cfg, params, prompts_ExBxP, prompt_len_ExB, *, max_new, min_prompt, strategy="auto",
                    eos_id=None):
  fn = functools.partial(greedy_decode, cfg, max_new=max_new, min_prompt=min_prompt, eos_id=eos_id)
  return ensemble_lib.over_members(fn, ensemble_lib.resolve(strategy))(params, prompts_ExBxP, prompt_len_ExB)


def pad_prompts(prompt_ids: list[list[int]], batch: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded prompts [n_padded, P] (rows repeated up to a multiple of `batch`)
  and their lengths."""
  n = len(prompt_ids)
  n_pad = -(-n // batch) * batch
  p = max(len(x) for x in prompt_ids)
  out = np.zeros((n_pad, p), np.int32)
  lens = np.zeros((n_pad,), np.int32)
  for i in range(n_pad):
    ids = prompt_ids[i % n]
    out[i, : len(ids)] = ids
    lens[i] = len(ids)
  return out, lens


@functools.partial(jax.jit, static_argnames=("cfg", "mesh", "max_new", "min_prompt", "strategy", "eos_id"))
def _decode_rows_per_device(cfg, params, prompts_ExBxP, prompt_len_ExB, *, mesh, max_new, min_prompt,
                            strategy="auto", eos_id=None):
  """`ensemble_decode` on each device of `mesh` for its own rows, params replicated: each
  device's loop stops when its rows are done, and no step waits on another device."""
  rows = P(None, tuple(mesh.axis_names))
  one = functools.partial(greedy_decode, cfg, max_new=max_new, min_prompt=min_prompt, eos_id=eos_id)
  fn = ensemble_lib.over_members(one, ensemble_lib.resolve(strategy))
  return jax.shard_map(fn, mesh=mesh, in_specs=(P(), rows, rows), out_specs=rows, check_vma=False)(
      params, prompts_ExBxP, prompt_len_ExB)


@jax.jit
def _member(params, k):
  """Member `k` of stacked params, kept [1, ...] and laid out as they are (one compiled
  program per ensemble size, not a gather per leaf)."""
  return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, k, 1), params)


def decode_batch(cfg, params, prompts_ExBxP: np.ndarray, prompt_len_ExB: np.ndarray, **kwargs) -> np.ndarray:
  """`ensemble_decode` of host prompts with their rows spread over the devices `params` live
  on (xlt.sharding.spread: otherwise each device would decode every row); tokens on the host.
  The batch must divide by the number of those devices.

  Params replicated in one process decode per device (`_decode_rows_per_device`): as one
  global program, the loop's "every row done?" test was an all-reduce per new token, and on
  XLA:CPU, whose devices share one thread pool, such a collective left waiting beside a
  training step's aborted a run (rendezvous timeout) on a busy 2-core machine."""
  e = prompts_ExBxP.shape[0]
  if e > 1 and ensemble_lib.resolve(kwargs.get("strategy", "auto")) == "map":
    # lax.map runs members one after another anyway: one member per call compiles one
    # program for any ensemble size, where a program per size recompiled (seconds each)
    # whenever early stopping changed how many members an evaluation decodes
    return np.concatenate([decode_batch(cfg, _member(params, k), prompts_ExBxP[k:k + 1], prompt_len_ExB[k:k + 1],
                                        **kwargs) for k in range(e)])
  prompts_ExBxP, prompt_len_ExB = (sharding.spread(x, params, 1) for x in (prompts_ExBxP, prompt_len_ExB))
  mesh = sharding.replicated_mesh(params)
  if mesh is not None and jax.process_count() == 1:
    return np.asarray(_decode_rows_per_device(cfg, params, prompts_ExBxP, prompt_len_ExB, mesh=mesh, **kwargs))
  # to_host: with several processes the tokens may be spread over all of them
  return distributed.to_host(ensemble_decode(cfg, params, prompts_ExBxP, prompt_len_ExB, **kwargs))


def decode_answers(cfg, params, prompt_sets: list[list[list[int]]], *, max_new: int, eos_id: int,
                   batch: int = 512) -> list[list[list[int]]]:
  """Greedy answers for one prompt list per ensemble member (all lists the same length).

  Returns, per member and prompt, the generated ids up to (not including) EOS.
  """
  e, n = len(prompt_sets), len(prompt_sets[0])
  if any(len(s) != n for s in prompt_sets):
    raise ValueError("every ensemble member needs the same number of prompts")
  # a multiple of the devices the params live on, so each decodes its share of the rows
  batch = sharding.round_up(min(batch, n), sharding.devices_of(params))
  padded = [pad_prompts(s, batch) for s in prompt_sets]
  p = max(x[0].shape[1] for x in padded)
  prompts = np.stack([np.pad(x[0], ((0, 0), (0, p - x[0].shape[1]))) for x in padded])
  lens = np.stack([x[1] for x in padded])
  min_prompt = int(lens.min())
  out = [[] for _ in range(e)]
  for start in range(0, prompts.shape[1], batch):
    toks = decode_batch(cfg, params, prompts[:, start:start + batch], lens[:, start:start + batch],
                        max_new=max_new, min_prompt=min_prompt, eos_id=eos_id)
    for k in range(e):
      for row, plen in zip(toks[k], lens[k, start:start + batch]):
        gen = row[plen:].tolist()
        out[k].append(gen[: gen.index(eos_id)] if eos_id in gen else gen)
  return [o[:n] for o in out]


def score_members(cfg, params, task: common.Task, sets: dict[str, common.EvalSet],
                  member_langs: list[list[str]], batch: int,
                  predictions: list | None = None) -> list[dict[str, dict[str, float]]]:
  """Decodes every member on each of its languages' sets; returns, per member,
  {language: {metric: mean over the set}}. With a `predictions` list, appends one record per
  member and prompt: {"member": index, "set", "prompt", "answer", "scores"}."""
  tok = task.tokenizer
  out = [{} for _ in member_langs]
  for lang, es in sets.items():
    members = [i for i, ls in enumerate(member_langs) if lang in ls]
    if not members:
      continue
    sub = ensemble_lib.take(params, np.asarray(members))
    prompt_ids = [tok.encode(p) for p in es.prompts]
    answers = decode_answers(cfg, sub, [prompt_ids] * len(members), max_new=es.max_new,
                             eos_id=tok.eos_id, batch=batch)
    for i, ans in zip(members, answers):
      decoded = [tok.decode(a) for a in ans]
      scores = [es.score(j, d) for j, d in enumerate(decoded)]
      out[i][lang] = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
      if predictions is not None:
        predictions += [{"member": i, "set": lang, "prompt": " ".join(p), "answer": " ".join(d), "scores": sc}
                        for p, d, sc in zip(es.prompts, decoded, scores)]
  return out
