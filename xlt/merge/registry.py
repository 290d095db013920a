"""Every merge method in one place (mergekit's registry): its function, the models it takes
(*roles*), its options with their defaults, types and help, and its paper.

A method is called the same way whatever it is, on in-memory trees or (through
`tool.merge_files` and `python -m xlt.merge`) on checkpoint files:

  registry.merge("ties", {"base": b, "experts": [t, l]}, {"density": 0.2})
  print(registry.describe())            # every method, its inputs, options and paper

Options are read from each function's signature (name, default, type annotation; one
without a default is required) and their help from its docstring's "name: help" lines,
so the registry never repeats what the function says. A role whose name ends in "+" at
registration takes a non-empty list of models.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import re
from typing import Any, Callable

import numpy as np

from xlt import paths as naming_lib
from xlt.merge import combine, core, geometric, sparse, swap
from xlt.merge.maet import maet as _maet  # xlt.merge.maet is the function

REQUIRED = inspect.Parameter.empty  # the default of an option that has none

# what each role's model is, for every method that takes it
ROLE_HELP = {
    "base": "the model every other input was fine-tuned from",
    "experts": "the fine-tuned models to merge",
    "expert": "the fine-tuned model whose small changes go back to the base",
    "task_expert": "fine-tuned on the task in the high-resource language",
    "language_expert": "fine-tuned on general data in the target language",
    "ability_model": "base trained on ability (task) data in the source language",
    "source_language_model": "base trained on general data in the source language",
    "target_language_models": "base trained on general data in each target language",
    "other": "the model merged into the base (for slerp: the end t = 1)",
    "models": "the models to combine, weights themselves (no base, no task vectors)",
}


@dataclasses.dataclass(frozen=True)
class Role:
  """One input of a method: a model, or a non-empty list of models (`many`)."""
  name: str
  many: bool
  help: str


@dataclasses.dataclass(frozen=True)
class Option:
  """One keyword of a method: `type` is the annotation as written ("" when none);
  `tree` options take parameter trees (masks), so only Python callers can set them."""
  name: str
  type: str
  default: Any
  help: str
  tree: bool = False

  @property
  def required(self) -> bool:
    return self.default is REQUIRED


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  fn: Callable
  roles: tuple[Role, ...]
  options: tuple[Option, ...]
  paper: str
  summary: str  # the first sentence of the function's docstring

  def option(self, name: str) -> Option:
    for o in self.options:
      if o.name == name:
        return o
    raise ValueError(f"merge method {self.name} has no option {name}")


def _sentence(text: str) -> str:
  """The first sentence of `text` (a ". " or "; " outside brackets, not after e.g./i.e.)."""
  depth = 0
  for i, ch in enumerate(text):
    depth += (ch in "([{") - (ch in ")]}")
    if depth == 0 and ch in ".;" and text[i + 1:i + 2] in (" ", "") and not text[:i].endswith(("e.g", "i.e")):
      return text[:i]
  return text


def _docstring_args(fn) -> dict[str, str]:
  """{parameter: help} from the "name: text" (or "a, b: text") lines of fn's docstring,
  each entry with its more indented continuation lines, cut to its first sentence."""
  entries, current, indent = {}, None, 0
  for line in (inspect.getdoc(fn) or "").splitlines():
    m = re.match(r"^(\s*)([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (\S.*)$", line)
    if m and (current is None or len(m.group(1)) <= indent):
      current, indent = [m.group(3)], len(m.group(1))
      for name in m.group(2).split(", "):
        entries.setdefault(name, current)
    elif current is not None and line.strip() and len(line) - len(line.lstrip()) > indent:
      current.append(line.strip())
    else:
      current = None
  return {name: _sentence(" ".join(text)) for name, text in entries.items()}


def _annotation(p: inspect.Parameter) -> str:
  if p.annotation is inspect.Parameter.empty:
    return ""
  return p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))


METHODS: dict[str, Method] = {}


def register(name: str, fn: Callable, roles: tuple[str, ...], paper: str, *,
             trees: tuple[str, ...] = (), hidden: tuple[str, ...] = ()) -> Method:
  """Adds a method: `roles` are fn's leading positional parameters ("name+" for a list of
  models), every other parameter but `naming` and `hidden` ones is an option; `trees`
  names the options that take parameter trees."""
  params = inspect.signature(fn).parameters
  role_names = [r.rstrip("+") for r in roles]
  if list(params)[:len(roles)] != role_names:
    raise ValueError(f"{name}: roles {role_names} are not the first parameters of {fn.__name__}")
  doc = _docstring_args(fn)
  options = tuple(Option(p.name, _annotation(p), p.default, doc.get(p.name, ""), p.name in trees)
                  for p in list(params.values())[len(roles):] if p.name not in ("naming", *hidden))
  summary = _sentence(" ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split()))
  method = Method(name, fn, tuple(Role(r.rstrip("+"), r.endswith("+"), ROLE_HELP[r.rstrip("+")]) for r in roles),
                  options, paper, summary)
  METHODS[name] = method
  return method


_LAYER_SWAPPING = "Bandarkar et al. 2024, Layer Swapping for Zero-Shot Cross-Lingual Transfer in Large Language Models"
register("layer_swap", swap.layer_swap, ("task_expert", "language_expert"), _LAYER_SWAPPING)
register("soup", combine.soup, ("experts+",), "Wortsman et al. 2022, Model soups: averaging weights of multiple "
         "fine-tuned models improves accuracy without increasing inference time")
register("task_arithmetic", combine.task_arithmetic, ("base", "experts+"),
         "Ilharco et al. 2023, Editing models with task arithmetic", trees=("masks",))
register("ties", combine.ties, ("base", "experts+"),
         "Yadav et al. 2023, TIES-Merging: Resolving Interference When Merging Models", trees=("masks",))
register("dare", combine.dare, ("base", "experts+"), "Yu et al. 2024, DARE: Language Models are Super Mario: "
         "Absorbing Abilities from Homologous Models as a Free Lunch", trees=("masks",))
register("maet", _maet, ("base", "ability_model", "source_language_model", "target_language_models+"),
         "Chen et al. 2024, MAET: Extracting and Transferring Abilities for Building Multi-lingual "
         "Ability-enhanced Large Language Models", trees=("ability_neurons", "source_neurons"),
         hidden=("return_info",))  # the registry's merges return one tree: call maet for the info
register("sparsify_rows", combine.sparsify_rows, ("expert", "base"),
         _LAYER_SWAPPING + " (section 3.2, row-level sparsification)")

# the methods mergekit users know, each module listing its own: (name, function, roles, paper,
# register's keywords)
for _name, _fn, _roles, _paper, _kw in sparse.REGISTER + geometric.REGISTER:
  register(_name, _fn, _roles, _paper, **_kw)


def get(method: str) -> Method:
  if method not in METHODS:
    raise ValueError(f"unknown merge method {method!r}; known: {', '.join(METHODS)}")
  return METHODS[method]


def _role_list(m: Method) -> str:
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
    raise ValueError(f"merge method {method} takes inputs {_role_list(m)}; missing {missing}, unknown {unknown}")
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
      raise ValueError(f"merge method {method}: option {name} takes a parameter tree, which only a "
                       "Python call can give (xlt.merge.registry.merge)")
    if not o.tree and not _type_ok(value, o.type):
      shown = " ".join(repr(value).split())
      shown = shown if len(shown) <= 60 else shown[:57] + "..."
      raise ValueError(f"merge method {method}: option {name} must be {o.type}, got {shown}")
  return m


def merge(method: str, inputs: dict, options: dict | None = None, *,
          naming: str | naming_lib.Naming = naming_lib.XLT):
  """The merged tree of `method` on {role: tree or list of trees} with `options`, after
  `check`. naming: a Naming, or "auto" / "xlt" / "hf" found from the first input's paths."""
  m = check(method, inputs, options)
  if not isinstance(naming, naming_lib.Naming):
    first = inputs[m.roles[0].name]
    first = first[0] if m.roles[0].many else first
    naming = naming_lib.naming_for([p for p, _ in core.leaves_with_paths(first)], naming)
  args = [list(inputs[r.name]) if r.many else inputs[r.name] for r in m.roles]
  return m.fn(*args, **dict(options or {}), naming=naming)


def describe(method: str | None = None) -> str:
  """Help text: every method (or one) with its inputs, options (type, default, help) and paper."""
  blocks = []
  for m in [get(method)] if method else METHODS.values():
    lines = [f"{m.name}: {m.summary}", f"  paper: {m.paper}", "  inputs:"]
    lines += [f"    {r.name}{' (list)' if r.many else ''}: {r.help}" for r in m.roles]
    lines.append("  options:" if m.options else "  options: none")
    for o in m.options:
      default = "required" if o.required else f"default {o.default!r}"
      kind = "parameter tree, Python only" if o.tree else o.type
      lines.append(f"    {o.name} ({kind}; {default}): {o.help}")
    blocks.append("\n".join(lines))
  return "\n\n".join(blocks)
