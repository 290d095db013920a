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
each other); two single-core processes each keep theirs busy, so a grid ends sooner.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Callable

from xlt import runner
from xlt import results as results_lib
from xlt import workdir_lock
from xlt import workers as workers_lib
from xlt.experiments import numbers


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
  try:
    numbers.check(sub)  # a nonsense number at any point fails before the first point trains
  except ValueError as e:
    raise ValueError(f"grid point {point.get('name')!r}: {e}") from None
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
  with _lock(workdir) as workdir:
    for point, sub in zip(points, configs):
      print(f"=== grid point {point['name']}", flush=True)
      rows += runner.run(sub, os.path.join(workdir, point["name"]), progress=progress)
    results_lib.write(workdir, rows)
    metric = rows[0]["metric"] if rows else ""
    table = results_lib.table(rows, metric, c.name, sweep=bool(c.get("sweep")))
    results_lib.atomic_write(os.path.join(workdir, "table.md"), table)
  print(table)
  return rows


def _lock(workdir: str):
  """The grid workdir's lock (xlt.workdir_lock), except in a point worker: its parent holds it,
  and the worker locks its point's workdir (runner.run)."""
  if os.environ.get(workers_lib.PARENT_ENV, "").strip():
    return contextlib.nullcontext(workdir_lock.make(workdir))
  return workdir_lock.hold(workdir)


def run_in_workers(c, workdir: str, command: Callable[[str], list[str]], workers: int, only=None,
                   progress: bool = True, poll_s: float = 1.0) -> list[dict]:
  """Trains the grid's unfinished points `workers` at a time, each as the process `command(name)`
  pinned to its own cores (xlt.workers.run_pinned) with its output in <workdir>/logs/<name>.log;
  then gathers every point's results as `run` does.

  Every point's config is checked against its workdir before any starts. If a worker fails,
  no further point starts, the running ones finish, and workers.WorkerFailed names the failed
  points: the points that finished keep their results and a rerun resumes the rest (an
  interrupt or SIGTERM stops the workers; their points resume from their checkpoints)."""
  workers_lib.check_host("point workers", workers)  # before any claim
  points = select(list(c.grid), only)
  configs = [point_config(c, p) for p in points]
  with _lock(workdir) as workdir:
    todo = []
    for point, sub in zip(points, configs):
      point_dir = os.path.join(workdir, point["name"])
      os.makedirs(point_dir, exist_ok=True)
      runner.claim_workdir(sub, point_dir)  # a point of another config fails now, not in a worker
      if not os.path.exists(os.path.join(point_dir, "results.json")):
        todo.append((point["name"], command(point["name"])))
    workers_lib.run_pinned(todo, os.path.join(workdir, "logs"), workers, "point workers", poll_s)
    return run(c, workdir, progress=progress, only=only)
