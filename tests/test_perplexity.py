"""xlt.perplexity: the perplexity of packed rows, under one model or each member of an ensemble."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_lm, tiny_lm_rows
from xlt import model as model_lib
from xlt import perplexity

_apply = jax.jit(model_lib.apply, static_argnums=0)
CFG = tiny_lm()
rows = tiny_lm_rows


def test_uniform_model_perplexity_is_vocab_size(tiny_lm_params):
  uniform = {**tiny_lm_params, "lm_head": jax.tree.map(jnp.zeros_like, tiny_lm_params["lm_head"])}
  tokens = rows()
  mask = np.ones((5, 12), np.float32)
  r = perplexity.perplexity(CFG, uniform, tokens, mask, batch=2)  # 3 batches, the last one padded
  assert r["tokens"] == 60 and r["ppl_token"] == pytest.approx(CFG.vocab_size, rel=1e-5)
  assert r["nll_sum"] == pytest.approx(60 * np.log(CFG.vocab_size), rel=1e-5)
  stacked = jax.tree.map(lambda *x: jnp.stack(x), uniform, tiny_lm_params)  # an ensemble of two
  e = perplexity.perplexity(CFG, stacked, tokens, mask, batch=2)
  assert e["ppl_token"].shape == (2,)
  assert e["ppl_token"][0] == pytest.approx(CFG.vocab_size, rel=1e-5)
  single = perplexity.perplexity(CFG, tiny_lm_params, tokens, mask, 2)
  assert e["ppl_token"][1] == pytest.approx(single["ppl_token"], rel=1e-5)
  one = perplexity.perplexity(CFG, stacked, tokens, mask, batch=2, members=[1])  # a sub-ensemble
  assert one["ppl_token"].shape == (1,) and one["ppl_token"][0] == pytest.approx(e["ppl_token"][1])


def test_perplexity_respects_loss_mask(tiny_lm_params):
  tokens = rows(seed=1)
  mask = (np.random.default_rng(2).random((5, 12)) < 0.5).astype(np.float32)
  logits, _ = _apply(CFG, tiny_lm_params, jnp.asarray(tokens[:, :-1]))
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  nll = -np.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  want = (nll * mask).sum()
  for batch in (2, 5, 64):  # padding of the last batch changes nothing
    r = perplexity.perplexity(CFG, tiny_lm_params, tokens, mask, batch)
    assert r["tokens"] == mask.sum() and r["nll_sum"] == pytest.approx(want, rel=1e-5)
  assert r["ppl_token"] == pytest.approx(np.exp(want / mask.sum()), rel=1e-5)
  with pytest.raises(ValueError, match="loss_mask"):
    perplexity.perplexity(CFG, tiny_lm_params, tokens, mask[:, 1:], 2)
