"""The recipe model the merge testbed and xlt.experiments.finetune share: a recipe is data (per
phase, a dataset and what it trains), `recipes` builds the experts, partial experts and
simultaneous runs both plan, and `swaps` reads their layer-swap specs. Its `variant` says which
stage trains it:
  full     the full fine-tunes (testbed: one ensemble under one gated optimizer);
  lora     the LoRA versions (testbed.peft.lora_stage): what = the adapters trained;
  neurons  MAET with trained neurons (testbed.peft): the short runs on every parameter that
           locate the key neurons, then the runs on those neurons only.
"""

from __future__ import annotations

import dataclasses

ALL = None  # a phase that trains every parameter (every adapter, for LoRA)
VARIANTS = ("full", "lora", "neurons")
# the roles a fine-tuning dataset teaches (`mixed` = task + language: data mixing)
TEACHES = {"task": ("task",), "language": ("language",), "source_language": ("source_language",),
           "mixed": ("task", "language")}


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
