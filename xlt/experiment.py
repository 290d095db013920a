"""An experiment: a set of *cells* (which languages, how many samples of each) × seeds,
trained together as one ensemble (one compiled step), then evaluated on held-out data
of each cell's languages, written as results rows.

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

from xlt import checkpoint as ckpt_lib
from xlt import evaluate as eval_lib
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
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


def condition_seeds(c, cond: str) -> list[int]:
  """The seeds a condition is trained with: `c.num_seeds`, or `c.seeds_per_condition[cond]`
  (the reference repeats only its mixed models; the alone baselines can run once)."""
  n = int(c.get("seeds_per_condition", {}).get(cond, c.num_seeds))
  if n < 1:
    raise ValueError(f"condition {cond!r} needs >= 1 seed, got {n} (num_seeds / seeds_per_condition)")
  return list(range(c.seed, c.seed + n))


def plan(c) -> list[Cell]:
  if c.get("sweep"):
    sizes = list(c.sweep.samples)
    if not sizes or min(sizes) < 1:
      raise ValueError(f"sweep.samples must be positive sample counts, got {sizes}")
    return [Cell("alone", ((c.sweep.language, int(n)),), s) for n in sizes
            for s in condition_seeds(c, "alone")]
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
  return [Cell(cond, samples[cond], s) for cond in c.conditions for s in condition_seeds(c, cond)]


def get_task(c, cells: list[Cell] | None = None) -> common.Task:
  if c.task not in TASKS:
    raise ValueError(f"unknown task {c.task!r}; known: {', '.join(TASKS)}, text")
  counts: dict[str, int] = {}
  for cell in cells or plan(c):
    for lang, n in cell.samples:
      counts[lang] = max(counts.get(lang, 0), n)
  return importlib.import_module(TASKS[c.task]).build(c, counts)


def model_config(c, task: common.Task) -> model_lib.Config:
  if task.seq_len > c.model.block_size:
    raise ValueError(f"sequences of {task.seq_len} tokens do not fit model.block_size={c.model.block_size}")
  return model_lib.config_from(c.model.to_dict(), task.tokenizer.vocab_size)


def score_members(cfg, params, task: common.Task, sets: dict[str, common.EvalSet],
                  member_langs: list[list[str]], batch: int) -> list[dict[str, dict[str, float]]]:
  """Decodes every member on each of its languages' sets; returns, per member,
  {language: {metric: mean over the set}}."""
  tok = task.tokenizer
  out = [{} for _ in member_langs]
  for lang, es in sets.items():
    members = [i for i, ls in enumerate(member_langs) if lang in ls]
    if not members:
      continue
    sub = jax.tree.map(lambda x: x[np.asarray(members)], params)
    prompt_ids = [tok.encode(p) for p in es.prompts]
    answers = eval_lib.decode_answers(cfg, sub, [prompt_ids] * len(members), max_new=es.max_new,
                                      eos_id=tok.eos_id, batch=batch)
    for i, ans in zip(members, answers):
      scores = [es.score(j, tok.decode(a)) for j, a in enumerate(ans)]
      out[i][lang] = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
  return out


def _role(c, lang: str) -> str:
  if c.get("sweep"):
    return "source"
  return "source" if lang == c.mixture.source else "target"


def run(c, workdir: str, *, progress: bool = True, stop_after: int | None = None) -> list[dict]:
  """Runs the experiment `c` describes; returns its results rows (empty if stopped early).
  A workdir that already holds this experiment's results is not trained again."""
  if c.task == "text":  # language modelling has its own runner (perplexity, not decoding)
    from xlt import text_experiment

    return text_experiment.run(c, workdir, progress=progress, stop_after=stop_after)
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  done = os.path.join(workdir, "results.json")
  if os.path.exists(done):
    print(f"{workdir}: finished earlier, reusing {done}")
    return json.load(open(done))
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
  # Tested: each member's parameters at its best validation score (accuracy can dip late).
  best = ckpt_lib.BestParams(os.path.join(workdir, "best_params.npz"), len(members))

  def evaluate(params, ids):  # early-stopping score: mean over the member's languages
    langs = [member_langs[i] for i in ids]
    scored = score_members(cfg, params, task, task.val, langs, c.eval.batch_size)
    scores = [np.mean([s[l][task.val[l].metric] for l in ls]) for s, ls in zip(scored, langs)]
    best.update(params, scores, ids)
    return scores

  out = loop_lib.train_ensemble(c, cfg, members, evaluate, workdir, stop_after=stop_after,
                                progress=progress)
  if not out["finished"]:
    return []
  params = best.params(out["state"]["params"])
  best_steps = loop_lib.best_steps(out["history"], out["stopped_at"])
  test = score_members(cfg, params, task, task.test, member_langs, c.eval.batch_size)
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
            best_steps=[best_steps[i] for i in idx], steps=[out["stopped_at"][i] for i in idx]))
  metric = next(iter(task.test.values())).metric
  results_lib.plot_curves(os.path.join(workdir, "curves.png"),
                          {m.name: h for m, h in zip(members, out["history"])}, f"held-out {metric}")
  table = results_lib.table(rows, metric, c.name, sweep=bool(c.get("sweep")))
  results_lib.atomic_write(os.path.join(workdir, "table.md"), table)
  summary = {"task_info": task.info, "vocab_size": cfg.vocab_size, "seq_len": task.seq_len,
             "params_per_model": model_lib.count_params(jax.tree.map(lambda x: x[0], params)),
             "members": len(members), "steps": out["step"], "train_tokens_per_s": out["tokens_per_s"],
             "wall_s": time.time() - t0}
  results_lib.atomic_write(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=1))
  results_lib.write(workdir, rows)  # last: its presence marks the experiment finished
  print(table)
  print(json.dumps(summary))
  return rows
