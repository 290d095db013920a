"""The kinds of experiment. A kind is a module of this package (or of a package in it) with a
module-level `KIND` (common.Kind: the config tasks, `c.task`, it runs, each with its headline
metric, and how xlt.report reads its rows) and the three functions xlt.runner calls, `prepare`,
`stages` and `outputs` (the runner's docstring describes them). `kinds()` finds them: adding a
kind edits nothing here. The kinds today (docs/extending.md walks through adding one):

  synthetic    graph, addition: language mixing on the synthetic tasks (Tables 2, 3)
  text         text: language modelling with a high- and a low-resource language (Table 4)
  testbed      arithmetic: the merge testbed, base -> experts -> merges -> scores (a package:
               the kind in testbed.experiment, its recipes' plan, PEFT stages, text and report)
  testbed.regimes  arithmetic_regimes: the testbed's fine-tunes and merges per fine-tuning
               regime (learning rate x steps) from one base: the regime map
  finetune     finetune: a pretrained Hugging Face model -> task and language experts ->
               partition recipes, LoRA, merges -> Hugging Face directories, scores
  pretrain_hf  pretrain_hf: a small Llama-shaped base on the testbed's data, saved as a Hugging
               Face directory with its tokenizer and fine-tuning data (configs/llama_base.py)

and what they share: common (what a kind declares, hands the runner and gets back, and the
stage helpers) and recipes (the recipe model of the testbed and finetune).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import types


@functools.cache
def kinds() -> dict[str, types.ModuleType]:
  """{config task: the kind module that runs it}, from every module of this package that declares
  a `KIND`; a task two kinds claim is an error naming both."""
  found: dict[str, types.ModuleType] = {}
  for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
    module = importlib.import_module(info.name)
    for task in getattr(getattr(module, "KIND", None), "tasks", ()):
      if task in found:
        raise ValueError(f"task {task!r} is claimed by both {found[task].__name__} and {module.__name__}")
      found[task] = module
  return found


def kind(task: str) -> types.ModuleType:
  """The kind that runs experiments of `task`."""
  known = kinds()
  if task not in known:
    raise ValueError(f"unknown task {task!r}; known: {', '.join(sorted(known))}")
  return known[task]
