"""What every experiment runner shares: the seeds of a condition, training an ensemble while
keeping each member's best-validation parameters, greedy-decoding scores, and the outputs that
mark a workdir finished.

A runner (`xlt.transfer`, `xlt.text_transfer`, ...) plans its cells, has its task build the
data and a validation score, then calls `train_and_select`, scores the selected parameters on
test data and hands its rows to `write_outputs`. This module imports no runner, so a runner
(or the merge testbed) can use it without an import cycle.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import jax
import numpy as np
from flax import traverse_util

from xlt import checkpoint as ckpt_lib
from xlt import ensemble as ensemble_lib
from xlt import evaluate as eval_lib
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt.data import common


def condition_seeds(c, cond: str) -> list[int]:
  """The seeds a condition is trained with: `c.num_seeds`, or `c.seeds_per_condition[cond]`
  (the reference repeats only its mixed models; the alone baselines can run once)."""
  n = int(c.get("seeds_per_condition", {}).get(cond, c.num_seeds))
  if n < 1:
    raise ValueError(f"condition {cond!r} needs >= 1 seed, got {n} (num_seeds / seeds_per_condition)")
  return list(range(c.seed, c.seed + n))


def train_and_select(c, model_cfg: model_lib.Config, members: Sequence[loop_lib.Member],
                     val_score: Callable[[object, np.ndarray], Sequence[float]], workdir: str, *,
                     init_params=None, tx=None, mesh=None, stop_after: int | None = None,
                     progress: bool = True):
  """Trains `members` as one ensemble (`loop.train_ensemble`) and selects, per member, the
  parameters of its best validation score: those are the models a runner tests, because a
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


def score_members(cfg, params, task: common.Task, sets: dict[str, common.EvalSet],
                  member_langs: list[list[str]], batch: int,
                  predictions: list | None = None) -> list[dict[str, dict[str, float]]]:
  """Decodes every member on each of its languages' sets; returns, per member,
  {language: {metric: mean over the set}}. With a `predictions` list, appends one record per
  member and prompt: {"member": index, "set", "prompt", "answer", "scores"}."""
  tok = task.tokenizer
  out = [{} for _ in member_langs]
  for lang, es in sets.items():
    members = [i for i, ls in enumerate(member_langs) if lang in ls]
    if not members:
      continue
    sub = ensemble_lib.take(params, np.asarray(members))
    prompt_ids = [tok.encode(p) for p in es.prompts]
    answers = eval_lib.decode_answers(cfg, sub, [prompt_ids] * len(members), max_new=es.max_new,
                                      eos_id=tok.eos_id, batch=batch)
    for i, ans in zip(members, answers):
      decoded = [tok.decode(a) for a in ans]
      scores = [es.score(j, d) for j, d in enumerate(decoded)]
      out[i][lang] = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
      if predictions is not None:
        predictions += [{"member": i, "set": lang, "prompt": " ".join(p), "answer": " ".join(d), "scores": sc}
                        for p, d, sc in zip(es.prompts, decoded, scores)]
  return out


def write_predictions(path: str, records: list[dict], member_names: Sequence[str]):
  """predictions.jsonl: each test prompt's decoded answer and scores, per member (by name),
  so errors can be read; written atomically."""
  lines = (json.dumps({**r, "member": member_names[r["member"]]}, ensure_ascii=False) for r in records)
  results_lib.atomic_write(path, "\n".join(lines) + "\n")


# Config fields that may differ between runs into one workdir: how often to log and save, and
# how the devices are laid out (which moves results by float rounding only).
MAY_CHANGE_ON_RESUME = ("train.log_every", "train.checkpoint_every", "mesh.")


def claim_workdir(c, workdir: str):
  """Records the config in <workdir>/config.json, or checks it against the one recorded there.

  A workdir holds one experiment: its checkpoints resume and its results are reused when the
  command is run again. Run again with another recipe (say `--config.train.steps`), it would
  silently continue or report the old one; so a config that differs from the recorded one in
  a field that changes results is an error naming the fields. (A workdir from before this
  check has no config.json: this run records its config.)"""
  now = json.loads(json.dumps(c.to_dict(), default=repr))
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    results_lib.atomic_write(path, json.dumps(now, indent=1, sort_keys=True))
    return
  with open(path) as f:
    recorded = json.load(f)
  old, new = traverse_util.flatten_dict(recorded, sep="."), traverse_util.flatten_dict(now, sep=".")
  diff = sorted((k for k in old.keys() | new.keys()
                 if old.get(k, "<unset>") != new.get(k, "<unset>")
                 and not any(k == m or (m.endswith(".") and k.startswith(m)) for m in MAY_CHANGE_ON_RESUME)),
                key=lambda k: (k not in old or k not in new, k))  # changed values before added fields
  if diff:
    shown = "; ".join(f"{k}: {old.get(k, '<unset>')!r} there, {new.get(k, '<unset>')!r} now" for k in diff[:8])
    raise ValueError(f"{workdir} holds an experiment run with another config ({shown}"
                     f"{'; ...' if len(diff) > 8 else ''}): use a fresh workdir (its recorded config is "
                     f"{path})")


def open_workdir(c, workdir: str) -> tuple[str, list[dict] | None]:
  """The workdir as an absolute path, created and claimed for `c` (`claim_workdir`), and the
  rows of the experiment it finished earlier, or None."""
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  claim_workdir(c, workdir)
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
