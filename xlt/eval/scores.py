"""lm-eval task scores of models held in memory, for the kinds that write models (finetune,
the text testbed: `c.eval.tasks`) and for xlt.merge_search's objective.

  check(tasks, ...)           at config-check time: one ValueError when tasks are given and
                              lm-eval is not installed, or a task is unknown
  score(cfg, params, tok, tasks, ...)   {task: {metric: value}} of one model, in-process
                              (xlt.eval.harness.XltLM over the params: nothing is written)
  metrics(results)            lm-eval's results dict as {task: {metric: value}}

Importing this module imports no lm-eval; `score` and `check` do, when tasks are given.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")


@dataclasses.dataclass(frozen=True)
class Options:
  """How tasks are run (the kinds' `c.eval.lm_eval`): None keeps lm-eval's / the task's own."""

  batch: int = 16
  num_fewshot: int | None = None
  limit: float | None = None
  include_path: str | None = None
  metadata: dict | None = None
  max_gen_toks: int = 256
  mesh: str | None = None

  def __post_init__(self):
    # every route (xlt.eval, the kinds' c.eval.lm_eval, merge_search) builds these: checked once
    if self.num_fewshot is not None and not (isinstance(self.num_fewshot, int) and self.num_fewshot >= 0):
      raise ValueError(f"num_fewshot must be 0 or more (unset: the task's own), got {self.num_fewshot!r}")
    if self.limit is not None and not (0 < self.limit < float("inf")):
      raise ValueError(f"limit must be a positive number of documents or fraction of them, got {self.limit!r}")
    for name in ("batch", "max_gen_toks"):
      if not (isinstance(getattr(self, name), int) and getattr(self, name) > 0):
        raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

  @classmethod
  def from_config(cls, e) -> Options:
    """From a ConfigDict (num_fewshot -1, limit 0, "" mean unset; metadata a JSON string)."""
    try:
      metadata = json.loads(e.metadata) if e.metadata else None
    except json.JSONDecodeError as err:
      raise ValueError(f"eval.lm_eval.metadata is not JSON: {err.msg}") from None
    return cls(batch=int(e.batch_size), num_fewshot=None if e.num_fewshot == -1 else e.num_fewshot,
               limit=float(e.limit) or None, include_path=e.include_path or None, metadata=metadata,
               max_gen_toks=int(e.max_gen_toks), mesh=e.get("mesh") or None)


def kind_options(c) -> Options:
  """The Options of a kind's config: `c.eval.lm_eval` (configs/common.lm_eval), else the defaults."""
  return Options.from_config(c.eval.lm_eval) if "lm_eval" in c.eval else Options()


def available() -> bool:
  return importlib.util.find_spec("lm_eval") is not None


def task_manager(include_path: str | None = None, metadata: dict | None = None):
  """lm-eval's TaskManager over its tasks, xlt's (xlt/eval/tasks) and `include_path`'s."""
  from lm_eval.tasks import TaskManager

  return TaskManager(include_path=[TASKS_DIR] + ([include_path] if include_path else []), metadata=metadata)


def check(tasks, options: Options = Options(), where: str = "eval.tasks", manager=None):
  """Refuses, in one ValueError, tasks that could not run: lm-eval missing, an unknown name,
  an include_path that is not a folder. Nothing to check when `tasks` is empty."""
  tasks = list(tasks)
  if not tasks:
    return None
  if not available():
    raise ValueError(f"{where}={tasks} needs lm-eval, which is not installed (pip install 'xlt[eval]')")
  if options.include_path and not os.path.isdir(options.include_path):
    raise ValueError(f"{where}: include_path {options.include_path!r} is not a folder")
  manager = manager or task_manager(options.include_path, options.metadata)
  if unknown := [t for t in tasks if t not in manager.all_tasks]:
    raise ValueError(f"{where}: unknown task {unknown[0]!r} (lm-eval's, xlt/eval/tasks' and the "
                     "include_path's are known)")
  return manager


def evaluate(lm, tasks, options: Options = Options(), manager=None, log_samples: bool = False,
             samples: dict | None = None) -> dict:
  """lm-eval's results dict of `tasks` on the lm-eval model `lm`. `samples` ({task: [doc
  index, ...]}) scores those documents alone (xlt.merge_search's splits)."""
  import lm_eval

  manager = check(tasks, options, manager=manager) if manager is None else manager
  kwargs = {"samples": samples} if samples is not None else {"limit": options.limit}
  return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=options.num_fewshot, task_manager=manager,
                                 log_samples=log_samples, **kwargs)


def model(cfg, params, tok, options: Options = Options(), name: str = "model"):
  """xlt's lm-eval model (harness.XltLM) over parameters in memory."""
  from xlt.eval import harness

  return harness.XltLM.from_params(cfg, params, tok, batch_size=options.batch, mesh=options.mesh,
                                   max_gen_toks=options.max_gen_toks, name=name)


def score(cfg, params, tok, tasks, options: Options = Options(), name: str = "model", manager=None) -> dict:
  """{task: {metric: value}} of the model (`cfg`, `params`, its xlt.hf_tokenizer `tok`) on
  lm-eval `tasks` (`metrics`)."""
  return metrics(evaluate(model(cfg, params, tok, options, name), tasks, options, manager))


_NOT_SCORES = ("alias", "name", "sample_len", "sample_count")  # what lm-eval's results hold besides scores


def metrics(results: dict) -> dict:
  """{task or group: {metric: value}} of lm-eval's results dict: every number but the
  standard errors and the document counts; a metric under a filter other than "none" is "metric/filter"."""
  out = {}
  for task, values in results["results"].items():
    for key, value in values.items():
      if key in _NOT_SCORES or "_stderr" in key or isinstance(value, bool) or not isinstance(value, (int, float)):
        continue
      metric, _, filt = key.partition(",")
      out.setdefault(task, {})[metric if filt in ("", "none") else f"{metric}/{filt}"] = float(value)
  return out


def rows(scores: dict, make_row, **fields) -> list[dict]:
  """Result rows (the kind's `make_row`) of {model: {task: {metric: [value per seed]}}}: one
  per model x task metric, role "lm_eval", metric "<task>/<metric>"; the task and metric also
  as their own fields (lm_eval_task, lm_eval_metric)."""
  out = []
  for name, tasks in scores.items():
    for task, values in tasks.items():
      for metric, per_seed in values.items():
        out.append(make_row(condition=name, role="lm_eval", language="", metric=f"{task}/{metric}",
                            values=per_seed, samples=None, lm_eval_task=task, lm_eval_metric=metric, **fields))
  return out


def table(rows: list[dict]) -> str:
  """The lm-eval rows (`rows`) as a markdown table, a column per task metric: the mean, and
  ± the 95% interval's half-width where a row has one (over seeds); "" without rows."""
  rows = [r for r in rows if r.get("role") == "lm_eval"]
  if not rows:
    return ""
  models, cols = list(dict.fromkeys(r["condition"] for r in rows)), list(dict.fromkeys(r["metric"] for r in rows))
  by = {(r["condition"], r["metric"]): r for r in rows}

  def cell(r):
    if r is None:
      return "–"
    return f"{r['mean']:.4f}" + (f" ± {r['ci95']:.4f}" if r.get("ci95") is not None else "")

  lines = ["", "lm-eval (eval.tasks)", "", "| model | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
  lines += [f"| {m} | " + " | ".join(cell(by.get((m, k))) for k in cols) + " |" for m in models]
  return "\n".join(lines) + "\n"
