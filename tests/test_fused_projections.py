"""model.Config.fused_projections: q, k, v (and gate, up) computed as one product of their
weights concatenated where used. The same parameters (names, shapes, initial values, logical
axes), the same logits and gradients to float rounding, in both weight layouts and with
Qwen2's query/key/value biases; code that intercepts each dense layer's call (LoRA, RegMean's
statistics) sees the layers one by one as before."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from xlt import decode, generate, lora, merge_statistics, model

# GQA (2 key/value heads for 4 query heads): q, k and v are separate layers, as in Llama
LLAMA = model.Config(vocab_size=32, block_size=16, num_layers=2, num_heads=4, num_kv_heads=2, d_model=16,
                     mlp_dim=24, norm="rmsnorm", mlp="swiglu", pos_embedding="rope", bias=False)
QWEN2 = dataclasses.replace(LLAMA, qkv_bias=True)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 32, (3, 10)), jnp.int32)
apply, lora_apply = compiled(model.apply), compiled(lora.apply)


def fused(cfg):
  return dataclasses.replace(cfg, fused_projections=True)


def random_params(cfg, seed=0):
  """Every leaf random (the biases too, which init leaves at zero)."""
  params = model.init_params(cfg, jax.random.key(seed))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: jnp.asarray(0.3 * rng.standard_normal(x.shape), x.dtype), params)


@pytest.mark.parametrize("layout", ["kernel", "weight"])
@pytest.mark.parametrize("cfg", [LLAMA, QWEN2], ids=["llama", "qwen2"])
def test_the_same_parameters_and_axes(cfg, layout):
  cfg = dataclasses.replace(cfg, dense_layout=layout)
  want, got = (model.init_params(c, jax.random.key(3)) for c in (cfg, fused(cfg)))
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  assert model.logical_axes(fused(cfg)) == model.logical_axes(cfg)


def loss_and_grads(cfg, params):
  def loss(p):
    logits, _ = model.apply(cfg, p, TOKENS)
    return jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("layout", ["kernel", "weight"])
@pytest.mark.parametrize("cfg", [LLAMA, QWEN2], ids=["llama", "qwen2"])
def test_the_same_logits_and_gradients(cfg, layout):
  cfg = dataclasses.replace(cfg, dense_layout=layout)
  params = random_params(cfg)
  want, got = (apply(c, params, TOKENS)[0] for c in (cfg, fused(cfg)))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  (want_loss, want_g), (got_loss, got_g) = (loss_and_grads(c, params) for c in (cfg, fused(cfg)))
  np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
  for w, g in zip(jax.tree.leaves(want_g), jax.tree.leaves(got_g)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)
  assert float(jnp.abs(got_g["block_0"]["attn"]["v"][layout]).max()) > 0  # the split reaches every layer


def test_bf16_compute_within_its_rounding():
  cfg = dataclasses.replace(LLAMA, dtype="bfloat16")
  params = random_params(cfg)
  want, got = (np.asarray(apply(c, params, TOKENS)[0], np.float32) for c in (cfg, fused(cfg)))
  assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_decoding_the_same_tokens():
  params = random_params(LLAMA)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]  # of different lengths: left padding too
  want, got = (generate.greedy_ids(c, params, prompts, max_new=5) for c in (LLAMA, fused(LLAMA)))
  assert got == want and {len(x) for x in got} == {5}


def test_lora_and_regmean_see_each_projection():
  params = random_params(LLAMA)
  adapters = lora.init(params, jax.random.key(1), rank=2, alpha=4.0)
  adapters = jax.tree.map(lambda x: x + 0.1 if x.ndim == 2 else x, adapters)  # b nonzero: the adapters count
  composite = {"base": params, "lora": adapters}
  want, got = (lora_apply(c, composite, TOKENS)[0] for c in (LLAMA, fused(LLAMA)))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  want, got = (merge_statistics.grams(c, params, [TOKENS]) for c in (LLAMA, fused(LLAMA)))
  assert set(got) == set(want) and "block_0/attn/k/kernel" in got
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])


def test_sharded_equals_one_device():
  """data=2, fsdp=2, tensor=2 (the 8 CPU devices of tests/conftest.py): each weight split by
  its own heads, the concatenation of differently split weights the same values."""
  params = random_params(LLAMA)
  mesh = decode.make_mesh("data=2,fsdp=2,tensor=2")
  placed = decode.place(fused(LLAMA), params, mesh)
  assert not placed["block_0"]["attn"]["k"]["kernel"].sharding.is_fully_replicated
  tokens, valid = decode.left_pad([[1, 2, 3, 4], [5, 6], [7, 8, 9], [10]], multiple=decode.rows_multiple(mesh))
  np.testing.assert_allclose(decode.logits(fused(LLAMA), placed, tokens, valid, mesh=mesh),
                             decode.logits(LLAMA, params, tokens, valid), rtol=1e-5, atol=1e-5)
