"""The structure measure (xlt.structure): deltas per block, the swap zone's edge ratio, single-
block swaps, the language probe and similarity on hand-made cases, and the command on a tiny
finished testbed run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlt import layers, model, structure


def _tree(block0: float, block1: float, wte: float):
  """Two blocks (an attention and an MLP kernel each, 4 entries) and an embedding."""
  blk = lambda v: {"attn": {"qkv": {"kernel": np.full((2, 2), v)}}, "mlp": {"fc": {"kernel": np.full((2, 2), v)}}}
  return {"block_0": blk(block0), "block_1": blk(block1), "wte": {"embedding": np.full((2, 2), wte)}}


def test_delta_by_block_is_the_relative_norm_per_block_kind_and_non_block_parameter():
  base = _tree(1.0, 2.0, 1.0)
  expert = _tree(1.0, 3.0, 1.5)  # block 0 unchanged; block 1 moved by 1 per entry; wte by 0.5
  d = structure.delta_by_block(expert, base, 2)
  assert d["by_block"] == [0.0, 0.5]  # ||1|| / ||2|| over the same 8 entries
  assert d["by_kind"][1][:2] == [0.5, 0.5] and d["by_kind"][1][2] == 0.0  # attn, mlp; no norm
  assert d["non_block"] == {"wte/embedding": 0.5}
  assert d["sq_by_block"] == [0.0, 8.0] and d["size_by_block"] == [8, 8]


def test_edge_ratio_is_the_edges_share_of_the_change_over_their_share_of_parameters():
  assert structure.edge_ratio([4, 0, 0, 4], [1, 1, 1, 1], 1, 1) == 2.0  # all of it at the edges, half the params
  assert structure.edge_ratio([1, 1, 1, 1], [1, 1, 1, 1], 1, 1) == 1.0
  assert structure.edge_ratio([0, 2, 2, 0], [1, 1, 1, 1], 1, 1) == 0.0
  assert structure.edge_ratio([3, 1, 0, 0], [1, 1, 1, 1], 1, 0) == 3.0  # no top zone: 3/4 of it in 1/4
  assert [structure.zone(n) for n in (6, 12, 24, 32)] == [(1, 1), (2, 1), (4, 2), (5, 2)]


def test_swap_block_takes_one_block_from_the_language_expert():
  task, lang = _tree(1.0, 2.0, 3.0), _tree(10.0, 20.0, 30.0)
  swapped = structure.swap_block(task, lang, 1)
  assert swapped["block_0"]["attn"]["qkv"]["kernel"][0, 0] == 1.0
  assert swapped["block_1"]["mlp"]["fc"]["kernel"][0, 0] == 20.0
  assert swapped["wte"]["embedding"][0, 0] == 3.0


def test_probe_reads_a_linear_signal_and_not_noise():
  rng = np.random.default_rng(0)
  y = np.repeat([0.0, 1.0], 100)
  x = rng.normal(size=(200, 5))
  signal = x.copy()
  signal[:, 2] += 4 * y  # one feature carries the label
  idx = rng.permutation(200)
  tr, te = idx[:100], idx[100:]
  assert structure.fit_probe(signal[tr], y[tr], signal[te], y[te]) >= 0.97
  assert 0.3 <= structure.fit_probe(x[tr], y[tr], x[te], y[te]) <= 0.7


def test_cross_language_similarity():
  rng = np.random.default_rng(1)
  a = rng.normal(size=(50, 8))
  assert structure.cross_language_similarity(a, a) == pytest.approx(1.0)
  assert structure.cross_language_similarity(a, -a) == pytest.approx(-1.0)
  same = np.ones((4, 3))
  assert structure.cross_language_similarity(same, same) == 1.0  # equal rows: nothing left after centring


def test_residuals_start_at_the_embeddings_and_a_block_changes_only_what_follows_it():
  cfg = model.Config(vocab_size=11, block_size=8, num_layers=3, num_heads=2, d_model=8, pos_embedding="rope")
  params = model.init_params(cfg, jax.random.key(0))
  tokens = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
  r = structure.residuals(cfg, params, tokens)
  assert r.shape == (4, 2, 4, 8)
  np.testing.assert_allclose(r[0], np.asarray(params["wte"]["embedding"])[tokens], rtol=1e-6)
  moved = jax.tree.map(lambda x: x, params)
  moved["block_1"] = jax.tree.map(lambda x: x + 0.1, params["block_1"])
  r2 = structure.residuals(cfg, moved, tokens)
  np.testing.assert_array_equal(r2[:2], r[:2])
  assert not np.allclose(r2[2], r[2])
  logits, _ = model.apply(cfg, params, jnp.asarray(tokens))
  assert logits.shape == (2, 4, 11)


def test_the_lens_at_the_last_layer_is_the_model_and_at_layer_0_the_head_on_the_embeddings():
  cfg = model.Config(vocab_size=11, block_size=8, num_layers=3, num_heads=2, d_model=8, pos_embedding="rope")
  params = model.init_params(cfg, jax.random.key(0))
  tokens = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
  logits, _ = model.apply(cfg, params, jnp.asarray(tokens))
  np.testing.assert_allclose(structure.lens_probabilities(cfg, params, tokens, 3),
                             jax.nn.softmax(logits[:, -1], -1), rtol=1e-5, atol=1e-7)
  # layer 0: the final norm and head on the last token's embedding, whatever the blocks hold
  moved = {**params, **{f"block_{i}": jax.tree.map(lambda x: x + 1.0, params[f"block_{i}"]) for i in range(3)}}
  p0 = structure.lens_probabilities(cfg, moved, tokens, 0)
  embedded = structure.residuals(cfg, params, tokens)[0, :, -1]
  normed = layers.norm(cfg, "ln_f").apply({"params": params["ln_f"]}, jnp.asarray(embedded))
  np.testing.assert_allclose(p0, jax.nn.softmax(normed @ params["lm_head"]["kernel"], -1), rtol=1e-5, atol=1e-7)
  assert not np.allclose(structure.lens_probabilities(cfg, moved, tokens, 2),
                         structure.lens_probabilities(cfg, params, tokens, 2))


def test_script_lens_shares_the_mass_between_two_scripts(monkeypatch):
  # a lens that puts, at layer l, mass 0.1 * l on token 1 (script a) and 0.2 on token 3 (script b)
  cfg = model.Config(vocab_size=6, block_size=8, num_layers=2, num_heads=2, d_model=8)

  def fake(cfg_, params, tokens, layer):
    p = np.full((len(tokens), 6), 0.0)
    p[:, 1], p[:, 3] = 0.1 * layer, 0.2
    p[:, 5] = 1 - p.sum(1)
    return p

  monkeypatch.setattr(structure, "lens_probabilities", fake)
  out = structure.script_lens(cfg, None, [np.zeros((3, 4), int), np.zeros((2, 5), int)], [1, 2], [3, 4])
  assert out["share"] == pytest.approx([0.0, 1 / 3, 0.5])
  assert out["mass"] == pytest.approx([0.2, 0.3, 0.4])
  with pytest.raises(ValueError, match="share tokens"):
    structure.script_lens(cfg, None, [np.zeros((1, 4), int)], [1, 2], [2, 3])


def test_the_command_measures_a_finished_run_and_refuses_other_workdirs(finished_testbed, tmp_path, capsys):
  out = tmp_path / "s.json"
  assert structure.main([f"--workdir={finished_testbed}", "--problems=4", f"--out={out}",
                         f"--png={tmp_path / 's.png'}"]) == 0
  r = json.loads(out.read_text())
  assert r["stage"] == "finetune" and r["num_layers"] == 4 and r["seeds"] == [0, 1]
  assert len(r["swap"]["goal"]["mean"]) == 4 and len(r["swap"]["task"]["values"]) == 2
  assert set(r["revert"]) == {"task", "language"} and len(r["revert"]["task"]["values"][1]) == 4
  assert set(r["scores"]) == {"base", "task expert", "language expert"}
  assert all(len(v) == 2 and all(0 <= x <= 1 for x in v) for m in r["scores"].values() for v in m.values())
  for name in ("base", "task expert", "language expert"):
    acc = r["probe"][name]["accuracy"]["mean"]
    assert len(acc) == 5 and acc[0] == 0.5  # at the embeddings "=" is the same token in both languages
    assert r["probe"][name]["similarity"]["mean"][0] == 1.0
  lens = r["lens"]["base"]
  assert len(lens["target_prompts share"]["values"]) == 2 and len(lens["source_prompts mass"]["mean"]) == 5
  assert all(0 <= x <= 1 for k in lens for x in lens[k]["mean"])
  assert (tmp_path / "s.png").exists()
  (tmp_path / "other").mkdir()
  assert structure.main([f"--workdir={tmp_path / 'other'}"]) == 2
  assert "holds no config.json" in capsys.readouterr().err
