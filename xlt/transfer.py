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

import jax
import numpy as np

from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt import runner
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


def run(c, workdir: str, *, progress: bool = True, stop_after: int | None = None) -> list[dict]:
  """Runs the experiment `c` describes; returns its results rows (empty if stopped early).
  A workdir that already holds this experiment's results is not trained again."""
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  runner.claim_workdir(c, workdir)
  rows = runner.finished_rows(workdir)
  if rows is not None:
    return rows
  t0 = time.time()
  cells = plan(c)
  task = get_task(c, cells)
  cfg = model_config(c, task)
  print(f"task {c.task}: {task.info}; vocab {cfg.vocab_size}, seq_len {task.seq_len}", flush=True)
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
    return []
  predictions = []
  test = runner.score_members(cfg, params, task, task.test, member_langs, c.eval.batch_size, predictions)
  runner.write_predictions(os.path.join(workdir, "predictions.jsonl"), predictions, [m.name for m in members])
  rows = []
  groups: dict[tuple, list[int]] = {}
  for i, cell in enumerate(cells):
    groups.setdefault((cell.condition, cell.samples), []).append(i)
  for (cond, samples), idx in groups.items():
    for lang, n in samples:
      for metric in test[idx[0]][lang]:
        rows.append(results_lib.make_row(
            experiment=c.name, task=c.task, language=lang, role=_role(c, lang),
            condition="mixed" if cond == "mixed" else "alone", metric=metric,
            values=[test[i][lang][metric] for i in idx], samples=n,
            mixture="+".join(f"{l}:{k}" for l, k in samples),
            best_steps=[out["best_steps"][i] for i in idx],
            best_val=[out["best_val"][i] for i in idx],
            steps=[out["stopped_at"][i] for i in idx]))
  metric = next(iter(task.test.values())).metric
  results_lib.plot_curves(os.path.join(workdir, "curves.png"),
                          {m.name: h for m, h in zip(members, out["history"])}, f"held-out {metric}")
  table = results_lib.table(rows, metric, c.name, sweep=bool(c.get("sweep")))
  summary = {"task_info": task.info, "vocab_size": cfg.vocab_size, "seq_len": task.seq_len,
             "params_per_model": model_lib.count_params(jax.tree.map(lambda x: x[0], params)),
             "members": len(members), "steps": out["step"], "train_tokens_per_s": out["tokens_per_s"],
             "wall_s": time.time() - t0}
  runner.write_outputs(workdir, rows, table, summary)
  print(table)
  print(json.dumps(summary))
  return rows
