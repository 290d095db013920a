"""The cores as XLA:CPU devices (xlt.cpu_devices), and evaluation spread over a mesh's devices."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from xlt import cpu_devices, ensemble_decode, perplexity, sharding
from xlt import model as model_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("cores,want", [(1, 1), (2, 2), (3, 2), (4, 4), (6, 4), (8, 8), (64, 8)])
def test_default_count_is_a_power_of_two_of_the_cores(cores, want):
  assert cpu_devices.default_count(cores) == want


def test_configure_sets_the_count_once_and_keeps_a_given_flag():
  env = {"XLT_CPU_DEVICES": "3", "XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
  assert cpu_devices.configure(env) == 3
  timeouts = " ".join(f"{f}=86400" for f in cpu_devices.COLLECTIVE_TIMEOUT_FLAGS)
  assert env["XLA_FLAGS"] == f"--xla_cpu_enable_fast_math=false {timeouts} --xla_force_host_platform_device_count=3"
  assert cpu_devices.configure(env) is None  # already set: left alone
  assert env["XLA_FLAGS"].count("timeout") == 2
  short = {"XLA_FLAGS": "--xla_cpu_collective_timeout_seconds=5"}
  cpu_devices.configure(short)
  assert "--xla_cpu_collective_timeout_seconds=5" in short["XLA_FLAGS"] and short["XLA_FLAGS"].count("timeout") == 2
  given = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "XLT_CPU_DEVICES": "2"}
  assert cpu_devices.configure(given) is None and "device_count=8 " in given["XLA_FLAGS"]
  empty = {}
  assert cpu_devices.configure(empty) == cpu_devices.default_count(cpu_devices.usable_cores())
  for bad in ("0", "-2", "two", "1.5"):
    with pytest.raises(ValueError, match="XLT_CPU_DEVICES"):
      cpu_devices.configure({"XLT_CPU_DEVICES": bad})


def test_a_fresh_process_gets_the_devices():
  code = "from xlt import cpu_devices; cpu_devices.configure(); import jax; print(jax.device_count())"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  for n in ("1", "3"):
    out = subprocess.run([sys.executable, "-c", code], env={**env, "XLT_CPU_DEVICES": n, "JAX_PLATFORMS": "cpu"},
                         cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == n  # XLA accepts the collective timeout flags, too


def test_cores_env_pins_the_process_and_counts_its_cores():
  code = ("import os; from xlt import cpu_devices; n = cpu_devices.configure(); import jax; "
          "print(sorted(os.sched_getaffinity(0)), n, jax.device_count())")
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XLT_CPU_DEVICES")}
  core = max(os.sched_getaffinity(0))
  out = subprocess.run([sys.executable, "-c", code], env={**env, "XLT_CPU_CORES": str(core), "JAX_PLATFORMS": "cpu"},
                       cwd=REPO, capture_output=True, text=True, check=True)
  assert out.stdout.split("\n")[-2] == f"[{core}] 1 1"
  for bad, why in (("zero", "comma-separated core ids"), ("100000", "not among this process's")):
    with pytest.raises(ValueError, match=why):
      cpu_devices.configure({"XLT_CPU_CORES": bad})


def test_worker_env_pins_and_drops_the_parents_device_count():
  parent = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8", "HOME": "/h",
            "XLT_CPU_DEVICES": "1"}
  env = cpu_devices.worker_env([3, 2], parent)
  assert env == {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "HOME": "/h", "XLT_CPU_DEVICES": "1",
                 "XLT_CPU_CORES": "2,3"}
  assert parent["XLA_FLAGS"].endswith("=8")  # the parent's own environment is untouched


CFG = model_lib.Config(vocab_size=40, block_size=32, num_layers=2, num_heads=2, d_model=16)


@pytest.fixture(scope="module")
def stacked():
  keys = jax.random.split(jax.random.key(0), 2)
  return jax.vmap(lambda k: model_lib.init_params(CFG, k))(keys)  # an ensemble of two


@pytest.mark.parametrize("n_devices", [2, 4])
def test_decoding_and_perplexity_spread_over_the_mesh_equal_one_device(stacked, n_devices):
  assert jax.device_count() == 8, "tests/conftest.py sets 8 fake CPU devices"
  rng = np.random.default_rng(0)
  prompts = [[rng.integers(3, 40, rng.integers(3, 9)).tolist() for _ in range(7)] for _ in range(2)]
  mesh = sharding.make_mesh({"data": -1, "devices": n_devices})
  spread_params = jax.device_put(stacked, sharding.replicated(mesh))
  one = ensemble_decode.decode_answers(CFG, stacked, prompts, max_new=6, eos_id=2, batch=3)
  many = ensemble_decode.decode_answers(CFG, spread_params, prompts, max_new=6, eos_id=2, batch=3)
  assert one == many and len(one[0]) == 7
  tokens = rng.integers(3, 40, (5, 12)).astype(np.int32)
  mask = (rng.random((5, 11)) < 0.7).astype(np.float32)
  a, b = (perplexity.perplexity(CFG, p, tokens, mask, batch=3) for p in (stacked, spread_params))
  np.testing.assert_allclose(a["nll_sum"], b["nll_sum"], rtol=1e-5)
  assert (a["tokens"] == b["tokens"]).all() and a["tokens"][0] == mask.sum()


def test_spread_splits_rows_and_checks_them(stacked):
  mesh = sharding.make_mesh({"data": -1, "devices": 4})
  params = jax.device_put(stacked, sharding.replicated(mesh))
  x = np.arange(2 * 8 * 3).reshape(2, 8, 3)
  y = sharding.spread(x, params, 1)
  assert len(y.sharding.device_set) == 4 and y.addressable_shards[0].data.shape == (2, 2, 3)
  np.testing.assert_array_equal(np.asarray(y), x)
  assert sharding.spread(x, stacked, 1) is x  # one device: left on the host
  with pytest.raises(ValueError, match="does not split over 4 devices"):
    sharding.spread(x[:, :6], params, 1)
  assert sharding.devices_of(params) == 4 and sharding.round_up(7, 4) == 8


def test_cpu_devices_caps_a_cpu_mesh_only():
  """mesh.cpu_devices: the fine-tuning kind's one CPU device (configs/finetune.py) leaves an
  accelerator's mesh whole; it composes with mesh.devices and the axes' sizes."""
  assert len(jax.devices()) > 2  # the tests' fake CPU devices
  assert sharding.make_mesh({"data": -1, "cpu_devices": 1}).devices.size == 1
  two = sharding.make_mesh({"data": -1, "devices": 4, "cpu_devices": 2})
  assert two.devices.size == 2 and list(two.devices.flat) == jax.devices()[:2]
  assert sharding.make_mesh({"data": -1, "cpu_devices": -1}).devices.size == len(jax.devices())

  class Fake:  # what make_mesh reads of a device before the mesh is built
    def __init__(self, platform, process_index=0):
      self.platform, self.process_index = platform, process_index

  with pytest.raises(ValueError, match="needs 1 devices but 3 are in use"):  # an accelerator's: all kept
    sharding.make_mesh({"data": 1, "cpu_devices": 1}, devices=[Fake("gpu") for _ in range(3)])
  # several processes (multi-host): each keeps its own first cpu_devices
  hosts = [Fake("cpu", p) for p in (0, 0, 0, 1, 1, 1)]
  with pytest.raises(ValueError, match="needs 3 devices but 4 are in use"):
    sharding.make_mesh({"data": 3, "cpu_devices": 2}, devices=hosts)
  with pytest.raises(ValueError, match="needs 2 devices but 1 are in use"):
    sharding.make_mesh({"data": 2, "cpu_devices": 1})
