"""Language-mixing experiments on the synthetic tasks (graph navigation, addition): a set of
*cells* (which languages, how many samples of each) × seeds, trained together as one ensemble
(one compiled step), then decoded greedily on held-out problems of each cell's languages and
written as results rows.

Two shapes of experiment, chosen by the config:
  transfer pair (`c.mixture`): target alone (M samples), source alone (N), mixed (N + M);
  sample-size sweep (`c.sweep`): one language alone at several sample sizes, to find
    where it starts and stops generalizing. Smaller cells use a prefix of the largest
    cell's samples.

A kind of xlt.runner: `prepare` plans the cells and builds the problem set, `stages` is the
one ensemble (trained in the workdir itself), `outputs` decodes the test problems.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from xlt import ensemble_decode
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt.data import addition, common, graph
from xlt.experiments import common as kind_lib

# what this kind is called (c.kind) and runs (data tasks, each with its headline metric) and how xlt.report reads its rows
KIND = kind_lib.Kind(name="synthetic", tasks={"graph": "valid", "addition": "exact_match"}, measurements="transfer")

TASKS = {"graph": graph, "addition": addition}
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
            for s in kind_lib.condition_seeds(c, "alone")]
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
          for s in kind_lib.condition_seeds(c, cond)]


def get_task(c, cells: list[Cell] | None = None) -> common.Task:
  """The problem set of `c.task`, with enough training samples of each language for `cells`."""
  if c.task not in TASKS:
    raise ValueError(f"unknown task {c.task!r} for the synthetic experiments; known: "
                     f"{', '.join(TASKS)}")
  counts: dict[str, int] = {}
  for cell in cells or plan(c):
    for lang, n in cell.samples:
      counts[lang] = max(counts.get(lang, 0), n)
  return TASKS[c.task].build(c, counts)


def model_config(c, task: common.Task) -> model_lib.Config:
  if task.seq_len > c.model.block_size:
    raise ValueError(f"sequences of {task.seq_len} tokens do not fit model.block_size={c.model.block_size}")
  return model_lib.config_from(c.model.to_dict(), task.tokenizer.vocab_size)


def _role(c, lang: str) -> str:
  if c.get("sweep"):
    return "source"
  return "source" if lang == c.mixture.source else "target"


@dataclasses.dataclass(frozen=True)
class Prep:
  """What `prepare` built: the cells, the task's data and the model."""

  cells: list[Cell]
  task: common.Task
  cfg: model_lib.Config


def prepare(c, workdir: str) -> Prep:
  del workdir  # the problem sets are built in memory
  cells = plan(c)
  task = get_task(c, cells)
  cfg = model_config(c, task)
  print(f"task {c.task}: {task.info}; vocab {cfg.vocab_size}, seq_len {task.seq_len}", flush=True)
  return Prep(cells, task, cfg)


def stages(c, prep: Prep, trained: dict):
  """One ensemble of every cell, trained in the workdir itself."""
  del trained
  task, cfg = prep.task, prep.cfg
  members = []
  for cell in prep.cells:
    examples = [ex for lang, n in cell.samples for ex in task.train[lang][:n]]
    enc = common.encode_examples(examples, task.tokenizer, task.seq_len)
    members.append(loop_lib.Member(cell.name, cell.seed, {"tokens": enc.tokens, "loss_mask": enc.loss_mask}))
  member_langs = [cell.languages for cell in prep.cells]

  def val_score(params, ids):  # early stopping: mean headline metric over the member's languages
    langs = [member_langs[i] for i in ids]
    scored = ensemble_decode.score_members(cfg, params, task, task.val, langs, c.eval.batch_size)
    return [np.mean([s[l][task.val[l].metric] for l in ls]) for s, ls in zip(scored, langs)]

  yield kind_lib.Stage("ensemble", cfg, members, val_score, subdir="")


def outputs(c, prep: Prep, trained: dict, workdir: str):
  """Tests each member's selected parameters (their answers in workdir/predictions.jsonl);
  the results rows per condition and language, curves.png, the table and the summary."""
  done = trained["ensemble"]
  params, out, members = done.params, done.out, done.stage.members
  task, cells = prep.task, prep.cells
  predictions = []
  test = ensemble_decode.score_members(prep.cfg, params, task, task.test, [cell.languages for cell in cells],
                                c.eval.batch_size, predictions)
  results_lib.write_predictions(os.path.join(workdir, "predictions.jsonl"), predictions,
                                [m.name for m in members])
  records = [{"name": m.name, "test": test[i], "best_step": out["best_steps"][i], "best_val": out["best_val"][i],
              "stopped_at": out["stopped_at"][i], "history": out["history"][i]} for i, m in enumerate(members)]
  metric = next(iter(task.test.values())).metric
  results_lib.plot_curves(os.path.join(workdir, "curves.png"), {r["name"]: r["history"] for r in records},
                          f"held-out {metric}")
  rows = _rows(c, cells, records)
  table = results_lib.table(rows, metric, c.name, sweep=bool(c.get("sweep")))
  summary = {"task_info": task.info, "vocab_size": prep.cfg.vocab_size, "seq_len": task.seq_len,
             "params_per_model": model_lib.count_params(params, stacked=True),
             "members": len(cells), "steps": out["step"], "train_tokens_per_s": out["tokens_per_s"]}
  return rows, table, summary


def _rows(c, cells: list[Cell], records: list[dict]) -> list[dict]:
  """One row per condition, language and metric: the values of its seeds."""
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
  return rows
