"""Several processes, one run (multi-host): joining the processes, feeding each one's share
of a global batch, fetching sharded arrays to the host, and which process writes.

Every process runs the same `python -m xlt.main ...`; `initialize` joins them with
`jax.distributed.initialize`, from explicit flags (SLURM via launch/slurm.sh, or processes
started by hand) or from the environment jax recognises by itself (a Cloud TPU VM slice, an
`srun` job step). After that `jax.devices()` lists every process's devices and the mesh spans
them all; a process computes only on its own (addressable) devices.

The data pipeline is deterministic (batch i is a pure function of the seeds and i), so every
process knows the global batch without talking to the others; each reads only the rows its
devices hold (`local_rows`) and `global_batch` assembles the global array from those shares.
Only process 0 writes files (`is_main`); the others compute the same values and write none.
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np
from jax.experimental import multihost_utils

# The variables jax's SLURM detection reads (jax/_src/clusters/slurm_cluster.py).
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


def cluster_environment() -> str | None:
  """The multi-process environment jax's `initialize()` configures itself from, or None.

  SLURM counts only in a job step of several tasks (`srun -n 2 ...`): a one-task step is a plain
  single-process run. A Cloud TPU VM counts always (a one-host slice initialises as one process)."""
  if all(v in os.environ for v in _SLURM_VARS) and int(os.environ["SLURM_NTASKS"]) > 1:
    return "SLURM"
  try:  # jax's own test (TPU devices and libtpu present); private, so a failure means "no"
    from jax._src.cloud_tpu_init import running_in_cloud_tpu_vm
  except ImportError:
    return None
  return "Cloud TPU VM" if running_in_cloud_tpu_vm else None


def check_flags(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> bool:
  """True if the three flags are given (and valid), False if none is; ValueError otherwise."""
  given = {"--coordinator_address": coordinator_address, "--num_processes": num_processes,
           "--process_id": process_id}
  if all(v is None for v in given.values()):
    return False
  missing = [k for k, v in given.items() if v is None]
  if missing:
    raise ValueError(f"{', '.join(missing)} missing: --coordinator_address, --num_processes and --process_id "
                     f"go together (or give none of them to run as one process, or in a TPU VM / SLURM "
                     f"environment to have it detected)")
  m = re.fullmatch(r"(.+):(\d+)", coordinator_address)
  if not m or not 0 < int(m.group(2)) < 65536:
    raise ValueError(f"--coordinator_address must be host:port (e.g. node-1:12355), got {coordinator_address!r}")
  if num_processes < 1:
    raise ValueError(f"--num_processes must be >= 1, got {num_processes}")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"--process_id must be in 0..{num_processes - 1} (--num_processes={num_processes}), "
                     f"got {process_id}")
  return True


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Joins this process to the others, before anything touches a jax backend. With the three
  flags, exactly as they say; with none, from a detected cluster environment; otherwise it
  does nothing (one process, as always). Returns whether jax.distributed was initialised."""
  explicit = check_flags(coordinator_address, num_processes, process_id)
  if not explicit and cluster_environment() is None:
    return False
  # XLA:CPU needs a cross-process collectives backend; gloo is jax 0.10's default but was
  # "none" in older releases, where a CPU run would fail at its first cross-process psum.
  # (Only the CPU client reads it: harmless on GPU and TPU.)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if explicit:
    # "deactivate": with the flags given, jax's SLURM detection would still pick the devices
    # (one GPU per process, by SLURM_LOCALID), but slurm.sh's default is one process per node
    # seeing all its GPUs; with --per gpu it narrows CUDA_VISIBLE_DEVICES itself.
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               cluster_detection_method="deactivate")
  else:
    jax.distributed.initialize()
  return True


def is_main() -> bool:
  """Whether this process writes files and logs: process 0, or the only one. (Touches no
  backend when jax.distributed is not initialised, so tools without devices can ask.)"""
  return not jax.distributed.is_initialized() or jax.process_index() == 0


def multi_process() -> bool:
  return jax.process_count() > 1


def local_rows(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...], axis: int) -> np.ndarray:
  """The indices along `axis` of the rows this process's devices hold, in order: the rows its
  data pipeline reads. (All of them when `axis` is not split across processes.)"""
  spans = {(s[axis].start or 0, global_shape[axis] if s[axis].stop is None else s[axis].stop)
           for s in sharding.addressable_devices_indices_map(global_shape).values()}
  return np.concatenate([np.arange(a, b) for a, b in sorted(spans)])


def global_batch(local, shardings):
  """Global arrays from each process's share of a batch (the rows `local_rows` named); leaves
  that are not split across processes are the whole value on every process."""
  return jax.make_array_from_process_local_data(shardings, local)


def to_host(tree):
  """Numpy copies of a tree's arrays, also of arrays sharded across processes (gathered; a
  collective, so every process must call it in the same order)."""

  def one(x):
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

  return jax.tree.map(one, tree)


def barrier(name: str):
  """Waits until every process gets here (nothing to wait for in a single process)."""
  if multi_process():
    multihost_utils.sync_global_devices(name)
