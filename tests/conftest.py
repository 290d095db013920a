"""Test setup: 8 fake CPU devices, so sharding is tested without hardware; XLA's back end
unoptimised and its quicker-compiling fusion emitters (below); and one persistent compilation cache for the session
(`JAX_COMPILATION_CACHE_DIR`: a fresh temporary folder, removed at the end), which the
subprocesses tests start inherit, pytest-xdist's workers (pyproject's addopts) among them:
many tests compile the same small models' programs, and XLA compiling them was most of the
suite's time.

All must be set before jax is imported anywhere.
"""

import atexit
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

import pytest


def _known_to_xla(flags: str) -> str:
  """`flags` if this jaxlib's XLA accepts them, else "": XLA ends the process on a flag it does
  not know, and a newer jaxlib may drop one. Asked once per session, in a fresh process (the
  answer is left in the environment for pytest-xdist's workers)."""
  if "XLT_TEST_COMPILE_FLAGS" not in os.environ:
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], capture_output=True,
                           env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"})
    os.environ["XLT_TEST_COMPILE_FLAGS"] = flags if probe.returncode == 0 else ""
  return os.environ["XLT_TEST_COMPILE_FLAGS"]


# XLA:CPU's fusion emitters (its default) compile each fusion through an MLIR pipeline; its
# older elemental emitters compile the same fusions with about 40% less CPU time (three of the
# longest tests: 77 s instead of 111 s). Like the unoptimised back end (below) this is for the
# tests alone, and the tests that start processes pass these flags on to them.
COMPILE_FLAGS = _known_to_xla("--xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = " ".join(
    (os.environ.get("XLA_FLAGS", ""), COMPILE_FLAGS, "--xla_force_host_platform_device_count=8")).strip()
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="xlt-test-jax-cache-")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  # every program, however quick to compile: jax's default (1 s) and 0.3 s left most of the
  # small programs the tests share out (tests/test_train.py, test_pretrained.py,
  # test_generate.py, test_finetune.py and test_lora.py: 184 and 188 s with 0 against 192 and
  # 198 s with 0.3, alternating)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The tests' programs are tiny and each runs a few steps, so optimising their machine code costs
# more than it saves: most of a test's time was XLA compiling. jax_disable_most_optimizations
# turns off only the LLVM back end's optimisation (level 0, no expensive passes); the HLO passes
# (fusion, sharding, donation) run as they do for users. The testbed test took 83 s instead of
# 138 s on one core, the suite 9.4 min instead of 13.3 on two. What the tests assert (equalities
# between two ways of computing one thing, round trips, exact values) holds either way; speed is
# measured by benchmarks/, which run fully optimised.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # so configs/ and xlt/ import from a plain checkout


def child_env(**overrides: str) -> dict:
  """The environment of a process a test starts (`python -m xlt.main`, a script): this one's,
  with the tests' compile flags in place of the 8 fake devices (XLA_FLAGS) and no allocator
  re-execution (XLT_ALLOCATOR=system: one interpreter start less), then `overrides`."""
  return {**os.environ, "XLA_FLAGS": COMPILE_FLAGS, "XLT_ALLOCATOR": "system", **overrides}


# The modules with the suite's longest tests (end-to-end runs: several processes, a notebook, a
# testbed, 15-90 s each), longest first, collected before the others (which keep their order).
# pytest-xdist's worksteal hands each worker a contiguous share of the collection and lets an
# idle worker take the end of another's queue: with these first, the long runs start at once and
# the run ends on short tests, instead of one worker finishing a long test last while the other
# has nothing left to take; and the tests that read one run built once (`finished_testbed`, the
# multi-host runs) sit in one worker's share, so the other does not wait on its lock.
FIRST = ("test_multihost.py", "test_notebooks.py", "test_testbed.py", "test_structure.py", "test_testbed_remerge.py",
         "test_structure_experiment.py", "test_testbed_regimes.py", "test_synthetic.py", "test_testbed_text.py",
         "test_grid.py", "test_llama_e2e.py", "test_finetune_peft.py", "test_finetune.py", "test_train.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: each module stays in one piece


def compiled(fn):
  """`fn` (a Config first, then arrays: model.apply, lora.apply, composite.apply) under jax.jit.
  Run eagerly, each of the model's ops compiles as a program of its own: seconds a call, most of
  the time of the tests that compared forwards. A test that monkeypatches what `fn` calls must
  trace a fresh function instead: jit caches the trace per argument shapes and would not see
  the patch."""
  import jax

  return jax.jit(fn, static_argnums=0)


@pytest.fixture
def graph_config():
  """configs/graph.py shrunk to a model and budget that train in seconds."""
  return small_graph_config()


def small_graph_config():
  """The `graph_config` fixture's config, for module-scoped fixtures."""
  from configs import graph

  c = graph.get_config()
  c.num_seeds = 2
  c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.block_size = 2, 2, 32, 64
  c.mixture.source_samples, c.mixture.target_samples = 256, 64
  c.graph.num_test_pairs, c.graph.num_val_pairs = 64, 32
  c.train.batch_size, c.train.steps, c.train.eval_every = 16, 12, 6
  c.train.checkpoint_every, c.train.log_every = 4, 2
  c.opt.warmup_steps = 2
  c.eval.batch_size = 64
  c.mesh.data, c.mesh.devices = 1, 1
  return c


@pytest.fixture(scope="session")
def shrink_testbed():
  """A function that shrinks a merge-testbed config (configs/merge*.py) to the tests' tiny
  sizes: 2-digit operands, `examples` of each two-operand operation (half that of the others,
  and of the base's target language), `tests` test problems per set, a 4-block width-16 model,
  `steps` steps a stage."""
  from configs import merge as merge_config

  def shrink(c, examples: int = 40, tests: int = 16, steps: int = 6):
    n, half, quarter = examples, examples // 2, examples // 4
    c.arithmetic.min_digits = c.arithmetic.max_digits = 2
    c.arithmetic.num_test, c.arithmetic.num_val = tests, tests // 2
    c.arithmetic.num_test_by_op = {"add_digit": tests}
    ops = merge_config.OTHER_OPS
    c.data.base = merge_config.parts(ops, "standard", n, half) + merge_config.parts(ops, "letter", half, quarter)
    c.data.task = (("add_digit", "standard", n),)
    c.data.language = merge_config.parts(ops, "letter", n, half)
    c.data.source_language = merge_config.parts(ops, "standard", n, half)
    c.model.num_layers, c.model.d_model, c.model.num_heads = 4, 16, 2
    c.partition.bottom = c.partition.top = 1
    for stage in (c.base, c.finetune, c.lora, c.maet_neurons.short):
      stage.train.steps, stage.train.eval_every, stage.train.batch_size = steps, steps // 2, 8
      stage.train.checkpoint_every, stage.train.min_steps = steps // 2, 0
    c.merge.swaps = ("1,1,0", "1,1,1")
    c.eval.batch_size = tests
    c.mesh.devices = 1
    return c

  return shrink


# the merges of the testbed's data-aware and registry methods that `finished_testbed`'s run adds
# as rows (merge.extra), for test_testbed_remerge
DATA_AWARE_MERGES = ("tsv_m", "iso_c", "iso_cts", "consensus", "tall_mask expert=0", "magmax", "localize_and_stitch",
                     "localize_and_stitch losses='data' steps=2", "regmean", "fisher")


def finished_testbed_config(shrink):
  """The config of `finished_testbed`'s run (`shrink`: the shrink_testbed fixture's function)."""
  from configs import merge as merge_config

  c = shrink(merge_config.get_config(), steps=4)
  c.num_seeds = 2
  c.partition.presets, c.simultaneous.presets = ("C",), ()
  c.merge.extra = DATA_AWARE_MERGES
  c.merge.statistics = {"examples": 16, "batch_size": 8, "loss_examples": 8}
  return c


def built_once(tmp_path_factory, name: str, build) -> pathlib.Path:
  """The folder `name` that `build(folder)` fills, built once per test session: pytest-xdist's
  workers share it (the first to ask builds it under a lock; the others wait for it, then read
  it). Module and session fixtures are per worker, and worksteal may split a module's tests
  between workers, so a run the tests only read would otherwise be trained once per worker.
  A build that fails is redone by the next test to ask for it."""
  import fcntl

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the session's folder, above each worker's own
  folder, done = root / name, root / f"{name}.built"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      build(folder)
      done.touch()
  return folder


@pytest.fixture(scope="session")
def finished_testbed(shrink_testbed, tmp_path_factory):
  """A finished tiny testbed run (2 seeds, preset [C] only, 4 steps a stage, the data-aware
  merges as extra rows) that tests only read (the structure command and kind, bases_from, the
  re-merge), trained once per session (`built_once`): one testbed run for all of them, since
  training and compiling one was most of each such test's time."""
  from xlt import runner

  return built_once(tmp_path_factory, "finished_testbed", lambda workdir: runner.run(
      finished_testbed_config(shrink_testbed), str(workdir), progress=False))


def tiny_lm():
  """A tiny language model's config (2 blocks, width 16, vocabulary 50) for the decoding and
  perplexity tests."""
  from xlt import model as model_lib
  return model_lib.Config(vocab_size=50, block_size=24, num_layers=2, num_heads=2, d_model=16)


def tiny_lm_rows(n=5, t=13, seed=0):
  """n random token rows of length t, each starting with the BOS (2) of xlt.data.spm_tokenizer."""
  import numpy as np

  tokens = np.random.default_rng(seed).integers(4, tiny_lm().vocab_size, (n, t)).astype(np.int32)
  tokens[:, 0] = 2
  return tokens


@pytest.fixture(scope="module")
def tiny_lm_params():
  import jax

  from xlt import model as model_lib
  return jax.jit(model_lib.init_params, static_argnums=0)(tiny_lm(), jax.random.key(0))


def load_script(relative: str, name: str | None = None):
  """A script of the repository (tests/fixtures/make_*.py, benchmarks/*.py) as a module, by its
  path: they are not packages, and their peers (torch, mergekit, ...) are imported only when
  their functions run."""
  import importlib.util

  path = REPO / relative
  spec = importlib.util.spec_from_file_location(name or path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_mergekit_yaml(tmp_path, case: str, config: dict, script) -> str:
  """Merges mergekit YAML `config` (the fixture `script`'s paths filled in by its `with_paths`)
  with `python -m xlt.merge`'s own functions into tmp_path/case; returns that directory."""
  import yaml

  from configs import merge_files
  from xlt.merge.__main__ import merge_config, with_yaml
  yml = tmp_path / f"{case}.yml"
  yml.write_text(yaml.safe_dump(script.with_paths(config)))
  out = str(tmp_path / case)
  merge_config(with_yaml(merge_files.get_config(), str(yml)) | {"output": out, "heatmaps": False})
  return out


# ---- small text corpora: xlt.data's tests (test_corpus, test_spm_tokenizer, test_packing)


def write(path, content: str | bytes) -> str:
  """Writes `content` (text as UTF-8, or bytes) to `path`; returns the path as a string."""
  mode = "wb" if isinstance(content, bytes) else "w"
  with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
    f.write(content)
  return str(path)


def jsonl(records) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


EN_STORY = (("the little girl", "a happy dog", "her brother", "the old cat", "a small bird"),
            ("found", "wanted", "played with", "looked at", "shared"),
            ("a red ball", "the big tree", "some sweet cake", "a shiny stone", "the blue boat"))
DE_STORY = (("das kleine Mädchen", "ein fröhlicher Hund", "ihr Bruder", "die alte Katze", "ein kleiner Vogel"),
            ("fand", "wollte", "spielte mit", "schaute auf", "teilte"),
            ("einen roten Ball", "den großen Baum", "süßen Kuchen", "einen glänzenden Stein", "das blaue Boot"))


def stories(words, verbs, objects, n, seed):
  """n stories of four sentences (subject verb object), seeded."""
  rng = random.Random(seed)
  sentence = lambda: " ".join(rng.choice(x) for x in (words, verbs, objects)) + "."
  return ["\n\n".join(s[0].upper() + s[1:] for s in (sentence() for _ in range(4)))
          for _ in range(n)]


@pytest.fixture(scope="session")
def story_corpora(tmp_path_factory):
  """Two corpora of 60 stories each: English as JSONL, German as text with an eot marker."""
  from xlt.data import corpus

  root = tmp_path_factory.mktemp("corpora")
  en = write(root / "en.jsonl", jsonl({"text": s} for s in stories(*EN_STORY, 60, seed=0)))
  de = write(root / "de.txt", "\n<|endoftext|>\n".join(stories(*DE_STORY, 60, seed=1)))
  return [corpus.CorpusSpec(en, "jsonl", language="en"), corpus.CorpusSpec(de, "text", language="de")]


@pytest.fixture(scope="session")
def story_sp(story_corpora, tmp_path_factory):
  """A 400-piece sentencepiece tokenizer trained on `story_corpora`."""
  from xlt.data import spm_tokenizer

  return spm_tokenizer.train_or_load_tokenizer(str(tmp_path_factory.mktemp("work")), story_corpora, vocab_size=400)


@pytest.fixture
def autodiff_products(monkeypatch):
  """Call it to make xlt.matmul's dense products plain `lax.dot_general`, differentiated by
  autodiff, for the rest of the test: the reference xlt's own backward passes must equal."""
  import jax

  from xlt import matmul

  def plain():
    monkeypatch.setattr(matmul, "_dense", lambda x, w, n, precision: jax.lax.dot_general(
        x, w, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ()))))
    monkeypatch.setattr(matmul, "_dense_t", lambda x, w, n, precision: jax.lax.dot_general(
        x, w, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(w.ndim - n, w.ndim))), ((), ()))))

  return plain
