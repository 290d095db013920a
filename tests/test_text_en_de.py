"""configs/tinystories_en_de.py: English + German from one story-aligned file, split by story.

Tests that read the real file skip when ../shared is absent (it is not part of the repository:
its licence is non-commercial research only); the alignment guard is tested on a small file.
"""

import importlib.util
import json
import os

import jax
import pytest

from xlt import runner, sharding
from xlt.experiments import text as tt
from xlt.data import corpus

ROOT = os.path.join(os.path.dirname(__file__), "..")
PARALLEL = os.path.join(ROOT, "..", "shared", "data", "parallel_en_de",
                        "simple_stories_1000_en_de.jsonl")
needs_data = pytest.mark.skipif(not os.path.isfile(PARALLEL),
                                reason="../shared/data/parallel_en_de is not present")


def load_config(name="tinystories_en_de"):
  path = os.path.join(ROOT, "configs", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def write_parallel(path, pairs):
  path.write_text("".join(json.dumps({"en": en, "de": de}) + "\n" for en, de in pairs))
  return str(path)


# --------------------------------------------------------------------- no data needed


def test_paths_follow_one_field_and_missing_file_is_named(tmp_path):
  c = load_config()
  assert c.data.high.path == c.data.low.path == c.data.parallel_path
  assert (c.data.high.field, c.data.low.field) == ("en", "de")
  c.data.shared_dir = str(tmp_path / "no_shared")  # moves both languages
  assert c.data.low.path == str(tmp_path / "no_shared" / "data" / "parallel_en_de" /
                                "simple_stories_1000_en_de.jsonl")
  with pytest.raises(FileNotFoundError, match=r"config\.data\.high\.path.*no_shared/data/"
                                              r"parallel_en_de/simple_stories_1000_en_de\.jsonl"):
    tt.corpus_specs(c)


def test_misaligned_parallel_file_is_refused(tmp_path):
  c = load_config()
  c.data.parallel_path = write_parallel(tmp_path / "ok.jsonl", [("a", "A"), ("b", "B")])
  assert set(tt.corpus_specs(c)) == {"high", "low"}  # aligned: accepted
  # Line 2's German is empty, so it is dropped: German document 1 would be line 3's story and
  # every later split index would pair a story with the next one's translation.
  c.data.parallel_path = write_parallel(tmp_path / "bad.jsonl",
                                        [("a", "A"), ("b", ""), ("c", "C")])
  with pytest.raises(ValueError, match=r"misaligned at document 1: field 'en' starts at "
                                       r".*bad\.jsonl:2, field 'de' at .*bad\.jsonl:3"):
    tt.corpus_specs(c)
  # A shorter cap on one side compares only the common prefix.
  high = corpus.CorpusSpec(c.data.parallel_path, "jsonl", field="en", max_documents=1)
  corpus.check_parallel(high, corpus.CorpusSpec(c.data.parallel_path, "jsonl", field="de"))


# --------------------------------------------------------------------- the real file


@needs_data
def test_split_is_by_story_in_both_languages():
  c = load_config()
  specs, split = tt.corpus_specs(c), tt.split_spec(c)
  with open(PARALLEL, encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  en_of = {r["de"]: r["en"] for r in records}
  docs = {(role, name): list(corpus.iter_split(corpus.iter_documents(specs[role]), name, split))
          for role in tt.ROLES for name in corpus.SPLITS}
  en_train = set(docs["high", "train"])
  held_out_de = docs["low", "held_out"]
  # No held-out German story has its English in the English training set (the mixed model
  # would otherwise train on test content in translation); validation and test are the same
  # stories in both languages, in the same order.
  assert not {en_of[d] for d in held_out_de} & en_train
  assert [en_of[d] for d in held_out_de] == docs["high", "held_out"]
  assert [en_of[d] for d in docs["low", "limited"]] == docs["high", "limited"]
  # The sizes the docstring states: 1,000 stories, 200 held out (64 validation + 136 test),
  # 800 train per language, limited = 78 (~10%) of them, a subset of train.
  assert len(records) == 1000 and len(held_out_de) == 200
  assert len(docs["low", "train"]) == len(en_train) == 800
  assert len(docs["low", "limited"]) == 78 and set(docs["low", "limited"]) <= set(
      docs["low", "train"])
  assert len(held_out_de) - c.data.num_val_documents == 136


@needs_data
def test_en_de_end_to_end(tmp_path):
  c = load_config()
  c.num_seeds, c.seeds_per_condition = 1, {}
  c.data.high.max_documents = c.data.low.max_documents = 300  # the first 300 stories
  c.data.num_val_documents = 8
  c.tokenizer.vocab_size = 400
  c.model.update(num_layers=1, num_heads=2, d_model=32, block_size=32)
  c.train.update(batch_size=8, steps=4, eval_every=4, log_every=2, checkpoint_every=100)
  c.opt.update(warmup_steps=1)
  c.eval.batch_size = 64
  c.samples.num_prompts = 0  # sampling is covered by test_text_experiment (a compile per prompt)
  c.mesh.data = 1
  rows = runner.run(c, str(tmp_path / "run"), progress=False,
                    mesh=sharding.make_mesh(c.mesh, jax.devices()[:1]))
  assert {(r["language"], r["role"]) for r in rows} == {("en", "source"), ("de", "target")}
  assert {r["condition"] for r in rows} == set(tt.CONDITIONS)
  docs = {(r["condition"], r["language"]): r["samples"] for r in rows}
  assert 0 < docs["low_limited", "de"] < docs["low_full", "de"] == docs["high_only", "en"]
  assert docs["mixed", "de"] == docs["low_limited", "de"] and docs["mixed", "en"] > 0
  tests = {r["language"]: r["test_documents"] for r in rows}
  assert tests["en"] == tests["de"] > 0  # the same held-out stories in both languages
