"""Neuron-level masks: expansion and its errors, locating top neurons, training that moves
only selected entries (values and optimizer state), and the merges taking the same masks."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from xlt import merge, model, neurons, train


def tiny():
  # an xlt-named tree: mlp/fc kernel [D=2, F=3] (rows = its 3 columns), a bias, a norm
  return {"block_0": {"mlp": {"fc": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
                                     "bias": np.zeros(3, np.float32)}},
                      "ln_1": {"scale": np.ones(2, np.float32)}}}


def test_expand_rows_entries_and_whole_tensors():
  params = tiny()
  masks = {"block_0": {"mlp": {"fc": {"kernel": np.array([True, False, True]), "bias": True}},
                       "ln_1": {"scale": np.array([[1, 0]])[0]}}}
  full = neurons.expand(masks, params)
  # rows of a [D, F] kernel are its F output units: columns 0 and 2
  np.testing.assert_array_equal(full["block_0"]["mlp"]["fc"]["kernel"], [[1, 0, 1], [1, 0, 1]])
  np.testing.assert_array_equal(full["block_0"]["mlp"]["fc"]["bias"], [1, 1, 1])
  np.testing.assert_array_equal(full["block_0"]["ln_1"]["scale"], [1, 0])  # per entry
  assert neurons.count(full) == 4 + 3 + 1
  bad = {"block_0": {"mlp": {"fc": {"kernel": np.ones(2, bool), "bias": True}}, "ln_1": {"scale": True}}}
  with pytest.raises(ValueError, match=r"block_0/mlp/fc/kernel: mask of shape \(2,\) fits neither the tensor "
                                       r"\(2, 3\) nor its 3 rows"):
    neurons.expand(bad, params)
  with pytest.raises(ValueError, match="missing from the mask"):
    neurons.expand({"block_0": {"mlp": {"fc": {"kernel": True}}}}, params)


def test_locate_picks_the_rows_that_moved_most():
  base = tiny()
  moved = jax.tree.map(np.copy, base)
  moved["block_0"]["mlp"]["fc"]["kernel"][:, 1] += 5.0  # output unit 1: norm 5*sqrt(2)
  moved["block_0"]["ln_1"]["scale"] += 1.0  # the norm's one row: norm sqrt(2)
  masks = neurons.locate(moved, base, fraction=0.2)  # 5 rows in all -> 1 kept
  np.testing.assert_array_equal(masks["block_0"]["mlp"]["fc"]["kernel"], [False, True, False])
  assert not masks["block_0"]["ln_1"]["scale"].any()
  both = neurons.union(base, masks, {"block_0": {"mlp": {"fc": {"kernel": False, "bias": False}},
                                                 "ln_1": {"scale": True}}})
  assert neurons.count(both) == 2 + 2


def opt():
  return ml_collections.ConfigDict(dict(name="adamw", peak_lr=1e-2, schedule="constant", warmup_steps=0,
                                        total_steps=10, b1=0.9, b2=0.99, weight_decay=0.1, clip=1.0))


def test_masked_training_leaves_unselected_neurons_and_their_moments_untouched():
  cfg = model.Config(vocab_size=16, block_size=8, num_layers=1, num_heads=2, d_model=8)
  params = jax.tree.map(np.asarray, model.init_params(cfg, jax.random.key(0)))
  rng = np.random.default_rng(0)
  masks = jax.tree.map(lambda x: rng.random(x.shape) < 0.3, params)  # any entries
  tx = neurons.masked(train.make_optimizer(opt()))
  comp = jax.tree.map(lambda x: x[None], neurons.composite(params, masks))
  state = jax.tree.map(lambda x: x[0], train.init_state(cfg, tx, [0], comp))
  tokens = jnp.asarray(rng.integers(0, 16, (4, 6)), jnp.int32)
  batch = {"tokens": tokens, "loss_mask": jnp.ones((4, 5), jnp.float32)}
  step = jax.jit(lambda s, b: train.train_step(s, b, cfg=cfg, tx=tx))
  for _ in range(2):
    state, _ = step(state, batch)
  new = state["params"]["params"]
  changed = 0
  for p0, p1, m in zip(jax.tree.leaves(params), jax.tree.leaves(new), jax.tree.leaves(masks)):
    np.testing.assert_array_equal(np.asarray(p1)[~m], p0[~m])  # bit for bit off the mask
    changed += int((np.asarray(p1)[m] != p0[m]).sum())
  assert changed > 0.9 * neurons.count(masks)
  adam = state["opt_state"][1][0]  # chain(clip, adamw): adamw's scale_by_adam state
  for mu, nu, m in zip(jax.tree.leaves(adam.mu), jax.tree.leaves(adam.nu), jax.tree.leaves(masks)):
    assert not np.asarray(mu)[~m].any() and not np.asarray(nu)[~m].any()
    assert np.asarray(nu)[m].any() or not m.any()
  assert neurons.is_composite(state["params"])


def test_merges_take_the_same_masks():
  base = {"block_0": {"mlp": {"fc": {"kernel": np.zeros((2, 3), np.float32)}}}}
  e1 = {"block_0": {"mlp": {"fc": {"kernel": np.ones((2, 3), np.float32)}}}}
  e2 = {"block_0": {"mlp": {"fc": {"kernel": 2 * np.ones((2, 3), np.float32)}}}}
  m1 = {"block_0": {"mlp": {"fc": {"kernel": np.array([True, False, False])}}}}  # output unit 0
  m2 = {"block_0": {"mlp": {"fc": {"kernel": np.array([False, False, True])}}}}  # output unit 2
  ta = merge.task_arithmetic(base, [e1, e2], masks=[m1, m2])
  np.testing.assert_array_equal(ta["block_0"]["mlp"]["fc"]["kernel"], [[1, 0, 2], [1, 0, 2]])
  ties = merge.ties(base, [e1, e2], density=1.0, masks=[m1, m2])
  np.testing.assert_array_equal(ties["block_0"]["mlp"]["fc"]["kernel"], [[1, 0, 2], [1, 0, 2]])
  dare = merge.dare(base, [e1, e2], drop=0.0, masks=m1)
  np.testing.assert_array_equal(dare["block_0"]["mlp"]["fc"]["kernel"], [[3, 0, 0], [3, 0, 0]])
  with pytest.raises(ValueError, match="fits neither"):
    merge.task_arithmetic(base, [e1], masks={"block_0": {"mlp": {"fc": {"kernel": np.ones(4, bool)}}}})


def test_maet_with_given_neurons_equals_maet_locating_them():
  rng = np.random.default_rng(0)
  shapes = {"kernel": (2, 3), "bias": (3,)}
  tree = lambda: {"block_0": {"mlp": {"fc": {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}}}}
  base, ability, source, target = tree(), tree(), tree(), tree()
  want = merge.maet(base, ability, source, [target], key_ratio=0.5)
  got = merge.maet(base, ability, source, [target], key_ratio=0.5,
                   ability_neurons=neurons.locate(ability, base, 0.5),
                   source_neurons=neurons.locate(source, base, 0.5))
  for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(x, y)
