"""Perplexity of packed rows, under one model or every member of an ensemble.

Which module for what: this one scores text (an experiment's validation and test rows, or
`python -m xlt.generate --perplexity`); xlt.decode decodes and scores one model's tokens (logits,
log-probabilities, greedy with stops, sampling); xlt.ensemble_decode decodes an ensemble's answers
to a task's evaluation sets and scores them (the experiments' exact match); xlt.generate is the
command line over decode and this module for a Hugging Face model directory.

`perplexity` scores packed rows (tokens [N, T], loss_mask [N, T-1], see xlt.data.packing) with
one model or an ensemble (params with a leading axis E), in batches of rows, and returns the
summed target NLL, the number of scored targets and the per-token perplexity. Per-byte or
per-character perplexity is exp(nll_sum / bytes) with the byte count of the scored documents
(`xlt.data.corpus.text_stats`): the caller knows which documents the rows hold.
"""

from __future__ import annotations

import functools

import jax
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
