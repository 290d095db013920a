import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from xlt import model
from xlt import partition as P
from xlt import train as train_lib

CFG = model.Config(vocab_size=16, block_size=8, num_layers=4, num_heads=2, d_model=8)
PARAMS = model.init_params(CFG, jax.random.key(0))
STEPS = 6


def _opt(**kw):
  # clip small enough that clipping is active, so "clip over which gradients" is tested.
  return ml_collections.ConfigDict(dict(name="adamw", schedule="cosine", peak_lr=1e-2, warmup_steps=2,
                                        total_steps=20, b1=0.9, b2=0.95, weight_decay=0.1, clip=0.05) | kw)


def _batch(i, member=0):
  rng = np.random.default_rng(100 * member + i)
  return {"tokens": rng.integers(0, 16, (4, 8)).astype(np.int32), "loss_mask": np.ones((4, 7), np.float32)}


GRAD = jax.jit(lambda p, b: train_lib._mean(*train_lib._grad_sums(CFG, p, b, 1))[1])


_JITTED = {}  # one compiled update per optimizer object (tests share the slow compiles)


def _update(tx):
  return _JITTED.setdefault(id(tx), (tx, jax.jit(lambda g, s, p, kw: tx.update(g, s, p, **kw))))[1]


def _run(tx, params=PARAMS, steps=STEPS, flags=None):
  """[(params, opt_state)] after each step; `flags(i)` is passed as trainable=."""
  update = _update(tx)
  state, history = tx.init(params), []
  for i in range(steps):
    kw = {} if flags is None else {"trainable": flags(i)}
    updates, state = update(GRAD(params, _batch(i)), state, params, kw)
    params = optax.apply_updates(params, updates)
    history.append((params, state))
  return history


def _close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=rtol, atol=atol), a, b)


def _equal_where(a, b, keep):
  """Leaves where keep is True are bit-for-bit equal; returns how many were compared."""
  flags = jax.tree.leaves(keep)
  for k, x, y in zip(flags, jax.tree.leaves(a), jax.tree.leaves(b)):
    if k:
      assert np.array_equal(np.asarray(x), np.asarray(y))
  return sum(flags)


def _branch(state, name):
  """The inner optimizer state of one multi_transform branch (under conditionally_mask)."""
  part = next(s for s in state if isinstance(s, optax.transforms.PartitionState))
  return part.inner_states[name].inner_state.inner_state


A = P.labels(PARAMS, P.preset_rules("A", 4, 1, 1))
C = P.labels(PARAMS, P.preset_rules("C", 4, 1, 1))
CELLS, NAMES = P.refine([A, C])
GATED = P.gated_optimizer(_opt(), CELLS, NAMES)


@functools.cache
def _history(recipe: str, k: int = 1):
  """The trajectory of a reference recipe, shared by the tests that compare with it."""
  c = _opt()
  tx = {"adamw": lambda: train_lib.make_optimizer(c), "freeze": lambda: P.frozen_optimizer(c, A, "task"),
        "alternating": lambda: P.alternating(c, A, ("task", "language"), k)}[recipe]()
  return _run(tx)


# ---------------------------------------------------------------- declaration

@pytest.mark.parametrize("spec, blocks", [
    ("all", {0, 1, 2, 3}), ("none", set()), ("bottom:2", {0, 1}), ("top:1", {3}),
    ("bottom:1+top:2", {0, 2, 3}), ("0-1,3", {0, 1, 3}), (" 2 ", {2}), ([0, 3], {0, 3}),
    ("bottom:0+top:0", set())])
def test_block_specs(spec, blocks):
  assert P.parse_blocks(spec, 4) == blocks


@pytest.mark.parametrize("spec, message", [
    ("bottom:3+top:2", "bottom \\+ top = 5 > 4"), ("top:5", "more than 4"), ("4", "out of range"),
    ([0, 7], "out of range"), ("middle", "malformed"), ("", "malformed"), ("2-1", "backwards"),
    (3, "malformed")])
def test_bad_block_specs(spec, message):
  with pytest.raises(ValueError, match=message):
    P.parse_blocks(spec, 4)


def test_preset_A_puts_norms_with_their_sublayer():
  for i in range(4):
    b = A[f"block_{i}"]
    assert set(jax.tree.leaves(b["attn"])) == set(jax.tree.leaves(b["ln_1"])) == {"language"}
    end = "language" if i in (0, 3) else "task"
    assert set(jax.tree.leaves(b["mlp"])) == set(jax.tree.leaves(b["ln_2"])) == {end}
  assert A["wte"]["embedding"] == A["wpe"] == A["lm_head"]["kernel"] == A["ln_f"]["scale"] == "language"


def test_preset_C_and_inverses():
  for i in range(4):
    assert set(jax.tree.leaves(C[f"block_{i}"])) == {"language" if i in (0, 3) else "task"}
  swap = {"language": "task", "task": "language"}
  for name, plain in (("A_inv", A), ("C_inv", C)):
    inv = P.labels(PARAMS, P.preset_rules(name, 4, 1, 1))
    for (path, l), l_inv in zip(jax.tree_util.tree_flatten_with_path(plain)[0], jax.tree.leaves(inv)):
      block, _ = model.path_info(path)
      # blocks exchange labels; embeddings and head follow the arguments, not the inversion
      assert l_inv == (l if block is None else swap[l]), P.path_str(path)
  inv = P.labels(PARAMS, P.preset_rules("C_inv", 4, 1, 1, embeddings="task", head="task"))
  assert inv["wte"]["embedding"] == inv["lm_head"]["kernel"] == "task"


def test_rules_first_match_wins_and_non_block_params_need_their_kind():
  rules = [{"label": "x", "blocks": "bottom:1", "kinds": "all"},
           {"label": "y", "blocks": "all", "kinds": ("mlp", "head")}]
  lt = P.labels(PARAMS, rules, rest="z")
  assert set(jax.tree.leaves(lt["block_0"])) == {"x"}  # rule 0 came first
  assert set(jax.tree.leaves(lt["block_1"]["mlp"])) == {"y"}
  assert set(jax.tree.leaves(lt["block_1"]["attn"])) == {"z"}
  assert lt["lm_head"]["kernel"] == "y" and lt["wte"]["embedding"] == "z"  # "all" is block kinds only
  # a rule naming a non-block kind matches it whatever its block spec
  assert P.labels(PARAMS, [{"label": "e", "blocks": "none", "kinds": "embedding"}], rest="r")["wpe"] == "e"


def test_labels_on_shapes_and_names_filter():
  shapes = jax.eval_shape(lambda: PARAMS)
  assert P.labels(shapes, P.preset_rules("A", 4, 1, 1)) == A
  ensemble = jax.eval_shape(lambda: jax.tree.map(lambda x: jnp.stack([x, x, x]), PARAMS))
  assert P.labels(ensemble, P.preset_rules("A", 4, 1, 1)) == A  # labels are per leaf, whatever E
  with pytest.raises(ValueError, match="bottom \\+ top = 5 > 4"):
    P.preset_rules("C", 4, 3, 2)
  lt = P.labels(shapes, [{"label": "q", "kinds": "attn", "names": ["qkv"]}], rest="r")
  assert lt["block_2"]["attn"]["qkv"]["kernel"] == "q" and lt["block_2"]["attn"]["proj"]["bias"] == "r"


@pytest.mark.parametrize("rules, rest, message", [
    ([{"label": "a", "kinds": ("attn", "ffn")}], "r", "unknown kinds \\['ffn'\\]; known: \\['embedding'"),
    ([{"label": "a", "blocks": "0-4"}], "r", "block 4 out of range"),
    ([{"label": "a", "blocks": "bottom:3+top:3"}], "r", "bottom \\+ top = 6 > 4"),
    ([{"label": "a", "blocks": "bottom3"}], "r", "malformed"),
    ([{"label": "a", "blocks": "0-1"}, {"label": "b", "kinds": "head"}], None, "block_2/attn/proj/bias"),
    ([{"label": "", "blocks": "all"}], "r", "non-empty"),
    ([{"label": "a"}], "", "non-empty"),
    ([{"label": "a", "block": "all"}], "r", "keys must be"),
    ([{"label": "a", "names": ["ln1"]}], "r", "occur in no parameter path"),
])
def test_declaration_errors(rules, rest, message):
  with pytest.raises(ValueError, match=message):
    P.labels(PARAMS, rules, rest)


def test_unassigned_parameter_is_named():
  with pytest.raises(ValueError, match="parameter block_2/attn/proj/bias .* matches no rule"):
    P.labels(PARAMS, [{"label": "a", "blocks": "0-1"}, {"label": "b", "kinds": ("embedding", "head")}])


def test_from_config_and_summary():
  pc = ml_collections.ConfigDict(dict(preset="A", bottom=1, top=1, embeddings="language", head="language",
                                      rules=(), rest=None))
  assert P.from_config(pc, PARAMS) == A
  rules = ({"label": "language", "blocks": "bottom:1+top:1", "kinds": "all"},
           {"label": "language", "kinds": "embedding,head"})
  assert P.from_config({"rules": rules, "rest": "task"}, PARAMS) == C
  with pytest.raises(ValueError, match="exactly one of preset or rules"):
    P.from_config({"preset": "A", "bottom": 1, "top": 1, "rules": rules}, PARAMS)
  with pytest.raises(ValueError, match="unknown partition preset 'B'"):
    P.from_config({"preset": "B", "bottom": 1, "top": 1}, PARAMS)
  with pytest.raises(ValueError, match="needs bottom and top"):
    P.from_config({"preset": "C"}, PARAMS)
  table = P.summary(C, PARAMS)
  assert "block_3" in table and f"{model.count_params(PARAMS):,}" in table and "share" in table
  lang = sum(x.size for x, l in zip(jax.tree.leaves(PARAMS), jax.tree.leaves(C)) if l == "language")
  assert f"{lang:,}" in table.splitlines()[-2]


def test_mask():
  m = P.mask(A, "task")
  assert m["block_1"]["mlp"]["fc"]["kernel"] and not m["block_1"]["attn"]["qkv"]["kernel"]
  assert all(jax.tree.leaves(P.mask(A, {"task", "language"})))
  with pytest.raises(ValueError, match="not in the label tree"):
    P.mask(A, "math")


# ---------------------------------------------------------------- freezing

def _paths(tree):
  return [P.path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _sub(tree, keep):
  """{path: leaf} of the leaves where `keep` is True: a partition as a tree of its own."""
  return {p: x for p, x, k in zip(_paths(tree), jax.tree.leaves(tree), jax.tree.leaves(keep)) if k}


def test_freeze_leaves_frozen_bit_for_bit_and_clips_over_the_trainable_only():
  c = _opt()
  history = _history("freeze")
  frozen, trainable = P.mask(A, "language"), P.mask(A, "task")
  for params, _ in history:
    assert _equal_where(params, PARAMS, frozen) > 0
  # the trainable branch holds state for the trainable leaves only (MaskedNode elsewhere)
  mu = history[-1][1].inner_states["trainable"].inner_state[1][0].mu
  assert set(_paths(mu)) == set(_sub(PARAMS, trainable))
  # reference: make_optimizer on the trainable parameters alone (so the clip sees only them)
  ref_tx, ref = train_lib.make_optimizer(c), _sub(PARAMS, trainable)
  ref_state, params, ref_update = ref_tx.init(ref), PARAMS, jax.jit(ref_tx.update)
  for i in range(STEPS):
    g = _sub(GRAD(params, _batch(i)), trainable)
    assert float(optax.tree.norm(g)) > c.clip  # the clip acts
    u, ref_state = ref_update(g, ref_state, ref)
    ref = optax.apply_updates(ref, u)
    params = history[i][0]
    _close(_sub(params, trainable), ref)


# ---------------------------------------------------------------- alternating

def test_active_label():
  turns = [P.active_label(i, ("task", "language"), 2) for i in range(6)]
  assert turns == ["task", "task", "language", "language", "task", "task"]
  assert [P.active_label(i, ("t", "t", "l")) for i in range(4)] == ["t", "t", "l", "t"]
  with pytest.raises(ValueError):
    P.active_label(0, (), 1)


def _two_optimizer_reference(c, label_tree, order, k, steps=STEPS):
  """Per label its own clip + AdamW on its parameters alone, stepped only on its turns,
  with the learning rate set to the schedule at the global step."""
  sched = train_lib.make_schedule(c)
  keep = {l: P.mask(label_tree, l) for l in set(order)}
  adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))  # a callable mask is no schedule
  txs = {l: optax.chain(optax.clip_by_global_norm(c.clip), adamw(
      learning_rate=0.0, b1=c.b1, b2=c.b2, weight_decay=c.weight_decay, mask=P._decay_mask)) for l in keep}
  subs = {l: _sub(PARAMS, keep[l]) for l in keep}
  states = {l: txs[l].init(subs[l]) for l in keep}
  updates = {l: jax.jit(txs[l].update) for l in keep}
  params, out = PARAMS, []
  for i in range(steps):
    l = P.active_label(i, order, k)
    states[l][1].hyperparams["learning_rate"] = jnp.asarray(sched(i))
    u, states[l] = updates[l](_sub(GRAD(params, _batch(i)), keep[l]), states[l], subs[l])
    subs[l] = optax.apply_updates(subs[l], u)
    flat = {**subs["task"], **subs["language"]}
    params = jax.tree_util.tree_map_with_path(lambda p, _: flat[P.path_str(p)], PARAMS)
    out.append(params)
  return out


@pytest.mark.parametrize("k", [1, 2])
def test_alternating_rests_bit_for_bit_and_matches_two_optimizers(k):
  c, order = _opt(), ("task", "language")
  history = _history("alternating", k)
  reference = _two_optimizer_reference(c, A, order, k)
  for i, (params, state) in enumerate(history):
    _close(params, reference[i])
    resting = next(l for l in order if l != P.active_label(i, order, k))
    prev_params, prev_state = history[i - 1] if i else (PARAMS, None)
    assert _equal_where(params, prev_params, P.mask(A, resting)) > 0
    if prev_state is not None:  # moments and count frozen in time
      jax.tree.map(np.testing.assert_array_equal, _branch(state, resting), _branch(prev_state, resting))
    active = P.active_label(i, order, k)
    count = _branch(state, active)[1][0].count
    assert int(count) == sum(P.active_label(j, order, k) == active for j in range(i + 1))


def test_alternating_with_one_label_is_make_optimizer():
  c = _opt()
  one = P.labels(PARAMS, [], rest="all")
  got, want = _run(P.alternating(c, one, ("all",)))[-1][0], _history("adamw")[-1][0]
  _close(got, want)
  with pytest.raises(ValueError, match="differ"):
    P.alternating(c, A, ("task",))


# ---------------------------------------------------------------- gated cells


def test_refine_and_cells_of():
  assert NAMES == ("language|language", "language|task", "task|task")  # A's task is inside C's
  assert CELLS["block_1"]["attn"]["qkv"]["kernel"] == "language|task"
  assert CELLS["block_1"]["mlp"]["fc"]["kernel"] == "task|task"
  np.testing.assert_array_equal(P.cells_of(0, "task", NAMES), [False, False, True])
  np.testing.assert_array_equal(P.cells_of(1, "task", NAMES), [False, True, True])
  with pytest.raises(ValueError, match="no cell has label 'math'"):
    P.cells_of(0, "math", NAMES)


@pytest.mark.parametrize("one_cell", [True, False])
def test_gated_all_on_is_make_optimizer(one_cell):
  cells, names = P.refine([P.labels(PARAMS, [], rest="all")]) if one_cell else (CELLS, NAMES)
  tx = P.gated_optimizer(_opt(), cells, names) if one_cell else GATED
  got = _run(tx, flags=lambda i: np.ones(len(names), bool))[-1][0]
  _close(got, _history("adamw")[-1][0])


def test_gated_fixed_flags_is_freeze_and_frozen_cells_keep_their_moments():
  tx = GATED
  got = _run(tx, flags=lambda i: P.cells_of(0, "task", NAMES))
  _close(got[-1][0], _history("freeze")[-1][0])
  assert _equal_where(got[-1][0], PARAMS, P.mask(A, "language")) > 0
  # all on for 3 steps, then only C's language cells: the others keep step 2's moments and count
  flip = _run(tx, flags=lambda i: np.ones(len(NAMES), bool) if i < 3 else P.cells_of(1, "language", NAMES))
  for name in ("language|task", "task|task"):
    for _, state in flip[3:]:
      jax.tree.map(np.testing.assert_array_equal, _branch(state, name), _branch(flip[2][1], name))
  assert _equal_where(flip[-1][0], flip[2][0], P.mask(C, "task")) > 0
  with pytest.raises(ValueError, match="needs trainable=bool\\[3\\]"):
    tx.update(PARAMS, tx.init(PARAMS), PARAMS)


def test_gated_flags_following_the_turns_are_alternating():
  order, k = ("task", "language"), 2
  got = _run(GATED, flags=lambda i: P.cells_of(0, P.active_label(i, order, k), NAMES))
  _close(got[-1][0], _history("alternating", k)[-1][0])


def test_gated_under_vmap_members_follow_their_own_recipes():
  tx = GATED
  # full fine-tuning, A's task partition, C's language partition: three recipes, one step
  flags = np.stack([np.ones(len(NAMES), bool), P.cells_of(0, "task", NAMES),
                    P.cells_of(1, "language", NAMES)])
  stack = lambda trees: jax.tree.map(lambda *x: jnp.stack(x), *trees)
  params = stack([PARAMS, jax.tree.map(lambda x: 0.9 * x, PARAMS), jax.tree.map(lambda x: 1.1 * x, PARAMS)])
  state = jax.vmap(tx.init)(params)
  step = jax.jit(jax.vmap(lambda g, s, p, t: tx.update(g, s, p, trainable=t)))
  member, start = lambda t, m: jax.tree.map(lambda x: x[m], t), params
  for i in range(4):
    grads = stack([GRAD(member(params, m), _batch(i, m)) for m in range(3)])
    updates, state = step(grads, state, params, flags)
    params = optax.apply_updates(params, updates)
  for m in range(3):
    alone = member(start, m)
    s = tx.init(alone)
    for i in range(4):
      u, s = _update(tx)(GRAD(alone, _batch(i, m)), s, alone, {"trainable": flags[m]})
      alone = optax.apply_updates(alone, u)
    _close(member(params, m), alone)
    frozen = jax.tree.map(lambda cell: not flags[m][NAMES.index(cell)], CELLS)
    compared = _equal_where(member(params, m), member(start, m), frozen)
    assert compared == (0 if m == 0 else sum(jax.tree.leaves(frozen)))
    for i, name in enumerate(NAMES):  # a frozen cell's moments and count stay at their start
      if not flags[m][i]:
        jax.tree.map(np.testing.assert_array_equal, _branch(member(state, m), name),
                     _branch(tx.init(alone), name))


# ---------------------------------------------------------------- revert and combine

def test_revert_and_combine():
  trained = _history("adamw")[1][0]
  out = P.revert(trained, PARAMS, A, "task")
  for x, t, b, l in zip(*map(jax.tree.leaves, (out, trained, PARAMS, A))):
    assert np.array_equal(x, b if l == "task" else t)
  mixed = P.combine({"task": PARAMS, "language": trained}, A)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), mixed, out)
  bad = jax.tree.map(lambda x: x, PARAMS)
  bad["block_1"]["mlp"]["fc"]["kernel"] = jnp.zeros((8, 16))
  with pytest.raises(ValueError, match="block_1/mlp/fc/kernel: params has \\(8, 32\\)"):
    P.revert(trained, bad, A, "task")
  del bad["block_1"]["mlp"]
  with pytest.raises(ValueError, match="different structures.*block_1/mlp/fc/bias"):
    P.combine({"task": bad, "language": trained}, A)
  with pytest.raises(ValueError, match="must be exactly the labels"):
    P.combine({"task": PARAMS}, A)
