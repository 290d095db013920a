"""xlt.experiments: the kinds declare themselves (common.Kind), and the runner and the report
find each config's kind (c.kind, apart from its data task c.task; older config.json files by
their task), headline metric and measurements from the declarations."""

import importlib
import json
import os

import pytest

from xlt import experiments, report, runner
from xlt.experiments import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_kind_is_found_from_its_declaration():
  found = {name: module.__name__ for name, module in experiments.kinds().items()}
  assert found == {"synthetic": "xlt.experiments.synthetic", "text": "xlt.experiments.text",
                   "testbed": "xlt.experiments.testbed.experiment",
                   "testbed.regimes": "xlt.experiments.testbed.regimes",
                   "finetune": "xlt.experiments.finetune", "pretrain_hf": "xlt.experiments.pretrain_hf",
                   "structure": "xlt.experiments.structure"}
  for module in set(experiments.kinds().values()):
    assert all(callable(getattr(module, f, None)) for f in ("prepare", "stages", "outputs")), module.__name__


def test_the_kind_and_the_data_task_are_apart():
  assert experiments.resolve({"kind": "testbed", "task": "arithmetic"}) == ("testbed", "arithmetic")
  assert experiments.resolve({"kind": "testbed.regimes", "task": "arithmetic"}) == ("testbed.regimes", "arithmetic")
  assert experiments.resolve({"kind": "synthetic", "task": "addition"}) == ("synthetic", "addition")
  with pytest.raises(ValueError, match="^unknown experiment kind 'chess'; known: finetune, pretrain_hf, structure, "
                                       "synthetic, testbed, testbed.regimes, text$"):
    experiments.resolve({"kind": "chess", "task": "arithmetic"})
  with pytest.raises(ValueError, match="^experiment kind 'testbed' runs task 'arithmetic', not 'graph'$"):
    experiments.resolve({"kind": "testbed", "task": "graph"})
  with pytest.raises(report.UserError, match="unknown experiment kind 'chess'"):
    report.declaration({"kind": "chess", "task": "graph"})


def test_configs_of_older_code_are_read_with_the_kind_their_task_chose():
  # config.json files written before c.kind existed: the task chose the kind
  assert experiments.resolve({"task": "arithmetic"}) == ("testbed", "arithmetic")
  assert experiments.resolve({"task": "arithmetic_regimes"}) == ("testbed.regimes", "arithmetic")
  assert experiments.resolve({"task": "graph"}) == ("synthetic", "graph")
  # a config deriving from configs/merge.py (kind testbed) that sets only the former task
  # (configs/claims_study.py) runs the regime map
  assert experiments.resolve({"kind": "testbed", "task": "arithmetic_regimes"}) == ("testbed.regimes", "arithmetic")
  with pytest.raises(ValueError, match="names no experiment kind .* its task 'chess' chose none"):
    experiments.resolve({"task": "chess"})
  old = {"task": "arithmetic_regimes", "seed": 0}
  assert experiments.with_kind(old) == {"kind": "testbed.regimes", "task": "arithmetic", "seed": 0}
  assert old == {"task": "arithmetic_regimes", "seed": 0}  # the input is left alone


def test_a_config_json_of_older_code_still_claims_its_workdir(tmp_path):
  # a workdir that a run of older code recorded (no kind, the former task) resumes under
  # today's config of the same experiment: no field differs
  from configs import merge_regimes

  c = merge_regimes.get_config()
  old = json.loads(json.dumps(c.to_dict(), default=repr))
  del old["kind"]
  old["task"] = "arithmetic_regimes"
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert common.config_changes(old, c) == {}
  assert runner.claim_workdir(c, str(tmp_path)) == "same"
  # a config that sets only the former task (configs/claims_study.py) is recorded as it runs
  c.kind, c.task = "testbed", "arithmetic_regimes"
  (tmp_path / "new").mkdir()
  assert runner.claim_workdir(c, str(tmp_path / "new")) == "new"
  recorded = json.loads((tmp_path / "new" / "config.json").read_text())
  assert (recorded["kind"], recorded["task"]) == ("testbed.regimes", "arithmetic")
  c.kind, c.task = "testbed.regimes", "arithmetic"
  c.kind = "testbed"
  assert set(common.config_changes(old, c)) == {"kind"}


def test_a_declaration_is_checked():
  with pytest.raises(ValueError, match="at least one task"):
    common.Kind(name="x", tasks={})
  with pytest.raises(ValueError, match="has a name"):
    common.Kind(name="", tasks={"x": None})
  with pytest.raises(ValueError, match="measurements 'table'"):
    common.Kind(name="x", tasks={"x": None}, measurements="table")
  with pytest.raises(ValueError, match="former tasks mean \\['y'\\], which it does not run"):
    common.Kind(name="x", tasks={"x": None}, former_tasks={"old": "y"})


def test_every_recorded_result_has_its_kinds_headline_metric():
  # the declarations give the metric each results/*.json was collected with (before them,
  # a table in xlt.report): `collect` without --metric records what it did
  for name in sorted(n for n in os.listdir(os.path.join(REPO, "results")) if n.endswith(".json")):
    result = json.load(open(os.path.join(REPO, "results", name)))
    module, _, arg = result["config"].removesuffix(".py").partition(":")
    config = importlib.import_module(module.replace("/", ".").replace(".py", ""))
    c = config.get_config(arg) if arg else config.get_config()
    assert c.get("kind"), f"{result['config']} names no kind"
    c = experiments.with_kind(c)
    assert report.declaration(c).tasks[c.task] == result["metric"], name


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


def test_an_unknown_kind_or_task_is_refused_before_anything_is_written(graph_config, tmp_path):
  graph_config.task = "chess"
  with pytest.raises(ValueError, match="experiment kind 'synthetic' runs task 'graph' or 'addition', not 'chess'"):
    runner.run(graph_config, str(tmp_path / "w"), progress=False)
  graph_config.task, graph_config.kind = "graph", "chess"
  with pytest.raises(ValueError, match="unknown experiment kind 'chess'; known: finetune, "):
    runner.run(graph_config, str(tmp_path / "w"), progress=False)
  assert not (tmp_path / "w").exists()


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
