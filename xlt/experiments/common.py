"""What an experiment kind declares of itself (`Kind`: its name, the data tasks it runs, their headline
metric, how xlt.report reads its rows), hands the runner (xlt.runner, whose docstring describes
the interface): the ensembles it trains (`Stage`) and what the runner hands back (`Trained`);
the seeds of a condition, which every kind plans its members with; and the helpers every kind
builds its stages with (`loop_config`, `stack`, `member`).

The kinds import this module, never xlt.runner, so the runner can import the kinds.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from xlt import distributed
from xlt import ensemble as ensemble_lib
from xlt import loop as loop_lib
from xlt import model as model_lib

# how xlt.report.collect turns a kind's rows into measurements: "transfer" (per role and language,
# the baseline -> mixed pair and one per other condition), "testbed" (one per model, its goal
# score first, the other sets after), "regimes" (the testbed's, per fine-tuning regime)
MEASUREMENTS = ("transfer", "testbed", "regimes")


@dataclasses.dataclass(frozen=True)
class Kind:
  """What a kind module declares as its module-level `KIND`, read by xlt.experiments (which
  module runs a config's `kind`) and xlt.report (the headline metric, how to read the rows).

  `name`: what a config's `c.kind` calls it. `tasks`: {data task (`c.task`) it runs: its
  headline metric (a row's `metric`) in results/, or None when the kind's results are not
  recorded there}. `measurements`: one of MEASUREMENTS. `former_tasks`: {the value `c.task` had
  when it also chose the kind (config.json files written before `c.kind` existed): the data
  task it meant}; None = the tasks themselves."""

  name: str
  tasks: dict[str, str | None]
  measurements: str = "transfer"
  former_tasks: dict[str, str] | None = None

  def __post_init__(self):
    if not self.name:
      raise ValueError("a kind has a name (what c.kind calls it)")
    if not self.tasks:
      raise ValueError(f"kind {self.name!r} runs at least one task")
    if self.measurements not in MEASUREMENTS:
      raise ValueError(f"measurements {self.measurements!r}: one of {MEASUREMENTS}")
    if bad := sorted(set((self.former_tasks or {}).values()) - set(self.tasks)):
      raise ValueError(f"kind {self.name!r}: former tasks mean {bad}, which it does not run")

  def former(self) -> dict[str, str]:
    """{former c.task value: the data task it meant}."""
    return dict(self.former_tasks) if self.former_tasks is not None else {t: t for t in self.tasks}


# val_score(stacked params of the members `ids`, ids) -> one score per member, higher is better
ValScore = Callable[[Any, np.ndarray], Sequence[float]]


@dataclasses.dataclass(frozen=True)
class Stage:
  """One ensemble to train: its members, the score its best parameters are selected by, and
  where its checkpoints go.

  `val_score` None trains without evaluating and keeps the last parameters (a short run
  whose result is only a starting point). `config` is the loop's view (train, opt, mesh):
  None takes the experiment's config. `init_params` (stacked, one model per member)
  fine-tunes; `tx` replaces the config's optimizer. `subdir` is the stage's folder under the
  workdir: None names it after the stage, "" is the workdir itself. `info` carries what
  later parts of the kind need from building the stage (e.g. partition labels)."""

  name: str
  model: model_lib.Config
  members: Sequence[loop_lib.Member]
  val_score: ValScore | None
  config: ml_collections.ConfigDict | None = None
  init_params: Any = None
  tx: Any = None
  subdir: str | None = None
  info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Trained:
  """A trained stage: `params` stacked over its members (each at its best validation score,
  or the last ones without a `val_score`), the loop's output `out` (with "best_steps" and
  "best_val" when selected), the `stage` itself, and `done_s`, seconds from the start of the
  run to the end of this stage."""

  params: Any
  out: dict
  stage: Stage
  done_s: float


def config_changes(recorded: dict, c) -> dict[str, tuple[Any, Any]]:
  """{dotted field: (recorded value, value in `c`)} for every field on which `c` differs from a
  recorded config.json, "<unset>" on the side that lacks it. `c` goes through JSON as
  config.json did, so a tuple equals its recorded list. Both are read with their kind written
  out (xlt.experiments.with_kind): a config.json of older code, whose task chose the kind,
  equals today's config of the same experiment."""
  old = traverse_util.flatten_dict(_kind_written_out(recorded), sep=".")
  new = traverse_util.flatten_dict(_kind_written_out(json.loads(json.dumps(c.to_dict(), default=repr))), sep=".")
  return {k: (old.get(k, UNSET), new.get(k, UNSET)) for k in old.keys() | new.keys()
          if old.get(k, UNSET) != new.get(k, UNSET)}


UNSET = "<unset>"


def _kind_written_out(config: dict) -> dict:
  """An experiment's config with its kind written out; another dict (a part of one) as it is."""
  from xlt import experiments  # the package finds the kinds, which import this module

  return experiments.with_kind(config) if "task" in config or "kind" in config else config


def condition_seeds(c, cond: str) -> list[int]:
  """The seeds a condition is trained with: `c.num_seeds`, or `c.seeds_per_condition[cond]`
  (the reference repeats only its mixed models; the alone baselines can run once)."""
  n = int(c.get("seeds_per_condition", {}).get(cond, c.num_seeds))
  if n < 1:
    raise ValueError(f"condition {cond!r} needs >= 1 seed, got {n} (num_seeds / seeds_per_condition)")
  return list(range(c.seed, c.seed + n))


def loop_config(c, train, opt) -> ml_collections.ConfigDict:
  """The loop's view of one stage (`Stage.config`): its `train` and `opt`, and the experiment's
  mesh and sharding rules."""
  s = ml_collections.ConfigDict({"train": train.to_dict(), "opt": opt.to_dict(), "mesh": c.mesh.to_dict()})
  if c.get("sharding_rules"):
    s.sharding_rules = c.sharding_rules
  return s


def stack(trees):
  """Parameter trees (one per member) stacked on a leading member axis, as numpy arrays; as
  shapes (jax.ShapeDtypeStruct) when any leaf is one (xlt.plan's abstract models)."""
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(trees)):
    return jax.tree.map(lambda *xs: jax.ShapeDtypeStruct((len(xs), *xs[0].shape), xs[0].dtype), *trees)
  return jax.tree.map(lambda *xs: np.stack(xs), *distributed.to_host(trees))


def member(stacked, i: int):
  """Member `i` of stacked parameters, as numpy arrays (gathered from every process)."""
  return distributed.to_host(ensemble_lib.take(stacked, i))
