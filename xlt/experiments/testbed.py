"""The merge testbed: composing a task learned in one language with a language learned from
other data, where the answer is known by construction (configs/merge.py documents the design).

The data flow, one stage per step, every stage an ensemble over seeds:

  1. base        trained from scratch on the non-task operations in both languages
                 (workdir/base);
  2. fine-tunes  every recipe (`plan`) from its seed's base, all recipes and seeds in ONE
                 ensemble: partition recipes (a frozen partition, partitions taking turns)
                 run under one gated optimizer, so a member's recipe is data (workdir/finetune);
  3. models      per seed, the trained models plus what is built from them without training:
                 freeze-then-train and train-then-revert compositions, layer swaps, soups,
                 task arithmetic, TIES, DARE, MAET (`compose`; xlt.merge and xlt.partition);
  4. scores      every model greedily decoded on the goal (the task in the target language,
                 on which nothing trained), the task in the source language, and the target
                 language's other operations; results rows, table.md, and the heatmaps of
                 where each expert changed (delta_<expert>.png).

Each trained stage keeps its members' best-validation parameters and resumes from its
checkpoints, so a killed run started again with the same command ends the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import ml_collections
import numpy as np

from xlt import distributed
from xlt import ensemble as ensemble_lib
from xlt import loop as loop_lib
from xlt import merge
from xlt import model as model_lib
from xlt import partition
from xlt import results as results_lib
from xlt import runner
from xlt import testbed_peft
from xlt.data import arithmetic, common

ALL = None  # a phase that trains every parameter


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A fine-tuning recipe: per phase, a dataset and what it trains (ALL, or a (preset,
  label) partition); phases take turns `steps_per_phase` steps each. `val` names the
  roles whose validation sets pick its best checkpoint."""

  name: str
  phases: tuple[tuple[str, tuple[str, str] | None], ...]
  val: tuple[str, ...]
  steps_per_phase: int = 1


def plan(c) -> list[Recipe]:
  """The stage-2 recipes of the config: experts, data mixing, partial experts per
  partition preset, and simultaneous partition training per preset and switch interval."""
  recipes = [Recipe("task expert", (("task", ALL),), ("task",)),
             Recipe("language expert", (("language", ALL),), ("language",)),
             Recipe("source-language expert", (("source_language", ALL),), ("source_language",)),
             Recipe("data mixing", (("mixed", ALL),), ("task", "language"))]
  for p in c.partition.presets:
    recipes += [Recipe(f"partial task expert [{p}]", (("task", (p, "task")),), ("task",)),
                Recipe(f"partial language expert [{p}]", (("language", (p, "language")),), ("language",))]
  for p in c.simultaneous.presets:
    for k in c.simultaneous.steps_per_switch:
      recipes.append(Recipe(f"simultaneous [{p}] k={k}", (("task", (p, "task")), ("language", (p, "language"))),
                            ("task", "language"), int(k)))
  return recipes


def roles(c) -> dict[str, list[str]]:
  """Evaluation set names ("operation/language") of each role."""
  src, tgt, op = c.languages.source, c.languages.target, c.task_op
  if src == tgt:
    raise ValueError(f"languages.source and languages.target are the same language {src!r}")
  if op in c.other_ops:
    raise ValueError(f"the task operation {op!r} is also among other_ops: the goal would leak")
  return {"goal": [f"{op}/{tgt}"], "task": [f"{op}/{src}"],
          "language": [f"{o}/{tgt}" for o in c.other_ops],
          "source_language": [f"{o}/{src}" for o in c.other_ops]}


def datasets(c) -> dict[str, list[common.Example]]:
  """The training sets by name: mixtures [(operation, language, count), ...] of the config, and
  `mixed` = task + language (data mixing)."""
  for name in ("task", "language", "source_language"):
    for op, lang, _ in c.data[name]:
      if (name == "task") != (op == c.task_op) or lang != (c.languages.target if name == "language"
                                                            else c.languages.source):
        raise ValueError(f"data.{name} holds ({op}, {lang}): the {name} data must be "
                         + ("the task in the source language" if name == "task" else
                            f"non-task operations in the {name.replace('_', ' ')}"))
  if any(op == c.task_op for op, _, _ in c.data.base):
    raise ValueError(f"data.base holds the task operation {c.task_op!r}: the base must not learn it")
  out = {k: arithmetic.mixture(c.data[k], c.arithmetic) for k in ("base", "task", "language", "source_language")}
  out["mixed"] = out["task"] + out["language"]
  return out


# --------------------------------------------------------------------------- stage 3


def compose(c, base, trained: dict, labels: dict, seed: int = 0) -> dict:
  """Every model of one seed to evaluate, by name (insertion order = table order): the base,
  the trained recipes, and what is built from them without training. `trained` maps recipe
  names to params; `labels` preset names to label trees."""
  task, lang = trained["task expert"], trained["language expert"]
  models = {"base": base, **{k: v for k, v in trained.items()}}
  for p in c.partition.presets:
    # freeze-then-train: each partial expert changed only its own partition, so taking each
    # partition from its expert composes them exactly
    models[f"freeze-then-train [{p}]"] = partition.combine(
        {"task": trained[f"partial task expert [{p}]"], "language": trained[f"partial language expert [{p}]"]},
        labels[p])
    # train-then-revert: full experts, each reset to the base outside its own partition
    models[f"train-then-revert [{p}]"] = partition.combine({"task": task, "language": lang}, labels[p])
    models[f"task expert, language partition reverted [{p}]"] = partition.revert(task, base, labels[p], "language")
  m = c.merge
  for b, u, t in _swaps(c):
    models[f"layer swap b={b} u={u} t={t}"] = merge.layer_swap(
        task, lang, bottom=b, top=u, lower_transition=t, upper_transition=t, non_block=m.non_block)
  models["soup"] = merge.soup([task, lang])
  models["soup (magnitude)"] = merge.soup([task, lang], merge.magnitude_weights([task, lang], base))
  for lam in m.task_arithmetic:
    models[f"task arithmetic λ={lam}"] = merge.task_arithmetic(base, [task, lang], float(lam))
  models[f"TIES density={m.ties_density}"] = merge.ties(base, [task, lang], density=m.ties_density)
  models[f"DARE drop={m.dare_drop}"] = merge.dare(base, [task, lang], drop=m.dare_drop, seed=seed)
  models["MAET"] = merge.maet(base, task, trained["source-language expert"], [lang], **m.maet.to_dict())
  return models


# --------------------------------------------------------------------------- running


def _swaps(c) -> list[tuple[int, int, int]]:
  out = []
  for spec in c.merge.swaps:
    try:
      b, u, t = (int(x) for x in str(spec).split(","))
    except ValueError:
      raise ValueError(f"merge.swaps entry {spec!r} is not 'bottom,top,transition'") from None
    out.append((b, u, t))
  return out


def check(c, num_layers: int):
  """Fails on a config that could not finish, before anything trains: partition presets and
  layer swaps that do not fit the model, unknown presets in the simultaneous recipes."""
  for p in set(c.partition.presets) | set(c.simultaneous.presets):
    partition.preset_rules(p, num_layers, c.partition.bottom, c.partition.top,
                           c.partition.embeddings, c.partition.head)
  for b, u, t in _swaps(c):
    merge.swap_plan(num_layers, b, u, t, t)
  if not c.simultaneous.steps_per_switch or min(c.simultaneous.steps_per_switch) < 1:
    raise ValueError(f"simultaneous.steps_per_switch must be positive, got {c.simultaneous.steps_per_switch}")
  testbed_peft.check(c, num_layers)


def _stage(c, part) -> ml_collections.ConfigDict:
  """The loop's view of one stage: its train/opt, and the shared mesh."""
  s = ml_collections.ConfigDict({"train": part.train.to_dict(), "opt": part.opt.to_dict(),
                                 "mesh": c.mesh.to_dict()})
  if c.get("sharding_rules"):
    s.sharding_rules = c.sharding_rules
  return s


def _stack(trees):
  return jax.tree.map(lambda *xs: np.stack(xs), *distributed.to_host(trees))


def _member(stacked, i):
  return distributed.to_host(ensemble_lib.take(stacked, i))


def run(c, workdir: str, *, progress: bool = True, stop_after: int | None = None) -> list[dict]:
  """Runs the testbed `c` describes in `workdir`; returns its results rows (empty if
  stopped early by `stop_after`, which applies to each training stage)."""
  workdir, rows = runner.open_workdir(c, workdir)
  if rows is not None:
    return rows
  t0 = time.time()
  seeds = runner.condition_seeds(c, "all")
  sets = roles(c)
  recipes = plan(c)
  tok = common.WordTokenizer(arithmetic.symbols())
  seq_len = arithmetic.max_length(c.arithmetic.max_digits)
  cfg = model_lib.config_from(c.model.to_dict(), tok.vocab_size)
  if seq_len > cfg.block_size:
    raise ValueError(f"sequences of {seq_len} tokens do not fit model.block_size={cfg.block_size}")
  check(c, cfg.num_layers)
  names = [n for r in sets.values() for n in r]
  val_sets, test_sets = arithmetic.eval_sets(names, c.arithmetic)
  task = common.Task(tokenizer=tok, seq_len=seq_len, train={}, val=val_sets, test=test_sets, info={})
  data = {k: (lambda e: {"tokens": e.tokens, "loss_mask": e.loss_mask})(
      common.encode_examples(v, tok, seq_len)) for k, v in datasets(c).items()}

  def val_score(member_sets):
    def score(params, ids):
      scored = runner.score_members(cfg, params, task, val_sets, [member_sets[i] for i in ids],
                                    c.eval.batch_size)
      return [np.mean([s[n]["exact_match"] for n in member_sets[i]]) for s, i in zip(scored, ids)]
    return score

  # 1. base
  base_sets = sets["language"] + sets["source_language"]
  members = [loop_lib.Member(f"base/seed_{s}", s, data["base"]) for s in seeds]
  base, out = runner.train_and_select(_stage(c, c.base), cfg, members, val_score([base_sets] * len(seeds)),
                                      os.path.join(workdir, "base"), stop_after=stop_after, progress=progress)
  if base is None:
    return []
  t_base = time.time() - t0

  # 2. fine-tunes: every recipe x seed in one ensemble
  one = _member(base, 0)
  presets = sorted(set(c.partition.presets) | set(c.simultaneous.presets))
  labels = {p: partition.labels(one, partition.preset_rules(
      p, cfg.num_layers, c.partition.bottom, c.partition.top, c.partition.embeddings, c.partition.head))
            for p in presets}
  cell_tree, cells = partition.refine([labels[p] for p in presets])
  flags = lambda what: tuple(bool(f) for f in (np.ones(len(cells), bool) if what is ALL else
                                               partition.cells_of(presets.index(what[0]), what[1], cells)))
  members, init, member_sets = [], [], []
  for r in recipes:
    for i, s in enumerate(seeds):
      members.append(loop_lib.Member(f"{r.name}/seed_{s}", 1000 + s, tuple(data[d] for d, _ in r.phases),
                                     tuple(flags(w) for _, w in r.phases), r.steps_per_phase))
      init.append(_member(base, i))
      member_sets.append([n for role in r.val for n in sets[role]])
  ft = _stage(c, c.finetune)
  print(f"testbed: {len(recipes)} recipes x {len(seeds)} seeds = {len(members)} fine-tuned models; "
        f"partition cells {list(cells)}", flush=True)
  tuned, tuned_out = runner.train_and_select(
      ft, cfg, members, val_score(member_sets), os.path.join(workdir, "finetune"),
      init_params=_stack(init), tx=partition.gated_optimizer(ft.opt, cell_tree, cells),
      stop_after=stop_after, progress=progress)
  if tuned is None:
    return []

  # 2b. LoRA recipes, 2c-d. MAET's short runs and training on its key neurons (testbed_peft);
  # their models are scored as plain parameters (LoRA merged into the base)
  peft_val = lambda member_sets: (lambda params, ids: val_score(member_sets)(testbed_peft.plain(params), ids))
  lora_adapters = maet_trained = None
  if testbed_peft.lora_plan(c):
    lora_adapters, _ = testbed_peft.train_lora(c, cfg, base, seeds, data, sets, peft_val, workdir,
                                               stop_after=stop_after, progress=progress)
    if lora_adapters is None:
      return []
  if c.get("maet_neurons") and c.maet_neurons.enabled:
    maet_trained, _ = testbed_peft.train_maet_neurons(c, cfg, base, seeds, data, sets, peft_val, workdir,
                                                      stop_after=stop_after, progress=progress)
    if maet_trained is None:
      return []
  t_tune = time.time() - t0 - t_base

  # 3. models per seed, 4. scores
  per_seed = []
  for i, s in enumerate(seeds):
    trained = {r.name: _member(tuned, k * len(seeds) + i) for k, r in enumerate(recipes)}
    models = compose(c, _member(base, i), trained, labels, seed=s)
    if lora_adapters is not None:
      models.update(testbed_peft.compose_lora(c, _member(base, i), {k: v[i] for k, v in lora_adapters.items()}))
    if maet_trained is not None:
      models.update(testbed_peft.compose_maet(c, _member(base, i), maet_trained[i], trained["language expert"]))
    per_seed.append(models)
  model_names = list(per_seed[0])
  scores = _score_all(cfg, task, per_seed, sets, c.eval.batch_size, seeds, workdir)
  rows = _rows(c, model_names, scores, sets, seeds)
  heatmaps = _heatmaps(c, workdir, base, tuned, recipes, seeds)

  table = _table(c, rows, model_names, sets)
  summary = {"members": {"base": len(seeds), "finetune": len(members),
                         "lora": len(testbed_peft.lora_plan(c)) * len(seeds),
                         "maet_neurons": 2 * len(seeds) if maet_trained is not None else 0}, "models_per_seed": len(model_names),
             "params_per_model": model_lib.count_params(one), "partition_cells": list(cells),
             "partition_summary": {p: partition.summary(labels[p], one) for p in presets},
             "base_steps": out["step"], "finetune_best_steps": dict(zip([m.name for m in members], tuned_out["best_steps"])),
             "finetune_stopped_at": dict(zip([m.name for m in members], tuned_out["stopped_at"])),
             "heatmaps": heatmaps, "wall_s": {"base": t_base, "finetune": t_tune,
                                              "merge_and_score": time.time() - t0 - t_base - t_tune,
                                              "total": time.time() - t0}}
  runner.write_outputs(workdir, rows, table, summary)
  print(table)
  print(json.dumps(summary["wall_s"]))
  return rows


def _score_all(cfg, task, per_seed, sets, batch, seeds, workdir, chunk: int = 48):
  """{model name: {set name: {metric: [value per seed]}}}, decoding models in chunks; every
  answer goes to workdir/predictions.jsonl (member "<model>/seed_<s>")."""
  flat = [(name, i, params) for i, models in enumerate(per_seed) for name, params in models.items()]
  wanted = [n for r in ("goal", "task", "language") for n in sets[r]]
  out, predictions = {}, []
  for start in range(0, len(flat), chunk):
    part = flat[start:start + chunk]
    stacked = jax.device_put(_stack([p for _, _, p in part]))
    records = []
    scored = runner.score_members(cfg, stacked, task, {n: task.test[n] for n in wanted},
                                  [wanted] * len(part), batch, records)
    predictions += [{**r, "member": start + r["member"]} for r in records]
    for (name, i, _), s in zip(part, scored):
      for n, metrics in s.items():
        for k, v in metrics.items():
          out.setdefault(name, {}).setdefault(n, {}).setdefault(k, [None] * len(per_seed))[i] = v
  runner.write_predictions(os.path.join(workdir, "predictions.jsonl"), predictions,
                           [f"{name}/seed_{seeds[i]}" for name, i, _ in flat])
  return out


def _rows(c, model_names, scores, sets, seeds) -> list[dict]:
  """One row per model x role x metric (the language role: mean over its operations)."""
  rows = []
  lang_of = {"goal": c.languages.target, "task": c.languages.source, "language": c.languages.target}
  for name in model_names:
    for role in ("goal", "task", "language"):
      metrics = ("exact_match", "any_script") if role == "goal" else ("exact_match",)
      for metric in metrics:
        values = np.mean([scores[name][n][metric] for n in sets[role]], axis=0)
        rows.append(results_lib.make_row(
            experiment=c.name, task=c.task, language=lang_of[role], role=role, condition=name,
            metric=metric, values=values, samples=None, sets=sets[role], seeds_used=seeds))
  return rows


def _table(c, rows, model_names, sets) -> str:
  find = lambda name, role, metric: next(r for r in rows if r["condition"] == name
                                         and r["role"] == role and r["metric"] == metric)
  goal, tsk = sets["goal"][0], sets["task"][0]
  lines = [f"{c.name}: test exact match, mean ± std over {len(rows[0]['values'])} seeds",
           "", f"| model | goal: {goal} | goal, any script | task: {tsk} | language: {', '.join(sets['language'])} |",
           "|---|---|---|---|---|"]
  for name in model_names:
    cells = [results_lib.fmt(find(name, r, m)) for r, m in
             (("goal", "exact_match"), ("goal", "any_script"), ("task", "exact_match"), ("language", "exact_match"))]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def _heatmaps(c, workdir, base, tuned, recipes, seeds) -> dict:
  """Where each expert changed (share of rows whose mean |delta| exceeds the threshold),
  averaged over seeds; one PNG and the numbers per expert."""
  out = {}
  for k, r in enumerate(recipes):
    if r.name not in ("task expert", "language expert"):
      continue
    changes = []
    for i in range(len(seeds)):
      expert, b = _member(tuned, k * len(seeds) + i), _member(base, i)
      threshold = c.merge.heatmap_threshold or merge.default_threshold(expert, b)
      changes.append(merge.row_change(expert, b, threshold=threshold))
    mean = {**changes[0], "share": np.mean([ch["share"] for ch in changes], axis=0).tolist(),
            "non_block": {k2: float(np.mean([ch["non_block"][k2] for ch in changes])) for k2 in changes[0]["non_block"]}}
    slug = r.name.replace(" ", "_")
    merge.plot_row_change(mean, os.path.join(workdir, f"delta_{slug}.png"),
                          f"{r.name}: share of rows changed (mean over {len(seeds)} seeds)")
    out[r.name] = {"png": f"delta_{slug}.png", "share": mean["share"], "columns": mean["columns"],
                   "non_block": mean["non_block"]}
  return out
