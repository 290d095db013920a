import jax
import numpy as np
import pytest

from xlt import ensemble, loop, model, sharding
from xlt import train as train_lib
from xlt.data import common
from xlt.experiments import synthetic


def _members(c, seeds=(0, 1)):
  task = synthetic.get_task(c)
  enc = common.encode_examples(task.train[c.mixture.source], task.tokenizer, task.seq_len)
  cfg = synthetic.model_config(c, task)
  arrays = {"tokens": enc.tokens, "loss_mask": enc.loss_mask}
  return cfg, [loop.Member(f"m{s}", s, arrays) for s in seeds]


def _assert_trees_close(a, b, **tol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def test_training_lowers_the_loss(graph_config, tmp_path):
  c = graph_config
  c.train.steps = 60
  cfg, members = _members(c, seeds=(0,))
  batch = {k: v[None, :64] for k, v in members[0].train.items()}
  before = train_lib.eval_loss(cfg, jax.vmap(lambda s: model.init_params(cfg, jax.random.key(s)))(np.array([0])), batch)
  out = loop.train_ensemble(c, cfg, members, None, str(tmp_path), progress=False)
  after = train_lib.eval_loss(cfg, out["state"]["params"], batch)
  assert float(after[0]) < 0.8 * float(before[0])
  assert out["finished"] and out["step"] == 60


@pytest.mark.parametrize("strategy", ["vmap", "map"])
def test_ensemble_matches_separate_runs(graph_config, tmp_path, strategy):
  graph_config.train.ensemble = strategy
  seeds = (0, 1)
  cfg, members = _members(graph_config, seeds)
  together = loop.train_ensemble(graph_config, cfg, members, None, str(tmp_path / "both"), progress=False)
  graph_config.train.ensemble = "auto"  # one member alone: the default
  for i, m in enumerate(members):
    alone = loop.train_ensemble(graph_config, cfg, [m], None, str(tmp_path / m.name), progress=False)
    _assert_trees_close(jax.tree.map(lambda x: x[i], together["state"]["params"]),
                        jax.tree.map(lambda x: x[0], alone["state"]["params"]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mesh_spec", [{"data": 8}, {"data": 2, "fsdp": 2, "tensor": 2}, {"fsdp": 4, "tensor": 2}])
def test_sharded_step_equals_single_device(graph_config, mesh_spec):
  assert jax.device_count() == 8, "tests/conftest.py sets 8 fake CPU devices"
  c = graph_config
  cfg, members = _members(c)
  tx = train_lib.make_optimizer(c.opt)
  seeds = [m.seed for m in members]
  abstract = jax.eval_shape(lambda: train_lib.init_state(cfg, tx, seeds))
  batch = {k: np.stack([m.train[k][:16] for m in members]) for k in ("tokens", "loss_mask")}
  results = []
  for mesh in (sharding.make_mesh({"data": 1}, jax.devices()[:1]), sharding.make_mesh(mesh_spec)):
    step, st_sh, _ = train_lib.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract)
    with jax.set_mesh(mesh):
      state = jax.jit(lambda: train_lib.init_state(cfg, tx, seeds), out_shardings=st_sh)()
      for _ in range(3):
        state, metrics = step(state, batch)
    results.append((jax.device_get(state["params"]), np.asarray(metrics["loss"]), state))
  (p1, l1, _), (p8, l8, s8) = results
  np.testing.assert_allclose(l1, l8, rtol=1e-5)
  _assert_trees_close(p1, p8, rtol=1e-4, atol=1e-5)
  # and the parameters really are spread over the mesh
  kernel = s8["params"]["block_0"]["mlp"]["fc"]["kernel"]
  assert len(kernel.sharding.device_set) == 8


def test_ensemble_strategy_per_platform():
  assert ensemble.resolve("auto", "cpu") == "map" and ensemble.resolve("auto", "gpu") == "vmap"
  assert ensemble.resolve("vmap", "cpu") == "vmap"
  with pytest.raises(ValueError, match="ensemble strategy 'pmap'"):
    ensemble.resolve("pmap")
  with pytest.raises(ValueError, match="ensemble strategy 'devices'"):  # removed: it did not pay
    ensemble.resolve("devices", "cpu")
  f = lambda x, y: (x * y).sum()
  x = np.arange(20.0).reshape(5, 4)
  for s in ("vmap", "map"):
    np.testing.assert_array_equal(ensemble.over_members(f, s)(x, x), (x * x).sum(1))


def test_kill_and_resume_equals_uninterrupted(graph_config, tmp_path):
  c = graph_config
  cfg, members = _members(c)
  full = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "full"), progress=False)
  part = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "resumed"), stop_after=7, progress=False)
  assert not part["finished"] and part["step"] == 7
  resumed = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "resumed"), progress=False)
  assert resumed["finished"] and resumed["step"] == c.train.steps
  for x, y in zip(jax.tree.leaves(full["state"]), jax.tree.leaves(resumed["state"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_dropout_changes_training_and_resumes_exactly(graph_config, tmp_path):
  c = graph_config
  c.model.dropout = 0.2
  cfg, members = _members(c)
  full = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "full"), progress=False)
  loop.train_ensemble(c, cfg, members, None, str(tmp_path / "resumed"), stop_after=7, progress=False)
  resumed = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "resumed"), progress=False)
  for x, y in zip(jax.tree.leaves(full["state"]), jax.tree.leaves(resumed["state"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # the masks follow the step
  keys = np.asarray(full["state"]["dropout_key"])
  assert keys.shape == (2, 2) and not np.array_equal(keys[0], keys[1])  # each member its own masks
  c.model.dropout = 0.0
  cfg0, _ = _members(c)
  plain = loop.train_ensemble(c, cfg0, members, None, str(tmp_path / "plain"), progress=False)
  assert "dropout_key" not in plain["state"]
  assert not np.allclose(plain["state"]["params"]["wte"]["embedding"], full["state"]["params"]["wte"]["embedding"])


def test_bad_configs_give_clear_errors(graph_config, tmp_path):
  c = graph_config
  c.mixture.target = "edge_klingon"
  with pytest.raises(ValueError, match="unknown graph language"):
    synthetic.get_task(c)
  c.mixture.target = "edge_plain"
  c.mixture.target_samples = 10**6
  with pytest.raises(ValueError, match="distinct shortest paths"):
    synthetic.get_task(c)
  with pytest.raises(ValueError, match="does not divide the 8 devices"):
    sharding.make_mesh({"data": 3, "fsdp": -1})
  with pytest.raises(ValueError, match="needs 4 devices"):
    sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 1})
  with pytest.raises(ValueError, match="not divisible by the data x fsdp"):
    sharding.check_batch(12, sharding.make_mesh({"data": 8}))
  c.task = "chess"
  with pytest.raises(ValueError, match="unknown task"):
    synthetic.get_task(c)


def test_stopped_members_freeze_drop_out_and_resume_exactly(graph_config, tmp_path):
  c = graph_config
  c.train.steps, c.train.eval_every, c.train.checkpoint_every, c.train.patience = 24, 4, 4, 3
  cfg, members = _members(c)
  # member 0 reaches the target score at the first evaluation; member 1 never improves
  # after its first score, so it stops after `patience` more evaluations.
  evaluate = lambda params, ids: [[1.0, 0.5][i] for i in ids]
  full = loop.train_ensemble(c, cfg, members, evaluate, str(tmp_path / "full"), progress=False)
  assert full["stopped_at"] == [4, 16] and full["finished"] and full["step"] == 16
  at4 = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "at4"), stop_after=4, progress=False)
  for x, y in zip(jax.tree.leaves(full["state"]["params"]), jax.tree.leaves(at4["state"]["params"])):
    np.testing.assert_array_equal(np.asarray(x)[0], np.asarray(y)[0])  # frozen since step 4
  assert np.asarray(full["state"]["step"]).tolist() == [4, 16]
  part = loop.train_ensemble(c, cfg, members, evaluate, str(tmp_path / "resumed"), stop_after=10, progress=False)
  assert not part["finished"]
  resumed = loop.train_ensemble(c, cfg, members, evaluate, str(tmp_path / "resumed"), progress=False)
  assert resumed["stopped_at"] == [4, 16]
  for x, y in zip(jax.tree.leaves(full["state"]), jax.tree.leaves(resumed["state"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_no_early_stop_before_min_steps(graph_config, tmp_path):
  c = graph_config
  c.train.steps, c.train.eval_every, c.train.patience, c.train.min_steps = 12, 2, 1, 8
  cfg, members = _members(c, seeds=(0,))
  out = loop.train_ensemble(c, cfg, members, lambda params, ids: [0.5] * len(ids), str(tmp_path), progress=False)
  assert out["stopped_at"] == [8]
