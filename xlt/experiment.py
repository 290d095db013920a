"""A transfer experiment: for a (source, target) language pair, train

  target alone (M samples), source alone (N samples), mixed (N + M),

each for several seeds, all together as one ensemble (one compiled step), then
evaluate every model on held-out data of its languages and write results rows.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax
import numpy as np

from xlt import evaluate as eval_lib
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt.data import common

TASKS = {"graph": "xlt.data.graph"}
CONDITIONS = ("target_alone", "source_alone", "mixed")


def get_task(c) -> common.Task:
  import importlib

  if c.task not in TASKS:
    raise ValueError(f"unknown task {c.task!r}; known: {', '.join(TASKS)}")
  return importlib.import_module(TASKS[c.task]).build(c)


def condition_languages(c, condition: str) -> list[str]:
  src, tgt = c.mixture.source, c.mixture.target
  try:
    return {"target_alone": [tgt], "source_alone": [src], "mixed": [src, tgt]}[condition]
  except KeyError:
    raise ValueError(f"unknown condition {condition!r}; known: {', '.join(CONDITIONS)}") from None


def model_config(c, task: common.Task) -> model_lib.Config:
  m = c.model.to_dict()
  if task.seq_len > m["block_size"]:
    raise ValueError(f"sequences of {task.seq_len} tokens do not fit model.block_size={m['block_size']}")
  return model_lib.Config(vocab_size=task.tokenizer.vocab_size, **m)


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


def run(c, workdir: str, *, progress: bool = True, stop_after: int | None = None) -> list[dict]:
  """Runs the experiment `c` describes; returns its results rows (empty if stopped early)."""
  if c.task == "text":  # language modelling has its own runner (perplexity, not decoding)
    from xlt import text_experiment

    return text_experiment.run(c, workdir, progress=progress, stop_after=stop_after)
  os.makedirs(workdir, exist_ok=True)
  t0 = time.time()
  task = get_task(c)
  cfg = model_config(c, task)
  print(f"task {c.task}: {task.info}; vocab {cfg.vocab_size}, seq_len {task.seq_len}", flush=True)
  conditions = list(c.conditions)
  cells = [(cond, seed) for cond in conditions for seed in range(c.seed, c.seed + c.num_seeds)]
  member_langs = [condition_languages(c, cond) for cond, _ in cells]
  members = []
  for (cond, seed), langs in zip(cells, member_langs):
    examples = [ex for lang in langs for ex in task.train[lang]]
    enc = common.encode_examples(examples, task.tokenizer, task.seq_len)
    members.append(loop_lib.Member(f"{cond}/seed_{seed}", seed,
                                   {"tokens": enc.tokens, "loss_mask": enc.loss_mask}))
  eval_batch = c.eval.batch_size

  def evaluate(params):  # early-stopping score: mean validity on the member's languages
    scored = score_members(cfg, params, task, task.val, member_langs, eval_batch)
    return [np.mean([s[l][task.val[l].metric] for l in ls]) for s, ls in zip(scored, member_langs)]

  out = loop_lib.train_ensemble(c, cfg, members, evaluate, workdir, stop_after=stop_after,
                                progress=progress)
  if not out["finished"]:
    return []
  test = score_members(cfg, out["state"]["params"], task, task.test, member_langs, eval_batch)
  rows = []
  roles = {c.mixture.source: "source", c.mixture.target: "target"}
  samples = {lang: len(ex) for lang, ex in task.train.items()}
  for cond in conditions:
    idx = [i for i, (cd, _) in enumerate(cells) if cd == cond]
    for lang in member_langs[idx[0]]:
      for metric in test[idx[0]][lang]:
        rows.append(results_lib.make_row(
            experiment=c.name, task=c.task, language=lang, role=roles[lang],
            condition="mixed" if cond == "mixed" else "alone", metric=metric,
            values=[test[i][lang][metric] for i in idx], samples=samples[lang],
            steps=[out["stopped_at"][i] for i in idx]))
  results_lib.write(workdir, rows)
  metric = next(iter(task.test.values())).metric
  table = results_lib.transfer_table(rows, metric, f"{c.task}: test {metric} (mean ± std over seeds)")
  results_lib.atomic_write(os.path.join(workdir, "table.md"), table)
  results_lib.plot_curves(os.path.join(workdir, "curves.png"),
                          {m.name: h for m, h in zip(members, out["history"])}, f"held-out {metric}")
  summary = {"task_info": task.info, "vocab_size": cfg.vocab_size, "seq_len": task.seq_len,
             "params_per_model": model_lib.count_params(jax.tree.map(lambda x: x[0], out["state"]["params"])),
             "members": len(members), "steps": out["step"], "train_tokens_per_s": out["tokens_per_s"],
             "wall_s": time.time() - t0}
  results_lib.atomic_write(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=1))
  print(table)
  print(json.dumps(summary))
  return rows
