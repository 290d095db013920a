"""xlt.experiments.recipes: the recipe model the testbed and finetune share."""

import pytest

from xlt.experiments import recipes
from xlt.experiments.recipes import ALL, Recipe


def test_recipes_lists_experts_then_partials_then_simultaneous_runs():
  also = (Recipe("data mixing", (("mixed", ALL),), ("task", "language")),)
  got = recipes.recipes(("A", "C"), ("C",), (1, 10), also=also)
  assert [r.name for r in got] == [
      "task expert", "language expert", "data mixing", "partial task expert [A]", "partial language expert [A]",
      "partial task expert [C]", "partial language expert [C]", "simultaneous [C] k=1", "simultaneous [C] k=10"]
  assert got[-1].phases == (("task", ("C", "task")), ("language", ("C", "language"))) and got[-1].steps_per_phase == 10
  assert got[2].trained_on == ("task", "language") and got[1].trained_on == ("language",)
  lora = recipes.recipes(("C",), (), (), "lora", "LoRA ")
  assert [r.name for r in lora] == ["LoRA task expert", "LoRA language expert", "partial LoRA task expert [C]",
                                    "partial LoRA language expert [C]"]
  assert {r.variant for r in lora} == {"lora"}


def test_a_recipe_of_an_unknown_variant_is_refused():
  with pytest.raises(ValueError, match="recipe 'x': unknown variant 'qlora'; known: full, lora, neurons"):
    Recipe("x", (("task", ALL),), ("task",), variant="qlora")


def test_swaps_reads_layer_swap_specs():
  assert recipes.swaps(("1,1,0", "2,0,1"), "merge.swaps") == [(1, 1, 0), (2, 0, 1)]
  with pytest.raises(ValueError, match=r"lora.swaps entry '1,1' is not 'bottom,top,transition'"):
    recipes.swaps(("1,1",), "lora.swaps")
