"""xlt's recipes on a pretrained Hugging Face model: a task expert and a language expert
fine-tuned from one base (`c.base`, any directory xlt.pretrained loads) on the user's jsonl
files (xlt.data.sft), then composed and merged as the papers do (configs/finetune.py).

  1. prepare   check the config, print the memory estimate of one trained model from
               config.json and the safetensors headers (and fail over `c.device_memory_gb`
               before a weight is read), encode `c.data.task` and `c.data.language` (each
               with a validation split; their counts as a table), then load the base and
               label the partitions;
  2. stages    the trained recipes (`plan`): the full task and language experts, the partial
               experts of each partition (the other label frozen), simultaneous alternation
               between the two datasets (the resting label frozen). All of them in one
               ensemble under one gated optimizer (`c.together`, as the testbed does) or one
               stage each (a recipe of one phase alone differentiates only what it trains:
               `static_frozen`); then the parameter-efficient recipes (finetune_peft): the LoRA
               experts, partial and simultaneous LoRA (`c.lora`), trained neurons
               (`c.neurons`). Every member stops early on its validation loss and keeps its
               best parameters;
  3. outputs   what is built without training: freeze-then-train and train-then-revert per
               partition, LoRA freeze-then-train and LoRA layer swaps (finetune_peft), and
               each merge of `c.merges` ("method option=value ...", any method of
               xlt.merge.registry over the experts and the base); every model written as a
               Hugging Face directory (workdir/models/<name>) and scored: its validation loss
               on each dataset, with `c.eval.prompts` greedy exact match, and with
               `c.eval.tasks` the lm-eval tasks' scores (xlt.eval.scores, in-process).

As a kind of xlt.runner, a killed run started again with the same command resumes, and a
finished workdir is reused.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from xlt import composite, hf_tokenizer, memory, merge, partition, pretrained
from xlt import generate as generate_lib
from xlt import perplexity as perplexity_lib
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt import train as train_lib
from xlt.data import sft
from xlt.eval import scores as eval_scores
from xlt.experiments import common as kind_lib
from xlt.experiments import finetune_memory, finetune_peft
from xlt.experiments import recipes as recipe_lib
from xlt.experiments.recipes import ALL, Recipe
from xlt.experiments.testbed import peft as testbed_peft

# what this kind is called (c.kind) and runs: its data task (no headline metric: its results are not recorded in results/)
KIND = kind_lib.Kind(name="finetune", tasks={"finetune": None})

DATASETS = ("task", "language")
# the merge registry's inputs the experiment has: the two full experts and the base
MERGE_INPUTS = ("task_expert", "language_expert", "experts", "base")


def partitions(c) -> list[str]:
  """The partition names of the config: its presets (A, C, A_inv, C_inv, scaled to the
  model's depth) and its declared rule sets (`c.partition.rules`, by name)."""
  return list(c.partition.presets) + [n for n in c.partition.rules if n not in c.partition.presets]


def plan(c) -> list[Recipe]:
  """The trained recipes (recipes.recipes): the two full experts, the partial experts of
  each partition, the simultaneous alternations (per partition and switch interval), and with
  `c.lora.enabled` the same in LoRA ("LoRA task expert", "partial LoRA task expert [C]",
  "simultaneous LoRA [C] k=1") over `c.lora.presets` and `c.lora.simultaneous_presets`. A
  recipe's `variant` is "full" or "lora" (adapters on the projections instead of the weights:
  those of the phase's label only, when it names one)."""
  out = recipe_lib.recipes(partitions(c), c.simultaneous.presets, c.simultaneous.steps_per_switch)
  if c.lora.enabled:
    out += recipe_lib.recipes(c.lora.presets, c.lora.simultaneous_presets, c.lora.steps_per_switch, "lora",
                                "LoRA ")
  return out


def merges(c) -> list[tuple[str, str, dict]]:
  """(label, registry method, options) of each `c.merges` entry "method option=value ..."
  (values as Python literals), e.g. "layer_swap bottom=1 top=1", "ties density=0.5"."""
  out = []
  for spec in c.merges:
    out.append((str(spec), *merge.registry.parse_spec(spec, "merges")))
  return out


def ends(c, num_layers: int) -> tuple[int, int]:
  """The presets' (bottom, top) blocks: `c.partition.bottom` / `top`, where -1 scales the
  paper's [C] (bottom 6 and top 2 of 32 blocks) to the model's depth, rounded, leaving the
  task label at least one block."""
  bottom, top = c.partition.bottom, c.partition.top
  if bottom == -1:
    bottom = min(round(6 * num_layers / 32), num_layers - 1)
  if top == -1:
    top = min(round(2 * num_layers / 32), num_layers - 1 - bottom)
  return int(bottom), int(top)


def label_trees(c, params) -> dict:
  """{partition name: label tree over `params`}: every leaf "task" or "language"."""
  p, out = c.partition, {}
  for name in partitions(c):
    if name in p.rules:
      out[name] = partition.labels(params, [dict(r) for r in p.rules[name]], rest=p.get("rest") or None)
    else:
      layers = partition.num_layers_of(params)
      out[name] = partition.labels(params, partition.preset_rules(name, layers, *ends(c, layers), p.embeddings,
                                                                  p.head))
    found = set(jax.tree.leaves(out[name]))
    if found != set(DATASETS):
      raise ValueError(f"partition {name!r} labels its parameters {sorted(found)}: each recipe needs both "
                       f"labels {list(DATASETS)}")
  return out


def check(c, num_layers: int):
  """Fails on a config that could not finish, before anything trains."""
  for name in ("task", "language"):
    if not c.data[name] or not os.path.isfile(c.data[name]):
      raise ValueError(f"data.{name} must be a jsonl file, got {c.data[name]!r}")
  if not 0 < c.data.val_fraction < 1:
    raise ValueError(f"data.val_fraction must be in (0, 1) (early stopping needs a validation split), got "
                     f"{c.data.val_fraction}")
  if unknown := [p for p in c.simultaneous.presets if p not in partitions(c)]:
    raise ValueError(f"simultaneous.presets {unknown} are not partitions of the config ({partitions(c)})")
  if not c.simultaneous.steps_per_switch or min(c.simultaneous.steps_per_switch) < 1:
    raise ValueError(f"simultaneous.steps_per_switch must be positive, got {c.simultaneous.steps_per_switch}")
  for label, method, options in merges(c):
    merge.registry.check_among(method, options, MERGE_INPUTS, label)
    if method == "layer_swap":
      merge.swap_plan(num_layers, options["bottom"], options["top"], options.get("lower_transition", 0),
                      options.get("upper_transition", 0))
  finetune_peft.check(c, num_layers, partitions(c))
  eval_scores.check(c.eval.get("tasks", ()), eval_scores.kind_options(c))
  for path in c.eval.prompts:
    prompt_set(path)


def prompt_set(path: str) -> tuple[list[dict], list]:
  """(records, prompts) of an `eval.prompts` file, every record with an "answer": read by
  `check` too, so that a missing file or answer fails before the first step, not after every
  model has trained."""
  if not os.path.isfile(str(path)):
    raise ValueError(f"eval.prompts: {path} is not a file")
  records, prompts = generate_lib.read_prompts(str(path))
  if missing := [i for i, r in enumerate(records) if "answer" not in r]:
    raise ValueError(f"eval.prompts: {path}: prompt {missing[0]} has no \"answer\"")
  return records, prompts


def check_merge_values(c, shapes) -> None:
  """Runs each merge of `c.merges` on stand-ins of the models (the base's tree, each dimension
  cut to 4 at most): an option value the method itself refuses (ties density=1.5, slerp t=5)
  fails here, before the first step, instead of after every expert has trained."""
  if not c.merges:
    return
  rng = np.random.default_rng(0)

  def stand_in():
    return jax.tree.map(lambda s: rng.standard_normal([min(d, 4) for d in s.shape]).astype(np.float32), shapes)

  task, lang = stand_in(), stand_in()
  inputs = {"task_expert": task, "language_expert": lang, "experts": [task, lang], "base": stand_in()}
  for label, method, options in merges(c):
    try:
      merge.registry.merge_among(method, inputs, options)
    except (ValueError, TypeError) as e:
      raise ValueError(f"merges {label!r}: {' '.join(str(e).split())}") from e


# The fields a config may change on a workdir whose recipes it only adds to (`adds_recipes`)
_ADDING_FIELDS = ("merges", "simultaneous.", "lora.", "neurons.", "eval.tasks", "eval.lm_eval.")
# and those it may change on a workdir whose outputs were never written (a run that failed in them)
_OUTPUT_FIELDS = ("eval.prompts", "eval.chat", "eval.max_new")


def adds_recipes(recorded: dict, c, changes: dict, finished: bool = True) -> bool:
  """Whether `c` only adds recipes to the run whose config.json is `recorded` (xlt.runner keeps
  its finished stages and trains the new ones): every changed field is a merge, a
  simultaneous alternation trained alone (`together` False: a stage each), the LoRA recipes
  where the run had none, the trained neurons where it had none, or what scores the models
  (`eval.tasks`: outputs only); every recorded recipe (and merge) is still planned; and no
  stage that trained changes (the weight ensemble of `together`, the LoRA stage, the neuron
  stages). Where the outputs were never written (not `finished`: a run that failed in them), the
  merges and the prompts scored may change freely: they are made from the trained stages when
  the outputs are, so the corrected command resumes the run."""
  old = ml_collections.ConfigDict(recorded)
  fields = _ADDING_FIELDS + (() if finished else _OUTPUT_FIELDS)
  if any(not any(k == f or (f.endswith(".") and k.startswith(f)) for f in fields) for k in changes):
    return False
  if any(k.startswith("simultaneous.") for k in changes) and c.together:
    return False  # the alternations train in the one weight ensemble
  if old.lora.enabled and any(k.startswith("lora.") and k != "lora.swaps" for k in changes):
    return False  # the LoRA recipes train in one ensemble: a new one changes it
  if old.neurons.enabled and any(k.startswith("neurons.") for k in changes):
    return False
  was, now = {r.name for r in plan(old)}, {r.name for r in plan(c)}
  return was <= now and (not finished or set(old.merges) <= set(c.merges))


def slug(name: str) -> str:
  """A model's folder name: "partial task expert [C]" -> "partial_task_expert_C"."""
  return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_")


@dataclasses.dataclass(frozen=True)
class Prep:
  """What `prepare` built: the base (config, host params, tokenizer), the datasets
  (sft.Data by name), the recipes, the partitions' label trees and cells, the memory
  estimate."""

  cfg: model_lib.Config
  base: dict
  tok: object
  data: dict
  recipes: list[Recipe]
  labels: dict
  cell_tree: object
  cells: tuple[str, ...]
  estimate: dict


def prepare(c, workdir: str) -> Prep:
  """Checks the config, estimates the memory from config.json and the safetensors headers
  (refusing a model that does not fit before any weight is read), then loads the base and
  the data."""
  del workdir
  cfg, shapes = pretrained.abstract(c.base, dtype=c.get("param_dtype") or c.dtype or None)
  # computation in c.dtype on parameters in c.param_dtype; remat / remat_policy where a config sets them (scale_*.py)
  cfg = dataclasses.replace(cfg, **{k: c[k] for k in ("dtype", "remat", "remat_policy") if c.get(k)})
  check(c, cfg.num_layers)
  if c.data.block_size > cfg.block_size:
    raise ValueError(f"data.block_size={c.data.block_size} is over the model's context {cfg.block_size}")
  recipes = plan(c)
  labels = label_trees(c, shapes)  # (from the shapes: a partition without both labels fails before the load)
  check_merge_values(c, shapes)
  estimate = finetune_memory.estimate(c, cfg, shapes, recipes)
  tok = hf_tokenizer.load(c.base)
  data = {}
  for name in DATASETS:  # every data file is read and checked before the weights load
    data[name] = sft.load(c.data[name], tok, block_size=c.data.block_size, val_fraction=c.data.val_fraction,
                          seed=c.data.seed, packing=c.data.packing)
    if data[name].val is None:
      raise ValueError(f"data.{name}: val_fraction={c.data.val_fraction} leaves no validation example")
  print(counts_table(data), flush=True)
  _, params = pretrained.load(c.base, dtype=c.get("param_dtype") or c.dtype or None)
  base = jax.tree.map(np.asarray, params)
  if labels:
    cell_tree, cells = partition.refine([labels[p] for p in partitions(c)])
  else:  # no partition: one cell, every recipe trains all of it
    cell_tree, cells = jax.tree.map(lambda _: "all", base), ("all",)
  return Prep(cfg, base, tok, data, recipes, labels, cell_tree, cells, estimate)


def counts_table(data: dict) -> str:
  """The datasets' counts (sft.Data.counts) as a table: a row per dataset and split."""
  fields = ("examples", "truncated", "dropped", "rows", "tokens", "response_tokens")
  lines = ["finetune: data", f"{'':18}" + "".join(f"{f.replace('_', ' '):>16}" for f in fields)]
  for name, d in data.items():
    for split, counts in d.counts.items():
      lines.append(f"{f'data.{name} {split}':18}" + "".join(f"{counts[f]:>16,}" for f in fields))
  return "\n".join(lines)


# --------------------------------------------------------------------------- stages


def val_score(c, prep: Prep, member_sets: list[tuple[str, ...]], plain=None) -> kind_lib.ValScore:
  """Early stopping: minus a member's mean validation loss over its datasets (`member_sets`,
  by member). `plain` turns a stage's params into plain model parameters first (LoRA)."""
  def score(params, ids):
    if plain is not None:
      params = plain(params)
    loss = np.zeros(len(ids))
    for name in DATASETS:
      ks = [k for k, i in enumerate(ids) if name in member_sets[i]]
      if not ks:
        continue
      v = prep.data[name].val
      r = perplexity_lib.perplexity(prep.cfg, params, v["tokens"], v["loss_mask"], c.eval.batch_size, ensemble=True,
                                    members=ks)
      for k, nll, n in zip(ks, r["nll_sum"], r["tokens"]):
        loss[k] += nll / n / len(member_sets[ids[k]])
    return list(-loss)
  return score


def _flags(prep: Prep, c, what) -> tuple[bool, ...]:
  if what is ALL:
    return (True,) * len(prep.cells)
  return tuple(bool(f) for f in partition.cells_of(partitions(c).index(what[0]), what[1], prep.cells))


def stages(c, prep: Prep, trained: dict):
  """The weight recipes in one ensemble (`c.together`) or one stage each, then the LoRA
  recipes in one ensemble, then the trained neurons' short runs and experts (finetune_peft)."""
  weights = [r for r in prep.recipes if r.variant == "full"]
  for group in ([weights] if c.together else [[r] for r in weights]):
    yield _weights_stage(c, prep, group, "finetune" if c.together else f"finetune_{slug(group[0].name)}")
  peft_val = lambda member_sets: val_score(c, prep, member_sets, plain=testbed_peft.plain)
  if lora_recipes := [r for r in prep.recipes if r.variant == "lora"]:
    yield finetune_peft.lora_stage(c, prep, lora_recipes, lambda what: _flags(prep, c, what), peft_val,
                                   kind_lib.loop_config(c, c.lora.train, c.lora.opt))
  if c.neurons.enabled:
    n = c.neurons
    yield finetune_peft.neuron_short_stage(c, prep, kind_lib.loop_config(c, n.short.train, n.short.opt))
    yield finetune_peft.neuron_stage(c, prep, trained["neuron_short"].params, peft_val,
                                     kind_lib.loop_config(c, c.train, c.opt))


def static_frozen(c, prep: Prep, recipes: list[Recipe]):
  """What a stage of `recipes` freezes when that is fixed: a tree of bools over the params
  (True: frozen; all False for a full expert) for one recipe of one phase, trained alone
  (`c.together` False). None when the stage needs the gated step: several recipes in one
  ensemble, or phases taking turns (simultaneous alternation)."""
  if len(recipes) != 1 or len(recipes[0].phases) != 1:
    return None
  return partition.frozen_leaves(prep.cell_tree, prep.cells, _flags(prep, c, recipes[0].phases[0][1]))


def describe(r: Recipe) -> str:
  """What a recipe trains, in words: "partial task expert [C]: the task data trains the task
  part of [C] (the rest frozen)"."""
  what = lambda w: "every parameter" if w is ALL else f"the {w[1]} part of [{w[0]}] (the rest frozen)"
  phases = [f"the {d} data trains {what(w)}" for d, w in r.phases]
  turns = f", {r.steps_per_phase} step(s) each in turn" if len(phases) > 1 else ""
  return f"{r.name}: " + " and ".join(phases) + turns


def _weights_stage(c, prep: Prep, recipes: list[Recipe], name: str) -> kind_lib.Stage:
  """Recipes fine-tuning the weights from the base. Several recipes, or one whose phases take
  turns, train under one gated optimizer: a member's recipe (which partition cells each phase
  trains) is data. A recipe with one phase trained alone takes a static step
  (`static_frozen`): only its trained leaves are differentiated and hold optimizer state."""
  frozen = static_frozen(c, prep, recipes)
  if frozen is None:
    flags = lambda r: tuple(_flags(prep, c, w) for _, w in r.phases)
    tx = train_lib.with_state_dtype(partition.gated_optimizer(c.opt, prep.cell_tree, prep.cells), c.opt.state_dtype)
  else:
    flags = lambda r: None
    tx = train_lib.static_freeze(train_lib.make_optimizer(c.opt), frozen)
  members = [loop_lib.Member(r.name, c.seed + 1000 + i, tuple(prep.data[d].train for d, _ in r.phases), flags(r),
                             r.steps_per_phase)
             for i, r in enumerate(recipes)]
  step = "gated" if frozen is None else "static"
  together = f"{len(recipes)} models trained together, " if len(recipes) > 1 else ""
  print(f"finetune: stage {name}: {together}" + "; ".join(describe(r) for r in recipes), flush=True)
  return kind_lib.Stage(name, prep.cfg, members, val_score(c, prep, [r.val for r in recipes]),
                        config=kind_lib.loop_config(c, c.train, c.opt),
                        init_params=kind_lib.stack([prep.base] * len(recipes)),
                        tx=tx, info={"recipes": [r.name for r in recipes], "step": step})


# --------------------------------------------------------------------------- outputs


def models(c, prep: Prep, trained: dict) -> dict:
  """Every model by name (table order): the trained recipes (LoRA merged into the base, a
  neuron expert's params), the compositions of each partition, the LoRA compositions
  (finetune_peft) and the merges."""
  out = {}
  for t in trained.values():
    if t.stage.info.get("lora"):
      out.update(finetune_peft.lora_models(c, prep, t))
      continue
    for k, name in enumerate(t.stage.info.get("recipes", ())):  # (none: the neurons' short runs)
      out[name] = jax.tree.map(np.asarray, composite.merged(kind_lib.member(t.params, k)))
  task, lang = out["task expert"], out["language expert"]
  for p in partitions(c):
    # each partial expert changed only its own label, so taking each label from its expert
    # composes them exactly
    out[f"freeze-then-train [{p}]"] = partition.combine(
        {"task": out[f"partial task expert [{p}]"], "language": out[f"partial language expert [{p}]"]},
        prep.labels[p])
    out[f"train-then-revert [{p}]"] = partition.combine({"task": task, "language": lang}, prep.labels[p])
  inputs = {"task_expert": task, "language_expert": lang, "experts": [task, lang], "base": prep.base}
  for label, method, options in merges(c):
    out[label] = jax.tree.map(np.asarray, merge.registry.merge_among(method, inputs, options))
  return out


def _val_losses(c, prep: Prep, params) -> dict:
  """{dataset: mean validation loss per scored token} of one model."""
  out = {}
  for name in DATASETS:
    v = prep.data[name].val
    r = perplexity_lib.perplexity(prep.cfg, params, v["tokens"], v["loss_mask"], c.eval.batch_size, ensemble=False)
    out[name] = r["nll_sum"] / r["tokens"]
  return out


def _exact_match(c, prep: Prep, params) -> dict:
  """{prompt set: share of prompts whose greedy continuation is the answer} (`c.eval.prompts`:
  jsonl files of {"prompt" or "messages", "answer"}; leading/trailing spaces ignored)."""
  out = {}
  for path in c.eval.prompts:
    records, prompts = prompt_set(path)
    got = generate_lib.decode(prep.cfg, params, prep.tok, prompts, chat=c.eval.chat, max_new=c.eval.max_new,
                              batch=c.eval.batch_size)
    # the scoring of `python -m xlt.generate --answers --match=exact`, so the two agree
    correct = [generate_lib.match(g["continuation"], r["answer"], "exact")["correct"] for g, r in zip(got, records)]
    out[os.path.splitext(os.path.basename(path))[0]] = float(np.mean(correct))
  return out


def outputs(c, prep: Prep, trained: dict, workdir: str):
  """Writes every model but the base as a Hugging Face directory (workdir/models/<slug>; a LoRA
  expert also as its PEFT adapter, workdir/models/<slug>-peft) and
  scores all of them: results rows, the table and the summary."""
  built = {"base": prep.base, **models(c, prep, trained)}
  steps = {n: {"best step": int(b), "stopped at step": int(st)} for t in trained.values()
           for n, b, st in zip(t.stage.info.get("recipes", ()), t.out.get("best_steps", ()), t.out["stopped_at"])}
  dirs, scores, lm_eval_scores = {}, {}, {}
  tasks, options = list(c.eval.get("tasks", ())), eval_scores.kind_options(c)
  manager = eval_scores.check(tasks, options)  # the task index, built once (None without tasks)
  for name, params in built.items():
    if name != "base":
      dirs[name] = os.path.join("models", slug(name))
      pretrained.save(prep.cfg, params, os.path.join(workdir, dirs[name]), source_dir=c.base,
                      card=model_card(c, prep, name, steps))
    device = jax.tree.map(jnp.asarray, params)
    scores[name] = {"val_loss": _val_losses(c, prep, device), "exact_match": _exact_match(c, prep, device)}
    if tasks:  # lm-eval's tasks, in-process on the params in memory
      by_task = eval_scores.score(prep.cfg, device, prep.tok, tasks, options, name=name, manager=manager)
      lm_eval_scores[name] = {t: {m: [v] for m, v in ms.items()} for t, ms in by_task.items()}
  adapters = finetune_peft.write_adapters(c, prep, trained, workdir, dirs)
  rows = []
  for name, s in scores.items():
    for metric, values in s.items():
      for role, value in values.items():
        rows.append(results_lib.make_row(experiment=c.name, task=c.task, language=role, role=role, condition=name,
                                         metric=metric, values=[value], samples=None))
  rows += eval_scores.rows(lm_eval_scores, results_lib.make_row, experiment=c.name, task=c.task)
  summary = {"base": c.base, "models": dirs, "adapters": adapters, "data": {k: d.counts for k, d in prep.data.items()},
             "memory_per_model": {k: prep.estimate[k] for k in (*memory.PARTS, "total")},
             "partition_summary": {p: partition.summary(t, prep.base) for p, t in prep.labels.items()},
             "best_steps": {n: s for t in trained.values()
                            for n, s in zip(t.stage.info.get("recipes", ()), t.out.get("best_steps", ()))}}
  return rows, _table(c, scores, dirs) + eval_scores.table(rows), summary


def model_card(c, prep: Prep, name: str, steps: dict) -> dict:
  """What README.md of model `name` records (xlt.io.hf_dir's card): its base, data, recipe and
  steps; a merge of `c.merges` also its method and options (and so the card's "merge" tag)."""
  recipes = {r.name: r for r in prep.recipes}
  by_label = {label: (method, options) for label, method, options in merges(c)}
  card = {"title": f"{name}: a fine-tune of {os.path.basename(os.path.normpath(c.base))} by xlt"}
  if name in by_label:
    card = {"title": f"{name}: a merge of fine-tunes of {os.path.basename(os.path.normpath(c.base))} by xlt",
            "method": by_label[name][0], "options": by_label[name][1],
            "inputs": "the task expert, the language expert and the base"}
  card["base"] = c.base
  card["data"] = {d: f"{c.data[d]} ({prep.data[d].counts['train']['examples']} training examples)" for d in DATASETS}
  if name in recipes:
    card["recipe"] = describe(recipes[name])
  elif name not in by_label:
    card["recipe"] = f"{name}, built from the trained experts without further training"
  if name in steps:
    card["steps"] = steps[name]
  card["made by"] = "xlt.experiments.finetune"
  return card


def _table(c, scores: dict, dirs: dict) -> str:
  sets = list(next(iter(scores.values()))["exact_match"])
  head = ["model", "task val loss", "language val loss", *(f"{s} exact match" for s in sets), "directory"]
  lines = [f"{c.name}: {c.base} fine-tuned; validation loss per token (lower is better)", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, s in scores.items():
    cells = [f"{s['val_loss'][d]:.4f}" for d in DATASETS] + [f"{s['exact_match'][k]:.3f}" for k in sets]
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {dirs.get(name, c.base)} |")
  return "\n".join(lines) + "\n"
