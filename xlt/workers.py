"""Pinned worker processes: several `python -m xlt.main` jobs at once on one CPU host, each
pinned to cores of its own (xlt.cpu_devices.worker_env), with its output in a log file.

Why: one process keeps a 2-core CPU only partly busy with a small model's step (XLA's thread
pool and the devices' rendezvous wait on each other); two single-core processes each keep
theirs busy. A grid's points use it (`--point_workers`, xlt.grid).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Sequence

from xlt import cpu_devices


PARENT_ENV = "XLT_PARENT_PID"


def die_with_parent(environ=os.environ):
  """In a worker (its environment names the parent): asks the kernel for SIGTERM when the
  parent dies (Linux), so a SIGKILLed parent, which runs no handler, leaves no orphan training
  beside the workers a rerun starts. Call it first thing (`python -m xlt.main` does). The
  worker calls it itself: a preexec_fn would run Python in a fork of jax's threaded process."""
  parent = environ.get(PARENT_ENV, "").strip()
  if not parent or sys.platform != "linux":
    return
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    return
  if os.getppid() != int(parent):  # the parent died before the request
    sys.exit(f"xlt: worker of process {parent}, which has ended")


class WorkerFailed(RuntimeError):
  """A worker process ended with an error (its log says why)."""


def check_host(what: str, workers: int):
  """`workers` workers split a CPU's cores, a core or more each, from one process: anything
  else is an error naming `what` (before the caller writes anything)."""
  import jax  # only to tell the platform
  if jax.default_backend() != "cpu":
    raise ValueError(f"{what} split a CPU's cores; this host computes on {jax.default_backend()} "
                     "(run without them)")
  if jax.process_count() > 1:
    raise ValueError(f"{what} start their own processes; run them from one process")
  worker_cores(workers, cpu_devices.available_cores(), what)


def worker_cores(workers: int, cores: Sequence[int], what: str = "workers") -> list[list[int]]:
  """`cores` split into `workers` contiguous sets, as even as they divide."""
  cores = sorted(cores)
  if not 1 <= workers <= len(cores):
    raise ValueError(f"{workers} {what} on {len(cores)} cores: each worker needs a core of its own "
                     f"(1 <= {what.replace(' ', '_')} <= {len(cores)})")
  size, extra = divmod(len(cores), workers)
  sets, start = [], 0
  for i in range(workers):
    end = start + size + (i < extra)
    sets.append(cores[start:end])
    start = end
  return sets


def run_pinned(jobs: Sequence[tuple[str, list[str]]], log_dir: str, workers: int, what: str = "workers",
               poll_s: float = 1.0):
  """Runs the commands of `jobs` ((name, argv) pairs, in order) `workers` at a time, each pinned
  to its own share of this process's cores, with stdout and stderr appended to
  <log_dir>/<name>.log.

  If a job fails, no further job starts, the running ones finish, and WorkerFailed names the
  failed jobs and their logs (the end of each failed log is printed). An interrupt stops the
  workers, and so does SIGTERM (a scheduler's preemption), which would otherwise end this
  process and leave them running."""
  slots = worker_cores(workers, cpu_devices.available_cores(), what)
  todo = list(jobs)
  os.makedirs(log_dir, exist_ok=True)
  running, failed, stopped = {}, [], []

  def stop(signum, frame):
    # noted, and acted on between polls: an exception raised here could land inside a Popen
    # call holding its lock, which the `finally` below would then wait on forever
    stopped.append(signum)

  on_term = signal.signal(signal.SIGTERM, stop)
  try:
    while (todo or running) and not stopped:
      while todo and slots and not failed and not stopped:
        (name, argv), cores = todo.pop(0), slots.pop(0)
        log_path = os.path.join(log_dir, name.replace(os.sep, "_") + ".log")
        log = open(log_path, "ab")
        env = {**cpu_devices.worker_env(cores), PARENT_ENV: str(os.getpid())}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        running[proc] = (name, cores, time.time(), log, log_path)
        print(f"=== {name}: started on core(s) {cores}, output in {log_path}", flush=True)
      if not running:
        break
      time.sleep(poll_s)
      for proc in [p for p in running if p.poll() is not None]:
        name, cores, t0, log, log_path = running.pop(proc)
        log.close()
        slots.append(cores)
        if proc.returncode:
          failed.append(f"{name} (exit {proc.returncode}, see {log_path})")
          with open(log_path, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace").replace("\r", "\n").splitlines()[-15:]
          print(f"=== {name} failed; the end of its log:\n" + "\n".join(tail), file=sys.stderr, flush=True)
        else:
          print(f"=== {name}: finished in {(time.time() - t0) / 60:.1f} min", flush=True)
  finally:
    signal.signal(signal.SIGTERM, on_term)
    for proc in running:  # an interrupt (or a bug here): leave no worker behind
      proc.terminate()
    for proc in running:
      proc.wait()
  if stopped:
    raise SystemExit(128 + stopped[0])
  if failed:
    raise WorkerFailed(f"{what}: {'; '.join(failed)} failed; what finished keeps its results, and the "
                       "same command resumes the rest")
