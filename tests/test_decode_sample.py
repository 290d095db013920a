"""xlt.decode.sample: temperature / top-k sampling of one small random model, greedy at
temperature 0 (equal to xlt.ensemble_decode's greedy decoding and to full forward passes)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlt import decode, ensemble_decode
from conftest import tiny_lm, tiny_lm_rows
from xlt import model as model_lib

_apply = jax.jit(model_lib.apply, static_argnums=0)
CFG = tiny_lm()
rows = tiny_lm_rows


def test_sample_greedy_matches_greedy_decode(tiny_lm_params):
  prompts = rows(n=3, t=5, seed=3)
  got = decode.sample(CFG, tiny_lm_params, prompts, max_new=7, temperature=0.0)
  want = ensemble_decode.ensemble_decode(CFG, jax.tree.map(lambda x: x[None], tiny_lm_params), prompts[None],
                                         np.full((1, 3), 5), max_new=7, min_prompt=5)[0]
  np.testing.assert_array_equal(got, np.asarray(want))
  # Repeated full forward passes (no cache), argmax at the last real position; the buffer is
  # padded to a fixed length, which causal attention ignores.
  buf = np.zeros((3, 12), np.int32)
  buf[:, :5] = prompts
  for t in range(5, 12):
    logits, _ = _apply(CFG, tiny_lm_params, jnp.asarray(buf))
    buf[:, t] = np.argmax(np.asarray(logits[:, t - 1]), axis=-1)
  np.testing.assert_array_equal(got, buf)
  np.testing.assert_array_equal(decode.sample(CFG, tiny_lm_params, prompts, max_new=7, temperature=1.0,
                                          top_k=1, rng=5), buf)  # top-1 is greedy too


def test_sample_top_k_and_rng(tiny_lm_params):
  prompt = rows(n=3, t=5, seed=4)  # the shapes of the test above: no new compile
  a = decode.sample(CFG, tiny_lm_params, prompt, max_new=7, temperature=5.0, top_k=3, rng=jax.random.key(1))
  b = decode.sample(CFG, tiny_lm_params, prompt, max_new=7, temperature=5.0, top_k=3, rng=jax.random.key(1))
  c = decode.sample(CFG, tiny_lm_params, prompt, max_new=7, temperature=5.0, top_k=3, rng=jax.random.key(2))
  np.testing.assert_array_equal(a, b)
  assert a.shape == (3, 12) and (a[:, :5] == prompt).all() and not (a == c).all()
  # Every new token is among the 3 most likely ones given what precedes it.
  logits, _ = _apply(CFG, tiny_lm_params, jnp.asarray(a))
  top3 = np.argsort(np.asarray(logits), axis=-1)[:, 4:-1, -3:]
  assert (top3 == a[:, 5:, None]).any(-1).all()
  with pytest.raises(ValueError, match="block_size"):
    decode.sample(CFG, tiny_lm_params, prompt, max_new=CFG.block_size)


@pytest.mark.parametrize("tie", [False, True])
def test_last_only_is_the_last_position_of_the_full_logits(tiny_lm_params, tie):
  cfg = dataclasses.replace(CFG, tie_embeddings=tie, final_logit_softcap=30.0)
  params = model_lib.init_params(cfg, jax.random.key(7)) if tie else tiny_lm_params
  tokens = jnp.asarray(rows(n=3, t=6, seed=5))
  valid = jnp.asarray([[1] * 6, [0, 0, 1, 1, 1, 1], [0] * 5 + [1]], bool)  # left padding: each row's own mask
  cache = model_lib.init_cache(cfg, 3, 9, padded=True)
  full, full_cache = model_lib.apply(cfg, params, tokens, cache, 0, valid_BxT=valid)
  last, last_cache = model_lib.apply(cfg, params, tokens, cache, 0, valid_BxT=valid, last_only=True)
  assert last.shape == (3, 1, cfg.vocab_size)
  np.testing.assert_allclose(last, full[:, -1:], rtol=1e-5, atol=1e-5)
  jax.tree.map(np.testing.assert_array_equal, last_cache, full_cache)  # the cache is the same computation


def test_sample_prefill_makes_no_logits_for_every_prompt_position(tiny_lm_params):
  b, p = 2, 11  # a shape no other array of the step has: [b, p, V] would be the prefill's logits
  text = decode._sample.lower(CFG, tiny_lm_params, jnp.zeros((b, p), jnp.int32), jax.random.key(0), 1.0, 0,
                              max_new=3, greedy=True).as_text()
  assert f"tensor<{b}x{p}x{CFG.vocab_size}xf32>" not in text
  assert f"tensor<{b}x1x{CFG.vocab_size}xf32>" in text
