"""The kinds of experiment. A kind is a module of this package (or of a package in it) with a
module-level `KIND` (common.Kind: its name, which a config's `c.kind` gives; the data tasks,
`c.task`, it runs, each with its headline metric; how xlt.report reads its rows) and the three functions xlt.runner calls, `prepare`,
`stages` and `outputs` (the runner's docstring describes them). `kinds()` finds them: adding a
kind edits nothing here. The kinds today, by name: their data tasks (docs/extending.md walks
through adding one):

  synthetic    graph, addition: language mixing on the synthetic tasks (Tables 2, 3)
  text         text: language modelling with a high- and a low-resource language (Table 4)
  testbed      arithmetic: the merge testbed, base -> experts -> merges -> scores (a package:
               the kind in testbed.experiment, its recipes' plan, PEFT stages, text and report)
  testbed.regimes  arithmetic: the testbed's fine-tunes and merges per fine-tuning
               regime (learning rate x steps) from one base: the regime map
  finetune     finetune: a pretrained Hugging Face model -> task and language experts ->
               partition recipes, LoRA, merges -> Hugging Face directories, scores
  pretrain_hf  pretrain_hf: a small Llama-shaped base on the testbed's data, saved as a Hugging
               Face directory with its tokenizer and fine-tuning data (configs/llama_base.py)
  structure    arithmetic: xlt.structure's measure of finished testbed runs, requested by a
               config (configs/structure.py); it trains nothing

and what they share: common (what a kind declares, hands the runner and gets back, and the
stage helpers) and recipes (the recipe model of the testbed and finetune).
"""

from __future__ import annotations

import copy
import functools
import importlib
import pkgutil
import types


@functools.cache
def kinds() -> dict[str, types.ModuleType]:
  """{kind name (`c.kind`): the module that runs it}, from every module of this package that
  declares a `KIND`; a name, or a former task, two kinds claim is an error naming both."""
  found: dict[str, types.ModuleType] = {}
  former: dict[str, str] = {}
  for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
    module = importlib.import_module(info.name)
    declared = getattr(module, "KIND", None)
    if declared is None:
      continue
    if declared.name in found:
      raise ValueError(f"kind {declared.name!r} is declared by both {found[declared.name].__name__} and "
                       f"{module.__name__}")
    found[declared.name] = module
    for task in declared.former():
      if task in former:
        raise ValueError(f"former task {task!r} is claimed by both kinds {former[task]!r} and {declared.name!r}")
      former[task] = declared.name
  return found


def resolve(config) -> tuple[str, str]:
  """(kind name, data task) of a config or a recorded config.json (a dict).

  A config names its kind (`kind`) and its data task (`task`) apart. Configs written before
  `kind` existed chose the kind by the task alone ("arithmetic_regimes" meant the regimes kind
  on the arithmetic data): such a task value is read as that kind's former task, so their
  config.json files and the configs that derive from one and set only the task still run."""
  task, name = config.get("task"), config.get("kind")
  known = kinds()
  former = {t: (n, data) for n, m in known.items() for t, data in m.KIND.former().items()}
  data_tasks = {t for m in known.values() for t in m.KIND.tasks}
  if task in former and (name is None or task not in data_tasks):
    return former[task]
  if name is None:
    raise ValueError(f"the config names no experiment kind (c.kind; known: {', '.join(sorted(known))}) and its "
                     f"task {task!r} chose none")
  if name not in known:
    raise ValueError(f"unknown experiment kind {name!r}; known: {', '.join(sorted(known))}")
  if task not in known[name].KIND.tasks:
    raise ValueError(f"experiment kind {name!r} runs task {' or '.join(map(repr, known[name].KIND.tasks))}, "
                     f"not {task!r}")
  return name, task


def kind(config) -> types.ModuleType:
  """The kind module that runs the experiment `config` describes (a config or a config.json)."""
  return kinds()[resolve(config)[0]]


def with_kind(config):
  """`config` (a ConfigDict or a config.json dict, left unchanged) with its kind and data task
  written out as `resolve` reads them: a recorded config.json of older code compares equal to
  today's config of the same experiment."""
  name, task = resolve(config)
  if config.get("kind") == name and config.get("task") == task:
    return config
  out = copy.deepcopy(config)
  if isinstance(out, dict):
    out.update(kind=name, task=task)
  else:
    with out.unlocked():
      out.kind, out.task = name, task
  return out
