"""The structure measure as an experiment (configs/structure.py): xlt.structure's measure of
finished testbed or regime-map runs, requested by a config, so a study's config can ask for it
and its workdir holds the figures, resumes and is finished like any other run.

  python -m xlt.main --config=configs/structure.py --workdir=runs/structure \
      --config.runs="('runs/claims_study/depth_6',)"

Config: `runs` (finished testbed / regime-map workdirs, read only), `stages` (their fine-tune
stages to measure; () = every one each run has: finetune, or finetune_r<i> of a regime map),
`problems` (per set, in the swap curve) and `seeds` (the first N; 0: all), as the command's
flags. Nothing trains. Writes, per run and stage, structure_<run>_<stage>.json and .png (the
command's files) in this workdir, never in the runs measured; rows: each expert's edge ratio
per seed (role "task" / "language", condition "<run>/<stage>"); table.md the same means.
"""

from __future__ import annotations

import json
import os
import re

from xlt import experiments
from xlt import results as results_lib
from xlt import structure as structure_lib
from xlt.experiments import common as kind_lib

# what this kind is called (c.kind) and runs: the testbed's data, whose runs it measures (its
# rows are not recorded in results/: the measure's own files are, results/structure/)
KIND = kind_lib.Kind(name="structure", tasks={"arithmetic": None}, former_tasks={})  # new: no former task

EXPERTS = (("task expert", "task"), ("language expert", "language"))


def _stages(run: str, wanted) -> list[str]:
  if wanted:
    return list(wanted)
  found = sorted((d for d in os.listdir(run) if re.fullmatch(r"finetune(_r\d+)?", d)),
                 key=lambda d: int(d.rpartition("_r")[2]) if "_r" in d else -1)
  if not found:
    raise ValueError(f"{run}: no fine-tune stage (finetune, finetune_r<i>): not a finished testbed run")
  return found


def prepare(c, workdir: str) -> list[tuple[str, str, str]]:
  """[(run, its label, stage)] to measure; every run checked (a testbed run of xlt's own base)
  before anything is measured."""
  del workdir
  if not c.runs:
    raise ValueError("runs: name at least one finished testbed or regime-map workdir")
  out, labels = [], {}
  for run in c.runs:
    path = os.path.join(run, "config.json")
    if not os.path.isfile(path):
      raise ValueError(f"{run} holds no config.json: not an xlt run")
    with open(path, encoding="utf-8") as f:
      name, task = experiments.resolve(json.load(f))
    if name not in ("testbed", "testbed.regimes") or task != c.task:
      raise ValueError(f"{run}: a {name!r} run of task {task!r}; the structure measure reads testbed runs of {c.task!r}")
    label = os.path.basename(os.path.normpath(run))
    if label in labels:
      raise ValueError(f"runs {labels[label]} and {run} share the name {label!r}: their files would collide")
    labels[label] = run
    out += [(run, label, stage) for stage in _stages(run, c.stages)]
  return out


def stages(c, prep, trained):
  """None: the runs measured are trained already."""
  del c, prep, trained
  return iter(())


def outputs(c, prep, trained, workdir: str):
  """Measures each (run, stage), writes its JSON and figure, and returns the edge-ratio rows."""
  del trained
  rows, measured, lines = [], [], ["| run / stage | task expert edge ratio | language expert edge ratio |", "|---|---|---|"]
  for run, label, stage in prep:
    result = structure_lib.measure(run, stage, c.problems, c.seeds)
    stem = os.path.join(workdir, f"structure_{label}_{stage}")
    results_lib.atomic_write(stem + ".json", json.dumps(result, indent=1))
    structure_lib.plot(result, stem + ".png")
    ratios = result["edge_ratio"]
    measured.append({"run": run, "stage": stage, "seeds": result["seeds"]})
    rows += [results_lib.make_row(experiment=c.name, task=c.task, language="both", role=role,
                                  condition=f"{label}/{stage}", metric="edge_ratio",
                                  values=ratios[name]["values"], samples=None) for name, role in EXPERTS]
    lines.append(f"| {label}/{stage} | " + " | ".join(f"{ratios[n]['mean']:.2f}" for n, _ in EXPERTS) + " |")
  return rows, "\n".join(lines) + "\n", {"measured": measured}
