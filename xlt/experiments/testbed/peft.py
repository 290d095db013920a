"""The merge testbed's parameter-efficient recipes (stages of xlt.experiments.testbed, after
its full fine-tunes): LoRA versions of the recipes, and MAET with trained neurons. The recipes
themselves (variants "lora" and "neurons") are listed by testbed_plan.plan with the others.

LoRA (xlt.lora), one ensemble of every LoRA recipe x seed, from each seed's base:
  LoRA task / language expert      adapters on every attn / mlp projection;
  partial LoRA task / language [p] only the adapters of partition p's task / language
                                   label train (the others keep b = 0: no change);
  simultaneous LoRA [p] k=K        the two partitions' adapters take turns, K steps each.
Compositions: LoRA layer swap (the adapters of the swapped blocks from the language
expert, the rest from the task expert, then merged into the base), LoRA freeze-then-train
(both partial experts' adapters merged into the base). Every LoRA model is scored merged.

MAET with trained neurons (xlt.neurons), MAET's extraction stage end to end:
  1. short runs from the base on the task data and on the source-language data;
  2. key neurons: the top key_ratio rows by change in each short run, N_A and N_L0;
  3. the ability model trains on the task data on N_A u N_L0 only, the source-language
     model on the source-language data on N_L0 only;
  4. MAET forms the ability weight from them (their deltas are already on those neurons)
     and transfers it with the language expert (xlt.merge.maet).
"""

from __future__ import annotations

import jax
import numpy as np

from xlt import loop as loop_lib
from xlt import lora, merge, neurons, partition
from xlt import train as train_lib
from xlt.experiments import common as kind_lib
from xlt.experiments import recipes as recipe_lib
from xlt.experiments.recipes import ALL, Recipe
from xlt.experiments.testbed import plan as testbed_plan


def lora_plan(c) -> list[Recipe]:
  """The LoRA recipes of testbed_plan.plan (empty when `c.lora` is off), in member order."""
  return testbed_plan.plan(c, "lora")


def check(c, num_layers: int):
  """Config errors before anything trains."""
  if c.get("lora") and c.lora.enabled:
    for p in set(c.lora.presets) | set(c.lora.simultaneous_presets):
      partition.preset_rules(p, num_layers, c.partition.bottom, c.partition.top)
    for b, u, t in recipe_lib.swaps(c.lora.swaps, "lora.swaps"):
      merge.swap_plan(num_layers, b, u, t, t)
    if int(c.lora.rank) < 1:
      raise ValueError(f"lora.rank must be positive, got {c.lora.rank}")
  if c.get("maet_neurons") and c.maet_neurons.enabled:
    merge.check_range("maet_neurons.key_ratio", c.maet_neurons.key_ratio, 0.0, 1.0, low_open=True)


def plain(stacked):
  """Stacked composites (xlt.composite: LoRA or neuron-masked) as stacked plain parameters:
  LoRA merged into its base, a neuron composite's params."""
  from xlt import composite

  if not composite.is_composite(stacked):
    return stacked
  return jax.jit(jax.vmap(composite.merged))(stacked)


def lora_stage(c, prep, base, val_score) -> kind_lib.Stage:
  """Stage 2b: every LoRA recipe x seed in one ensemble, from each seed's base (`prep` is the
  testbed's: cfg, seeds, data, sets; `val_score(member_sets)` scores merged parameters)."""
  recipes, cfg, seeds = prep.of("lora"), prep.cfg, prep.seeds
  one = kind_lib.member(base, 0)
  presets = sorted(set(c.lora.presets) | set(c.lora.simultaneous_presets)) or ["C"]
  labels = {p: partition.labels(one, partition.preset_rules(p, cfg.num_layers, c.partition.bottom, c.partition.top,
                                                            c.partition.embeddings, c.partition.head))
            for p in presets}
  adapters0 = lora.init(one, jax.random.key(0), rank=c.lora.rank, alpha=c.lora.alpha)
  trainable = lora.split({"base": one, "lora": adapters0})[0]
  cell_tree, cells = partition.refine([lora.labels(trainable, labels[p]) for p in presets])
  flags = lambda what: tuple(bool(f) for f in (np.ones(len(cells), bool) if what is ALL else
                                               partition.cells_of(presets.index(what[0]), what[1], cells)))
  members, init, member_sets = [], [], []
  for r in recipes:
    for i, s in enumerate(seeds):
      members.append(loop_lib.Member(f"{r.name}/seed_{s}", 2000 + s, tuple(prep.data[d] for d, _ in r.phases),
                                     tuple(flags(w) for _, w in r.phases), r.steps_per_phase))
      init.append({"base": kind_lib.member(base, i),
                   "lora": lora.init(one, jax.random.key(3000 + s), rank=c.lora.rank, alpha=c.lora.alpha)})
      member_sets.append([n for role in r.val for n in prep.sets[role]])
  st = kind_lib.loop_config(c, c.lora.train, c.lora.opt)
  print(f"testbed: {len(recipes)} LoRA recipes x {len(seeds)} seeds, rank {c.lora.rank}, "
        f"{lora.num_params(adapters0):,} adapter parameters per model; cells {list(cells)}", flush=True)
  return kind_lib.Stage("lora", cfg, members, val_score(member_sets), config=st, init_params=kind_lib.stack(init),
                        tx=partition.gated_optimizer(st.opt, cell_tree, cells))


def lora_adapters(c, prep, trained) -> dict:
  """The trained LoRA stage as {recipe name: [adapters per seed]}."""
  n, adapters = len(prep.seeds), trained.params["lora"]
  return {r.name: [kind_lib.member(adapters, k * n + i) for i in range(n)] for k, r in enumerate(prep.of("lora"))}


def compose_lora(c, base, adapters: dict) -> dict:
  """The LoRA models of one seed, merged into `base`: each trained recipe, the LoRA layer
  swaps and LoRA freeze-then-train."""
  models = {name: lora.merge_into(base, a) for name, a in adapters.items()}  # recipe order
  task, lang = adapters["LoRA task expert"], adapters["LoRA language expert"]
  for b, u, t in recipe_lib.swaps(c.lora.swaps, "lora.swaps"):
    swapped = merge.layer_swap(task, lang, bottom=b, top=u, lower_transition=t, upper_transition=t,
                               non_block="average")
    models[f"LoRA layer swap b={b} u={u} t={t}"] = lora.merge_into(base, swapped)
  for p in c.lora.presets:
    # each partial expert's adapters outside its partition kept b = 0, so merging both in
    # composes the two partitions exactly
    both = lora.merge_into(base, adapters[f"partial LoRA task expert [{p}]"])
    models[f"LoRA freeze-then-train [{p}]"] = lora.merge_into(both, adapters[f"partial LoRA language expert [{p}]"])
  return {k: jax.tree.map(np.asarray, v) for k, v in models.items()}  # (tree.map would sort the names)


def maet_short_stage(c, prep, base) -> kind_lib.Stage:
  """Stage 2c: short runs from the base on the task data and on the source-language data,
  kept as they end (no selection): only where they changed matters."""
  m, seeds = c.maet_neurons, prep.seeds
  members = [loop_lib.Member(f"{r.name}/seed_{s}", 4000 + s, prep.data[r.phases[0][0]]) for r in _short(prep)
             for s in seeds]
  init = [kind_lib.member(base, i) for _ in _short(prep) for i in range(len(seeds))]
  return kind_lib.Stage("maet_short", prep.cfg, members, None, config=kind_lib.loop_config(c, m.short.train, m.short.opt),
                        init_params=kind_lib.stack(init))


def _short(prep) -> list[Recipe]:
  """The neuron recipes on every parameter: MAET's short runs (task, then source language)."""
  return [r for r in prep.of("neurons") if r.phases[0][1] is ALL]


def maet_neurons_stage(c, prep, base, ran, val_score) -> kind_lib.Stage:
  """Stage 2d: the key neurons of the short runs `ran` (the top key_ratio rows by change, N_A
  and N_L0), then the ability model trained on the task data on N_A u N_L0 only and the
  source-language model on the source-language data on N_L0 only. `info["located"]` holds
  (base, ability neurons, source neurons) per seed."""
  m, seeds = c.maet_neurons, prep.seeds
  located = []
  for i in range(len(seeds)):
    b = kind_lib.member(base, i)
    n_a = neurons.locate(kind_lib.member(ran, i), b, m.key_ratio)
    n_l0 = neurons.locate(kind_lib.member(ran, len(seeds) + i), b, m.key_ratio)
    located.append((b, neurons.union(b, n_a, n_l0), neurons.expand(n_l0, b)))
  members, init, member_sets = [], [], []
  for r in prep.of("neurons"):
    (d, what), = r.phases
    if what is ALL:  # a short run
      continue
    for i, s in enumerate(seeds):  # ability: on N_A u N_L0; source: on N_L0
      b, union, source = located[i]
      members.append(loop_lib.Member(f"{r.name}/seed_{s}", 5000 + s, prep.data[d]))
      init.append(neurons.composite(b, union if what[1] == "ability" else source))
      member_sets.append([n for role in r.val for n in prep.sets[role]])
  ft = kind_lib.loop_config(c, c.finetune.train, c.finetune.opt)
  print(f"testbed: MAET key neurons, seed {seeds[0]}: ability + source {neurons.describe(located[0][1])}, "
        f"source {neurons.describe(located[0][2])}", flush=True)
  return kind_lib.Stage("maet_neurons", prep.cfg, members, val_score(member_sets), config=ft,
                        init_params=kind_lib.stack(init), tx=neurons.masked(train_lib.make_optimizer(ft.opt)),
                        info={"located": located})


def maet_models(prep, trained) -> list[dict]:
  """The trained-neuron stage per seed: {"ability", "source", "ability_neurons",
  "source_neurons"}."""
  n, params, located = len(prep.seeds), trained.params["params"], trained.stage.info["located"]
  return [{"ability": kind_lib.member(params, i), "source": kind_lib.member(params, n + i),
           "ability_neurons": located[i][1], "source_neurons": located[i][2]} for i in range(n)]


def compose_maet(c, base, trained: dict, language_expert) -> dict:
  """MAET with trained neurons for one seed (and its ability model, for reference)."""
  options = {k: v for k, v in c.merge.maet.to_dict().items() if k != "key_ratio"}
  merged = merge.maet(base, trained["ability"], trained["source"], [language_expert], **options,
                      ability_neurons=trained["ability_neurons"], source_neurons=trained["source_neurons"])
  return {"MAET ability model (trained neurons)": trained["ability"], "MAET (trained neurons)": merged}
