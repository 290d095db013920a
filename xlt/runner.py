"""The run of every experiment: `run(c, workdir)` claims or resumes the workdir, has the kind
`c.kind` names (xlt.experiments) prepare the data of `c.task`, trains its stages, has it test
them, and writes the outputs that mark the workdir finished. main.py, grid.py, the tests, the notebooks
and the benchmarks all start experiments here.

A kind is a module of xlt.experiments that declares its name and the data tasks it runs
(`KIND`, a common.Kind; xlt.experiments.kinds() finds it by that) and has three functions; the runner calls them in order
and owns everything between them (the workdir, training and selection, timing, the files):

  prepare(c, workdir) -> prep
      Checks the config, plans the members and builds the data; anything the later parts
      need goes in `prep` (the kind's own object). A config that could not finish fails
      here, before anything trains.
  stages(c, prep, trained) -> iterator of common.Stage
      The ensembles to train, in order. The runner trains each one it is given (keeping
      every member's best-validation parameters, `train_and_select`) and stores the result
      as `trained[stage.name]` (a common.Trained) before asking for the next, so a later
      stage can start from an earlier one (the testbed's base -> fine-tunes).
  outputs(c, prep, trained, workdir) -> (rows, table_md, summary)
      Tests the trained parameters, writes the kind's own files (predictions, plots,
      samples) and returns the results rows, table.md's text and summary.json's dict.

The kinds and their tasks: xlt.experiments' docstring.

A finished workdir (it holds results.json) returns its rows without training or testing; an
unfinished one resumes every stage from its checkpoints, so a killed run started again with
the same command ends as the uninterrupted one would. `stop_after` ends a run early, as a
preemption would: it returns no rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Sequence

from xlt import checkpoint as ckpt_lib
from xlt import experiments
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt import workdir_lock
from xlt.experiments import common, numbers


def run(c, workdir: str, *, progress: bool = True, stop_after: int | None = None, mesh=None) -> list[dict]:
  """Runs the experiment `c` describes in `workdir`; returns its results rows (empty if stopped
  early by `stop_after`, which applies to each training stage). `mesh` overrides the one
  the config describes (a test on one device). A run that fails before anything trained
  (a bad data file, a config the kind refuses) releases the workdir it claimed
  (`release_claim`), so the corrected command can use it. Another process running in
  `workdir` meanwhile is refused (xlt.workdir_lock), and so is a workdir that cannot be one."""
  c = experiments.with_kind(c)  # an unknown kind or task fails before anything is written
  numbers.check(c)  # so does a nonsense number (a negative or NaN learning rate, ...)
  kind = experiments.kind(c)
  created = bool(str(workdir).strip()) and not os.path.lexists(os.path.abspath(workdir))
  with workdir_lock.hold(workdir) as workdir:  # one run per workdir: another process is refused
    fresh = claim_workdir(c, workdir, kind) == "new"
    rows = finished_rows(workdir)
    if rows is not None:
      return rows
    try:
      return _run_claimed(c, kind, workdir, progress=progress, stop_after=stop_after, mesh=mesh)
    except BaseException:
      if fresh:
        release_claim(workdir, created)
      raise


def _run_claimed(c, kind, workdir: str, *, progress, stop_after, mesh) -> list[dict]:
  t0 = time.time()
  prep = kind.prepare(c, workdir)
  trained: dict[str, common.Trained] = {}
  for stage in kind.stages(c, prep, trained):
    params, out = train_stage(c, stage, workdir, stop_after=stop_after, progress=progress, mesh=mesh)
    if params is None:
      return []
    trained[stage.name] = common.Trained(params, out, stage, time.time() - t0)
  rows, table_md, summary = kind.outputs(c, prep, trained, workdir)
  summary.setdefault("wall_s", time.time() - t0)
  write_outputs(workdir, rows, table_md, summary)
  print(table_md)
  print(json.dumps({k: v for k, v in summary.items() if k == "wall_s" or isinstance(v, (int, float, str))},
                   default=float))
  return rows


def trained_anything(workdir: str) -> bool:
  """Whether a run wrote anything that training produced in `workdir`: a checkpoint step
  (a folder in some stage's ckpt/) or best parameters."""
  for root, dirs, files in os.walk(workdir):
    if os.path.basename(root) == "ckpt" and dirs:
      return True
    if "best_params.npz" in files:
      return True
  return False


def release_claim(workdir: str, created: bool):
  """Undoes the claim of a run that failed before anything trained: removes the config.json
  it recorded (and the workdir, when the run made it and it holds nothing else), so the
  corrected command is not refused as "another config"."""
  if trained_anything(workdir):
    return
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(workdir, "config.json"))
  if created:
    workdir_lock.release(workdir)  # its file too: the process is giving the workdir up
    for root, _, _ in os.walk(workdir, topdown=False):  # empty stage folders, then the workdir
      if not os.listdir(root):
        os.rmdir(root)


def train_stage(c, stage: common.Stage, workdir: str, *, stop_after=None, progress=True, mesh=None):
  """Trains one stage in its folder; returns (params, the loop's output), params None if the
  run stopped early."""
  where = workdir if stage.subdir == "" else os.path.join(workdir, stage.subdir or stage.name)
  config = stage.config if stage.config is not None else c
  if stage.val_score is None:
    out = loop_lib.train_ensemble(config, stage.model, stage.members, None, where, tx=stage.tx, mesh=mesh,
                                  stop_after=stop_after, progress=progress, init_params=stage.init_params)
    return (out["state"]["params"] if out["finished"] else None), out
  return train_and_select(config, stage.model, stage.members, stage.val_score, where, init_params=stage.init_params,
                          tx=stage.tx, mesh=mesh, stop_after=stop_after, progress=progress)


def train_and_select(c, model_cfg: model_lib.Config, members: Sequence[loop_lib.Member],
                     val_score: common.ValScore, workdir: str, *, init_params=None, tx=None, mesh=None,
                     stop_after: int | None = None, progress: bool = True):
  """Trains `members` as one ensemble (`loop.train_ensemble`) and selects, per member, the
  parameters of its best validation score: those are the models a kind tests, because a
  member's score can dip between its best evaluation and the one that stops it.

  `val_score(params, ids) -> scores` (higher is better) scores the stacked params of the
  members `ids`; each call also records improved members in workdir/best_params.npz
  (`checkpoint.BestParams`), so a resumed or re-run workdir selects the same models.
  `init_params` (stacked, one model per member) fine-tunes instead of training from scratch.

  Returns (best params, stacked, or None if the run has not finished, e.g. `stop_after`;
  the loop's output dict, with "best_steps": each member's step of its best score, and
  "best_val": that score, the number a recipe is chosen by, never the test score).
  """
  best = ckpt_lib.BestParams(os.path.join(workdir, "best_params.npz"), len(members))

  def evaluate(params, ids):
    scores = val_score(params, ids)
    best.update(params, scores, ids)
    return scores

  out = loop_lib.train_ensemble(c, model_cfg, members, evaluate, workdir, tx=tx, mesh=mesh,
                                stop_after=stop_after, progress=progress,
                                init_params=init_params)
  out["best_steps"] = loop_lib.best_steps(out["history"], out["stopped_at"])
  out["best_val"] = [max(s for _, s in h) if h else None for h in out["history"]]
  if not out["finished"]:
    return None, out
  return best.params(out["state"]["params"]), out


# Config fields that may differ between runs into one workdir: how often to log and save, and
# how the devices are laid out (which moves results by float rounding only).
MAY_CHANGE_ON_RESUME = ("train.log_every", "train.checkpoint_every", "mesh.")


def claim_workdir(c, workdir: str, kind=None) -> str:
  """Records the config in <workdir>/config.json, or checks it against the one recorded there;
  returns "new" (recorded now), "same" or "added".

  A workdir holds one experiment: its checkpoints resume and its results are reused when the
  command is run again. Run again with another recipe (say `--config.train.steps`), it would
  silently continue or report the old one; so a config that differs from the recorded one in
  a field that changes results is an error naming the fields. (A workdir without a
  config.json gets this run's.) A kind with `adds_recipes(recorded, c, changes)` may accept
  a config that only adds recipes, or on an unfinished workdir changes only outputs never
  written ("added"): the finished stages are kept, the new ones trained, and the outputs written again (the finished mark, results.json, is removed first,
  then the new config recorded)."""
  if "task" in c or "kind" in c:  # an experiment's: recorded with its kind written out
    c = experiments.with_kind(c)
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    results_lib.atomic_write(path, json.dumps(_as_json(c), indent=1, sort_keys=True))
    return "new"
  with open(path) as f:
    recorded = json.load(f)
  changes = {k: v for k, v in common.config_changes(recorded, c).items()
             if not any(k == m or (m.endswith(".") and k.startswith(m)) for m in MAY_CHANGE_ON_RESUME)}
  if not changes:
    return "same"
  finished = os.path.exists(os.path.join(workdir, "results.json"))
  if kind is not None and hasattr(kind, "adds_recipes") and kind.adds_recipes(recorded, c, changes, finished):
    for name in ("results.json", "results.csv"):
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(workdir, name))
    results_lib.atomic_write(path, json.dumps(_as_json(c), indent=1, sort_keys=True))
    print(f"{workdir}: the config adds recipes ({', '.join(sorted(changes))}): the finished stages are kept, "
          "the new ones train", flush=True)
    return "added"
  diff = sorted(changes, key=lambda k: (common.UNSET in changes[k], k))  # changed values before added fields
  shown = "; ".join(f"{k}: {changes[k][0]!r} there, {changes[k][1]!r} now" for k in diff[:8])
  raise ValueError(f"{workdir} holds an experiment run with another config ({shown}"
                   f"{'; ...' if len(diff) > 8 else ''}): use a fresh workdir (its recorded config is "
                   f"{path})")


def _as_json(c) -> dict:
  return json.loads(json.dumps(c.to_dict(), default=repr))


def open_workdir(c, workdir: str, kind=None) -> tuple[str, list[dict] | None]:
  """The workdir as an absolute path, created and claimed for `c` (`claim_workdir`), and the
  rows of the experiment it finished earlier, or None."""
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  claim_workdir(c, workdir, kind)
  return workdir, finished_rows(workdir)


def finished_rows(workdir: str) -> list[dict] | None:
  """The results rows of a workdir whose experiment finished (it holds results.json; says so
  on stdout), or None."""
  done = os.path.join(workdir, "results.json")
  if not os.path.exists(done):
    return None
  print(f"{workdir}: finished earlier, reusing {done}")
  with open(done) as f:
    return json.load(f)


def write_outputs(workdir: str, rows: list[dict], table_md: str, summary: dict):
  """Writes table.md and summary.json, then results.json/.csv: last, because their presence
  marks the experiment finished (`finished_rows`), so a crash before it leaves none."""
  results_lib.atomic_write(os.path.join(workdir, "table.md"), table_md)
  results_lib.atomic_write(os.path.join(workdir, "summary.json"),
                           json.dumps(summary, indent=1, default=float))
  results_lib.write(workdir, rows)
