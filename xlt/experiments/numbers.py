"""The numbers of an experiment's config, checked before a workdir is claimed or a step is run
(xlt.runner.run): a nonsense value is one ValueError naming its key, never a run that trains on
it. A negative learning rate trains by gradient ascent, `peak_lr=nan` turns every parameter into
NaN (and its table into 0.00%), `lora.alpha=nan` the adapters, a graph `edge_prob` of 2.0 is no
probability; each exited 0.

One check per concept, found wherever it sits in the config (kinds nest them: `opt`,
`finetune.opt`, `lora.opt`, `base.opt`, ...):

  optimizer   a config with `peak_lr` and `schedule` (configs/common.opt)
  LoRA        a config with `rank` and `alpha` (configs/finetune.py's c.lora)
  graph       a config with `edge_prob` (configs/graph.py's c.graph)
  any float   finite: NaN or infinity is refused wherever it is

lm-eval's options (num_fewshot, limit) are checked where every route builds them
(xlt.eval.scores.Options); a merge's options by the merge registry (slerp's t in [0, 1]).
"""

from __future__ import annotations

import math
import numbers


def _real(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _need(ok: bool, key: str, value, what: str) -> None:
  if not ok:
    raise ValueError(f"{key} must be {what}, got {value!r}")


def check_opt(c, where: str = "opt") -> None:
  """An optimizer config: a positive finite peak_lr, non-negative warmup and decay, betas in [0, 1)."""
  _need(_real(c.peak_lr) and math.isfinite(c.peak_lr) and c.peak_lr > 0, f"{where}.peak_lr", c.peak_lr,
        "a positive number (a negative one trains by gradient ascent)")
  for key in ("warmup_steps", "total_steps", "weight_decay", "clip", "end_lr_ratio"):
    if key in c:
      _need(_real(c[key]) and c[key] >= 0, f"{where}.{key}", c[key], "a number >= 0")
  for key in ("b1", "b2"):
    if key in c:
      _need(_real(c[key]) and 0 <= c[key] < 1, f"{where}.{key}", c[key], "in [0, 1)")


def check_lora(c, where: str = "lora") -> None:
  """A LoRA config: a positive integer rank and a positive finite alpha."""
  _need(isinstance(c.rank, numbers.Integral) and not isinstance(c.rank, bool) and c.rank > 0, f"{where}.rank",
        c.rank, "a positive integer")
  _need(_real(c.alpha) and math.isfinite(c.alpha) and c.alpha > 0, f"{where}.alpha", c.alpha, "a positive number")


def check_graph(c, where: str = "graph") -> None:
  """A random graph's config: edge_prob a probability, a positive number of nodes."""
  _need(_real(c.edge_prob) and 0 <= c.edge_prob <= 1, f"{where}.edge_prob", c.edge_prob, "a probability in [0, 1]")
  if "num_nodes" in c:
    _need(isinstance(c.num_nodes, numbers.Integral) and c.num_nodes > 0, f"{where}.num_nodes", c.num_nodes,
          "a positive integer")


def check(c, where: str = "") -> None:
  """Every number of config `c` (a ConfigDict or a dict) that the checks above know, at any depth."""
  keys = set(c.keys())
  if {"peak_lr", "schedule"} <= keys:
    check_opt(c, where or "opt")
  if {"rank", "alpha"} <= keys:
    check_lora(c, where or "lora")
  if "edge_prob" in keys:
    check_graph(c, where or "graph")
  for key in sorted(keys):
    value, name = c[key], f"{where}.{key}" if where else key
    if hasattr(value, "keys"):
      check(value, name)
    elif isinstance(value, float) and not math.isfinite(value):
      raise ValueError(f"{name} must be a finite number, got {value}")
