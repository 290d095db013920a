"""A grid: several experiments (language pairs, sample sizes) run one after another from
one config, each in its own sub-workdir, then gathered into one results file and table.

`c.grid` is a list of points; a point is a dict with a `name` and dotted config
overrides, e.g. {"name": "standard+roman", "mixture.source": "standard", ...}. A point
whose sub-workdir already has results is not trained again, so a crashed grid resumes
where it stopped (and the point it was in resumes from its last checkpoint).
Inside a point, all conditions and seeds train together as one ensemble.
"""

from __future__ import annotations

import copy
import os

from xlt import experiment
from xlt import results as results_lib


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
