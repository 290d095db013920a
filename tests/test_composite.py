"""xlt.composite: plain, LoRA and neuron-masked params through one apply / split / shardings,
each giving what its kind's own functions (model.apply, lora.apply, lora.split, ...) give."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import compiled
from xlt import composite, lora, model, neurons, sharding, train
from xlt.param_paths import path_names

apply, lora_apply, composite_apply = compiled(model.apply), compiled(lora.apply), compiled(composite.apply)

CFG = model.Config(vocab_size=16, block_size=8, num_layers=2, num_heads=2, d_model=8)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 16, (3, 6)), jnp.int32)


def params():
  return model.init_params(CFG, jax.random.key(0))


def lora_composite(p):
  """LoRA adapters with b drawn at random (a trained adapter), so they change the forward."""
  rng = np.random.default_rng(1)
  adapters = jax.tree_util.tree_map_with_path(
      lambda q, x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32) * 0.1 if path_names(q)[-1] == "b" else x,
      lora.init(p, jax.random.key(1), rank=2, alpha=4.0))
  return {"base": p, "lora": adapters}


def neuron_composite(p):
  rng = np.random.default_rng(2)
  return neurons.composite(p, jax.tree.map(lambda x: rng.random(x.shape) < 0.3, jax.tree.map(np.asarray, p)))


def _equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_kinds_are_told_apart():
  p = params()
  assert not composite.is_composite(p)
  assert composite.is_composite(lora_composite(p)) and composite.is_composite(neuron_composite(p))
  stacked = jax.tree.map(lambda x: x[None], lora_composite(p))  # stacked members: the same kind
  assert composite.is_composite(stacked)


@pytest.mark.parametrize("dropout", [False, True])
def test_apply_is_each_kinds_forward(dropout):
  cfg = dataclasses.replace(CFG, dropout=0.3) if dropout else CFG
  rng = jax.random.key(5) if dropout else None
  p = params()
  _equal(composite_apply(cfg, p, TOKENS, rng), apply(cfg, p, TOKENS, dropout_rng=rng))
  comp = lora_composite(p)
  want = lora_apply(cfg, comp, TOKENS, dropout_rng=rng)
  _equal(composite_apply(cfg, comp, TOKENS, rng), want)
  assert not np.allclose(np.asarray(want[0]), np.asarray(apply(cfg, p, TOKENS, dropout_rng=rng)[0]))
  _equal(composite_apply(cfg, neuron_composite(p), TOKENS, rng), apply(cfg, p, TOKENS, dropout_rng=rng))


def test_split_trains_each_kinds_part():
  p = params()
  trained, rebuild, extra = composite.split(p)
  assert trained is p and rebuild(trained) is p and extra == {}
  comp = lora_composite(p)
  trained, rebuild, extra = composite.split(comp)
  want, _ = lora.split(comp)
  _equal(trained, want)
  assert "scale" not in trained and extra == {}
  _equal(rebuild(trained), comp)  # the base and the scale come back untouched
  comp = neuron_composite(p)
  trained, rebuild, extra = composite.split(comp)
  _equal(trained, p)
  assert set(extra) == {neurons.MASK_KEY} and extra[neurons.MASK_KEY] is comp[neurons.MASK_KEY]
  _equal(rebuild(trained), comp)


def test_base_and_merged():
  p = params()
  assert composite.base(p) is p and composite.merged(p) is p
  comp = lora_composite(p)
  assert composite.base(comp) is p
  _equal(composite.merged(comp), lora.merge_into(p, comp["lora"]))
  comp = neuron_composite(p)
  assert composite.base(comp) is p and composite.merged(comp) is p


def test_shardings_and_the_optimizer_state_follow_the_parameters():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rep = sharding.replicated(mesh)
  param_sh = sharding.param_shardings(model.logical_axes(CFG), mesh, sharding.DEFAULT_RULES)
  p = params()
  assert composite.shardings(p, param_sh, rep) is param_sh
  comp = lora_composite(p)
  sh = composite.shardings(comp, param_sh, rep)
  assert sh["base"] is param_sh and all(s == rep for s in jax.tree.leaves(sh["lora"]))
  sh = composite.shardings(neuron_composite(p), param_sh, rep)
  assert sh == {"params": param_sh, neurons.MASK_KEY: param_sh}
  # in the train state: Adam's moments follow the trained part's shardings (adapters
  # replicated; a neuron composite's params as the model's), whatever the kind
  kernel = ("block_0", "mlp", "fc", "kernel")
  for comp, kind_sh in ((p, param_sh), (neuron_composite(p), param_sh), (lora_composite(p), None)):
    tx = train.make_optimizer(_opt())
    if neurons.is_composite(comp):
      tx = neurons.masked(tx)
    abstract = jax.eval_shape(lambda c=comp, tx=tx: train.init_state(CFG, tx, [0], jax.tree.map(lambda x: x[None], c)))
    st_sh = train.state_shardings(CFG, tx, mesh, sharding.DEFAULT_RULES, abstract)
    mu = st_sh["opt_state"][1][0].mu
    for path, s in jax.tree_util.tree_flatten_with_path(mu)[0]:
      names = path_names(path)
      if kind_sh is None:
        assert s == rep, names
      elif names == kernel:
        assert s == param_sh["block_0"]["mlp"]["fc"]["kernel"] and s != rep


def _opt():
  return ml_collections.ConfigDict(dict(name="adamw", peak_lr=1e-2, schedule="constant", warmup_steps=0,
                                        total_steps=10, b1=0.9, b2=0.99, weight_decay=0.1, clip=1.0))


def test_loss_is_the_kinds_forward_loss():
  batch = {"tokens": TOKENS, "loss_mask": jnp.ones((3, 5), jnp.float32)}
  p = params()
  for comp, forward in ((p, lambda: apply(CFG, p, TOKENS[:, :-1])),
                        (lora_composite(p), lambda: lora_apply(CFG, lora_composite(p), TOKENS[:, :-1])),
                        (neuron_composite(p), lambda: apply(CFG, p, TOKENS[:, :-1]))):
    logits, _ = forward()
    logp = jax.nn.log_softmax(logits)
    want = -jnp.take_along_axis(logp, TOKENS[:, 1:, None], -1).sum()
    total, count = train.loss_sums(CFG, comp, batch)
    np.testing.assert_allclose(float(total), float(want), rtol=1e-5)
    assert float(count) == 15
