"""benchmarks/decode_attention.py: its other forms compute what xlt's do (the attention to float
rounding, the greedy pick exactly, ties to the first index), and it writes a results file."""

import json

import jax
import numpy as np
import pytest

from benchmarks import decode_attention as da


@pytest.mark.parametrize("shape", [(3, 4, 2, 8, 10), (2, 3, 3, 4, 7), (1, 2, 1, 16, 5)])
def test_the_broadcast_form_is_xlts_attention(shape):
  args = da.attention_inputs(*shape)
  want = np.asarray(jax.jit(da.xlt_attention)(*args))
  got = np.asarray(jax.jit(da.broadcast_attention)(*args))
  assert got.shape == want.shape == (shape[0], 1, shape[1], shape[3])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_first_maximum_is_argmaxs_pick():
  (logits,) = da.pick_inputs(5, 37)
  picks = np.asarray(jax.jit(da.first_max_pick)(logits))
  assert (picks == 37 // 3).all()  # the tie's first index
  assert (picks == np.asarray(jax.jit(da.argmax_pick)(logits))).all()
  x = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32)
  assert (np.asarray(jax.jit(da.first_max_pick)(x)) == x.argmax(-1)).all()


def test_the_benchmark_writes_its_rows(tmp_path, monkeypatch):
  monkeypatch.setattr(da, "ATTENTION", [("small", 2, 4, 2, 8, 12)])
  monkeypatch.setattr(da, "PICK", [("small", 2, 50)])
  out = tmp_path / "decode_attention.json"
  da.main(["--rounds=1", "--calls=1", f"--out={out}"])
  record = json.loads(out.read_text())
  assert [r[:2] for r in record["rows"]] == [["attention", "small: batch 2, 4/2 heads x 8, cache 12"],
                                            ["greedy pick", "small: batch 2, vocabulary 50"]]
  assert record["rows"][1][-1] == 0 and record["rows"][0][-1] < 1e-5  # the forms' outputs agree
  assert all(r[2] > 0 and r[3] > 0 for r in record["rows"])
