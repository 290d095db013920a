"""One declaration per merge method, next to its function:

  @declare.method("ties", ("base", "experts+"), paper=..., mergekit="ties", trees=("masks",))
  def ties(base, experts, *, density: float = 0.2, ..., naming=XLT): ...       # over trees

  @declare.per_tensor("ram", ("base", "experts+"), paper=..., mergekit="ram")
  def ram(base, experts, *, epsilon: float = 1e-5): ...                      # one tensor

A `per_tensor` function receives one tensor of each input (a list of them for a list role)
and returns the merged tensor; the declaration lifts it over trees (`lift`: the inputs are
checked compatible, a `masks` option restricts each expert, then the function runs leaf by
leaf), so no method repeats that preamble. It may declare `path` and `naming` parameters to
learn where the tensor sits, and a `prepare(n, **options) -> options` hook runs once per call
(checks, per-expert lists) before the first tensor.

The declaration carries everything the registry (xlt.merge.registry), the command line, the
mergekit mapping and docs/merge.md's table read: the name, the *roles* (the function's
leading parameters; "name+" for a non-empty list of models), the options (every other
parameter but `naming`, with defaults, annotations and their docstring's "name: help"),
the paper, whether it reads blocks or rows (`layer_aware`), and mergekit's name for it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable

from xlt.merge import core
from xlt.param_paths import XLT

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
  `tree` options take parameter trees (masks) or other Python objects (statistics, loss
  functions), so only Python callers can set them; `rows`: such a value places neurons in rows
  (a mask does: the naming must know the architecture)."""
  name: str
  type: str
  default: Any
  help: str
  tree: bool = False
  rows: bool = False

  @property
  def required(self) -> bool:
    return self.default is REQUIRED


def _numbers(v) -> bool:
  return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          for x in v)


def filtered(v) -> bool:
  """Whether `v` is mergekit's filtered value: a list of {filter: substring of the tensor's name
  (absent: every tensor), value: a number or a per-layer list}, the first match applying."""
  return (isinstance(v, (list, tuple)) and bool(v) and all(isinstance(c, dict) and "value" in c for c in v))


def per_layer_options(m, options: dict) -> list[str]:
  """The options of a call to method `m` given as per-layer lists (xlt.merge.layerwise): float
  options (declared plain `float`) whose value is a list or tuple of numbers, and per-expert
  options (declared `Sequence[float]`) of which some expert's value is such a list (mergekit's
  per-model gradient, e.g. `weight: [0, 0.5, 1]` under one model); either may be `filtered`
  (values by tensor name, mergekit's `filter:`)."""
  floats = {o.name for o in m.options if o.type in ("float", "float | None")}
  scalars = {o.name for o in m.options if o.type.startswith("float")}
  per_expert = {o.name for o in m.options if "Sequence[float]" in o.type}
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  return [k for k, v in (options or {}).items()
          if (k in floats and _numbers(v)) or (k in scalars and filtered(v))
          or (k in per_expert and isinstance(v, (list, tuple)) and not filtered(v)
              and any(_numbers(x) or filtered(x) for x in v)
              and all(_numbers(x) or filtered(x) or number(x) for x in v))]


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  fn: Callable  # over trees: fn(*inputs in role order, **options, naming=...)
  roles: tuple[Role, ...]
  options: tuple[Option, ...]
  paper: str
  summary: str  # the first sentence of the function's docstring
  # True when the method reads blocks or rows, or a predicate on the options for one that
  # does only with some of them (slerp's per-block t); see `uses_layers`
  layer_aware: bool | Callable[[dict], bool] = False
  mergekit: str | None = None  # mergekit's merge_method for it, if mergekit has it
  per_tensor: Callable | None = None  # the per-tensor function `fn` lifts, for `per_tensor` methods
  # {option: (low, high)}: the closed interval a number of it (each number of a list) must be in
  ranges: dict = dataclasses.field(default_factory=dict)

  def uses_layers(self, options: dict | None = None) -> bool:
    """Whether this call reads the naming's blocks or rows: the method always does, or
    these options make it (a tree option, a neuron mask, always does)."""
    options = options or {}
    if any(o.rows and options.get(o.name) is not None for o in self.options):
      return True
    if per_layer_options(self, options):
      return True  # per-layer values (xlt.merge.layerwise): the blocks must be known
    return bool(self.layer_aware(options) if callable(self.layer_aware) else self.layer_aware)

  def option(self, name: str) -> Option:
    for o in self.options:
      if o.name == name:
        return o
    raise ValueError(f"merge method {self.name} has no option {name}")


def sentence(text: str) -> str:
  """The first sentence of `text` (a ". " or "; " outside brackets, not after e.g./i.e.)."""
  depth = 0
  for i, ch in enumerate(text):
    depth += (ch in "([{") - (ch in ")]}")
    if depth == 0 and ch in ".;" and text[i + 1:i + 2] in (" ", "") and not text[:i].endswith(("e.g", "i.e")):
      return text[:i]
  return text


def docstring_args(fn) -> dict[str, str]:
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
  return {name: sentence(" ".join(text)) for name, text in entries.items()}


def _annotation(p: inspect.Parameter) -> str:
  if p.annotation is inspect.Parameter.empty:
    return ""
  return p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))


METHODS: dict[str, Method] = {}  # every declared method, in declaration (import) order


def register(name: str, fn: Callable, roles: tuple[str, ...], paper: str, *, trees: tuple[str, ...] = (),
             python_only: tuple[str, ...] = (), hidden: tuple[str, ...] = (), layer_aware: bool | Callable[[dict], bool] = False,
             mergekit: str | None = None, per_tensor: Callable | None = None,
             ranges: dict | None = None) -> Method:
  """Adds a method over trees: `roles` are fn's leading positional parameters ("name+" for a
  list of models), every other parameter but `naming` and `hidden` ones is an option; `trees`
  names the options that take neuron masks (parameter trees placing rows), `python_only` those
  that take other Python objects (statistics, functions); `layer_aware` says whether it reads the
  naming's blocks or rows (`Method.layer_aware`); `mergekit` is mergekit's name for it; `ranges`
  {option: (low, high)} the interval its numbers must be in (registry.check refuses others)."""
  if name in METHODS:
    raise ValueError(f"merge method {name} is declared twice")
  params = inspect.signature(fn).parameters
  role_names = [r.rstrip("+") for r in roles]
  if list(params)[:len(roles)] != role_names:
    raise ValueError(f"{name}: roles {role_names} are not the first parameters of {fn.__name__}")
  doc = docstring_args(fn)
  options = tuple(Option(p.name, _annotation(p), p.default, doc.get(p.name, ""), p.name in (*trees, *python_only),
                         p.name in trees)
                  for p in list(params.values())[len(roles):] if p.name not in ("naming", *hidden))
  summary = sentence(" ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split()))
  method = Method(name, fn, tuple(Role(r.rstrip("+"), r.endswith("+"), ROLE_HELP[r.rstrip("+")]) for r in roles),
                  options, paper, summary, layer_aware, mergekit, per_tensor, dict(ranges or {}))
  METHODS[name] = method
  return method


def method(name: str, roles: tuple[str, ...], *, paper: str, **declared):
  """Declares the decorated function over trees as merge method `name` (see `register` for
  the keywords); the function itself is returned unchanged."""
  def declare(fn):
    register(name, fn, roles, paper, **declared)
    return fn
  return declare


def per_tensor(name: str, roles: tuple[str, ...], *, paper: str, prepare: Callable | None = None, **declared):
  """Declares the decorated per-tensor function as merge method `name`, lifted over trees
  (`lift`); returns the function over trees (its per-tensor form as `.per_tensor`)."""
  def declare(fn):
    tree_fn = lift(fn, roles, prepare)
    register(name, tree_fn, roles, paper, per_tensor=fn, **declared)
    return tree_fn
  return declare


def lift(fn: Callable, roles: tuple[str, ...], prepare: Callable | None = None) -> Callable:
  """fn(*one tensor per role, **options[, path][, naming]) as a function over trees with the
  same roles and options and a `naming` keyword (default XLT). A list role is checked
  non-empty; a None input (an optional base) is passed as None; every tree is checked
  compatible with the others; a `masks` option (one tree for every expert or one per
  expert) restricts each expert to its mask's neurons before fn sees it."""
  params = inspect.signature(fn).parameters
  role_names = [r.rstrip("+") for r in roles]
  many = [r.rstrip("+") for r in roles if r.endswith("+")]
  call = [p for p in params.values() if p.name not in ("path", "naming")]  # roles and options, as written
  wants = {k: k in params for k in ("path", "naming")}

  def over_trees(*args, naming=XLT, **options):
    bound = inspect.Signature(call).bind(*args, **options)
    bound.apply_defaults()
    values = dict(bound.arguments)
    inputs = {r: values.pop(r) for r in role_names}
    masks = values.pop("masks", None)
    if prepare is not None:
      values = prepare(len(core.expert_list(inputs[many[0]], many[0])) if many else None, **values)
    extra = {"naming": naming} if wants["naming"] else {}

    def leaf(path, *xs):
      return fn(*xs, **values, **extra, **({"path": path} if wants["path"] else {}))

    return core.over_leaves(leaf, inputs, lists=many, masks=masks, naming=naming)

  over_trees.__signature__ = inspect.Signature(
      call + [inspect.Parameter("naming", inspect.Parameter.KEYWORD_ONLY, default=XLT)])
  over_trees.__doc__, over_trees.__name__, over_trees.__qualname__ = fn.__doc__, fn.__name__, fn.__qualname__
  over_trees.__module__, over_trees.per_tensor = fn.__module__, fn
  return over_trees
