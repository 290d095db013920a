"""Language-model evaluation: perplexity of packed rows and sampling with a KV cache.

`perplexity` scores packed rows (tokens [N, T], loss_mask [N, T-1], see xlt.data.packing) with
one model or an ensemble (params with a leading axis E), in batches of rows, and returns the
summed target NLL, the number of scored targets and the per-token perplexity. Per-byte or
per-character perplexity is exp(nll_sum / bytes) with the byte count of the scored documents
(`xlt.data.corpus.text_stats`): the caller knows which documents the rows hold.

`sample` continues prompts with temperature / top-k sampling (temperature 0 = greedy), one
jitted function: a prefill of the prompt into the KV cache, then `lax.scan` over new tokens;
temperature and top_k are traced, so changing them does not recompile.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from xlt import distributed
from xlt import ensemble as ensemble_lib
from xlt import model as model_lib
from xlt import sharding
from xlt import train as train_lib


def is_ensemble(params) -> bool:
  """Whether params carry a leading ensemble axis (the token embedding is [E, V, D])."""
  return params["wte"]["embedding"].ndim == 3


@functools.partial(jax.jit, static_argnames=("cfg", "ensemble"))
def _nll_sums(cfg, params, tokens_BxT, mask_BxT, members, *, ensemble):
  fn = lambda p: train_lib.loss_sums(cfg, p, {"tokens": tokens_BxT, "loss_mask": mask_BxT})
  if not ensemble:
    return fn(params)
  if members is not None:  # gather inside the jit: no eager per-leaf gathers
    params = jax.tree.map(lambda x: x[members], params)
  return ensemble_lib.over_members(fn, ensemble_lib.resolve())(params)


def perplexity(cfg: model_lib.Config, params, tokens, loss_mask, batch: int,
               ensemble: bool | None = None, members=None) -> dict:
  """{"nll_sum", "tokens", "ppl_token"} of rows tokens [N, T] under loss_mask [N, T-1].

  Every model scores the same rows. With an ensemble (auto-detected unless `ensemble` is given)
  each value is an array [E] (or [len(members)]: only those ensemble members are scored);
  otherwise a float. Sums are accumulated in float64 on the host; the last batch is padded with
  masked rows, so one shape is compiled.
  """
  ensemble = is_ensemble(params) if ensemble is None else ensemble
  if members is not None:
    if not ensemble:
      raise ValueError("members selects ensemble members; params are one model")
    members = np.asarray(members, np.int32)
  tokens, loss_mask = np.asarray(tokens, np.int32), np.asarray(loss_mask, np.float32)
  n = len(tokens)
  if n == 0 or loss_mask.shape != (n, tokens.shape[1] - 1):
    raise ValueError(f"need rows tokens [N>0, T] and loss_mask [N, T-1], got {tokens.shape}, "
                     f"{loss_mask.shape}")
  # a multiple of the devices the params live on, so each scores its share of the rows
  batch = sharding.round_up(max(1, min(batch, n)), sharding.devices_of(params))
  nll, count = 0.0, 0.0
  for start in range(0, n, batch):
    tok, mask = tokens[start:start + batch], loss_mask[start:start + batch]
    if len(tok) < batch:  # pad: zero rows with a zero mask
      tok = np.concatenate([tok, np.zeros((batch - len(tok), tok.shape[1]), np.int32)])
      mask = np.concatenate([mask, np.zeros((batch - len(mask), mask.shape[1]), np.float32)])
    tok, mask = sharding.spread(tok, params, 0), sharding.spread(mask, params, 0)
    s, c = _nll_sums(cfg, params, tok, mask, members, ensemble=ensemble)
    s, c = distributed.to_host((s, c))  # may be spread over several processes' devices
    nll, count = nll + np.asarray(s, np.float64), count + np.asarray(c, np.float64)
  ppl = np.exp(nll / np.maximum(count, 1.0))
  if not ensemble:
    nll, count, ppl = float(nll), float(count), float(ppl)
  return {"nll_sum": nll, "tokens": count, "ppl_token": ppl}


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
  logits_BxPxV, cache = model_lib.apply(cfg, params, prompt_BxP, cache, 0)
  keys = jax.random.split(rng, max_new)
  pick = lambda logits_BxV, key: _pick(logits_BxV, key, temperature, top_k, greedy)
  first_B = pick(logits_BxPxV[:, -1], keys[0])

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
