"""The merge testbed end to end on a tiny config, its compositions, and its config checks."""

import json
import os

import jax
import numpy as np
import ml_collections
import pytest

from conftest import finished_testbed_config
from configs import merge as merge_config
from configs import merge_peft
from xlt import model, partition, runner
from xlt.data import arithmetic
from xlt.experiments.testbed import experiment as testbed
from xlt.experiments.testbed import plan as testbed_plan


@pytest.fixture
def tiny(shrink_testbed):
  # every recipe: the default's, and the second config's; 4 steps a stage, as finished_testbed's
  # run (conftest): their base stages compile the same programs, compiled once a session
  c = shrink_testbed(merge_peft.get_config(), steps=4)
  c.name = "merge_testbed"
  c.num_seeds = 2
  c.lora.rank, c.lora.presets, c.lora.swaps = 2, ("C",), ("1,1,0",)
  return c


def test_testbed_writes_every_method_and_resumes(tiny, tmp_path):
  assert runner.run(tiny, str(tmp_path), progress=False, stop_after=3) == []  # killed in stage 1
  rows = runner.run(tiny, str(tmp_path), progress=False)
  methods = list(dict.fromkeys(r["condition"] for r in rows))
  assert methods[:5] == ["base", "task expert", "language expert", "source-language expert", "data mixing"]
  for want in ("freeze-then-train [A]", "train-then-revert [C_inv]", "simultaneous [C] k=10",
               "layer swap b=1 u=1 t=1", "soup (magnitude)", "task arithmetic λ=1.0", "TIES density=0.2",
               "DARE drop=0.5", "MAET", "task expert, language partition reverted [A]",
               "LoRA task expert", "LoRA language expert", "LoRA layer swap b=1 u=1 t=0",
               "partial LoRA task expert [C]", "LoRA freeze-then-train [C]", "simultaneous LoRA [C] k=1",
               "MAET ability model (trained neurons)", "MAET (trained neurons)"):
    assert want in methods, want
  for m in methods:
    got = {(r["role"], r["metric"]) for r in rows if r["condition"] == m}
    assert got == {("goal", "exact_match"), ("goal", "any_script"), ("task", "exact_match"),
                   ("language", "exact_match"), ("source_language", "exact_match")}
  for r in rows:
    assert r["seeds"] == 2 and all(0 <= v <= 1 for v in r["values"])
    assert r["language"] == ("standard" if r["role"] in ("task", "source_language") else "letter")
    assert r["ci95"] is not None and r["ci95"] >= 0
    if (r["role"], r["metric"]) == ("goal", "exact_match"):
      assert r["vs_best_expert"]["expert"] in ("task expert", "language expert") and "retention" in r
  retained = {r["condition"]: set(r["retention"]["sets"]) for r in rows if "retention" in r}
  base_scores = {r["role"]: r["mean"] for r in rows if r["condition"] == "base" and r["metric"] == "exact_match"}
  for name, untrained in (("task expert", {"language", "source_language"}), ("language expert", {"source_language"}),
                          ("source-language expert", {"language"}), ("soup", {"language", "source_language"})):
    assert retained[name] == {s for s in untrained if base_scores[s] > 0}, name
  for name in ("table.md", "summary.json", "results.csv", "delta_task_expert.png", "delta_language_expert.png",
               "predictions.jsonl"):
    assert (tmp_path / name).exists(), name
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["members"] == {"base": 2, "finetune": 32, "lora": 2 * 5, "maet_neurons": 4}
  table = (tmp_path / "table.md").read_text()
  assert "| layer swap b=1 u=1 t=0 |" in table and "| goal − best expert |" in table and "| retention |" in table
  assert runner.run(tiny, str(tmp_path), progress=False) == rows  # finished: reused


def test_compose_builds_each_model_from_the_right_parts(tiny):
  cfg = model.Config(vocab_size=32, block_size=16, num_layers=4, num_heads=2, d_model=8)
  base = jax.tree.map(np.asarray, model.init_params(cfg, jax.random.key(0)))
  recipes = testbed.plan(tiny)
  # every trained model = base + a constant that names it, so each leaf tells its source
  trained = {r.name: jax.tree.map(lambda x, k=k: x + (k + 1), base) for k, r in enumerate(recipes)}
  source = lambda tree, leaf_base: float(np.round(np.mean(tree - leaf_base)))
  labels = {p: partition.labels(base, partition.preset_rules(p, 4, 1, 1)) for p in ("A", "C", "A_inv", "C_inv")}
  models = testbed.compose(tiny, base, trained, labels)
  k = {r.name: i + 1 for i, r in enumerate(recipes)}
  flat = lambda t: jax.tree.leaves(t)
  for p in ("A", "C"):
    for leaf, b, label in zip(flat(models[f"freeze-then-train [{p}]"]), flat(base), flat(labels[p])):
      want = k[f"partial task expert [{p}]"] if label == "task" else k[f"partial language expert [{p}]"]
      assert source(leaf, b) == want
    for leaf, b, label in zip(flat(models[f"train-then-revert [{p}]"]), flat(base), flat(labels[p])):
      assert source(leaf, b) == (k["task expert"] if label == "task" else k["language expert"])
    for leaf, b, label in zip(flat(models[f"task expert, language partition reverted [{p}]"]), flat(base),
                              flat(labels[p])):
      assert source(leaf, b) == (k["task expert"] if label == "task" else 0)
  # task arithmetic with both experts: base + (task - base) + (lang - base)
  ta = models["task arithmetic λ=1.0"]
  assert all(source(x, b) == k["task expert"] + k["language expert"] for x, b in zip(flat(ta), flat(base)))
  assert models["base"] is base


def test_bad_testbed_configs_fail_before_training(tiny, tmp_path):
  c = tiny
  c.merge.swaps = ("2,2,1",)  # 2 + 1 + 1 + 2 > 4 blocks
  with pytest.raises(ValueError, match="exceeds the model's 4"):
    runner.run(c, str(tmp_path / "a"), progress=False)
  assert not os.path.exists(tmp_path / "a" / "base")
  c.merge.swaps = ("1,1,0",)
  c.data.base = c.data.base + (("add_digit", "letter", 5),)
  with pytest.raises(ValueError, match="must not learn it"):
    runner.run(c, str(tmp_path / "b"), progress=False)
  c.data.base = c.data.base[:-1]
  c.data.language = (("max", "standard", 10),)
  with pytest.raises(ValueError, match=r"data.language holds \(max, standard\)"):
    runner.run(c, str(tmp_path / "c"), progress=False)


def test_arithmetic_problems():
  ac = merge_config.get_config().arithmetic
  ex = arithmetic.make_example("add", 327, 104, "letter")
  assert " ".join(ex.prompt) == "[let] 3 2 7 + 1 0 4 =" and ex.answer == ("B", "D", "E")
  assert arithmetic.make_example("copy", 327, None, "letter").answer == ("H", "C", "D")
  assert arithmetic.make_example("double", 500, None, "standard").answer == ("0", "0", "0", "1")
  assert arithmetic.score("add", 327, 104, ["1", "3", "4"], "letter") == {"exact_match": 0.0, "any_script": 1.0}
  assert arithmetic.score("add", 327, 104, ["B", "D", "E"], "letter") == {"exact_match": 1.0, "any_script": 1.0}
  for a, d in arithmetic.train_problems("add_digit", "standard", 500, ac):  # always a carry
    assert 2 <= d <= 9 and a % 10 + d >= 10
  test, val = arithmetic.held_out("add", ac)
  held = {p for a, b in test + val for p in ((a, b), (b, a))}
  for lang in arithmetic.LANGUAGES:  # no language trains on a held-out problem of the operation
    assert not held & set(arithmetic.train_problems("add", lang, 3000, ac))
  assert arithmetic.train_problems("max", "letter", 50, ac) == arithmetic.train_problems("max", "letter", 80, ac)[:50]
  with pytest.raises(ValueError, match="only .* operands exist"):
    arithmetic.train_problems("succ", "standard", 900, ac)
  with pytest.raises(ValueError, match="unknown operation"):
    arithmetic.make_example("mul", 1, 2, "standard")


def test_num_test_by_op_sizes_one_operations_test_set():
  ac = ml_collections.ConfigDict(dict(min_digits=3, max_digits=3, seed=0, num_test=200, num_val=64))
  test, val = arithmetic.held_out("add_digit", ac)
  ac.num_test_by_op = {"add_digit": 1000}
  big, big_val = arithmetic.held_out("add_digit", ac)
  assert (len(test), len(big), len(big_val)) == (200, 1000, 64)
  assert len(arithmetic.held_out("copy", ac)[0]) == 200  # the others keep num_test
  held = {p for p in big + big_val}
  assert not held & set(arithmetic.train_problems("add_digit", "standard", 2000, ac))
  ac.num_test_by_op = {"mul": 10}
  with pytest.raises(ValueError, match="unknown operations"):
    arithmetic.held_out("copy", ac)


def test_plan_lists_every_trained_recipe_once_with_its_variant(tiny):
  recipes = testbed_plan.plan(tiny)
  assert len({r.name for r in recipes}) == len(recipes)
  assert [r.name for r in recipes if r.variant == "full"] == [r.name for r in testbed.plan(tiny)]
  assert [r.name for r in testbed_plan.plan(tiny, "lora")] == [
      "LoRA task expert", "LoRA language expert", "partial LoRA task expert [C]", "partial LoRA language expert [C]",
      "simultaneous LoRA [C] k=1"]
  assert [r.name for r in testbed_plan.plan(tiny, "neurons")] == [
      "MAET short task", "MAET short source_language", "MAET ability model (trained neurons)",
      "MAET source model (trained neurons)"]
  assert testbed.plan(tiny)[3].trained_on == ("task", "language")  # data mixing
  tiny.lora.enabled = tiny.maet_neurons.enabled = False
  assert {r.variant for r in testbed_plan.plan(tiny)} == {"full"}


def test_replay_adds_a_fixed_share_of_the_base_data(tiny):
  tiny.finetune.replay = 0.0
  plain = testbed.datasets(tiny)
  for name in ("base", "task", "language", "source_language"):  # replay 0: the mixtures as they were
    assert plain[name] == arithmetic.mixture(tiny.data[name], tiny.arithmetic), name
  assert plain["mixed"] == plain["task"] + plain["language"]
  tiny.finetune.replay = 0.25
  got = testbed.datasets(tiny)
  assert got["base"] == plain["base"]
  base = set(plain["base"])
  for name in ("task", "language", "source_language", "mixed"):
    n = len(plain[name])
    assert got[name][:n] == plain[name], name
    added = got[name][n:]
    assert len(added) == round(0.25 * n) and set(added) <= base, name
  assert testbed.datasets(tiny) == got  # seeded: the same examples every time
  assert testbed_plan.replay(list(range(3)), ["b"], 2.0, 0) == [0, 1, 2] + ["b"] * 6  # more than the base has


def test_bases_from_reruns_the_recipes_on_a_finished_runs_bases(finished_testbed, shrink_testbed, tmp_path):
  # the finished run is the session's (conftest), only read here
  first = json.loads((finished_testbed / "results.json").read_text())
  again = finished_testbed_config(shrink_testbed)
  again.bases_from = str(finished_testbed)
  again.merge.extra = ()  # what is rerun on the bases is checked here, not the extra merges (test_testbed_remerge)
  rows = runner.run(again, str(tmp_path / "again"), progress=False)
  for name in ("best_params.npz", "metrics.jsonl"):  # taken whole, and not trained again
    assert (tmp_path / "again" / "base" / name).read_bytes() == (finished_testbed / "base" / name).read_bytes()
  scores = lambda rs: {(r["role"], r["metric"]): r["values"] for r in rs if r["condition"] == "base"}
  assert scores(rows) == scores(first) and not (tmp_path / "again" / "base.tmp").exists()
  unfinished = ml_collections.ConfigDict(again.to_dict())
  unfinished.bases_from = str(tmp_path / "again" / "base")
  with pytest.raises(ValueError, match="not a finished testbed run"):
    runner.run(unfinished, str(tmp_path / "b"), progress=False)
  other = ml_collections.ConfigDict(again.to_dict())
  other.model.d_model, other.base.opt.peak_lr = 32, 1e-3
  with pytest.raises(ValueError, match=r"another config \(base.opt.peak_lr, model.d_model differ\)"):
    runner.run(other, str(tmp_path / "c"), progress=False)
  assert not (tmp_path / "c" / "base").exists()
