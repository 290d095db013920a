"""What the merge testbed trains: every recipe of every stage (`plan`), the layer-swap specs,
and the fine-tuning data (with replay of the base's data).

A recipe is data: per phase, a dataset and what it trains; its `variant` says which stage
trains it:
  full     the full fine-tunes (testbed: one ensemble under one gated optimizer);
  lora     the LoRA versions (testbed_peft.lora_stage): what = the adapters trained;
  neurons  MAET with trained neurons (testbed_peft): the short runs on every parameter that
           locate the key neurons, then the runs on those neurons only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

ALL = None  # a phase that trains every parameter (every adapter, for LoRA)
VARIANTS = ("full", "lora", "neurons")
# the roles a fine-tuning dataset teaches (`mixed` = task + language: data mixing)
TEACHES = {"task": ("task",), "language": ("language",), "source_language": ("source_language",),
           "mixed": ("task", "language")}
FINETUNE_SETS = tuple(TEACHES)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A fine-tuning recipe: per phase, a dataset and what it trains (ALL, or a (preset, label)
  partition; for neurons, ("neurons", "ability" | "source")); phases take turns
  `steps_per_phase` steps each. `val` names the roles whose validation sets pick its best
  checkpoint (none: kept as it ends). `variant`: "full", "lora" or "neurons"."""

  name: str
  phases: tuple[tuple[str, tuple[str, str] | None], ...]
  val: tuple[str, ...]
  steps_per_phase: int = 1
  variant: str = "full"

  def __post_init__(self):
    if self.variant not in VARIANTS:
      raise ValueError(f"recipe {self.name!r}: unknown variant {self.variant!r}; known: {', '.join(VARIANTS)}")

  @property
  def trained_on(self) -> tuple[str, ...]:
    """The roles its data teaches (task, language, source_language)."""
    return tuple(dict.fromkeys(r for d, _ in self.phases for r in TEACHES[d]))


def recipes(presets, simultaneous, steps_per_switch, variant: str = "full", tag: str = "", also=()) -> list[Recipe]:
  """The task and language experts, then `also` (more recipes), partial experts per preset, and
  simultaneous training per preset and switch interval; `tag` is "" (full) or "LoRA " in the
  names. The testbed's plan and xlt.experiments.finetune's both build theirs with it."""
  pre = lambda what: f"{tag}{what}"  # "task expert" / "LoRA task expert"
  out = [Recipe(pre("task expert"), (("task", ALL),), ("task",), variant=variant),
         Recipe(pre("language expert"), (("language", ALL),), ("language",), variant=variant), *also]
  for p in presets:
    out += [Recipe(f"partial {tag}task expert [{p}]", (("task", (p, "task")),), ("task",), variant=variant),
            Recipe(f"partial {tag}language expert [{p}]", (("language", (p, "language")),), ("language",),
                   variant=variant)]
  for p in simultaneous:
    for k in steps_per_switch:
      out.append(Recipe(f"simultaneous {tag}[{p}] k={k}", (("task", (p, "task")), ("language", (p, "language"))),
                        ("task", "language"), int(k), variant))
  return out


def plan(c, variant: str | None = None) -> list[Recipe]:
  """Every trained recipe of the config, stage by stage (or those of one `variant`): the full
  fine-tunes (experts, data mixing, partial experts per partition preset, simultaneous partition
  training per preset and switch interval), their LoRA versions (`c.lora`, when enabled), and
  MAET's trained-neuron runs (`c.maet_neurons`, when enabled)."""
  also = (Recipe("source-language expert", (("source_language", ALL),), ("source_language",)),
          Recipe("data mixing", (("mixed", ALL),), ("task", "language")))
  out = recipes(c.partition.presets, c.simultaneous.presets, c.simultaneous.steps_per_switch, also=also)
  if c.get("lora") and c.lora.enabled:
    out += recipes(c.lora.presets, c.lora.simultaneous_presets, c.lora.steps_per_switch, "lora", "LoRA ")
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


def swaps(specs, field: str) -> list[tuple[int, int, int]]:
  """Layer-swap specs "bottom,top,transition" (the config's `merge.swaps`, `lora.swaps`) as
  (b, u, t) triples; a malformed one fails naming `field`."""
  out = []
  for spec in specs:
    try:
      b, u, t = (int(x) for x in str(spec).split(","))
    except ValueError:
      raise ValueError(f"{field} entry {spec!r} is not 'bottom,top,transition'") from None
    out.append((b, u, t))
  return out


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
