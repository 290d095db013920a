"""The merge testbed: composing a task learned in one language with a language learned from
other data, where the answer is known by construction (configs/merge.py documents the design).

The data flow, one stage per step, every stage an ensemble over seeds:

  1. base        trained from scratch on the non-task operations in both languages
                 (workdir/base), or a Hugging Face model the user brings (`base_model`:
                 testbed_text, the task as text in its tokenizer);
  2. fine-tunes  every recipe (testbed_plan.plan: what each trains on, and `finetune.replay`
                 of the base's data) from its seed's base, all recipes and seeds in ONE
                 ensemble: partition recipes (a frozen partition, partitions taking turns)
                 run under one gated optimizer, so a member's recipe is data (workdir/finetune);
  3. models      per seed, the trained models plus what is built from them without training:
                 freeze-then-train and train-then-revert compositions, layer swaps, soups,
                 task arithmetic, TIES, DARE, MAET (`compose`; xlt.merge and xlt.partition);
  4. scores      every model greedily decoded on the goal (the task in the target language,
                 on which nothing trained), the task in the source language, and the other
                 operations in the target and in the source language; results rows and
                 table.md with 95% intervals over seeds, paired differences to the best expert
                 and retention (testbed_report), and the heatmaps of where each expert changed
                 (delta_<expert>.png).

As a kind of xlt.runner, stages 1 and 2 (and testbed_peft's LoRA and trained-neuron stages
after them) are `stages`, which the runner trains one after another; 3 and 4 are `outputs`.
Each trained stage keeps its members' best-validation parameters and resumes from its
checkpoints, so a killed run started again with the same command ends the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import jax
import numpy as np

from xlt import distributed
from xlt import ensemble_decode
from xlt import loop as loop_lib
from xlt import merge
from xlt import model as model_lib
from xlt import partition
from xlt import results as results_lib
from xlt.data import arithmetic, common
from xlt.eval import scores as eval_scores
from xlt.experiments import common as kind_lib
from xlt.experiments import recipes as recipe_lib
from xlt.experiments.recipes import ALL, Recipe
from xlt.experiments.testbed import peft as testbed_peft
from xlt.experiments.testbed import plan as testbed_plan
from xlt.experiments.testbed import report as testbed_report
from xlt.experiments.testbed import statistics as testbed_statistics
from xlt.experiments.testbed import text as testbed_text

# what this kind is called (c.kind) and runs (data tasks, each with its headline metric) and how xlt.report reads its rows
KIND = kind_lib.Kind(name="testbed", tasks={"arithmetic": "exact_match"}, measurements="testbed")

# the merge registry's inputs the testbed has (compose fills each): checked before training
MERGE_INPUTS = ("task_expert", "language_expert", "experts", "base", "ability_model", "source_language_model",
                "target_language_models")
# the config fields a base is made from: a run takes another run's bases (`bases_from`) only
# when both agree on each of them
BASE_FIELDS = ("task", "seed", "num_seeds", "seeds_per_condition", "arithmetic", "languages", "task_op", "other_ops",
               "data.base", "data.base_task", "model", "base", "base_model", "base_fluency", "base_render")


def plan(c) -> list[Recipe]:
  """The stage-2 recipes (the full fine-tunes, in member order) of testbed_plan.plan, which
  lists every trained recipe of every stage."""
  return testbed_plan.plan(c, "full")


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
  `mixed` = task + language (data mixing). With `finetune.replay` = r > 0 each fine-tuning set
  (task, language, source_language, mixed) of n examples gets round(r n) examples of the base's
  data after it, drawn once with the data's seed (testbed_plan.with_replay)."""
  for name in ("task", "language", "source_language"):
    for op, lang, _ in c.data[name]:
      if (name == "task") != (op == c.task_op) or lang != (c.languages.target if name == "language"
                                                            else c.languages.source):
        raise ValueError(f"data.{name} holds ({op}, {lang}): the {name} data must be "
                         + ("the task in the source language" if name == "task" else
                            f"non-task operations in the {name.replace('_', ' ')}"))
  if any(op == c.task_op for op, _, _ in c.data.base):
    raise ValueError(f"data.base holds the task operation {c.task_op!r}: the base must not learn it "
                     "(data.base_task gives it a dose of the task in the source language)")
  for op, lang, _ in c.data.get("base_task", ()):
    if (op, lang) != (c.task_op, c.languages.source):
      raise ValueError(f"data.base_task holds ({op}, {lang}): only the task in the source language")
  out = {k: arithmetic.mixture(c.data[k], c.arithmetic) for k in ("base", "task", "language", "source_language")}
  if c.data.get("base_task"):
    # a base that half-knows the task (the papers' regime): a dose of it in the source
    # language, the first problems of the task expert's own stream (a pretraining corpus
    # that overlaps the fine-tuning data), after the base's other data
    out["base"] += arithmetic.mixture(c.data.base_task, c.arithmetic)
  out["mixed"] = out["task"] + out["language"]
  return testbed_plan.with_replay(out, c.finetune.get("replay", 0.0), int(c.arithmetic.seed))


# --------------------------------------------------------------------------- stage 3


def compose(c, base, trained: dict, labels: dict, seed: int = 0, statistics=None) -> dict:
  """Every model of one seed to evaluate, by name (insertion order = table order): the base,
  the trained recipes, and what is built from them without training. `trained` maps recipe
  names to params; `labels` preset names to label trees; `statistics` the seed's experts'
  (testbed_statistics.Statistics) when a merge is data-aware (`merge_models`)."""
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
  models.update(merge_models(c, base, task, lang, merges(c, seed), statistics,
                             source_language=trained.get("source-language expert")))
  return models


def merge_models(c, base, task, lang, specs, statistics=None, source_language=None) -> dict:
  """{label: merged params} of `specs` ((label, method, options), `merges`) over one seed's
  base and experts. A data-aware merge takes its statistics from `statistics`
  (testbed_statistics.Statistics of this seed's experts, [task, language]); without it one
  is a ValueError."""
  inputs = {"task_expert": task, "language_expert": lang, "experts": [task, lang], "base": base,
            "ability_model": task, "source_language_model": source_language, "target_language_models": [lang]}
  out = {}
  for label, method, options in specs:
    options = dict(options)
    if method == "soup" and options.pop("weights", None) == "magnitude":
      options["weights"] = merge.magnitude_weights([task, lang], base)
    if testbed_statistics.needs_data(method, options):
      if statistics is None:
        raise ValueError(f"merge {label!r} is data-aware: it needs the experts' statistics")
      options = statistics.fill(method, options, [task, lang])
    out[label] = merge.registry.merge_among(method, inputs, options)
  return out


# --------------------------------------------------------------------------- running


def merges(c, seed: int = 0) -> list[tuple[str, str, dict]]:
  """The merges the testbed scores, as (table label, registry method, options), in table order:
  the config's layer swaps (each also module-wise, per `merge.swap_modules`), soups, task arithmetic, TIES, DARE and MAET, then `merge.extra`
  ("method option=value ..." for any registry method whose inputs the testbed has: the task
  and language experts, the base, the source-language expert; a data-aware one, RegMean,
  Fisher, Localize-and-Stitch with losses="data", gets its statistics from each expert's own
  training data: testbed_statistics). A soup's weights="magnitude" are computed from the
  experts' deltas."""
  m = c.merge
  out = []
  for b, u, t in recipe_lib.swaps(c.merge.swaps, "merge.swaps"):
    swap = dict(bottom=b, top=u, lower_transition=t, upper_transition=t, non_block=m.non_block)
    out.append((f"layer swap b={b} u={u} t={t}", "layer_swap", swap))
    # module-wise: only these kinds of the swapped blocks from the language expert
    out += [(f"layer swap b={b} u={u} t={t} [{k}]", "layer_swap", {**swap, "modules": str(k)})
            for k in m.get("swap_modules", ())]
  out += [("soup", "soup", {}), ("soup (magnitude)", "soup", {"weights": "magnitude"})]
  out += [(f"task arithmetic λ={lam}", "task_arithmetic", {"lambdas": float(lam)}) for lam in m.task_arithmetic]
  # TIES in the rule its recorded results were made with (xlt.merge.combine.ties: convention)
  out += [(f"TIES density={m.ties_density}", "ties", {"density": m.ties_density, "convention": "xlt"}),
          (f"DARE drop={m.dare_drop}", "dare", {"drop": m.dare_drop, "seed": seed}),
          ("MAET", "maet", m.maet.to_dict())]
  for spec in m.get("extra", ()):
    out.append((str(spec), *merge.registry.parse_spec(spec, "merge.extra")))
  return out


def seed_statistics(c, prep, i: int):
  """Seed i's testbed_statistics.Statistics of its task and language experts when a merge of
  the config is data-aware (None otherwise: nothing to compute)."""
  if not any(testbed_statistics.needs_data(method, options) for _, method, options in merges(c)):
    return None
  experts = {r.name: r for r in prep.of("full")}
  return testbed_statistics.for_seed(c, prep, [experts["task expert"], experts["language expert"]], i)


def _check_merges(c):
  for label, method, options in merges(c):
    if options.get("weights") == "magnitude":  # computed from the experts when they exist
      options = {k: v for k, v in options.items() if k != "weights"}
    merge.registry.check_among(method, testbed_statistics.placeholder(method, options, 2), MERGE_INPUTS, label)


def check(c, num_layers: int):
  """Fails on a config that could not finish, before anything trains: partition presets and
  layer swaps that do not fit the model, unknown presets in the simultaneous recipes."""
  for p in set(c.partition.presets) | set(c.simultaneous.presets):
    partition.preset_rules(p, num_layers, c.partition.bottom, c.partition.top,
                           c.partition.embeddings, c.partition.head)
  for b, u, t in recipe_lib.swaps(c.merge.swaps, "merge.swaps"):
    merge.swap_plan(num_layers, b, u, t, t)
  for k in c.merge.get("swap_modules", ()):
    merge.swapped_modules(k)
  _check_merges(c)
  testbed_statistics.settings(c)
  if not c.simultaneous.steps_per_switch or min(c.simultaneous.steps_per_switch) < 1:
    raise ValueError(f"simultaneous.steps_per_switch must be positive, got {c.simultaneous.steps_per_switch}")
  testbed_peft.check(c, num_layers)


def seed_models(tuned, recipes, num_seeds: int, i: int) -> dict:
  """{recipe name: seed i's trained params} of a fine-tune stage's stacked members, laid out
  recipe-major as `_finetune_stage` builds them (recipe k, seed i: member k * seeds + i)."""
  return {r.name: kind_lib.member(tuned, k * num_seeds + i) for k, r in enumerate(recipes)}


@dataclasses.dataclass(frozen=True)
class Prep:
  """What `prepare` built: the seeds, the evaluation sets of each role, every recipe of every
  stage (testbed_plan.plan), the model, the task (tokenizer and evaluation sets), the
  encoded training sets by name, and the params of `c.base_model` (None: xlt's own base)."""

  seeds: list[int]
  sets: dict[str, list[str]]
  recipes: list[Recipe]
  cfg: model_lib.Config
  task: common.Task
  data: dict[str, dict[str, np.ndarray]]
  loaded: object = None

  def of(self, variant: str) -> list[Recipe]:
    """The recipes of one variant ("full", "lora", "neurons"), in member order."""
    return [r for r in self.recipes if r.variant == variant]


def take_bases(c, workdir: str):
  """With `c.bases_from`, a finished testbed workdir: copies its base stage into `workdir`, so
  that this run's recipes start from those very bases (the runner resumes a finished stage
  without training it). A rerun under another float rounding then redraws nothing but the
  recipes: training a base from scratch is chaotic, and a base trained again under another
  rounding is another base (docs/testbed.md). Refuses a source that did not finish or whose
  bases another config made; the copy lands whole (a temporary folder, then a rename)."""
  src = os.path.abspath(c.get("bases_from") or "")
  dest = os.path.join(workdir, "base")
  if not c.get("bases_from") or os.path.exists(dest):
    return
  if not os.path.exists(os.path.join(src, "results.json")) or not os.path.isdir(os.path.join(src, "base")):
    raise ValueError(f"bases_from={src}: not a finished testbed run with a trained base stage (its results.json "
                     "and base/ folder)")
  with open(os.path.join(src, "config.json")) as f:
    changes = kind_lib.config_changes(json.load(f), c)
  differ = sorted(k for k in changes if any(k == f or k.startswith(f + ".") for f in BASE_FIELDS))
  if differ:
    raise ValueError(f"bases_from={src}: its bases were made with another config ({', '.join(differ[:6])}"
                     f"{', ...' if len(differ) > 6 else ''} differ)")
  if distributed.is_main():
    shutil.rmtree(dest + ".tmp", ignore_errors=True)
    shutil.copytree(os.path.join(src, "base"), dest + ".tmp")
    os.replace(dest + ".tmp", dest)
  distributed.barrier("bases_from")


def prepare(c, workdir: str) -> Prep:
  """Checks the config against the model and builds the problem sets (in memory); with
  `c.base_model`, from that Hugging Face model and its tokenizer (testbed_text); with
  `c.bases_from`, takes that run's bases (`take_bases`)."""
  take_bases(c, workdir)
  seeds = kind_lib.condition_seeds(c, "all")
  sets = roles(c)
  recipes = testbed_plan.plan(c)
  if c.get("base_model"):
    cfg, task, data, loaded = testbed_text.prepare(c, lambda layers: check(c, layers), datasets(c),
                                                   *arithmetic.eval_sets([n for r in sets.values() for n in r],
                                                                         c.arithmetic))
    return Prep(seeds, sets, recipes, cfg, task, data, loaded)
  if c.eval.get("tasks"):
    raise ValueError(f"eval.tasks={list(c.eval.tasks)}: lm-eval scores text models; set base_model (testbed_text)")
  tok = common.WordTokenizer(vocabulary(c))
  seq_len = arithmetic.max_length(c.arithmetic.max_digits)
  cfg = model_lib.config_from(c.model.to_dict(), tok.vocab_size)
  if seq_len > cfg.block_size:
    raise ValueError(f"sequences of {seq_len} tokens do not fit model.block_size={cfg.block_size}")
  check(c, cfg.num_layers)
  val_sets, test_sets = arithmetic.eval_sets([n for r in sets.values() for n in r], c.arithmetic)
  task = common.Task(tokenizer=tok, seq_len=seq_len, train={}, val=val_sets, test=test_sets, info={})
  data = {k: (lambda e: {"tokens": e.tokens, "loss_mask": e.loss_mask})(
      common.encode_examples(v, tok, seq_len)) for k, v in datasets(c).items()}
  return Prep(seeds, sets, recipes, cfg, task, data)


def vocabulary(c) -> list[str]:
  """The tokens of every language and operation the config's data and roles name (the first
  two languages' vocabulary as it always was, then what the config adds)."""
  parts = [p for k in ("base", "base_task", "task", "language", "source_language") for p in c.data.get(k, ())]
  languages = [c.languages.source, c.languages.target] + [lang for _, lang, _ in parts]
  return arithmetic.symbols(languages, [op for op, _, _ in parts])


def val_score(c, prep: Prep, member_sets: list[list[str]], plain=None) -> kind_lib.ValScore:
  """Early stopping: a member's mean exact match over its validation sets (`member_sets`, by
  member). `plain` turns a stage's params into plain model parameters first (LoRA, neurons)."""
  def score(params, ids):
    if plain is not None:
      params = plain(params)
    scored = ensemble_decode.score_members(prep.cfg, params, prep.task, prep.task.val, [member_sets[i] for i in ids],
                                    c.eval.batch_size)
    return [np.mean([s[n]["exact_match"] for n in member_sets[i]]) for s, i in zip(scored, ids)]
  return score


def stages(c, prep: Prep, trained: dict):
  """1. the base; 2. every recipe x seed from its seed's base, in one ensemble; then the
  parameter-efficient stages of testbed_peft (LoRA; MAET's short runs and key-neuron runs)."""
  base_stage = _base_stage(c, prep)
  if isinstance(base_stage, kind_lib.Trained):  # a loaded model as it is (testbed_text.base_stage)
    trained["base"] = base_stage
  else:
    yield base_stage
  base = trained["base"].params
  yield _finetune_stage(c, prep, base)
  peft_val = lambda member_sets: val_score(c, prep, member_sets, plain=testbed_peft.plain)
  if prep.of("lora"):
    yield testbed_peft.lora_stage(c, prep, base, peft_val)
  if prep.of("neurons"):
    yield testbed_peft.maet_short_stage(c, prep, base)
    yield testbed_peft.maet_neurons_stage(c, prep, base, trained["maet_short"].params, peft_val)


def _base_stage(c, prep: Prep) -> kind_lib.Stage | kind_lib.Trained:
  """Trained from scratch on the non-task operations in both languages; with `c.base_model`,
  that model fine-tuned on them or used as it is (testbed_text.base_stage)."""
  base_sets = prep.sets["language"] + prep.sets["source_language"]
  members = [loop_lib.Member(f"base/seed_{s}", s, prep.data["base"]) for s in prep.seeds]
  score = val_score(c, prep, [base_sets] * len(prep.seeds))
  config = kind_lib.loop_config(c, c.base.train, c.base.opt)
  if prep.loaded is not None:
    return testbed_text.base_stage(c, prep.cfg, prep.loaded, members, score, config)
  return kind_lib.Stage("base", prep.cfg, members, score, config=config)


def _finetune_stage(c, prep: Prep, base) -> kind_lib.Stage:
  """Every recipe x seed in one ensemble under one gated optimizer: a member's recipe (which
  partition cells each phase trains) is data. `info` holds the partition labels and cells."""
  cfg, seeds = prep.cfg, prep.seeds
  one = kind_lib.member(base, 0)
  presets = sorted(set(c.partition.presets) | set(c.simultaneous.presets))
  labels = {p: partition.labels(one, partition.preset_rules(
      p, cfg.num_layers, c.partition.bottom, c.partition.top, c.partition.embeddings, c.partition.head))
            for p in presets}
  if presets:
    cell_tree, cells = partition.refine([labels[p] for p in presets])
  else:  # whole-model recipes only: one cell
    cell_tree, cells = jax.tree.map(lambda _: "all", one), ("all",)
  flags = lambda what: tuple(bool(f) for f in (np.ones(len(cells), bool) if what is ALL else
                                               partition.cells_of(presets.index(what[0]), what[1], cells)))
  members, init, member_sets = [], [], []
  for r in prep.of("full"):
    for i, s in enumerate(seeds):
      members.append(loop_lib.Member(f"{r.name}/seed_{s}", 1000 + s, tuple(prep.data[d] for d, _ in r.phases),
                                     tuple(flags(w) for _, w in r.phases), r.steps_per_phase))
      init.append(kind_lib.member(base, i))
      member_sets.append([n for role in r.val for n in prep.sets[role]])
  ft = kind_lib.loop_config(c, c.finetune.train, c.finetune.opt)
  print(f"testbed: {len(prep.of('full'))} recipes x {len(seeds)} seeds = {len(members)} fine-tuned models; "
        f"partition cells {list(cells)}", flush=True)
  return kind_lib.Stage("finetune", cfg, members, val_score(c, prep, member_sets), config=ft,
                        init_params=kind_lib.stack(init), tx=partition.gated_optimizer(ft.opt, cell_tree, cells),
                        info={"labels": labels, "cells": cells, "presets": presets})


def outputs(c, prep: Prep, trained: dict, workdir: str):
  """3. the models of each seed (`compose` and testbed_peft's), 4. their scores: results rows,
  the table, the heatmaps of where each expert changed, and the summary."""
  t = time.time()
  base, tuned = trained["base"].params, trained["finetune"].params
  info, seeds = trained["finetune"].stage.info, prep.seeds
  lora_adapters = testbed_peft.lora_adapters(c, prep, trained["lora"]) if "lora" in trained else None
  maet_trained = testbed_peft.maet_models(prep, trained["maet_neurons"]) if "maet_neurons" in trained else None
  per_seed = []
  for i, s in enumerate(seeds):
    recipes = seed_models(tuned, prep.of("full"), len(seeds), i)
    models = compose(c, kind_lib.member(base, i), recipes, info["labels"], seed=s,
                     statistics=seed_statistics(c, prep, i))
    if lora_adapters is not None:
      models.update(testbed_peft.compose_lora(c, kind_lib.member(base, i), {k: v[i] for k, v in lora_adapters.items()}))
    if maet_trained is not None:
      models.update(testbed_peft.compose_maet(c, kind_lib.member(base, i), maet_trained[i], recipes["language expert"]))
    per_seed.append(models)
  model_names = list(per_seed[0])
  scores = _score_all(prep.cfg, prep.task, per_seed, prep.sets, c.eval.batch_size, seeds, workdir)
  rows = testbed_report.rows(c, model_names, scores, prep.sets, seeds, {r.name: r.trained_on for r in prep.recipes})
  heatmaps = _heatmaps(c, workdir, base, tuned, prep.of("full"), seeds)
  table = testbed_report.table(c, rows, model_names, prep.sets)
  if prep.loaded is not None:  # a text model: lm-eval's tasks too (c.eval.tasks)
    lm_eval_rows = testbed_text.lm_eval_rows(c, prep.cfg, prep.task.tokenizer, per_seed, seeds)
    rows, table = rows + lm_eval_rows, table + eval_scores.table(lm_eval_rows)
  return rows, table, _summary(c, trained, heatmaps, len(model_names), time.time() - t)


def _summary(c, trained: dict, heatmaps: dict, models_per_seed: int, merge_s: float) -> dict:
  seeds = len(trained["base"].stage.members)
  info, finetune = trained["finetune"].stage.info, trained["finetune"]
  one = kind_lib.member(trained["base"].params, 0)
  names = [m.name for m in finetune.stage.members]
  t_base = trained["base"].done_s
  t_trained = max(t.done_s for t in trained.values())
  return {"members": {"base": seeds, "finetune": len(names), "lora": len(testbed_plan.plan(c, "lora")) * seeds,
                      "maet_neurons": 2 * seeds if "maet_neurons" in trained else 0},
          "models_per_seed": models_per_seed, "params_per_model": model_lib.count_params(one),
          "partition_cells": list(info["cells"]),
          "partition_summary": {p: partition.summary(info["labels"][p], one) for p in info["presets"]},
          "base_steps": trained["base"].out["step"],
          "finetune_best_steps": dict(zip(names, finetune.out["best_steps"])),
          "finetune_stopped_at": dict(zip(names, finetune.out["stopped_at"])),
          "heatmaps": heatmaps, "wall_s": {"base": t_base, "finetune": t_trained - t_base,
                                           "merge_and_score": merge_s, "total": t_trained + merge_s}}


def _score_all(cfg, task, per_seed, sets, batch, seeds, workdir, chunk: int = 48,
               predictions_file: str = "predictions.jsonl"):
  """{model name: {set name: {metric: [value per seed]}}}, decoding models in chunks; every
  answer goes to workdir/`predictions_file` (member "<model>/seed_<s>")."""
  flat = [(name, i, params) for i, models in enumerate(per_seed) for name, params in models.items()]
  wanted = [n for r in testbed_report.ROLES for n in sets[r]]
  out, predictions = {}, []
  for start in range(0, len(flat), chunk):
    part = flat[start:start + chunk]
    stacked = jax.device_put(kind_lib.stack([p for _, _, p in part]))
    records = []
    scored = ensemble_decode.score_members(cfg, stacked, task, {n: task.test[n] for n in wanted},
                                  [wanted] * len(part), batch, records)
    predictions += [{**r, "member": start + r["member"]} for r in records]
    for (name, i, _), s in zip(part, scored):
      for n, metrics in s.items():
        for k, v in metrics.items():
          out.setdefault(name, {}).setdefault(n, {}).setdefault(k, [None] * len(per_seed))[i] = v
  results_lib.write_predictions(os.path.join(workdir, predictions_file), predictions,
                           [f"{name}/seed_{seeds[i]}" for name, i, _ in flat])
  return out


def _heatmaps(c, workdir, base, tuned, recipes, seeds, tag: str = "") -> dict:
  """Where each expert changed (share of rows whose mean |delta| exceeds the threshold),
  averaged over seeds; one PNG (delta_<expert><tag>.png) and the numbers per expert."""
  out = {}
  for k, r in enumerate(recipes):
    if r.name not in ("task expert", "language expert"):
      continue
    changes = []
    for i in range(len(seeds)):
      expert, b = kind_lib.member(tuned, k * len(seeds) + i), kind_lib.member(base, i)
      threshold = c.merge.heatmap_threshold or merge.default_threshold(expert, b)
      changes.append(merge.row_change(expert, b, threshold=threshold))
    mean = {**changes[0], "share": np.mean([ch["share"] for ch in changes], axis=0).tolist(),
            "non_block": {k2: float(np.mean([ch["non_block"][k2] for ch in changes])) for k2 in changes[0]["non_block"]}}
    slug = r.name.replace(" ", "_") + tag
    merge.plot_row_change(mean, os.path.join(workdir, f"delta_{slug}.png"),
                          f"{r.name}: share of rows changed (mean over {len(seeds)} seeds)")
    out[r.name] = {"png": f"delta_{slug}.png", "share": mean["share"], "columns": mean["columns"],
                   "non_block": mean["non_block"]}
  return out
