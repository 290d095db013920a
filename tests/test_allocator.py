"""The malloc preloaded by `python -m xlt.main` changes speed, never results."""

import os
import subprocess
import sys

import pytest

from conftest import child_env
from xlt import allocator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A few training steps of a tiny model; prints the allocator in use and a hash of the params.
SCRIPT = """
from xlt import allocator
allocator.preload()
import hashlib, jax, numpy as np, ml_collections
from configs import common
from xlt import model, sharding, train
cfg = model.Config(vocab_size=16, block_size=8, num_layers=2, num_heads=2, d_model=16)
c = common.opt(common.train(steps=10), warmup_steps=2)
tx = train.make_optimizer(c)
mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
abstract = jax.eval_shape(lambda: train.init_state(cfg, tx, [0]))
step, st_sh, _ = train.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract)
state = jax.jit(lambda: train.init_state(cfg, tx, [0]), out_shardings=st_sh)()
rng = np.random.default_rng(0)
for _ in range(5):
  batch = {"tokens": rng.integers(0, 16, (1, 8, 8)).astype(np.int32), "loss_mask": np.ones((1, 8, 7), np.float32)}
  state, _ = step(state, batch)
h = hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(state["params"]))).hexdigest()
print(allocator.in_use(), h)
"""


def _run(choice):
  env = child_env(XLT_ALLOCATOR=choice, PYTHONPATH=REPO)
  env.pop("LD_PRELOAD", None)
  out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout.split()


def test_preloaded_malloc_gives_bit_identical_training():
  if allocator.library("auto") is None:
    pytest.skip("no faster malloc on this machine")
  fast, fast_hash = _run("auto")
  system, system_hash = _run("system")
  assert system == "system" and fast in ("mimalloc", "tcmalloc")
  assert fast_hash == system_hash


def test_mimalloc_purges_with_madv_free_unless_told():
  """xlt's mimalloc returns freed pages with MADV_FREE (MIMALLOC_PURGE_DECOMMITS=0); a value the
  user set is kept."""
  if allocator._mimalloc() is None:
    pytest.skip("no mimalloc on this machine")
  script = "from xlt import allocator; allocator.preload(); import os; " \
           "print(allocator.in_use(), os.environ.get('MIMALLOC_PURGE_DECOMMITS'))"
  for given, expected in ((None, "0"), ("1", "1")):
    env = child_env(XLT_ALLOCATOR="mimalloc", PYTHONPATH=REPO)
    env.pop("LD_PRELOAD", None)
    env.pop("MIMALLOC_PURGE_DECOMMITS", None)
    if given is not None:
      env["MIMALLOC_PURGE_DECOMMITS"] = given
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["mimalloc", expected]


def test_bad_allocator_choice():
  with pytest.raises(ValueError, match="XLT_ALLOCATOR"):
    allocator.library("jemalloc")
  assert allocator.library("system") is None
