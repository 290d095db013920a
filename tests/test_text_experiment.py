import importlib.util
import json
import os
import random

import jax
import numpy as np
import pytest

from xlt import runner, sharding
from xlt.experiments import text as tt

ROOT = os.path.join(os.path.dirname(__file__), "..")


def load_config(name):
  path = os.path.join(ROOT, "configs", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


# ---------------------------------------------------------------------------- experiment

EN = ("the cat", "a dog", "the girl", "a boy", "the bird", "mom")
EN_V = ("saw", "liked", "found", "had", "wanted")
EN_O = ("a ball", "the tree", "a cake", "the sun", "a box")


def corpus_text(seed, n, transform=lambda w: w):
  rng = random.Random(seed)
  sent = lambda: " ".join(transform(rng.choice(x)) for x in (EN, EN_V, EN_O)) + "."
  return [" ".join(sent() for _ in range(rng.randint(3, 6))) for _ in range(n)]


def reverse_words(phrase):  # a second "language": same grammar, other word forms
  return " ".join(w[::-1] + "o" for w in phrase.split())


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  root = tmp_path_factory.mktemp("text_corpora")
  high = root / "high.jsonl"
  high.write_text("".join(json.dumps({"text": d}) + "\n" for d in corpus_text(0, 240)))
  low = root / "low.txt"
  low.write_text("\n<|endoftext|>\n".join(corpus_text(1, 240, reverse_words)))
  return str(high), str(low)


def tiny_config(high, low):
  c = load_config("tinystories")
  c.data.shared_dir = ""
  c.data.high.path, c.data.low.path = high, low
  c.data.low.format = "text"
  c.data.low.max_documents = 0
  c.data.split.held_out_fraction = 0.1
  c.data.num_val_documents = 4
  c.tokenizer.vocab_size = 300
  c.model.update(num_layers=1, num_heads=2, d_model=32, block_size=32)
  c.train.update(batch_size=8, steps=20, eval_every=10, log_every=5, checkpoint_every=100)
  c.opt.update(warmup_steps=2, peak_lr=1e-2)
  c.eval.batch_size = 16
  c.samples.update(max_new=6, num_prompts=1, prompt_words=2)
  c.mesh.data = 1
  return c


def test_text_experiment_end_to_end(corpora, tmp_path, monkeypatch):
  c = tiny_config(*corpora)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  workdir = str(tmp_path / "run")
  rows = runner.run(c, workdir, progress=False, mesh=mesh)
  saved = json.load(open(os.path.join(workdir, "results.json")))
  assert saved == json.loads(json.dumps(rows))
  # Run again on the finished workdir: its results, with nothing built, trained or tested.
  monkeypatch.setattr(tt, "prepare", lambda *a: pytest.fail("a finished workdir prepared data again"))
  assert runner.run(c, workdir, progress=False, mesh=mesh) == saved
  assert {r["condition"] for r in rows} == set(tt.CONDITIONS)
  assert {(r["language"], r["role"]) for r in rows} == {("en", "source"), ("ru", "target")}
  assert {r["metric"] for r in rows} == set(tt.METRICS)
  for r in rows:
    assert all(np.isfinite(v) and v > 1 for v in r["values"]), r
  docs = {(r["condition"], r["language"]): r["samples"] for r in rows}
  assert docs["high_only", "ru"] == 0 and docs["low_limited", "en"] == 0
  assert 0 < docs["low_limited", "ru"] < docs["low_full", "ru"]
  assert docs["mixed", "ru"] == docs["low_limited", "ru"]
  assert docs["mixed", "en"] == docs["high_only", "en"] > 0
  table = open(os.path.join(workdir, "table.md")).read()
  assert "| mixed |" in table and "transfer improvement" in table
  for name in ("curves.png", "train_loss.png", "samples.txt", "summary.json", "results.csv"):
    assert os.path.isfile(os.path.join(workdir, name)), name
  assert "mixed/seed_0 | ru" in open(os.path.join(workdir, "samples.txt")).read()
  assert json.load(open(os.path.join(workdir, "summary.json")))["steps"] == 20


def test_missing_corpus_is_a_clear_error(corpora, tmp_path):
  c = tiny_config(*corpora)
  c.data.low.path = str(tmp_path / "nope.txt")
  with pytest.raises(FileNotFoundError, match=r"config\.data\.low\.path.*nope\.txt"):
    runner.run(c, str(tmp_path / "w"), progress=False)
  c.data.low.path = None
  with pytest.raises(ValueError, match=r"--config\.data\.high\.path="):
    tt.corpus_specs(c)
  c.data.shared_dir = str(tmp_path / "no_shared")
  with pytest.raises(FileNotFoundError, match=r"shared_dir.*--config\.data\.high\.path"):
    tt.corpus_specs(c)


def test_configs_load():
  ref = load_config("tinystories_reference")
  assert (ref.model.d_model, ref.model.num_layers, ref.tokenizer.vocab_size) == (768, 4, 30_000)
  assert ref.train.batch_size // ref.train.grad_accum == 80
  with pytest.raises(ValueError, match=r"config\.data\.high\.path is not set"):
    tt.corpus_specs(ref)
  proxy = load_config("tinystories")
  if not os.path.isdir(os.path.join(ROOT, "..", "shared", "data")):
    pytest.skip("../shared/data is not present")
  specs = tt.corpus_specs(proxy)
  assert (specs["high"].language, specs["low"].language) == ("en", "ru")
  assert all(os.path.isfile(s.path) for s in specs.values())


def test_more_high_text_and_held_out_originals_join_the_right_conditions(corpora, tmp_path):
  """data.high_extra trains every condition with the high language and nothing else (not the
  tokenizer, not the held-out rows); data.mixed_high_held_out adds the held-out documents' high
  side to mixed only. Counted in the rows' samples: documents of each language trained on."""
  extra = write_lines(tmp_path / "extra.txt", [f"the sun had a box {i}." for i in range(23)])
  c = tiny_config(*corpora)
  c.conditions = ("high_only", "low_limited", "mixed")
  c.seeds_per_condition = {"mixed": 1, "low_limited": 1}
  c.data.high_extra = dict(path=extra, format="text", separator="line", lines_per_document=4,
                           skip_lines=3, language="en_extra")
  base = tt.get_task(tiny_config(*corpora), str(tmp_path / "base"), ["high_only"])
  c.data.mixed_high_held_out = True
  task = tt.get_task(c, str(tmp_path / "both"), list(c.conditions))
  held_out = task.counts["high", "held_out"]["documents"]
  assert held_out > 0 and task.counts["high_extra", "all"]["documents"] == 5  # 20 lines by 4
  train_en = base.composition["high_only"]["high_documents"]
  assert task.composition["high_only"]["high_documents"] == train_en + 5
  assert task.composition["mixed"]["high_documents"] == train_en + 5 + held_out
  assert task.composition["low_limited"]["high_documents"] == 0
  assert task.sp.serialized_model_proto() == base.sp.serialized_model_proto()
  np.testing.assert_array_equal(task.test["high"]["tokens"], base.test["high"]["tokens"])
  c.data.high_extra.path = str(tmp_path / "nope.txt")
  with pytest.raises(FileNotFoundError, match=r"config\.data\.high_extra\.path"):
    tt.corpus_specs(c)


def write_lines(path, lines):
  path.write_text("\n".join(lines) + "\n")
  return str(path)
