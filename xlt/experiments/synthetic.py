"""Language-mixing experiments on the synthetic tasks (graph navigation, addition): a set of
*cells* (which languages, how many samples of each) × seeds, trained together as one ensemble
(one compiled step), then decoded greedily on held-out problems of each cell's languages and
written as results rows.

Two shapes of experiment, chosen by the config:
  transfer pair (`c.mixture`): target alone (M samples), source alone (N), mixed (N + M);
  sample-size sweep (`c.sweep`): one language alone at several sample sizes, to find
    where it starts and stops generalizing. Smaller cells use a prefix of the largest
    cell's samples.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
from typing import Callable

import jax
import numpy as np

from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt import runner
from xlt import workers as workers_lib
from xlt.data import common

TASKS = {"graph": "xlt.data.graph", "addition": "xlt.data.addition"}
CONDITIONS = ("target_alone", "source_alone", "mixed")


@dataclasses.dataclass(frozen=True)
class Cell:
  condition: str  # target_alone | source_alone | mixed | alone (sweeps)
  samples: tuple[tuple[str, int], ...]  # (language, number of training samples)
  seed: int

  @property
  def languages(self) -> list[str]:
    return [lang for lang, _ in self.samples]

  @property
  def name(self) -> str:
    return f"{self.condition}_" + "+".join(f"{l}{n}" for l, n in self.samples) + f"/seed_{self.seed}"


def plan(c) -> list[Cell]:
  if c.get("sweep"):
    sizes = list(c.sweep.samples)
    if not sizes or min(sizes) < 1:
      raise ValueError(f"sweep.samples must be positive sample counts, got {sizes}")
    return [Cell("alone", ((c.sweep.language, int(n)),), s) for n in sizes
            for s in runner.condition_seeds(c, "alone")]
  m = c.mixture
  if m.source == m.target:
    raise ValueError(f"mixture.source and mixture.target are the same language {m.source!r}")
  for k in ("source_samples", "target_samples"):
    if m[k] < 1:
      raise ValueError(f"mixture.{k} must be >= 1, got {m[k]}")
  samples = {"target_alone": ((m.target, m.target_samples),),
             "source_alone": ((m.source, m.source_samples),),
             "mixed": ((m.source, m.source_samples), (m.target, m.target_samples))}
  for cond in c.conditions:
    if cond not in samples:
      raise ValueError(f"unknown condition {cond!r}; known: {', '.join(CONDITIONS)}")
  return [Cell(cond, samples[cond], s) for cond in c.conditions
          for s in runner.condition_seeds(c, cond)]


def get_task(c, cells: list[Cell] | None = None) -> common.Task:
  """The problem set of `c.task`, with enough training samples of each language for `cells`."""
  if c.task not in TASKS:
    raise ValueError(f"unknown task {c.task!r} for the synthetic transfer runner; known: "
                     f"{', '.join(TASKS)}")
  counts: dict[str, int] = {}
  for cell in cells or plan(c):
    for lang, n in cell.samples:
      counts[lang] = max(counts.get(lang, 0), n)
  return importlib.import_module(TASKS[c.task]).build(c, counts)


def model_config(c, task: common.Task) -> model_lib.Config:
  if task.seq_len > c.model.block_size:
    raise ValueError(f"sequences of {task.seq_len} tokens do not fit model.block_size={c.model.block_size}")
  return model_lib.config_from(c.model.to_dict(), task.tokenizer.vocab_size)


def _role(c, lang: str) -> str:
  if c.get("sweep"):
    return "source"
  return "source" if lang == c.mixture.source else "target"


def share_ids(n_cells: int, share: int, shares: int) -> list[int]:
  """The cells (by index) share `share` of `shares` trains: every shares-th cell from `share`,
  so each share mixes the conditions (members that stop early spread over the workers)."""
  if not 0 <= share < shares or shares > n_cells:
    raise ValueError(f"member share {share} of {shares}: an experiment of {n_cells} members splits into "
                     f"1 .. {n_cells} shares, numbered 0 .. shares - 1")
  return list(range(share, n_cells, shares))


def share_workdir(workdir: str, share: int, shares: int) -> str:
  return os.path.join(workdir, f"members_{share}of{shares}")


def run(c, workdir: str, *, progress: bool = True, stop_after: int | None = None,
        share: int | None = None, shares: int = 1) -> list[dict]:
  """Runs the experiment `c` describes; returns its results rows (empty if stopped early).
  A workdir that already holds this experiment's results is not trained again.

  Split over processes (`run_in_workers`): with `share`, this process trains only that share
  of the members (`share_ids`), in <workdir>/members_<share>of<shares>, and writes their
  scores there (members.json, predictions.jsonl), returning no rows; with `shares` > 1 and no
  `share`, it gathers the finished shares into the experiment's results. A member's data,
  initialisation and dropout depend on its seed alone, so it trains as it would beside all
  the others (up to float rounding: one device instead of several)."""
  workdir, rows = runner.open_workdir(c, workdir)
  if rows is not None:
    return rows
  t0 = time.time()
  cells = plan(c)
  if share is None and shares > 1:  # the shares built the task and trained: gathering needs neither
    return _write_results(c, workdir, cells, _gather_shares(workdir, cells, shares))
  task = get_task(c, cells)  # every share builds the whole task: the same data in each
  cfg = model_config(c, task)
  print(f"task {c.task}: {task.info}; vocab {cfg.vocab_size}, seq_len {task.seq_len}", flush=True)
  facts = {"task_info": task.info, "vocab_size": cfg.vocab_size, "seq_len": task.seq_len,
           "metric": next(iter(task.test.values())).metric}
  if share is not None:
    ids = share_ids(len(cells), share, shares)
    sub = share_workdir(workdir, share, shares)
    os.makedirs(sub, exist_ok=True)
    runner.claim_workdir(c, sub)
    done = _train_cells(c, cfg, task, [cells[i] for i in ids], sub, progress, stop_after)
    if done is not None:
      done.update(facts, wall_s=time.time() - t0)
      results_lib.atomic_write(os.path.join(sub, "members.json"), json.dumps(done, indent=1, default=float))
    return []
  done = _train_cells(c, cfg, task, cells, workdir, progress, stop_after)
  if done is None:
    return []
  done.update(facts, wall_s=time.time() - t0)
  return _write_results(c, workdir, cells, done)


def run_in_workers(c, workdir: str, command: Callable[[int], list[str]], workers: int,
                   poll_s: float = 1.0) -> list[dict]:
  """Trains the experiment's members split into `workers` shares, each the process
  `command(share)` pinned to cores of its own (xlt.workers.run_pinned, logs in
  <workdir>/logs/), then gathers their results (`run` with `shares`). A rerun resumes the
  unfinished shares from their checkpoints and skips the finished ones."""
  share_ids(len(plan(c)), 0, workers)  # more workers than members or cores: an error before any write
  workers_lib.check_host("member workers", workers)
  workdir, rows = runner.open_workdir(c, workdir)
  if rows is not None:
    return rows
  todo = [(f"members_{i}of{workers}", command(i)) for i in range(workers)
          if not os.path.exists(os.path.join(share_workdir(workdir, i, workers), "members.json"))]
  workers_lib.run_pinned(todo, os.path.join(workdir, "logs"), workers, "member workers", poll_s)
  return run(c, workdir, shares=workers)


def _train_cells(c, cfg, task, cells: list[Cell], workdir: str, progress: bool, stop_after):
  """Trains `cells` as one ensemble in `workdir` and tests each member's selected parameters
  (its predictions in workdir/predictions.jsonl). Returns {"members": one record per cell
  (name, test scores, best step and validation score, stopping step, validation history),
  "steps", "tokens_per_s", "params_per_model"}, or None if the run stopped early."""
  members = []
  for cell in cells:
    examples = [ex for lang, n in cell.samples for ex in task.train[lang][:n]]
    enc = common.encode_examples(examples, task.tokenizer, task.seq_len)
    members.append(loop_lib.Member(cell.name, cell.seed, {"tokens": enc.tokens, "loss_mask": enc.loss_mask}))
  member_langs = [cell.languages for cell in cells]

  def val_score(params, ids):  # early stopping: mean headline metric over the member's languages
    langs = [member_langs[i] for i in ids]
    scored = runner.score_members(cfg, params, task, task.val, langs, c.eval.batch_size)
    return [np.mean([s[l][task.val[l].metric] for l in ls]) for s, ls in zip(scored, langs)]

  params, out = runner.train_and_select(c, cfg, members, val_score, workdir,
                                        stop_after=stop_after, progress=progress)
  if params is None:
    return None
  predictions = []
  test = runner.score_members(cfg, params, task, task.test, member_langs, c.eval.batch_size, predictions)
  runner.write_predictions(os.path.join(workdir, "predictions.jsonl"), predictions, [m.name for m in members])
  records = [{"name": m.name, "test": test[i], "best_step": out["best_steps"][i], "best_val": out["best_val"][i],
              "stopped_at": out["stopped_at"][i], "history": out["history"][i]} for i, m in enumerate(members)]
  return {"members": records, "steps": out["step"], "tokens_per_s": out["tokens_per_s"],
          "params_per_model": model_lib.count_params(jax.tree.map(lambda x: x[0], params))}


def _gather_shares(workdir: str, cells: list[Cell], shares: int) -> dict:
  """The finished shares' records, in the cells' order, and their predictions in one file."""
  done, predictions = [], []
  for i in range(shares):
    sub = share_workdir(workdir, i, shares)
    path = os.path.join(sub, "members.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"member share {i} of {shares} has not finished ({path} is missing): run "
                              f"the experiment with --member_workers={shares} to train it")
    with open(path) as f:
      done.append(json.load(f))
    with open(os.path.join(sub, "predictions.jsonl")) as f:
      predictions.append(f.read())
  by_name = {r["name"]: r for d in done for r in d["members"]}
  if sorted(by_name) != sorted(cell.name for cell in cells):
    raise ValueError(f"the member shares in {workdir} hold {sorted(by_name)}, not this experiment's members")
  results_lib.atomic_write(os.path.join(workdir, "predictions.jsonl"), "".join(predictions))
  return {**{k: done[0][k] for k in ("task_info", "vocab_size", "seq_len", "metric", "params_per_model")},
          "members": [by_name[cell.name] for cell in cells], "steps": max(d["steps"] for d in done),
          # the shares trained at the same time: together they trained this many tokens/s
          "tokens_per_s": sum(d["tokens_per_s"] for d in done),
          "wall_s": max(d["wall_s"] for d in done),
          "member_shares": shares}


def _write_results(c, workdir: str, cells: list[Cell], done: dict) -> list[dict]:
  """Results rows, curves, table and summary from `done`: the members' records (in the cells'
  order) and the task's facts (`run`)."""
  records = done["members"]
  rows = []
  groups: dict[tuple, list[int]] = {}
  for i, cell in enumerate(cells):
    groups.setdefault((cell.condition, cell.samples), []).append(i)
  for (cond, samples), idx in groups.items():
    for lang, n in samples:
      for metric in records[idx[0]]["test"][lang]:
        rows.append(results_lib.make_row(
            experiment=c.name, task=c.task, language=lang, role=_role(c, lang),
            condition="mixed" if cond == "mixed" else "alone", metric=metric,
            values=[records[i]["test"][lang][metric] for i in idx], samples=n,
            mixture="+".join(f"{l}:{k}" for l, k in samples),
            best_steps=[records[i]["best_step"] for i in idx],
            best_val=[records[i]["best_val"] for i in idx],
            steps=[records[i]["stopped_at"] for i in idx]))
  metric = done["metric"]
  results_lib.plot_curves(os.path.join(workdir, "curves.png"), {r["name"]: r["history"] for r in records},
                          f"held-out {metric}")
  table = results_lib.table(rows, metric, c.name, sweep=bool(c.get("sweep")))
  summary = {"task_info": done["task_info"], "vocab_size": done["vocab_size"], "seq_len": done["seq_len"],
             "params_per_model": done["params_per_model"], "members": len(cells), "steps": done["steps"],
             "train_tokens_per_s": done["tokens_per_s"], "wall_s": done["wall_s"]}
  if "member_shares" in done:
    summary["member_shares"] = done["member_shares"]
  runner.write_outputs(workdir, rows, table, summary)
  print(table)
  print(json.dumps(summary))
  return rows
