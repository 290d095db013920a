"""Partition recipes inside the ensemble trainer: members that freeze a partition or take
turns between two partitions on two datasets train in one vmapped step with plain members,
frozen leaves stay bit-for-bit, and a killed run resumes to the same parameters."""

import jax
import ml_collections
import numpy as np
import pytest

from configs import common as cc
from xlt import loop, model, partition
from xlt.data import arithmetic, common, pipeline


def _setup(tmp_path, steps=6):
  ac = ml_collections.ConfigDict(dict(min_digits=2, max_digits=2, seed=0, num_test=8, num_val=8))
  tok = common.WordTokenizer(arithmetic.symbols())
  enc = lambda parts: (lambda e: {"tokens": e.tokens, "loss_mask": e.loss_mask})(
      common.encode_examples(arithmetic.mixture(parts, ac), tok, arithmetic.max_length(2)))
  task, lang = enc([("add", "standard", 40)]), enc([("max", "letter", 40)])
  cfg = model.config_from(cc.model(num_layers=4, num_heads=2, d_model=16, block_size=16).to_dict(),
                          tok.vocab_size)
  c = ml_collections.ConfigDict()
  c.train = cc.train(batch_size=8, steps=steps, eval_every=1000, checkpoint_every=2, log_every=1000)
  c.opt = cc.opt(c.train, peak_lr=1e-2, warmup_steps=1, clip=0.5)
  c.mesh = cc.mesh(devices=1)
  base = model.init_params(cfg, jax.random.key(0))
  labels = partition.labels(base, partition.preset_rules("C", 4, 1, 1))
  cell_tree, cells = partition.refine([labels])
  flags = lambda label: tuple(bool(f) for f in partition.cells_of(0, label, cells))
  members = [
      loop.Member("full", 1, task),
      loop.Member("freeze_language", 2, task, trainable=(flags("task"),)),
      loop.Member("alternate_k2", 3, (task, lang), trainable=(flags("task"), flags("language")),
                  steps_per_phase=2),
  ]
  tx = partition.gated_optimizer(c.opt, cell_tree, cells)
  init = jax.tree.map(lambda x: np.stack([x] * len(members)), base)
  return c, cfg, members, tx, init, base, labels


def _leaves(tree, labels, label):
  return [x for x, l in zip(jax.tree.leaves(tree), jax.tree.leaves(labels)) if l == label]


def test_recipes_in_one_ensemble(tmp_path):
  c, cfg, members, tx, init, base, labels = _setup(tmp_path)
  out = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "run"), tx=tx, init_params=init,
                            progress=False)
  params = jax.device_get(out["state"]["params"])
  member = lambda i: jax.tree.map(lambda x: x[i], params)
  # freeze: the language partition is the base, bit for bit; the task partition moved
  for got, want in zip(_leaves(member(1), labels, "language"), _leaves(base, labels, "language")):
    np.testing.assert_array_equal(got, want)
  assert any(not np.array_equal(g, w) for g, w in
             zip(_leaves(member(1), labels, "task"), _leaves(base, labels, "task")))
  # ... and its Adam moments of the frozen cell never left zero
  for path, x in jax.tree_util.tree_flatten_with_path(out["state"]["opt_state"])[0]:
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    if "language" in names and names[-1] != "count" and x.ndim > 1:
      assert not np.any(np.asarray(x)[1]), names
  # the plain member in the gated ensemble trains as make_optimizer does, alone
  alone = loop.train_ensemble(c, cfg, members[:1], None, str(tmp_path / "alone"), progress=False,
                              init_params=jax.tree.map(lambda x: x[:1], init))
  # (two programs, so float rounding: on an AVX-512 machine one entry near zero, of weights
  # ~1e-2, differed by 1.03e-6 after the steps; atol 1e-5 is still 1000x below the weights)
  for x, y in zip(jax.tree.leaves(member(0)), jax.tree.leaves(alone["state"]["params"])):
    np.testing.assert_allclose(x, np.asarray(y)[0], rtol=1e-5, atol=1e-5)


def test_alternation_rests_a_partition_and_resumes_exactly(tmp_path):
  c, cfg, members, tx, init, base, labels = _setup(tmp_path, steps=6)
  kw = dict(tx=tx, init_params=init, progress=False)
  # k=2: steps 1-2 train task, 3-4 language, 5-6 task. Stopped after step 4 (a crash), the
  # language partition holds its last update; steps 5-6 must not touch it.
  first = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "a"), stop_after=4, **kw)
  assert not first["finished"]
  resumed = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "a"), **kw)
  straight = loop.train_ensemble(c, cfg, members, None, str(tmp_path / "b"), **kw)
  at4 = jax.tree.map(lambda x: np.asarray(x)[2], jax.device_get(first["state"]["params"]))
  end = jax.tree.map(lambda x: np.asarray(x)[2], jax.device_get(resumed["state"]["params"]))
  for got, want in zip(_leaves(end, labels, "language"), _leaves(at4, labels, "language")):
    np.testing.assert_array_equal(got, want)
  assert any(not np.array_equal(g, w) for g, w in zip(_leaves(end, labels, "task"), _leaves(at4, labels, "task")))
  for x, y in zip(jax.tree.leaves(resumed["state"]), jax.tree.leaves(straight["state"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_phased_stream_draws_each_dataset_in_turn():
  a = {"tokens": np.arange(40).reshape(20, 2)}
  b = {"tokens": 100 + np.arange(40).reshape(20, 2)}
  flags = [[True, False], [False, True]]
  ds = pipeline.phased_batches([a, b], flags, 4, seed=5, steps_per_phase=3)
  plain_a, plain_b = pipeline.member_batches(a, 4, 5), pipeline.member_batches(b, 4, 6)
  ia = ib = 0
  for i in range(14):
    got = ds[i]
    if (i // 3) % 2 == 0:
      np.testing.assert_array_equal(got["tokens"], plain_a[ia]["tokens"])
      ia += 1
      assert got["trainable"].tolist() == [True, False]
    else:
      np.testing.assert_array_equal(got["tokens"], plain_b[ib]["tokens"])
      ib += 1
      assert got["trainable"].tolist() == [False, True]
  with pytest.raises(ValueError, match="trainable flags"):
    pipeline.phased_batches([a, b], None, 4, seed=0)
  with pytest.raises(ValueError, match="one row of trainable flags per phase"):
    pipeline.phased_batches([a, b], [[True]], 4, seed=0)


def test_members_must_agree_on_cells():
  data = {"tokens": np.zeros((4, 3), np.int32), "loss_mask": np.zeros((4, 2), np.float32)}
  with pytest.raises(ValueError, match="disagree on the number of partition cells"):
    loop.member_streams([loop.Member("a", 0, data, trainable=((True,),)),
                         loop.Member("b", 1, data, trainable=((True, False),))], 2)
