"""The host's cores as several XLA:CPU devices, so a run on CPU is data-parallel over them.

One XLA:CPU device runs a small model's step as a chain of small ops, each spread over the
cores by XLA's thread pool; on a 2-core machine that pool kept the cores about 1.5 busy
(../shared/PERF.md), and tiny matmuls split over two threads gain little. With two devices
every step is two independent halves of the batch, one per core, and one all-reduce of the
gradients (in-process memory, cheap); an ensemble's members take such steps one after
another (xlt.ensemble, "map"). `benchmarks/compare.py --one_device` measures what the two
devices gain on each training shape and in decoding (docs/speed.md). The configs' default mesh (`mesh.data=-1`) spans the devices with no change to any config.

XLT_CPU_DEVICES sets the count (1 turns this off: one CPU device, as before). The default is
the number of cores this process may use, rounded down to a power of two (every batch size in
configs/ divides it) and at most 8 (more was never measured). An XLA_FLAGS that already sets
--xla_force_host_platform_device_count (the tests, the multi-host walkthrough) is left alone.
Collectives between these devices get a day's timeout (COLLECTIVE_TIMEOUT_FLAGS) unless XLA_FLAGS sets one.
Only the CPU backend reads the flag: on a GPU or TPU host, jax's devices are the accelerators.

Results of a data-parallel step equal the single-device step's to float rounding (the loss
and gradients are sums over halves of the batch, added in another order). XLT_CPU_DEVICES=1
reruns a result that was measured on one device as it was run.

XLT_CPU_CORES (comma-separated core ids) first pins the process to those cores, so the count
and XLA's thread pool follow them: a grid's point workers run so, each on its own cores (xlt.workers.run_pinned;
`worker_env` makes their environment).

`configure()` must run before jax is imported (`python -m xlt.main` and the benchmarks call it
first thing).
"""

from __future__ import annotations

import os

ENV = "XLT_CPU_DEVICES"
CORES_ENV = "XLT_CPU_CORES"
FLAG = "--xla_force_host_platform_device_count"
MAX_DEFAULT = 8
# XLA:CPU aborts the process when one device waits on an all-reduce longer than these (40 s by
# default): on a busy machine the OS may leave one device's thread unscheduled that long, and
# a long run died so. A collective between in-process devices cannot hang for other reasons.
COLLECTIVE_TIMEOUT_FLAGS = ("--xla_cpu_collective_call_terminate_timeout_seconds",
                            "--xla_cpu_collective_timeout_seconds")
COLLECTIVE_TIMEOUT_S = 86400


def usable_cores() -> int:
  return len(available_cores())


def default_count(cores: int) -> int:
  """The largest power of two <= min(cores, MAX_DEFAULT)."""
  n = 1
  while n * 2 <= min(cores, MAX_DEFAULT):
    n *= 2
  return n


def count(environ=os.environ) -> int:
  """How many CPU devices to make: $XLT_CPU_DEVICES, or `default_count` of the usable cores."""
  value = environ.get(ENV, "").strip()
  if not value:
    return default_count(usable_cores())
  if not value.isdigit() or int(value) < 1:
    raise ValueError(f"{ENV}={value!r}: expected a positive integer (1: one CPU device)")
  return int(value)


def parse_cores(value: str) -> set[int]:
  """The core ids of an XLT_CPU_CORES value ("0,1"); an error names what is wrong."""
  try:
    cores = {int(v) for v in value.split(",")}
  except ValueError:
    raise ValueError(f"{CORES_ENV}={value!r}: expected comma-separated core ids, e.g. 0,1") from None
  allowed = available_cores()
  if not cores <= allowed:
    raise ValueError(f"{CORES_ENV}={value!r}: cores {sorted(cores - allowed)} are not among this "
                     f"process's {sorted(allowed)}")
  return cores


def available_cores() -> set[int]:
  try:
    return set(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return set(range(os.cpu_count() or 1))


def worker_env(cores, environ=os.environ) -> dict[str, str]:
  """The environment of a child process pinned to `cores`: its own XLT_CPU_CORES, and XLA_FLAGS
  without a device count (this process's, set by `configure` or by hand, counts its cores, not
  the child's), so the child makes one device per core, or $XLT_CPU_DEVICES if that is set."""
  flags = " ".join(f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith(FLAG))
  return {**environ, CORES_ENV: ",".join(str(c) for c in sorted(cores)), "XLA_FLAGS": flags}


def configure(environ=os.environ) -> int | None:
  """Pins the process to $XLT_CPU_CORES if set; adds FLAG=count() to XLA_FLAGS in `environ`
  (unless XLA_FLAGS already has FLAG) and returns the count, or None when it left XLA_FLAGS
  alone. Call it before importing jax."""
  if environ.get(CORES_ENV, "").strip():
    if not hasattr(os, "sched_setaffinity"):
      raise ValueError(f"{CORES_ENV} pins a process to cores, which needs Linux")
    os.sched_setaffinity(0, parse_cores(environ[CORES_ENV]))
  flags = environ.get("XLA_FLAGS", "")
  for timeout_flag in COLLECTIVE_TIMEOUT_FLAGS:
    if timeout_flag not in flags:
      flags = f"{flags} {timeout_flag}={COLLECTIVE_TIMEOUT_S}".strip()
  environ["XLA_FLAGS"] = flags
  if FLAG in flags:
    return None
  n = count(environ)
  environ["XLA_FLAGS"] = f"{flags} {FLAG}={n}".strip()
  return n
