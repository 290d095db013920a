"""xlt.experiments: the kinds declare themselves (common.Kind), and the runner and the report
find each config task's kind, headline metric and measurements from the declarations."""

import importlib
import json
import os

import pytest

from xlt import experiments, report, runner
from xlt.experiments import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_kind_is_found_from_its_declaration():
  found = {task: module.__name__ for task, module in experiments.kinds().items()}
  assert found == {"graph": "xlt.experiments.synthetic", "addition": "xlt.experiments.synthetic",
                   "text": "xlt.experiments.text", "arithmetic": "xlt.experiments.testbed.experiment",
                   "arithmetic_regimes": "xlt.experiments.testbed.regimes",
                   "finetune": "xlt.experiments.finetune", "pretrain_hf": "xlt.experiments.pretrain_hf"}
  for module in set(experiments.kinds().values()):
    assert all(callable(getattr(module, f, None)) for f in ("prepare", "stages", "outputs")), module.__name__


def test_an_unknown_task_names_the_known_ones():
  with pytest.raises(ValueError, match="unknown task 'chess'; known: addition, arithmetic, arithmetic_regimes, "):
    experiments.kind("chess")
  with pytest.raises(report.UserError, match="unknown task 'chess'"):
    report.declaration("chess")


def test_a_declaration_is_checked():
  with pytest.raises(ValueError, match="at least one task"):
    common.Kind(tasks={})
  with pytest.raises(ValueError, match="measurements 'table'"):
    common.Kind(tasks={"x": None}, measurements="table")


def test_every_recorded_result_has_its_kinds_headline_metric():
  # the declarations give the metric each results/*.json was collected with (before them,
  # a table in xlt.report): `collect` without --metric records what it did
  for name in sorted(n for n in os.listdir(os.path.join(REPO, "results")) if n.endswith(".json")):
    result = json.load(open(os.path.join(REPO, "results", name)))
    module, _, arg = result["config"].removesuffix(".py").partition(":")
    config = importlib.import_module(module.replace("/", ".").replace(".py", ""))
    c = config.get_config(arg) if arg else config.get_config()
    assert report.declaration(c.task).tasks[c.task] == result["metric"], name


def test_stage_helpers_stack_take_and_configure():
  import ml_collections
  import numpy as np

  trees = [{"w": np.full((2, 3), i, np.float32), "b": np.arange(3) + i} for i in range(3)]
  stacked = common.stack(trees)
  assert stacked["w"].shape == (3, 2, 3) and stacked["b"].dtype == trees[0]["b"].dtype
  for i, tree in enumerate(trees):
    got = common.member(stacked, i)
    assert all(isinstance(v, np.ndarray) and np.array_equal(v, tree[k]) for k, v in got.items())
  c = ml_collections.ConfigDict({"mesh": {"devices": 1}, "train": {"steps": 3}, "opt": {"lr": 0.1}})
  view = common.loop_config(c, c.train, c.opt)
  assert view.to_dict() == {"train": {"steps": 3}, "opt": {"lr": 0.1}, "mesh": {"devices": 1}}
  c.sharding_rules = (("embed", None),)
  assert common.loop_config(c, c.train, c.opt).sharding_rules == (("embed", None),)


def test_unknown_task_is_named_with_the_known_ones(graph_config, tmp_path):
  graph_config.task = "chess"
  with pytest.raises(ValueError, match="unknown task 'chess'; known: addition, arithmetic, "):
    runner.run(graph_config, str(tmp_path / "w"), progress=False)
  assert not (tmp_path / "w").exists()  # refused before anything is written


def test_modules_of_xlt_import_no_cycle():
  # the runner imports the kinds (xlt.experiments); the kinds import neither it nor each other,
  # but for the testbed's own stages (testbed.peft).
  import ast
  import pathlib

  root = pathlib.Path(REPO)
  graph = {}
  for path in (root / "xlt").rglob("*.py"):
    parts = path.relative_to(root).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    graph[module] = [node for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, (ast.Import, ast.ImportFrom))]
  for module, nodes in graph.items():  # `from p import x`: module p.x if there is one, else p
    deps = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    deps |= {f"{n.module}.{a.name}" if f"{n.module}.{a.name}" in graph else n.module
             for n in nodes if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
    graph[module] = {d for d in deps if d in graph and d != module}

  def on_a_cycle(module):  # depth-first search for a way back to `module`
    stack, seen = list(graph[module]), set()
    while stack:
      m = stack.pop()
      if m == module:
        return True
      if m not in seen:
        seen.add(m)
        stack.extend(graph[m])
    return False

  assert [m for m in graph if on_a_cycle(m)] == []
  kinds = {"xlt.experiments.synthetic", "xlt.experiments.text", "xlt.experiments.testbed.experiment",
           "xlt.experiments.testbed.peft", "xlt.experiments.finetune", "xlt.experiments.pretrain_hf",
           "xlt.experiments.testbed.regimes"}
  assert graph["xlt.experiments"] == set()  # it finds the kinds by their declarations, importing none by name
  # a kind imports no other kind, but the regime map, which is the testbed run once per regime
  extends = {"xlt.experiments.testbed.regimes": {"xlt.experiments.testbed.experiment"}}
  for kind in kinds:
    others = kinds - {"xlt.experiments.testbed.peft"} - extends.get(kind, set())
    assert not graph[kind] & ({"xlt.runner", "xlt.experiments"} | others), kind
