"""The static frozen step (xlt.train.static_freeze): a partition recipe with fixed flags trains
to the gated step's parameters and moments while differentiating only the trained leaves, and
the finetune kind takes it for a recipe of one phase trained alone."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from xlt import loop as loop_lib
from xlt import model, partition, sharding
from xlt import train as train_lib
from xlt.experiments import finetune
from xlt.param_paths import path_names

CFG = model.Config(vocab_size=16, block_size=8, num_layers=4, num_heads=2, d_model=8)
PARAMS = model.init_params(CFG, jax.random.key(0))
B, T, STEPS = 4, 8, 4
C = partition.labels(PARAMS, partition.preset_rules("C", 4, 1, 1))  # blocks 0, 3, embeddings, head: language
CELLS, NAMES = partition.refine([C])
FLAGS = partition.cells_of(0, "task", NAMES)  # the partial task expert [C]
FROZEN = partition.frozen_leaves(CELLS, NAMES, FLAGS)


def _opt():  # a clip small enough to act, so "clip over which gradients" is tested
  return ml_collections.ConfigDict(dict(name="adamw", schedule="cosine", peak_lr=1e-2, warmup_steps=2,
                                        total_steps=20, b1=0.9, b2=0.95, weight_decay=0.1, clip=0.05))


def _batch(i, gated):
  rng = np.random.default_rng(i)
  out = {"tokens": rng.integers(0, 16, (1, B, T)).astype(np.int32), "loss_mask": np.ones((1, B, T - 1), np.float32)}
  return out | ({"trainable": FLAGS[None]} if gated else {})


def _leaves(tree):
  return {path_names(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _moments(opt_state):
  """{("mu" or "nu", parameter path): moment} of every Adam moment in an optimizer state."""
  out = {}
  for p, x in _leaves(opt_state).items():
    i = next((k for k, n in enumerate(p) if n in ("mu", "nu")), None)
    if i is not None:
      out[(p[i], p[i + 1:])] = x
  return out


def _compiled_run(tx, gated: bool):
  """(states after each step, flops of the compiled ensemble step) of one member."""
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  stacked = jax.tree.map(lambda x: x[None], PARAMS)
  abstract = jax.eval_shape(lambda: train_lib.init_state(CFG, tx, [0], stacked))
  step, st_sh, _ = train_lib.make_step(CFG, tx, mesh, sharding.DEFAULT_RULES, abstract, gated=gated,
                                       strategy="vmap")
  with jax.set_mesh(mesh):
    state = jax.jit(lambda p: train_lib.init_state(CFG, tx, [0], p), out_shardings=st_sh)(stacked)
    compiled = step.lower(state, _batch(0, gated)).compile()
    history = []
    for i in range(STEPS):
      state, _ = compiled(state, _batch(i, gated))
      history.append(jax.tree.map(lambda x: np.asarray(x[0]), {"params": state["params"],
                                                                "opt_state": state["opt_state"]}))
  return history, compiled.cost_analysis()["flops"]


@pytest.fixture(scope="module")
def runs():
  gated = _compiled_run(partition.gated_optimizer(_opt(), CELLS, NAMES), gated=True)
  static = _compiled_run(train_lib.static_freeze(train_lib.make_optimizer(_opt()), FROZEN), gated=False)
  return gated, static


def test_static_step_trains_as_the_gated_step(runs):
  (gated, _), (static, _) = runs
  frozen, base = _leaves(FROZEN), _leaves(PARAMS)
  assert 0 < sum(frozen.values()) < len(frozen)
  for g, s in zip(gated, static):
    gp, sp = _leaves(g["params"]), _leaves(s["params"])
    for p, f in frozen.items():
      if f:  # frozen: untouched by both, bit for bit
        assert np.array_equal(sp[p], base[p]) and np.array_equal(gp[p], base[p]), p
      else:  # trained: the same values, bit for bit
        np.testing.assert_array_equal(sp[p], gp[p], err_msg=str(p))
    gm, sm = _moments(g["opt_state"]), _moments(s["opt_state"])
    # the static step keeps moments for the trained leaves only; the gated step's frozen
    # moments stay at their initial zeros
    assert set(sm) == {(m, p) for m in ("mu", "nu") for p, f in frozen.items() if not f}
    for key, x in gm.items():
      if frozen[key[1]]:
        assert not x.any(), key
      else:
        np.testing.assert_array_equal(sm[key], x, err_msg=str(key))
  # and the trained leaves moved
  assert any(not np.array_equal(_leaves(static[-1]["params"])[p], base[p]) for p, f in frozen.items() if not f)


def test_static_step_forms_no_frozen_weight_gradient(runs):
  """The compiled static step saves at least the frozen kernels' weight-gradient products
  (2 B T flops per kernel entry); it saves more, since no gradient flows below the lowest
  trained block."""
  (_, gated_flops), (_, static_flops) = runs
  saved = sum(2 * B * (T - 1) * x.size for p, x in _leaves(PARAMS).items() if p[-1] == "kernel" and _leaves(FROZEN)[p])
  assert gated_flops - static_flops >= saved > 0, (gated_flops, static_flops, saved)


def test_static_freeze_as_a_transformation_is_freeze():
  """Called as any optax transformation (full trees in and out), static_freeze is
  partition.freeze: zero updates and no state for the frozen leaves."""
  grads = jax.tree.map(lambda x: jnp.full_like(x, 0.5), PARAMS)
  tx = train_lib.static_freeze(train_lib.make_optimizer(_opt()), FROZEN)
  ref = partition.frozen_optimizer(_opt(), C, "task")
  got, _ = tx.update(grads, tx.init(PARAMS), PARAMS)
  want, _ = ref.update(grads, ref.init(PARAMS), PARAMS)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  n_state = lambda s: sum(x.size for x in jax.tree.leaves(s))
  assert n_state(tx.init(PARAMS)) == n_state(ref.init(PARAMS))
  with pytest.raises(ValueError, match="one flag per cell"):
    partition.frozen_leaves(CELLS, NAMES, FLAGS[:1])


def test_a_static_run_checkpoints_and_resumes(tmp_path):
  """Through the loop: the optimizer state (None at the frozen leaves) checkpoints, and a run
  stopped after 2 steps and started again ends where an uninterrupted one does."""
  c = ml_collections.ConfigDict({"train": {"steps": 4, "batch_size": 4, "eval_every": 2, "checkpoint_every": 1,
                                           "log_every": 1, "patience": 5, "min_delta": 0.0, "target_score": 1e9},
                                 "opt": _opt().to_dict(), "mesh": {"data": 1, "devices": 1}})
  rng = np.random.default_rng(0)
  data = {"tokens": rng.integers(0, 16, (32, T)).astype(np.int32), "loss_mask": np.ones((32, T - 1), np.float32)}
  tx = train_lib.static_freeze(train_lib.make_optimizer(c.opt), FROZEN)
  kw = dict(tx=tx, init_params=jax.tree.map(lambda x: np.asarray(x)[None], PARAMS), progress=False)
  run = lambda d, **more: loop_lib.train_ensemble(c, CFG, [loop_lib.Member("m", 1, (data,))],
                                                  lambda p, ids: [0.0] * len(ids), str(tmp_path / d), **kw, **more)
  run("resumed", stop_after=2)
  resumed, whole = run("resumed")["state"], run("whole")["state"]
  assert jax.tree.structure(resumed) == jax.tree.structure(whole)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), resumed, whole)
  frozen, base = _leaves(FROZEN), _leaves(PARAMS)
  assert all(np.array_equal(x[0], base[p]) for p, x in _leaves(whole["params"]).items() if frozen[p])


def _prep(recipes):
  return finetune.Prep(CFG, PARAMS, None, {"task": _Data(), "language": _Data()}, recipes, {"C": C}, CELLS, NAMES, {})


class _Data:
  train = {"tokens": np.zeros((8, T), np.int32), "loss_mask": np.ones((8, T - 1), np.float32)}
  val = train


def test_finetune_takes_the_static_step_for_a_recipe_alone():
  c = ml_collections.ConfigDict({"partition": {"presets": ("C",), "rules": {}}, "seed": 0, "opt": _opt(),
                                 "train": {"steps": 1}, "mesh": {"data": 1}, "eval": {"batch_size": 2}})
  c.opt.state_dtype = ""
  full = finetune.Recipe("task expert", (("task", None),), ("task",))
  partial = finetune.Recipe("partial task expert [C]", (("task", ("C", "task")),), ("task",))
  alternating = finetune.Recipe("simultaneous [C] k=1", (("task", ("C", "task")), ("language", ("C", "language"))),
                                finetune.DATASETS)
  prep = _prep([full, partial, alternating])
  assert _leaves(finetune.static_frozen(c, prep, [partial])) == _leaves(FROZEN)
  assert not any(jax.tree.leaves(finetune.static_frozen(c, prep, [full])))
  assert finetune.static_frozen(c, prep, [alternating]) is None  # flags change over time
  assert finetune.static_frozen(c, prep, [full, partial]) is None  # c.together: mixed recipes
  stage = finetune._weights_stage(c, prep, [partial], "finetune_partial")
  assert stage.info["step"] == "static" and isinstance(stage.tx, train_lib.StaticFreeze)
  assert stage.members[0].trainable is None  # no flags in its batches: no gated step
  together = finetune._weights_stage(c, prep, [full, partial], "finetune")
  assert together.info["step"] == "gated" and together.members[1].trainable == (tuple(FLAGS.tolist()),)
