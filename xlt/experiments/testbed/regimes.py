"""The merge testbed's regime map (c.kind "testbed.regimes", configs/merge_regimes.py): every
recipe's goal score as a function of how far fine-tuning moved the experts from the base.

  python -m xlt.main --config=configs/merge_regimes.py --workdir=runs/merge_regimes

The testbed (xlt.experiments.testbed) with its one fine-tuning stage repeated per regime:

  1. base            testbed's base stage(s), as they are (workdir/base);
  2. finetune_r<i>   per regime i of `c.regimes` ((peak_lr, steps), ...), every full recipe x
                     seed from the same base, as testbed's fine-tune stage with `finetune.opt.
                     peak_lr` and `finetune.train.steps` of the regime (the cosine schedule spans
                     the regime's steps; min_steps and warm-up are capped at them); each resumes
                     from its own folder (workdir/finetune_r<i>);
  3. per regime      testbed's compositions and scores: results rows with the regime's fields,
                     table_r<i>.md (testbed's table), predictions_r<i>.jsonl and the heatmaps of
                     where each expert changed (delta_<expert>_r<i>.png);
  4. the map         table.md (one row per recipe, one column per regime: goal exact match, mean
                     ± 95% half-width over seeds) and regime_map.png (testbed_regimes_report).

How far an expert moved, its *relative delta*: ||theta_expert - theta_base||_2 / ||theta_base||_2
with every parameter of the model in one vector (so large tensors weigh more), per seed; the
map's x is the task expert's mean over seeds. Every trained recipe's is in summary.json.

Rows: testbed_report's rows of each regime (the same conditions repeat across regimes), each with
  regime                 the regime's index in `c.regimes`;
  peak_lr, finetune_steps  the regime's settings;
  task_expert_delta, language_expert_delta  the experts' mean relative deltas in that regime.
The LoRA and trained-neuron stages are not part of the map (lora.enabled and
maet_neurons.enabled must be False).
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import ml_collections
import numpy as np

from xlt import distributed
from xlt import results as results_lib
from xlt.experiments import common as kind_lib
from xlt.experiments.testbed import experiment as testbed
from xlt.experiments.testbed import regimes_report as testbed_regimes_report
from xlt.experiments.testbed import report as testbed_report

# what this kind is called (c.kind) and runs (data tasks, each with its headline metric) and how xlt.report reads its rows
KIND = kind_lib.Kind(name="testbed.regimes", tasks={"arithmetic": "exact_match"}, measurements="regimes",
                      former_tasks={"arithmetic_regimes": "arithmetic"})

EXPERTS = ("task expert", "language expert")


def regimes(c) -> list[tuple[float, int]]:
  """`c.regimes` as (peak_lr, steps) pairs; anything else fails with one ValueError naming the
  entry: not a pair, a learning rate that is not positive, steps not a positive integer, a
  repeated regime, or no regime at all."""
  given = c.get("regimes")
  if not given:
    raise ValueError("regimes is empty: give ((peak_lr, steps), ...) fine-tuning regimes")
  out = []
  for k, entry in enumerate(given):
    try:
      lr, steps = entry
      lr, steps_f = float(lr), float(steps)
    except (TypeError, ValueError):
      raise ValueError(f"regimes entry {k} ({entry!r}) is not a (peak_lr, steps) pair") from None
    if not (np.isfinite(lr) and lr > 0) or steps_f != int(steps_f) or steps_f < 1:
      raise ValueError(f"regimes entry {k} ({entry!r}): peak_lr must be a positive number and steps a "
                       "positive integer")
    if (lr, int(steps_f)) in out:
      raise ValueError(f"regimes entry {k} ({entry!r}) repeats an earlier regime")
    out.append((lr, int(steps_f)))
  return out


def regime_config(c, i: int) -> ml_collections.ConfigDict:
  """A copy of `c` whose fine-tuning (`finetune.train`, `finetune.opt`) is regime i's."""
  lr, steps = regimes(c)[i]
  r = ml_collections.ConfigDict(c.to_dict())  # a copy without field references
  r.finetune.opt.peak_lr = lr
  r.finetune.train.steps = r.finetune.opt.total_steps = steps
  r.finetune.train.min_steps = min(int(r.finetune.train.min_steps), steps)
  r.finetune.opt.warmup_steps = min(int(r.finetune.opt.warmup_steps), steps)
  return r


def prepare(c, workdir: str) -> testbed.Prep:
  """Checks the regimes, then testbed's prepare."""
  regimes(c)
  for part in ("lora", "maet_neurons"):
    if c.get(part) and c[part].enabled:
      raise ValueError(f"{part}.enabled: the regime map runs the full fine-tunes only; set it to False")
  return testbed.prepare(c, workdir)


def stage_name(i: int) -> str:
  return f"finetune_r{i}"


def stages(c, prep: testbed.Prep, trained: dict):
  """testbed's stages up to its fine-tune stage (the base), then one fine-tune stage per regime,
  each from the same base."""
  for stage in testbed.stages(c, prep, trained):
    if stage.name != "finetune":
      yield stage
      continue
    base = trained["base"].params
    for i, (lr, steps) in enumerate(regimes(c)):
      print(f"regime {i}: peak_lr {lr:g}, {steps} steps", flush=True)
      yield dataclasses.replace(testbed._finetune_stage(regime_config(c, i), prep, base), name=stage_name(i))
    return


def relative_delta(expert, base) -> float:
  """||expert - base||_2 / ||base||_2 over every parameter as one vector."""
  pairs = list(zip(jax.tree.leaves(expert), jax.tree.leaves(base)))
  num = sum(float(np.sum((np.asarray(e, np.float64) - np.asarray(b, np.float64)) ** 2)) for e, b in pairs)
  den = sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for _, b in pairs)
  return float(np.sqrt(num / den))


def _regime_models(c, prep, base, ft) -> tuple[list[dict], dict]:
  """Per seed, every model of one regime (testbed.compose); and every trained recipe's relative
  delta {recipe: {mean, values}}."""
  n = len(prep.seeds)
  per_seed, deltas = [], {}
  for i, s in enumerate(prep.seeds):
    b = kind_lib.member(base, i)
    recipes = testbed.seed_models(ft.params, prep.of("full"), n, i)
    for name, params in recipes.items():
      deltas.setdefault(name, []).append(relative_delta(params, b))
    per_seed.append(testbed.compose(c, b, recipes, ft.stage.info["labels"], seed=s,
                                    statistics=testbed.seed_statistics(c, prep, i)))
  return per_seed, {k: {"mean": float(np.mean(v)), "values": v} for k, v in deltas.items()}


def _regime_outputs(c, prep, trained, workdir, i: int):
  """Regime i's rows (with its fields), testbed table, predictions, heatmaps; its summary."""
  (lr, steps), ft, base = regimes(c)[i], trained[stage_name(i)], trained["base"].params
  per_seed, deltas = _regime_models(c, prep, base, ft)
  names = list(per_seed[0])
  scores = testbed._score_all(prep.cfg, prep.task, per_seed, prep.sets, c.eval.batch_size, prep.seeds, workdir,
                              predictions_file=f"predictions_r{i}.jsonl")
  rows = testbed_report.rows(c, names, scores, prep.sets, prep.seeds, {r.name: r.trained_on for r in prep.recipes})
  fields = {"regime": i, "peak_lr": lr, "finetune_steps": steps,
            **{f"{e.replace(' ', '_')}_delta": deltas[e]["mean"] for e in EXPERTS}}
  rows = [{**r, **fields} for r in rows]
  results_lib.atomic_write(os.path.join(workdir, f"table_r{i}.md"),
                           f"regime {i}: peak_lr {lr:g}, {steps} steps\n\n"
                           + testbed_report.table(c, rows, names, prep.sets))
  heatmaps = testbed._heatmaps(c, workdir, base, ft.params, prep.of("full"), prep.seeds, tag=f"_r{i}")
  member_names = [m.name for m in ft.stage.members]
  summary = {**fields, "stage": stage_name(i), "relative_delta": deltas, "heatmaps": heatmaps,
             "finetune_best_steps": dict(zip(member_names, ft.out["best_steps"])),
             "finetune_stopped_at": dict(zip(member_names, ft.out["stopped_at"]))}
  return rows, names, summary


def outputs(c, prep: testbed.Prep, trained: dict, workdir: str):
  """Per regime testbed's models and scores (`_regime_outputs`); then the map: table.md and
  regime_map.png (testbed_regimes_report), and the summary."""
  t = time.time()
  rows, per_regime, names = [], [], []
  for i in range(len(regimes(c))):
    r_rows, r_names, r_summary = _regime_outputs(c, prep, trained, workdir, i)
    rows += r_rows
    per_regime.append(r_summary)
    names += [n for n in r_names if n not in names]
  families = testbed_regimes_report.families(c, testbed.merges(c))
  lines = testbed_regimes_report.lines(rows, families)
  if distributed.is_main():
    testbed_regimes_report.plot(os.path.join(workdir, "regime_map.png"), lines,
                                f"{c.name}: goal exact match by how far the task expert moved",
                                {i: f"r{i}: lr {lr:g}, {steps} steps" for i, (lr, steps) in enumerate(regimes(c))})
  table = testbed_regimes_report.table(c, rows, names, lines)
  t_base = trained["base"].done_s
  done = [trained[stage_name(i)].done_s for i in range(len(per_regime))]
  summary = {"regimes": per_regime, "regime_map": lines, "png": "regime_map.png",
             "members": {"base": len(prep.seeds), "finetune_per_regime": len(prep.of("full")) * len(prep.seeds)},
             "wall_s": {"base": t_base, "finetune_per_regime": np.diff([t_base] + done).tolist(),
                        "merge_and_score": time.time() - t, "total": max(done) + time.time() - t}}
  return rows, table, summary
