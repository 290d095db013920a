"""What an experiment kind hands the runner (xlt.runner, whose docstring describes the
interface): the ensembles it trains (`Stage`) and what the runner hands back (`Trained`), and
the seeds of a condition, which every kind plans its members with.

The kinds import this module, never xlt.runner, so the runner can import the kinds.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np
from flax import traverse_util

from xlt import loop as loop_lib
from xlt import model as model_lib

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
  config.json did, so a tuple equals its recorded list."""
  old = traverse_util.flatten_dict(recorded, sep=".")
  new = traverse_util.flatten_dict(json.loads(json.dumps(c.to_dict(), default=repr)), sep=".")
  return {k: (old.get(k, UNSET), new.get(k, UNSET)) for k in old.keys() | new.keys()
          if old.get(k, UNSET) != new.get(k, UNSET)}


UNSET = "<unset>"


def condition_seeds(c, cond: str) -> list[int]:
  """The seeds a condition is trained with: `c.num_seeds`, or `c.seeds_per_condition[cond]`
  (the reference repeats only its mixed models; the alone baselines can run once)."""
  n = int(c.get("seeds_per_condition", {}).get(cond, c.num_seeds))
  if n < 1:
    raise ValueError(f"condition {cond!r} needs >= 1 seed, got {n} (num_seeds / seeds_per_condition)")
  return list(range(c.seed, c.seed + n))
