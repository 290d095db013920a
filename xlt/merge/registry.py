"""Every merge method in one place (mergekit's registry): its function, the models it takes
(*roles*), its options with their defaults, types and help, and its paper.

A method is called the same way whatever it is, on in-memory trees or (through
`tool.merge_files` and `python -m xlt.merge`) on checkpoint files:

  registry.merge("ties", {"base": b, "experts": [t, l]}, {"density": 0.2})
  print(registry.describe())            # every method, its inputs, options and paper

Each method is declared next to its function (xlt.merge.declare: `@declare.method` or the
per-tensor `@declare.per_tensor`); importing the modules below is what registers them. Options
are read from each function's signature (name, default, type annotation; one without a default
is required) and their help from its docstring's "name: help" lines, so the registry never
repeats what the function says. A role whose name ends in "+" takes a non-empty list of models.

Names only where needed: most methods combine each tensor with the same tensor of the other
inputs and never ask which block it is in or where its rows are, so they merge any tensor
by name (GPT-J's lm_head.bias, GPT-NeoX, Falcon, Bloom, OPT). A *layer-aware* method
(`Method.layer_aware`: layer_swap, sparsify_rows, maet, della's per-row ranks, arcee_fusion's
row softmax; slerp/nearswap with per-block t, nuslerp/model_stock row-wise, any neuron mask)
needs a naming rule (xlt.param_paths): "hf", "xlt" or a block prefix pattern such as
"gpt_neox.layers.{i}." (`paths.from_pattern`). `naming_for_method` picks it.
"""

from __future__ import annotations

import ast
import math
import numbers

import numpy as np

from xlt import param_paths as naming_lib
from xlt.merge import core, declare, layerwise
# every module that declares methods (xlt.merge.declare), imported for its declarations
from xlt.merge import combine, data_aware, geometric, localize, maet, selective, sparse, subspace, swap  # noqa: F401
from xlt.merge.declare import METHODS, REQUIRED, ROLE_HELP, Method, Option, Role, register  # noqa: F401

# listed module by module in this order (the methods xlt started with, then mergekit's kin),
# each module's in the order it declares them
_MODULES = [f"xlt.merge.{m}" for m in ("swap", "combine", "maet", "sparse", "geometric", "selective", "subspace",
                                        "localize", "data_aware")]
for _m in sorted(METHODS.values(), key=lambda m: _MODULES.index(m.fn.__module__)
                 if m.fn.__module__ in _MODULES else len(_MODULES)):
  METHODS[_m.name] = METHODS.pop(_m.name)


def parse_spec(spec: str, what: str = "merge") -> tuple[str, dict]:
  """(method, options) of a one-line merge spec "method option=value ...", the values Python
  literals (e.g. "ties density=0.5", "layer_swap bottom=1 top=1"): how configs list merges."""
  method, *pairs = str(spec).split()
  try:
    return method, {k: ast.literal_eval(v) for k, v in (pair.split("=", 1) for pair in pairs)}
  except (ValueError, SyntaxError):
    raise ValueError(f"{what} entry {spec!r} is not 'method option=value ...' (values as Python "
                     "literals)") from None


def get(method: str) -> Method:
  if method not in METHODS:
    raise ValueError(f"unknown merge method {method!r}; known: {', '.join(METHODS)}")
  return METHODS[method]


def role_list(m: Method) -> str:
  return ", ".join(r.name + (" (list)" if r.many else "") for r in m.roles)


def _type_ok(value, annotation: str) -> bool:
  """Whether `value` fits a simple annotation ("float", "int | None", "Sequence[float]",
  unions of those); True for any annotation not made of those."""
  real = lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)
  checks = {"float": real, "int": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
            "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
            "None": lambda v: v is None,
            "Sequence[float]": lambda v: (isinstance(v, (list, tuple)) or np.ndim(v) == 1) and all(real(x) for x in v)}
  kinds = [k.strip() for k in annotation.split("|")]
  if not annotation or any(k not in checks for k in kinds):
    return True
  return any(checks[k](value) for k in kinds)


def check(method: str, inputs: dict, options: dict | None = None, *, trees_allowed: bool = True) -> Method:
  """The Method, after checking a call: the inputs are exactly the method's roles (a list
  for a list role), the options known, of their types, every required one given.
  ValueError with one line naming what is wrong and what is accepted otherwise;
  trees_allowed=False (files, the command line) refuses the options that take trees."""
  m = get(method)
  options = dict(options or {})
  roles = [r.name for r in m.roles]
  missing = [r for r in roles if r not in inputs]
  unknown = sorted(set(inputs) - set(roles))
  if missing or unknown:
    raise ValueError(f"merge method {method} takes inputs {role_list(m)}; missing {missing}, unknown {unknown}")
  for r in m.roles:
    if r.many and (not isinstance(inputs[r.name], (list, tuple)) or not inputs[r.name]):
      raise ValueError(f"merge method {method}: input {r.name} is a non-empty list of models, "
                       f"got {type(inputs[r.name]).__name__}")
  names = [o.name for o in m.options]
  if unknown := sorted(set(options) - set(names)):
    raise ValueError(f"merge method {method} has no option {', '.join(unknown)}; "
                     f"its options: {', '.join(names) or 'none'}")
  if missing := [o.name for o in m.options if o.required and o.name not in options]:
    raise ValueError(f"merge method {method} needs option {', '.join(missing)} (no default)")
  for name, value in options.items():
    o = m.option(name)
    if o.tree and not trees_allowed and value is not None:
      what = "a parameter tree" if o.rows else "Python objects"
      raise ValueError(f"merge method {method}: option {name} takes {what}, which only a Python call can give "
                       "(xlt.merge.registry.merge)")
    per_layer = bool(declare.per_layer_options(m, {name: value}))
    if not o.tree and not per_layer and not _type_ok(value, o.type):
      shown = " ".join(repr(value).split())
      shown = shown if len(shown) <= 60 else shown[:57] + "..."
      raise ValueError(f"merge method {method}: option {name} must be {o.type}, got {shown}")
    if not o.tree:
      _check_numbers(m, name, value)
  return m


def _numbers_in(value) -> list[float]:
  """The numbers of an option's value: itself, a list's, a per-layer list's, a filtered list's."""
  if isinstance(value, bool) or value is None or isinstance(value, str):
    return []
  if isinstance(value, numbers.Real):
    return [float(value)]
  if isinstance(value, dict):
    return _numbers_in(value.get("value"))
  if isinstance(value, (list, tuple)):
    return [x for v in value for x in _numbers_in(v)]
  return []


def _check_numbers(m: Method, name: str, value) -> None:
  """No NaN or infinity in a number option, and each number in the method's declared range."""
  found = _numbers_in(value)
  if bad := [x for x in found if not math.isfinite(x)]:
    raise ValueError(f"merge method {m.name}: option {name} must be a finite number, got {bad[0]}")
  if name in m.ranges:
    low, high = m.ranges[name]
    if out := [x for x in found if not low <= x <= high]:
      raise ValueError(f"merge method {m.name}: option {name} must be between {low:g} and {high:g}, got {out[0]:g}")


def naming_for_method(m: Method, options: dict | None, paths, naming: str | naming_lib.Naming = "auto"):
  """The Naming a call of `m` reads `paths` with: `naming` itself; a block prefix pattern
  holding "{i}" (`paths.from_pattern`), which must place some path in a block; "xlt" /
  "hf", which must recognise every path; or "auto": the first naming that recognises every
  path, and when none does, `paths.UNNAMED` for a method that reads no blocks or rows (it
  merges any tensor by name) and a ValueError for one that does, saying how to name a rule."""
  if isinstance(naming, naming_lib.Naming):
    return naming
  paths = list(paths)
  if "{i}" in naming:
    nm = naming_lib.from_pattern(naming)
    if not any(nm.block_kind(p)[0] is not None for p in paths):
      shown = naming_lib.path_str(paths[0]) if paths else "none"
      raise ValueError(f"naming pattern {naming!r} matches no tensor name (the first: {shown})")
    return nm
  try:
    return naming_lib.naming_for(paths, naming)
  except ValueError as e:
    if naming != "auto":
      raise
    if not m.uses_layers(options):
      return naming_lib.UNNAMED
    raise ValueError(f"merge method {m.name} reads blocks or rows, so it needs to know this architecture: {e}. "
                     "Name a rule: naming='hf' or 'xlt', or the block prefix, e.g. "
                     "naming='gpt_neox.layers.{i}.'") from None


def merge(method: str, inputs: dict, options: dict | None = None, *,
          naming: str | naming_lib.Naming = naming_lib.XLT):
  """The merged tree of `method` on {role: tree or list of trees} with `options`, after
  `check`. naming: a Naming, "xlt" / "hf", a block prefix pattern ("model.layers.{i}."), or
  "auto", read from the first input's paths by `naming_for_method`."""
  m = check(method, inputs, options)
  if not isinstance(naming, naming_lib.Naming):
    first = inputs[m.roles[0].name]
    first = first[0] if m.roles[0].many else first
    naming = naming_for_method(m, options, [p for p, _ in core.leaves_with_paths(first)], naming)
  args = [list(inputs[r.name]) if r.many else inputs[r.name] for r in m.roles]
  if varying := declare.per_layer_options(m, options):
    return layerwise.merge(m, args, dict(options), varying, naming)
  return m.fn(*args, **dict(options or {}), naming=naming)


def check_among(method: str, options: dict | None, available, label: str) -> Method:
  """`check` of a call an experiment will make with the models it has (`available`: the role
  names it can fill), before any of them is trained: a role it lacks is a one-line error."""
  m = get(method)
  if missing := [r.name for r in m.roles if r.name not in available]:
    raise ValueError(f"merge {label!r}: no input for {method}'s {', '.join(missing)} (the experiment has "
                     f"{', '.join(available)})")
  return check(method, {r.name: [None] if r.many else None for r in m.roles}, options)


def merge_among(method: str, available: dict, options: dict | None = None, *,
                naming: str | naming_lib.Naming = naming_lib.XLT):
  """`merge` with the inputs `method` takes picked from `available` ({role: tree or list}), an
  experiment's models by the role each can fill."""
  return merge(method, {r.name: available[r.name] for r in get(method).roles}, options, naming=naming)


def describe(method: str | None = None) -> str:
  """Help text: every method (or one) with its inputs, options (type, default, help) and paper."""
  blocks = []
  for m in [get(method)] if method else METHODS.values():
    aware = ("reads blocks or rows: needs a naming rule" if m.layer_aware is True else
             "names needed only with some options" if m.layer_aware else "merges any tensor by name")
    lines = [f"{m.name}: {m.summary}", f"  paper: {m.paper}", f"  layers: {aware}"]
    if m.mergekit:
      lines.append(f"  mergekit: {m.mergekit}" + ("" if m.mergekit == m.name else " (accepted as its name too)"))
    lines.append("  inputs:")
    lines += [f"    {r.name}{' (list)' if r.many else ''}: {r.help}" for r in m.roles]
    lines.append("  options:" if m.options else "  options: none")
    for o in m.options:
      default = "required" if o.required else f"default {o.default!r}"
      kind = ("parameter tree, Python only" if o.rows else "Python only") if o.tree else o.type
      lines.append(f"    {o.name} ({kind}; {default}): {o.help}")
    blocks.append("\n".join(lines))
  return "\n\n".join(blocks)

