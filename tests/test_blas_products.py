"""benchmarks/blas_products.py's custom call: scipy's sgemm called from inside a compiled program
computes each product as numpy does, and the dense layers it stands in for while a step is traced
have xlt.matmul's values and gradients (to float rounding: another library's summation order)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import blas_products as bp
from xlt import matmul


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_the_custom_call_is_numpys_product(transpose_a, transpose_b):
  rng = np.random.default_rng(0)
  a = rng.standard_normal((7, 5) if transpose_a else (5, 7)).astype(np.float32)
  b = rng.standard_normal((3, 7) if transpose_b else (7, 3)).astype(np.float32)
  got = jax.jit(bp.blas, static_argnums=(2, 3))(a, b, transpose_a, transpose_b)
  want = (a.T if transpose_a else a) @ (b.T if transpose_b else b)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


def test_the_patched_dense_layers_have_xlts_values_and_gradients():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.float32)
  w_t, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((4, 8), (8, 4)))
  dims = (((2,), (0,)), ((), ()))

  def loss(x, w_t, w):  # a layer stored [out, in] (dense_t) beside one stored [in, out] (dense)
    return jnp.sum(jnp.sin(matmul.dense_t(x, w_t, 1)) * jnp.cos(matmul.dense(x, w, dims)))

  step = lambda: jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))  # noqa: E731  (traced afresh)
  plain = (matmul.dense, matmul.dense_t)
  want = step()(x, w_t, w)
  with bp.blas_products():
    hlo = step().lower(x, w_t, w).as_text()
    got = step()(x, w_t, w)
  assert hlo.count(bp.TARGET) == 6  # each layer's forward, input and weight gradient
  assert (matmul.dense, matmul.dense_t) == plain  # put back afterwards
  for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-5, atol=1e-5)
