"""What scaling a model up changes without changing its values: the attention kernel per
platform (xlt.attention), activation rematerialisation, bf16 compute over fp32 parameters and
optimizer state, and a loaded model's training step sharded over a mesh."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiled, small_graph_config

from xlt import attention, layers, model, pretrained, sharding
from xlt import train as train_lib

apply = compiled(model.apply)

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


def _load(family):
  path = os.path.join(HF, family)
  return pretrained.load(path) + (np.load(os.path.join(path, "input_ids.npy")).astype(np.int32),)


def _qkv_mask(g, window, padded, t=12, h=4, k=8):
  rng = np.random.default_rng(0)
  q, kk, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, h, t, k), (2, g, t, k), (2, g, t, k)))
  i = jnp.arange(t)
  mask = i[:, None] >= i[None, :]
  if window:
    mask = mask & (i[None, :] > i[:, None] - window)
  if padded:  # row 1 left-padded by 3: no query sees those keys
    valid = jnp.asarray([[True] * t, [False] * 3 + [True] * (t - 3)])
    mask = mask[None, None] & valid[:, None, None, :]
  return q, kk, v, mask


def _xlt(q, k, v, mask, scale, softcap=None):
  rep = q.shape[1] // k.shape[1]
  return layers.causal_attention(q * scale, jnp.repeat(k, rep, 1), jnp.repeat(v, rep, 1), mask, softcap=softcap)


@pytest.mark.parametrize("g,window,padded", [(4, 0, False), (2, 0, False), (1, 5, False), (2, 5, True), (4, 0, True)])
def test_xla_attention_equals_xlts(g, window, padded):
  q, k, v, mask = _qkv_mask(g, window, padded)
  out = attention.attend("xla", q, k, v, mask, scale=0.3, window=window)
  np.testing.assert_allclose(out, _xlt(q, k, v, mask, 0.3), atol=1e-5)


def test_splash_kernel_in_the_interpreter_equals_xlts():
  if attention.splash_missing():
    pytest.skip(attention.splash_missing())
  q, k, v, mask = _qkv_mask(2, 5, False, t=128, h=2, k=16)
  out = attention.attend("splash", q, k, v, mask, scale=0.25, window=5, softcap=2.0, interpret=True)
  np.testing.assert_allclose(out, _xlt(q, k, v, mask, 0.25, softcap=2.0), atol=1e-5)
  causal = jnp.tril(jnp.ones((128, 128), bool))  # the window is really applied
  assert np.abs(out - _xlt(q, k, v, causal, 0.25, softcap=2.0)).max() > 1e-2


@pytest.mark.parametrize("family", ["llama", "llama_kv1", "mistral", "qwen3", "gemma2"])
def test_loaded_model_with_xla_attention_equals_xlts(family):
  cfg, params, ids = _load(family)
  ref, _ = apply(dataclasses.replace(cfg, attention="xlt"), params, ids)
  xla = dataclasses.replace(cfg, attention="xla")  # gemma2's soft-capping falls back to xlt
  np.testing.assert_allclose(apply(xla, params, ids)[0], ref, atol=1e-5)
  # left-padded prefill, then a decoding step (a mask with an offset into the cache)
  valid = np.ones(ids.shape, bool)
  valid[0, :2] = False
  outs = []
  for c in (cfg, xla):
    cache = model.init_cache(c, ids.shape[0], ids.shape[1] + 1, padded=True)
    l0, cache = apply(c, params, ids, cache, 0, valid_BxT=valid)
    l1, _ = apply(c, params, ids[:, -1:], cache, ids.shape[1])
    outs.append((np.asarray(l0)[valid], np.asarray(l1)))
  for a, b in zip(*outs):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_attention_chosen_per_platform():
  bf16 = jnp.bfloat16
  assert attention.choose("auto", "cpu") == ("xlt", None)
  assert attention.choose("auto", "gpu", dtype=bf16) == ("cudnn", None)
  assert attention.choose("auto", "cuda", dtype="float16") == ("cudnn", None)
  assert attention.choose("auto", "gpu")[0] == "xla"  # fp32: XLA's attention
  assert attention.choose("auto", "gpu", dtype=bf16, decoding=True)[0] == "xla"
  assert attention.choose("auto", "gpu", dtype=bf16, softcap=50.0)[0] == "xlt"
  assert attention.choose("auto", "gpu", dtype=bf16, dropout=True)[0] == "xlt"
  assert attention.choose("auto", "gpu", dtype=bf16, head_dim=256)[0] == "xla"
  splash = "xlt" if attention.splash_missing() else "splash"
  assert attention.choose("auto", "tpu", seq=256, softcap=50.0)[0] == splash  # splash soft-caps
  assert attention.choose("auto", "tpu", seq=256, padded=True)[0] == "xlt"
  assert attention.choose("auto", "tpu", seq=100)[0] == "xlt"
  assert attention.choose("cudnn", "cpu") == ("xlt", "cuDNN attention needs a GPU (platform cpu)")
  assert attention.choose("splash", "gpu")[0] == "xlt"
  assert attention.choose("xla", "cpu") == ("xla", None)
  assert attention.choose("xla", "tpu", softcap=50.0)[0] == "xlt"
  assert attention.choose("xlt", "gpu", dtype=bf16) == ("xlt", None)
  with pytest.raises(ValueError, match="model.attention must be one of"):
    attention.choose("flash", "gpu")
  with pytest.raises(ValueError, match="model.attention must be one of"):
    model.Config(vocab_size=8, attention="flash")
  with pytest.raises(ValueError, match="model.remat must be none or block"):
    model.Config(vocab_size=8, remat="layer")


@pytest.mark.parametrize("policy", ["nothing", "dots"])
def test_remat_gradients_equal_plain_gradients(policy):
  cfg, params, ids = _load("gemma2")

  def grads(c):
    loss = lambda p: model.apply(c, p, ids)[0].astype(jnp.float32).std()
    return jax.jit(jax.grad(loss))(params)

  remat = dataclasses.replace(cfg, remat="block", remat_policy=policy)
  for a, b in zip(jax.tree.leaves(grads(cfg)), jax.tree.leaves(grads(remat))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  # the backward pass really recomputes: a remat primitive per block in the program
  jaxpr = str(jax.make_jaxpr(lambda p: jax.grad(lambda p: model.apply(remat, p, ids)[0].sum())(p))(params))
  assert jaxpr.count("remat") >= cfg.num_layers


def _state(cfg, params, tx, seeds=(0, 1)):
  stacked = jax.tree.map(lambda x: jnp.stack([x] * len(seeds)), params)
  return train_lib.init_state(cfg, tx, seeds, stacked)


def _batch(cfg, members=2, rows=16, t=12):
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (members, rows, t)).astype(np.int32)
  return {"tokens": tokens, "loss_mask": np.ones((members, rows, t - 1), np.float32)}


def test_bf16_compute_keeps_fp32_params_and_adam_state():
  cfg, params, _ = _load("llama")
  cfg = dataclasses.replace(cfg, dtype="bfloat16", param_dtype="float32")
  opt = small_graph_config().opt
  opt.schedule = "constant"  # a step at the full rate: the parameters move
  tx = train_lib.make_optimizer(opt)
  state, batch = _state(cfg, params, tx), _batch(cfg)
  jaxpr = str(jax.make_jaxpr(lambda p: model.apply(cfg, p, batch["tokens"][0])[0])(params))
  assert "bf16[16,12,48]" in jaxpr  # the MLP's activations are computed in bf16
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  step, st_sh, _ = train_lib.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, jax.eval_shape(lambda: state))
  state, metrics = step(jax.device_put(state, st_sh), batch)
  assert np.isfinite(np.asarray(metrics["loss"])).all()
  assert {x.dtype for x in jax.tree.leaves(state["params"])} == {jnp.dtype("float32")}
  moments = [x for x in jax.tree.leaves(state["opt_state"]) if x.ndim > 1]
  assert len(moments) == 2 * len(jax.tree.leaves(params))  # Adam's mu and nu, float32
  assert {x.dtype for x in moments} == {jnp.dtype("float32")}
  assert not np.allclose(state["params"]["wte"]["embedding"][0], params["wte"]["embedding"])


@pytest.mark.parametrize("family", ["llama_kv4", "gemma2"])
def test_sharded_step_of_a_loaded_model_equals_single_device(family):
  assert jax.device_count() == 8, "tests/conftest.py sets 8 fake CPU devices"
  cfg, params, _ = _load(family)
  tx = train_lib.make_optimizer(small_graph_config().opt)
  abstract = jax.eval_shape(lambda: _state(cfg, params, tx))
  batch = _batch(cfg)
  results = []
  for spec in ({"data": 1, "devices": 1}, {"data": 8}, {"data": 2, "fsdp": 2, "tensor": 2}):
    mesh = sharding.make_mesh(spec)
    step, st_sh, _ = train_lib.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract)
    with jax.set_mesh(mesh):
      state = jax.device_put(_state(cfg, params, tx), st_sh)
      for _ in range(2):
        state, metrics = step(state, batch)
    results.append((jax.device_get(state["params"]), np.asarray(metrics["loss"])))
    if "tensor" in spec:  # really spread: the MLP weight [F, D] over tensor x fsdp (after the ensemble axis)
      assert tuple(state["params"]["block_0"]["mlp"]["up"]["weight"].sharding.spec) == (None, "tensor", "fsdp")
  (p1, l1), *others = results
  for p, loss in others:
    np.testing.assert_allclose(loss, l1, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(p1)):
      np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
