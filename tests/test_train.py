import jax
import ml_collections
import numpy as np
import pytest

from conftest import small_graph_config
from xlt import ensemble, lora, loop, model, param_paths, partition, sharding
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
  # one checkpoint, at the end: this test reads none, and fifteen saves were a quarter of its time
  c.train.steps, c.train.checkpoint_every = 60, 60
  cfg, members = _members(c, seeds=(0,))
  batch = {k: v[None, :64] for k, v in members[0].train.items()}
  before = train_lib.eval_loss(cfg, jax.vmap(lambda s: model.init_params(cfg, jax.random.key(s)))(np.array([0])), batch)
  out = loop.train_ensemble(c, cfg, members, None, str(tmp_path), progress=False)
  after = train_lib.eval_loss(cfg, out["state"]["params"], batch)
  assert float(after[0]) < 0.8 * float(before[0])
  assert out["finished"] and out["step"] == 60


@pytest.fixture(scope="module")
def separate_runs(tmp_path_factory):
  """The final parameters of each of `_members`' two members trained alone (one member: the
  default strategy), the reference of both strategies' ensembles: trained once for the module."""
  c = small_graph_config()
  c.train.ensemble, c.train.checkpoint_every = "auto", c.train.steps  # one save: none is read
  cfg, members = _members(c, (0, 1))
  return [jax.device_get(loop.train_ensemble(c, cfg, [m], None, str(tmp_path_factory.mktemp(m.name)),
                                             progress=False)["state"]["params"]) for m in members]


@pytest.mark.parametrize("strategy", ["vmap", "map"])
def test_ensemble_matches_separate_runs(graph_config, tmp_path, strategy, separate_runs):
  graph_config.train.ensemble, graph_config.train.checkpoint_every = strategy, graph_config.train.steps
  cfg, members = _members(graph_config, (0, 1))
  together = loop.train_ensemble(graph_config, cfg, members, None, str(tmp_path / "both"), progress=False)
  for i, alone in enumerate(separate_runs):
    _assert_trees_close(jax.tree.map(lambda x: x[i], together["state"]["params"]),
                        jax.tree.map(lambda x: x[0], alone), rtol=1e-4, atol=1e-5)


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


# a Llama-shaped model (RMSNorm, SwiGLU, GQA, RoPE, untied head) small enough to compile in a second
LLAMA = model.Config(vocab_size=64, block_size=16, num_layers=2, num_heads=4, num_kv_heads=2, d_model=32,
                     norm="rmsnorm", mlp="swiglu", mlp_dim=48, bias=False, pos_embedding="rope")


def _llama_step(mode: str, seeds, update: str, mesh=None):
  """(jitted step, initial state, optimizer) of a full, LoRA, static (MLPs trained) or gated
  (partition flags) step on LLAMA under the map strategy, the optimizer's update as `update`."""
  opt = ml_collections.ConfigDict(dict(name="adamw", schedule="cosine", peak_lr=1e-2, warmup_steps=1, total_steps=20,
                                       b1=0.9, b2=0.95, weight_decay=0.1, clip=0.05))  # a clip that acts
  tx = train_lib.make_optimizer(opt)
  params = jax.vmap(lambda s: model.init_params(LLAMA, jax.random.key(s)))(np.asarray(seeds))
  if mode == "lora":
    params = {"base": params, "lora": jax.vmap(lambda p, s: lora.init(p, jax.random.key(s), rank=2, alpha=4.0))(
        params, np.asarray(seeds) + 7)}
  if mode == "static":
    frozen = jax.tree_util.tree_map_with_path(lambda p, _: "mlp" not in param_paths.path_str(p),
                                              jax.tree.map(lambda x: x[0], params))
    tx = train_lib.static_freeze(tx, frozen)
  if mode == "gated":
    cells, names = partition.refine([partition.labels(jax.tree.map(lambda x: x[0], params),
                                                      partition.preset_rules("C", 2, 0, 1))])
    tx = partition.gated_optimizer(opt, cells, names)
  mesh = mesh or sharding.make_mesh({"data": 1}, jax.devices()[:1])
  abstract = jax.eval_shape(lambda p: train_lib.init_state(LLAMA, tx, seeds, p), params)
  step, st_sh, _ = train_lib.make_step(LLAMA, tx, mesh, sharding.DEFAULT_RULES, abstract, gated=mode == "gated",
                                       strategy="map", update=update)
  with jax.set_mesh(mesh):
    state = jax.jit(lambda p: train_lib.init_state(LLAMA, tx, seeds, p), out_shardings=st_sh)(params)
  return step, state, tx


def _llama_batch(i: int, seeds, gated: bool):
  rng = np.random.default_rng(i)
  out = {"tokens": rng.integers(0, 64, (len(seeds), 4, 9)).astype(np.int32),
         "loss_mask": (rng.random((len(seeds), 4, 8)) > 0.3).astype(np.float32)}
  return out | ({"trainable": np.array([[i % 2 == 0, True]] * len(seeds))} if gated else {})


def _state_copies(step, state, batch, mesh) -> int:
  """Copies of parameter- or moment-shaped arrays in the compiled step's entry computation (not
  of a broadcast: with E > 1 the map's stacked gradients start as a copied broadcast of zeros)."""
  with jax.set_mesh(mesh):
    hlo = step.lower(state, batch).compile().as_text()
  shapes = {f"f32[{','.join(map(str, x.shape))}]" for x in jax.tree.leaves((state["params"], state["opt_state"]))
            if x.ndim > 2}
  entry = hlo[hlo.index("\nENTRY"):]
  return sum(" copy(" in line and "broadcast" not in line.split(" copy(")[1].split(")")[0]
             and line.split(" = ")[1].split("{")[0] in shapes for line in entry.splitlines())


@pytest.mark.parametrize("mode", ["full", "lora", "static"])
@pytest.mark.parametrize("seeds", [(0,), (0, 1)])
def test_vmapped_update_copies_no_state(mode, seeds):
  """With the update in the map XLA:CPU copies old moments and new parameters every step (if
  this stops, `train.ensemble_step` has no reason left to vmap it); vmapped, the state is
  updated in place."""
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  counts = {}
  for update in ("map", "auto"):
    step, state, _ = _llama_step(mode, seeds, update, mesh)
    counts[update] = _state_copies(step, state, _llama_batch(0, seeds, False), mesh)
  assert counts["map"] > 0 and counts["auto"] == 0, counts


@pytest.mark.parametrize("mode", ["full", "lora", "static", "gated"])
def test_update_where_it_runs_keeps_the_results(mode):
  """`update="auto"` against the update in the map (the default), three steps
  of two members on a 2-device data mesh: the vmapped update agrees to float rounding and leaves
  what it does not train bit for bit; a gated step keeps the update in the map (the same
  program, bit for bit)."""
  seeds, mesh = (0, 1), sharding.make_mesh({"data": 2}, jax.devices()[:2])
  runs = {}
  for update in ("map", "auto"):
    step, state, _ = _llama_step(mode, seeds, update, mesh)
    initial = jax.device_get(state["params"])
    with jax.set_mesh(mesh):
      for i in range(3):
        state, metrics = step(state, _llama_batch(i, seeds, mode == "gated"))
    runs[update] = jax.device_get((state, metrics))
  (old, old_m), (new, new_m) = runs["map"], runs["auto"]
  pairs = list(zip(jax.tree.leaves((old, old_m)), jax.tree.leaves((new, new_m))))
  if mode == "gated":
    for x, y in pairs:
      np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
  else:
    # atol: Adam divides by the root of the second moment, so a weight whose gradients are near
    # zero moves on rounding alone; a thousandth of the peak learning rate (1e-2) still fails a
    # wrong update by far
    for x, y in pairs:
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-5)
  flat = lambda tree: {param_paths.path_str(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  before, after = flat(initial), flat(new["params"])
  moved = {p for p in before if not np.array_equal(before[p], after[p])}
  if mode == "lora":  # only the adapters train; the base stays bit for bit
    assert moved and all(p.startswith("lora") for p in moved), sorted(moved)[:3]
  if mode == "static":  # only the MLPs train
    assert moved and all("mlp" in p for p in moved), sorted(moved)[:3]


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
