"""What the merge testbed trains: every recipe of every stage (`plan`, recipes of
xlt.experiments.recipes), and the fine-tuning data (with replay of the base's data)."""

from __future__ import annotations

import numpy as np

from xlt.experiments import recipes
from xlt.experiments.recipes import ALL, VARIANTS, Recipe

# the fine-tuning datasets (each teaches roles: recipes.TEACHES), which get replay of the base's data
FINETUNE_SETS = tuple(recipes.TEACHES)


def plan(c, variant: str | None = None) -> list[Recipe]:
  """Every trained recipe of the config, stage by stage (or those of one `variant`): the full
  fine-tunes (experts, data mixing, partial experts per partition preset, simultaneous partition
  training per preset and switch interval), their LoRA versions (`c.lora`, when enabled), and
  MAET's trained-neuron runs (`c.maet_neurons`, when enabled)."""
  also = (Recipe("source-language expert", (("source_language", ALL),), ("source_language",)),
          Recipe("data mixing", (("mixed", ALL),), ("task", "language")))
  out = recipes.recipes(c.partition.presets, c.simultaneous.presets, c.simultaneous.steps_per_switch, also=also)
  if c.get("lora") and c.lora.enabled:
    out += recipes.recipes(c.lora.presets, c.lora.simultaneous_presets, c.lora.steps_per_switch, "lora", "LoRA ")
  if c.get("maet_neurons") and c.maet_neurons.enabled:
    # the short runs (every parameter, kept as they end) locate N_A and N_L0; the ability model
    # trains on N_A u N_L0, the source-language model on N_L0
    out += [Recipe(f"MAET short {d}", ((d, ALL),), (), variant="neurons") for d in ("task", "source_language")]
    out += [Recipe("MAET ability model (trained neurons)", (("task", ("neurons", "ability")),), ("task",),
                   variant="neurons"),
            Recipe("MAET source model (trained neurons)", (("source_language", ("neurons", "source")),),
                   ("source_language",), variant="neurons")]
  if variant is not None and variant not in VARIANTS:
    raise ValueError(f"unknown recipe variant {variant!r}; known: {', '.join(VARIANTS)}")
  return [r for r in out if variant is None or r.variant == variant]


def replay(examples: list, base: list, fraction: float, seed) -> list:
  """`examples` followed by round(fraction * len(examples)) examples of `base` (the base's
  training data), drawn without replacement while there are enough (with replacement past
  that) by a generator seeded with `seed`: the same ones every run. fraction 0: `examples`."""
  fraction = float(fraction)
  if fraction < 0:
    raise ValueError(f"finetune.replay must be >= 0, got {fraction}")
  k = int(round(fraction * len(examples)))
  if k == 0:
    return list(examples)
  rng = np.random.default_rng(seed)
  picks = rng.choice(len(base), size=k, replace=k > len(base))
  return list(examples) + [base[int(i)] for i in picks]


def with_replay(sets: dict[str, list], fraction: float, seed: int) -> dict[str, list]:
  """The fine-tuning sets (FINETUNE_SETS) of `sets`, each with its replay of `sets["base"]`
  (`replay`, seeded per set); the others as they are."""
  return {name: replay(v, sets["base"], fraction, [seed, FINETUNE_SETS.index(name)]) if name in FINETUNE_SETS
          else v for name, v in sets.items()}
