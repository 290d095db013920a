"""xlt.cross_entropy: the custom-VJP loss equals optax's bit for bit on CPU, in value and
gradient, alone and inside a model's loss, and its gradient is softmax - one_hot."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from xlt import cross_entropy, model, train


def _logits_labels(dtype, shape=(2, 5, 37)):
  logits = (3 * jax.random.normal(jax.random.key(0), shape)).astype(dtype)
  labels = jax.random.randint(jax.random.key(1), shape[:-1], 0, shape[-1])
  weights = jax.random.uniform(jax.random.key(2), shape[:-1])
  return logits, labels, weights


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_equals_optax_in_value_and_gradient(dtype):
  logits, labels, weights = _logits_labels(dtype)

  def loss(lg, ce):  # as the model and train.loss_sums: logits cast up, a masked sum
    return jnp.sum(ce(lg.astype(jnp.float32), labels) * weights)

  fn = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  want, want_g = fn(logits, optax.softmax_cross_entropy_with_integer_labels)
  got, got_g = fn(logits, lambda lg, y: cross_entropy.tokens(lg, y, dtype))
  assert got_g.dtype == logits.dtype
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(np.float32(got_g), np.float32(want_g))
  tol = 1e-6 if dtype == "float32" else 2 ** -8  # bf16: one rounding of the same float32 value
  # by hand: softmax - one_hot, times each position's weight
  p = jax.nn.softmax(logits.astype(jnp.float32), -1)
  hand = (p - jax.nn.one_hot(labels, logits.shape[-1])) * weights[..., None]
  np.testing.assert_allclose(np.float32(got_g), hand.astype(logits.dtype).astype(np.float32), atol=tol)


def test_values_equal_optax_exactly():
  logits, labels, _ = _logits_labels("float32", (3, 7, 101))
  want = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  np.testing.assert_array_equal(cross_entropy.tokens(logits, labels, "float32"), want)


def test_residual_dtype_per_head():
  cfg = model.Config(vocab_size=16, d_model=8, num_layers=1, num_heads=2, block_size=8, dtype="bfloat16")
  assert cross_entropy.residual_dtype(cfg) == "bfloat16"
  # a soft-capped head's logits are float32 past the tanh: a bf16 residual would round them
  assert cross_entropy.residual_dtype(dataclasses.replace(cfg, final_logit_softcap=30.0)) == "float32"


@pytest.mark.parametrize("family,dtype", [("gpt", "float32"), ("llama", "bfloat16")])
def test_model_loss_equals_optax_bit_for_bit(monkeypatch, family, dtype):
  """train.loss_sums with the custom loss against optax's formula: the same sums and gradients
  (CPU results computed before the custom loss stay reproducible)."""
  llama = dict(norm="rmsnorm", mlp="swiglu", pos_embedding="rope", bias=False, tie_embeddings=True)
  cfg = model.Config(vocab_size=64, d_model=32, num_layers=2, num_heads=4, block_size=16, dtype=dtype,
                     **(llama if family == "llama" else {}))
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (4, 17), 0, cfg.vocab_size)
  batch = {"tokens": tokens, "loss_mask": (jnp.arange(16) > 3).astype(jnp.float32)[None].repeat(4, 0)}

  def sums_and_grads():
    fn = jax.jit(jax.value_and_grad(lambda p: train.loss_sums(cfg, p, batch)[0]))
    return fn(params)

  got, got_g = sums_and_grads()
  monkeypatch.setattr(cross_entropy, "tokens", lambda lg, y, _: optax.softmax_cross_entropy_with_integer_labels(lg, y))
  want, want_g = sums_and_grads()
  np.testing.assert_array_equal(got, want)
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_array_equal(np.float32(a), np.float32(b))
