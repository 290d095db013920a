"""The parameter-efficient recipes of xlt.experiments.finetune (stages after its weight
recipes), on a loaded Hugging Face model; the building blocks are the testbed's (xlt.lora,
xlt.neurons, xlt.partition, testbed_peft's compositions).

LoRA (`c.lora`), every LoRA recipe in one ensemble under one gated optimizer over the
adapters' partition cells (a member's recipe is data, as in the weight stage):
  LoRA task / language expert      adapters on every attn / mlp projection, all trained;
  partial LoRA task / language [p] only the adapters of partition p's task / language label
                                   train; the others keep b = 0 (no change), their Adam
                                   moments untouched (`c.lora.presets`);
  simultaneous LoRA [p] k=K        the two datasets take turns, K steps each, each training
                                   its label's adapters; the resting label's adapters and
                                   moments stay as they are (`c.lora.simultaneous_presets`).
Each trained LoRA recipe is written twice: merged into the base (a Hugging Face model directory)
and beside it as its PEFT adapter (<directory>-peft: `write_adapters`).
Compositions (testbed_peft.compose_lora), each merged into the base as plain parameters:
LoRA freeze-then-train [p] (both partial experts' adapters), LoRA layer swaps
(`c.lora.swaps`, "bottom,top,transition": the swapped blocks' adapters from the language
expert, the rest from the task expert).

Trained neurons (`c.neurons`, MAET's extraction on a loaded model, xlt.neurons):
  1. a short run from the base on each dataset of `c.neurons.experts` (stage neuron_short);
  2. its key neurons: the top `key_ratio` rows by change from the base;
  3. "neuron <dataset> expert": the base fine-tuned on that dataset on those rows only (the
     other entries and their Adam moments stay bit for bit), selected on its validation loss.

The functions take what they need from finetune (its Prep, its validation score, its loop
config) as arguments, so this module does not import it.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from xlt import loop as loop_lib
from xlt import lora, merge, neurons, partition
from xlt import train as train_lib
from xlt.experiments import common as kind_lib
from xlt.experiments import recipes as recipe_lib
from xlt.experiments.testbed import peft as testbed_peft

DATASETS = ("task", "language")


def check(c, num_layers: int, partitions: list[str]):
  """Config errors of the LoRA and neuron recipes, before anything trains."""
  if c.lora.enabled:
    if int(c.lora.rank) < 1:
      raise ValueError(f"lora.rank must be positive, got {c.lora.rank}")
    for field in ("presets", "simultaneous_presets"):
      if unknown := [p for p in c.lora[field] if p not in partitions]:
        raise ValueError(f"lora.{field} {unknown} are not partitions of the config ({partitions})")
    if not c.lora.steps_per_switch or min(c.lora.steps_per_switch) < 1:
      raise ValueError(f"lora.steps_per_switch must be positive, got {c.lora.steps_per_switch}")
    for b, u, t in recipe_lib.swaps(c.lora.swaps, "lora.swaps"):
      merge.swap_plan(num_layers, b, u, t, t)
  if c.neurons.enabled:
    merge.check_range("neurons.key_ratio", c.neurons.key_ratio, 0.0, 1.0, low_open=True)
    if not c.neurons.experts or any(d not in DATASETS for d in c.neurons.experts):
      raise ValueError(f"neurons.experts must name datasets among {list(DATASETS)}, got {list(c.neurons.experts)}")


def lora_stage(c, prep, recipes, flags, val_score, config) -> kind_lib.Stage:
  """The LoRA recipes in one ensemble from `prep.base`. `flags(what)` gives a phase's flags
  over the model's partition cells (`prep.cells`), which the adapters inherit from their
  kernels; `val_score(member_sets)` scores merged parameters; `config` is the loop's view."""
  adapters0 = lora.init(prep.base, jax.random.key(c.seed + 3000), rank=c.lora.rank, alpha=c.lora.alpha)
  cell_tree = lora.labels(lora.split({"base": prep.base, "lora": adapters0})[0], prep.cell_tree)
  cells = tuple(sorted(set(jax.tree.leaves(cell_tree))))

  def adapter_flags(r, what):
    on = dict(zip(prep.cells, flags(what)))
    out = tuple(on[n] for n in cells)
    if not any(out):
      raise ValueError(f"{r.name}: label {what[1]!r} of partition {what[0]!r} holds no attn / mlp kernel, "
                       "so it has no adapter to train")
    return out

  members, init = [], []
  for i, r in enumerate(recipes):
    members.append(loop_lib.Member(r.name, c.seed + 2000 + i, tuple(prep.data[d].train for d, _ in r.phases),
                                   tuple(adapter_flags(r, w) for _, w in r.phases), r.steps_per_phase))
    init.append({"base": prep.base, "lora": lora.init(prep.base, jax.random.key(c.seed + 3000 + i),
                                                      rank=c.lora.rank, alpha=c.lora.alpha)})
  tx = train_lib.with_state_dtype(partition.gated_optimizer(config.opt, cell_tree, cells),
                                  config.opt.get("state_dtype"))
  print(f"finetune: stage lora: {len(recipes)} models trained together, each with rank-{c.lora.rank} adapters "
        f"({lora.num_params(adapters0):,} parameters per model) on the base's attention and MLP projections, the "
        f"base frozen: {', '.join(r.name for r in recipes)}", flush=True)
  return kind_lib.Stage("lora", prep.cfg, members, val_score([r.val for r in recipes]), config=config,
                        init_params=kind_lib.stack(init), tx=tx,
                        info={"recipes": [r.name for r in recipes], "lora": True})


def lora_models(c, prep, trained) -> dict:
  """The trained LoRA stage's models, merged into the base: each recipe, LoRA freeze-then-train
  per `c.lora.presets` and the LoRA layer swaps (testbed_peft.compose_lora)."""
  adapters = trained.params["lora"]
  by_name = {name: kind_lib.member(adapters, k) for k, name in enumerate(trained.stage.info["recipes"])}
  return testbed_peft.compose_lora(c, prep.base, by_name)


def lora_adapters(trained: dict) -> dict:
  """{recipe name: its trained adapter tree} of every LoRA stage in `trained`, each kernel it
  left as it was (b = 0: a partial expert's other label) left out, so its PEFT adapter holds
  only the modules it changed."""
  out = {}
  for t in trained.values():
    if not t.stage.info.get("lora"):
      continue
    for k, name in enumerate(t.stage.info["recipes"]):
      adapters = jax.tree.map(np.asarray, kind_lib.member(t.params["lora"], k))
      kept = {"scale": adapters["scale"]}
      for path, (a, b) in merge.factors(adapters).items():
        if np.any(b):
          node = kept
          for key in path[:-1]:
            node = node.setdefault(key, {})
          node[path[-1]] = {"a": a.astype(np.float32), "b": b.astype(np.float32)}
      out[name] = kept
  return out


def write_adapters(c, prep, trained: dict, workdir: str, dirs: dict) -> dict:
  """Writes each LoRA expert's PEFT adapter (xlt.peft_io: adapter_config.json with the base's
  path as base_model_name_or_path, adapter_model.safetensors) beside its merged directory,
  as <its directory>-peft; returns {name: the adapter's directory, relative to workdir}."""
  from xlt import peft_io
  base = os.path.abspath(c.base) if os.path.isdir(c.base) else c.base
  out = {}
  for name, adapters in lora_adapters(trained).items():
    out[name] = dirs[name] + "-peft"
    peft_io.save(prep.cfg, prep.base, adapters, os.path.join(workdir, out[name]), base_model=base, overwrite=True)
  return out


def neuron_short_stage(c, prep, config) -> kind_lib.Stage:
  """Short runs from the base, one per dataset of `c.neurons.experts`, kept as they end (no
  selection): only where they changed matters."""
  members = [loop_lib.Member(f"neuron short run {d}", c.seed + 4000 + i, prep.data[d].train)
             for i, d in enumerate(c.neurons.experts)]
  return kind_lib.Stage("neuron_short", prep.cfg, members, None, config=config,
                        init_params=kind_lib.stack([prep.base] * len(members)))


def neuron_stage(c, prep, ran, val_score, config) -> kind_lib.Stage:
  """"neuron <dataset> expert" per `c.neurons.experts`: the top `key_ratio` rows by change in
  its short run (`ran`, stacked), then the base fine-tuned on those rows only
  (neurons.masked over xlt's optimizer)."""
  names = [f"neuron {d} expert" for d in c.neurons.experts]
  masks = [neurons.locate(kind_lib.member(ran, i), prep.base, c.neurons.key_ratio) for i in range(len(names))]
  init = [neurons.composite(prep.base, m) for m in masks]
  members = [loop_lib.Member(n, c.seed + 5000 + i, prep.data[d].train)
             for i, (n, d) in enumerate(zip(names, c.neurons.experts))]
  for n, one in zip(names, init):
    print(f"finetune: {n}: key neurons {neurons.describe(one[neurons.MASK_KEY])}", flush=True)
  return kind_lib.Stage("neurons", prep.cfg, members, val_score([(d,) for d in c.neurons.experts]), config=config,
                        init_params=kind_lib.stack(init), tx=neurons.masked(train_lib.make_optimizer(config.opt)),
                        info={"recipes": names, "neurons": True})
