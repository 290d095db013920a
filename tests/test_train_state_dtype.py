"""opt.state_dtype (xlt.train.with_state_dtype): float32 Adam moments for bfloat16 parameters,
updates in the parameters' dtype, extra update arguments passed through, and the default
unchanged."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import common
from xlt import partition
from xlt import train as train_lib


def _opt(**kw):
  return ml_collections.ConfigDict(dict(name="adamw", schedule="constant", peak_lr=1e-2, warmup_steps=0,
                                        total_steps=10, b1=0.9, b2=0.95, weight_decay=0.1, clip=1.0, **kw))


def _params(dtype):
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.standard_normal((4, 3)), dtype), "b": jnp.asarray(rng.standard_normal(3), dtype)}


def _moment_dtypes(state, params):
  shapes = {x.shape for x in jax.tree.leaves(params)}
  return {x.dtype for x in jax.tree.leaves(state) if x.shape in shapes}


def test_float32_moments_for_bf16_params_and_updates_in_bf16():
  params = _params(jnp.bfloat16)
  grads = jax.tree.map(lambda x: (x * 0.5).astype(x.dtype), params)
  tx = train_lib.make_optimizer(_opt(state_dtype="float32"))
  state = tx.init(params)
  assert _moment_dtypes(state, params) == {jnp.dtype("float32")}
  updates, state = tx.update(grads, state, params)
  assert {x.dtype for x in jax.tree.leaves(updates)} == {jnp.dtype("bfloat16")}
  assert _moment_dtypes(state, params) == {jnp.dtype("float32")}
  # the same as the optimizer run on float32 copies, rounded to bf16 at the end
  f32 = lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t)
  plain = train_lib.make_optimizer(_opt())
  want, _ = plain.update(f32(grads), plain.init(f32(params)), f32(params))
  for u, w in zip(jax.tree.leaves(updates), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(w.astype(jnp.bfloat16)))


def test_default_state_follows_the_params_and_is_unchanged():
  assert common.opt(common.train()).state_dtype == ""
  params = _params(jnp.bfloat16)
  c = _opt()
  tx = train_lib.make_optimizer(c)
  assert _moment_dtypes(tx.init(params), params) == {jnp.dtype("bfloat16")}
  assert train_lib.with_state_dtype(tx, "") is tx
  c.state_dtype = ""
  grads = jax.tree.map(lambda x: (x * 0.5).astype(x.dtype), params)
  a, _ = train_lib.make_optimizer(c).update(grads, tx.init(params), params)
  b, _ = tx.update(grads, tx.init(params), params)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_gated_optimizer_in_float32_keeps_frozen_moments():
  """The extra `trainable=` flags pass through the wrapper; a frozen cell keeps its moments."""
  params = _params(jnp.bfloat16)
  cells = {"w": "a", "b": "b"}
  tx = train_lib.with_state_dtype(partition.gated_optimizer(_opt(), cells, ("a", "b")), "float32")
  state = tx.init(params)
  grads = jax.tree.map(lambda x: (x * 0.5).astype(x.dtype), params)
  updates, new = tx.update(grads, state, params, trainable=np.array([True, False]))
  assert updates["w"].dtype == jnp.bfloat16 and np.any(np.asarray(updates["w"]) != 0)
  assert not np.any(np.asarray(updates["b"]))
  assert _moment_dtypes(new, params) == {jnp.dtype("float32")}


def test_bad_state_dtype():
  for bad in ("int32", "floaty"):
    with pytest.raises(ValueError, match="opt.state_dtype must be a float dtype"):
      train_lib.make_optimizer(_opt(state_dtype=bad))
