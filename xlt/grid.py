"""A grid: several experiments (language pairs, sample sizes) run one after another from
one config, each in its own sub-workdir, then gathered into one results file and table.

`c.grid` is a list of points; a point is a dict with a `name` and dotted config
overrides, e.g. {"name": "standard+roman", "mixture.source": "standard", ...}. A point
whose sub-workdir already has results is not trained again, so a crashed grid resumes
where it stopped (and the point it was in resumes from its last checkpoint).
Inside a point, all conditions and seeds train together as one ensemble.

On a CPU, `run_in_workers` trains several points at once, each in its own process pinned to
its own cores (`python -m xlt.main ... --point_workers=2`). One process keeps a 2-core CPU only
partly busy with a small model's step (XLA's thread pool and the devices' rendezvous wait on
each other); two single-core processes each keep theirs busy. Two graph points (9 members, 400
steps) took 504 s so against 674 s one after another (README, "Run an experiment").
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

from xlt import cpu_devices, experiment, runner
from xlt import results as results_lib


class PointFailed(RuntimeError):
  """A point's worker process ended with an error (its log says why)."""


def point_config(c, point: dict):
  sub = copy.deepcopy(c)
  with sub.unlocked():
    del sub["grid"]
    for key, value in point.items():
      if key == "name":
        sub.name = f"{c.name}/{value}"
        continue
      node, *path = key.split(".")
      target = sub
      for part in [node] + path[:-1]:
        if part not in target:
          raise ValueError(f"grid point {point.get('name')!r}: unknown config field {key!r}")
        target = target[part]
      last = path[-1] if path else node
      if path and last not in target:
        raise ValueError(f"grid point {point.get('name')!r}: unknown config field {key!r}")
      target[last] = value
  return sub


def select(points: list[dict], only=None) -> list[dict]:
  """The grid's points, or those named in `only` (in the grid's order): to split a grid over
  machines, or rerun one point. A name the grid lacks is an error, not an empty run."""
  names = [p["name"] for p in points]
  if len(set(names)) != len(names):
    raise ValueError(f"grid point names must be unique: {names}")
  if only is None:
    return points
  wanted = set(only)
  unknown = sorted(wanted - set(names))
  if unknown or not wanted:
    raise ValueError(f"grid points {unknown or list(only)} are not in the grid; its points: {names}")
  return [p for p in points if p["name"] in wanted]


def run(c, workdir: str, progress: bool = True, only=None) -> list[dict]:
  """Runs the grid's points (or those named in `only`) and writes their results and table."""
  points = select(list(c.grid), only)
  configs = [point_config(c, p) for p in points]  # fail on a bad point before any training
  rows = []
  for point, sub in zip(points, configs):
    print(f"=== grid point {point['name']}", flush=True)
    rows += experiment.run(sub, os.path.join(workdir, point["name"]), progress=progress)
  results_lib.write(workdir, rows)
  metric = rows[0]["metric"] if rows else ""
  table = results_lib.table(rows, metric, c.name, sweep=bool(c.get("sweep")))
  results_lib.atomic_write(os.path.join(workdir, "table.md"), table)
  print(table)
  return rows


def worker_cores(workers: int, cores: Sequence[int]) -> list[list[int]]:
  """`cores` split into `workers` contiguous sets, as even as they divide."""
  cores = sorted(cores)
  if not 1 <= workers <= len(cores):
    raise ValueError(f"{workers} point workers on {len(cores)} cores: each worker needs a core of its own "
                     f"(1 <= point_workers <= {len(cores)})")
  size, extra = divmod(len(cores), workers)
  sets, start = [], 0
  for i in range(workers):
    end = start + size + (i < extra)
    sets.append(cores[start:end])
    start = end
  return sets


def run_in_workers(c, workdir: str, command: Callable[[str], list[str]], workers: int, only=None,
                   progress: bool = True, poll_s: float = 1.0) -> list[dict]:
  """Trains the grid's unfinished points `workers` at a time, each as the process `command(name)`
  pinned to its own cores (xlt.cpu_devices.worker_env) with its output in
  <workdir>/logs/<name>.log; then gathers every point's results as `run` does.

  Every point's config is checked against its workdir before any starts. If a worker fails,
  no further point starts, the running ones finish, and PointFailed names the failed points:
  the points that finished keep their results and a rerun resumes the rest. An interrupt
  stops the workers, whose points resume from their checkpoints on a rerun; so does SIGTERM
  (a scheduler's preemption), which would otherwise end this process and leave them running."""
  import jax  # only to tell the platform: the workers split CPU cores
  if jax.default_backend() != "cpu":
    raise ValueError(f"point workers split a CPU's cores; this host computes on {jax.default_backend()} "
                     "(run the points one after another, or on several machines with --points)")
  if jax.process_count() > 1:
    raise ValueError("point workers start their own processes; run them from one process")
  slots = worker_cores(workers, cpu_devices.available_cores())
  points = select(list(c.grid), only)
  todo = []
  for point, sub in zip(points, [point_config(c, p) for p in points]):
    point_dir = os.path.join(workdir, point["name"])
    os.makedirs(point_dir, exist_ok=True)
    runner.claim_workdir(sub, point_dir)  # a point of another config fails now, not in a worker
    if not os.path.exists(os.path.join(point_dir, "results.json")):
      todo.append(point["name"])
  logs = os.path.join(workdir, "logs")
  os.makedirs(logs, exist_ok=True)
  running, failed = {}, []

  def stop(signum, frame):
    raise SystemExit(128 + signum)  # runs the `finally` below

  on_term = signal.signal(signal.SIGTERM, stop)
  try:
    while todo or running:
      while todo and slots and not failed:
        name, cores = todo.pop(0), slots.pop(0)
        log_path = os.path.join(logs, name.replace(os.sep, "_") + ".log")
        log = open(log_path, "ab")
        proc = subprocess.Popen(command(name), stdout=log, stderr=subprocess.STDOUT,
                                env=cpu_devices.worker_env(cores))
        running[proc] = (name, cores, time.time(), log, log_path)
        print(f"=== grid point {name}: started on core(s) {cores}, output in {log_path}", flush=True)
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
          print(f"=== grid point {name} failed; the end of its log:\n" + "\n".join(tail),
                file=sys.stderr, flush=True)
        else:
          print(f"=== grid point {name}: finished in {(time.time() - t0) / 60:.1f} min", flush=True)
  finally:
    signal.signal(signal.SIGTERM, on_term)
    for proc in running:  # an interrupt (or a bug here): leave no worker behind
      proc.terminate()
    for proc in running:
      proc.wait()
  if failed:
    raise PointFailed(f"grid point(s) failed: {'; '.join(failed)}; finished points keep their results, "
                      "and the same command resumes the others")
  return run(c, workdir, progress=progress, only=only)
