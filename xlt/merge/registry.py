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

Names only where needed: most methods combine each tensor with the same tensor of the other
inputs and never ask which block it is in or where its rows are, so they merge any tensor
by name (GPT-J's lm_head.bias, GPT-NeoX, Falcon, Bloom, OPT). A *layer-aware* method
(`Method.layer_aware`: layer_swap, sparsify_rows, maet, della's per-row ranks, arcee_fusion's
row softmax; slerp/nearswap with per-block t, nuslerp/model_stock row-wise, any neuron mask)
needs a naming rule (xlt.paths): "hf", "xlt" or a block prefix pattern such as
"gpt_neox.layers.{i}." (`paths.from_pattern`). `naming_for_method` picks it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import numbers
import re
from typing import Any, Callable

import numpy as np

from xlt import paths as naming_lib
from xlt.merge import combine, core, geometric, layerwise, sparse, swap
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
  # True when the method reads blocks or rows, or a predicate on the options for one that
  # does only with some of them (slerp's per-block t); see `uses_layers`
  layer_aware: bool | Callable[[dict], bool] = False

  def uses_layers(self, options: dict | None = None) -> bool:
    """Whether this call reads the naming's blocks or rows: the method always does, or
    these options make it (a tree option, a neuron mask, always does)."""
    options = options or {}
    if any(o.tree and options.get(o.name) is not None for o in self.options):
      return True
    if layerwise.per_layer_options(self, options):
      return True  # per-layer values (xlt.merge.layerwise): the blocks must be known
    return bool(self.layer_aware(options) if callable(self.layer_aware) else self.layer_aware)

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
             trees: tuple[str, ...] = (), hidden: tuple[str, ...] = (),
             layer_aware: bool | Callable[[dict], bool] = False) -> Method:
  """Adds a method: `roles` are fn's leading positional parameters ("name+" for a list of
  models), every other parameter but `naming` and `hidden` ones is an option; `trees`
  names the options that take parameter trees; `layer_aware` says whether it reads the
  naming's blocks or rows (`Method.layer_aware`)."""
  params = inspect.signature(fn).parameters
  role_names = [r.rstrip("+") for r in roles]
  if list(params)[:len(roles)] != role_names:
    raise ValueError(f"{name}: roles {role_names} are not the first parameters of {fn.__name__}")
  doc = _docstring_args(fn)
  options = tuple(Option(p.name, _annotation(p), p.default, doc.get(p.name, ""), p.name in trees)
                  for p in list(params.values())[len(roles):] if p.name not in ("naming", *hidden))
  summary = _sentence(" ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split()))
  method = Method(name, fn, tuple(Role(r.rstrip("+"), r.endswith("+"), ROLE_HELP[r.rstrip("+")]) for r in roles),
                  options, paper, summary, layer_aware)
  METHODS[name] = method
  return method


_LAYER_SWAPPING = "Bandarkar et al. 2024, Layer Swapping for Zero-Shot Cross-Lingual Transfer in Large Language Models"
register("layer_swap", swap.layer_swap, ("task_expert", "language_expert"), _LAYER_SWAPPING, layer_aware=True)
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
         hidden=("return_info",), layer_aware=True)  # the registry's merges return one tree: call maet for the info
register("sparsify_rows", combine.sparsify_rows, ("expert", "base"),
         _LAYER_SWAPPING + " (section 3.2, row-level sparsification)", layer_aware=True)

# Which of the methods below read blocks or rows (each checked in its module): della ranks
# entries within rows, arcee_fusion's softmax runs along rows; slerp and nearswap read blocks
# only for a list of t (one per block), nuslerp rows unless it flattens, model_stock when
# filter_wise. Every other one of them treats each tensor as one vector or entry by entry.
_per_block_t = lambda o: np.ndim(o.get("t", 0)) > 0
_LAYER_AWARE = {"della": True, "della_linear": True, "arcee_fusion": True, "slerp": _per_block_t,
                "nearswap": _per_block_t, "nuslerp": lambda o: not o.get("flatten", True),
                "nuslerp_nobase": lambda o: not o.get("flatten", True),
                "model_stock": lambda o: bool(o.get("filter_wise", False))}

# the methods mergekit users know, each module listing its own: (name, function, roles, paper,
# register's keywords)
for _name, _fn, _roles, _paper, _kw in sparse.REGISTER + geometric.REGISTER:
  register(_name, _fn, _roles, _paper, layer_aware=_LAYER_AWARE.get(_name, False), **_kw)


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
    per_layer = bool(layerwise.per_layer_options(m, {name: value}))
    if not o.tree and not per_layer and not _type_ok(value, o.type):
      shown = " ".join(repr(value).split())
      shown = shown if len(shown) <= 60 else shown[:57] + "..."
      raise ValueError(f"merge method {method}: option {name} must be {o.type}, got {shown}")
  return m


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
  if varying := layerwise.per_layer_options(m, options):
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
    lines = [f"{m.name}: {m.summary}", f"  paper: {m.paper}", f"  layers: {aware}", "  inputs:"]
    lines += [f"    {r.name}{' (list)' if r.many else ''}: {r.help}" for r in m.roles]
    lines.append("  options:" if m.options else "  options: none")
    for o in m.options:
      default = "required" if o.required else f"default {o.default!r}"
      kind = "parameter tree, Python only" if o.tree else o.type
      lines.append(f"    {o.name} ({kind}; {default}): {o.help}")
    blocks.append("\n".join(lines))
  return "\n\n".join(blocks)
