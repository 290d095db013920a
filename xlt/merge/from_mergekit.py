"""A mergekit YAML a user already has, as an xlt merge config (`python -m xlt.merge
--mergekit_yaml=merge.yml --config.output=out`).

What maps: `merge_method` (a method both tools have; mergekit's linear is xlt's soup, dare_linear
xlt's dare), `base_model`, `models: [{model, parameters: {weight, density, ...}}]` (the base
may be listed among them, as mergekit allows), global `parameters` (normalize, lambda, t,
rescale, ...), `dtype` / `out_dtype` (the output's dtype: xlt always computes in float32),
`tokenizer_source` and `tokenizer: {source, tokens, pad_to_multiple_of}` (xlt's tokenizer
option: token by token, xlt.merge.vocabulary), and `slices`: one slice whose sources all
cover every layer (the same as `models`), other slices of a merge method (xlt.merge.sliced: a
merge over slices, parameters per slice), and a passthrough layer swap
(model A's layers [0, b) and [L-u, L), model B's [b, L-u), each at its own position), and any
other passthrough stack, one that repeats, reorders or drops layers (a "frankenmerge":
xlt.merge.stack, the output of its own depth). Per-model values (weight, density, gamma,
epsilon) may be gradients over the layers or `filter`ed values (by tensor name), as t may
(xlt.merge.layerwise). Everything else (filtered values of other parameters, modules blocks, ...)
is refused with one line naming the key. mergekit's defaults are written out where xlt's
differ (density 1.0, ties/dare in mergekit's convention), so a mapped merge is mergekit's.
"""

from __future__ import annotations

import json
import keyword
import os

from xlt.io import fileio
from xlt.merge import core, registry

_TOP_KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype",
             "tokenizer_source", "tokenizer", "chat_template")
_SPARSE = ("dare_ties", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear")


def _mergekit_methods() -> dict[str, tuple[str | None, str | None]]:
  """mergekit method -> (xlt method with a base, xlt method without one), from the methods'
  declarations (their `mergekit` name; xlt.merge.declare); passthrough maps as slices."""
  out: dict[str, list] = {"passthrough": [None, None]}
  for m in registry.METHODS.values():
    if m.mergekit:
      out.setdefault(m.mergekit, [None, None])[0 if any(r.name == "base" for r in m.roles) else 1] = m.name
  return {k: tuple(v) for k, v in out.items()}


_METHODS = _mergekit_methods()
# per-model parameters each method takes, as lists over its experts: mergekit's name -> xlt's
_PER_MODEL = {"soup": {"weight": "weights"}, "karcher": {"weight": "weights"},
              "nuslerp": {"weight": "weights"}, "nuslerp_nobase": {"weight": "weights"},
              "multislerp": {"weight": "weights"}, "multislerp_nobase": {"weight": "weights"},
              "dare_ties": {"weight": "weights", "density": "density"},
              "breadcrumbs": {"weight": "weights", "density": "density", "gamma": "gamma"},
              "breadcrumbs_ties": {"weight": "weights", "density": "density", "gamma": "gamma"},
              "della": {"weight": "weights", "density": "density", "epsilon": "epsilon"},
              "della_linear": {"weight": "weights", "density": "density", "epsilon": "epsilon"}}
# global parameters: mergekit's name -> xlt's option (names the same on both sides are implied)
_GLOBAL = {"lambda": "scale", "nuslerp_row_wise": "row_wise", "nuslerp_flatten": "flatten"}
_IGNORED = ("int8_mask",)  # mergekit's memory knob: no effect on the result
# values that may be gradients (a list: interpolated over the blocks, xlt.merge.layerwise), per
# model or global: the per-model ones and slerp's / nearswap's t
_GRADIENTS = ("t", "weight", "density", "gamma", "epsilon")


def _number(value):
  """A parameter's value as xlt takes it: a float, a gradient's list of floats, or a filtered
  value's list of {filter, value} (xlt.merge.layerwise)."""
  if isinstance(value, dict):
    value = [value]
  if isinstance(value, list) and value and all(isinstance(c, dict) for c in value):
    return [({"filter": str(c["filter"])} if c.get("filter") is not None else {}) | {"value": _number(c["value"])}
            for c in value]
  return [float(v) for v in value] if isinstance(value, list) else float(value)


def _mapped(value, fn):
  """`value` (as `_number` gives it) with fn applied to each of its numbers."""
  if isinstance(value, list):
    return [c | {"value": _mapped(c["value"], fn)} if isinstance(c, dict) else fn(c) for c in value]
  return fn(value)


def _one_minus(value):
  return _mapped(value, lambda v: 1 - v)


def load_yaml(path: str) -> dict:
  """The mapped config ({method, inputs, options, dtype}, tokenizer and chat_template when given, and
  naming for Conv1D models) of
  mergekit YAML `path`."""
  import yaml
  try:
    with open(path) as f:
      cfg = yaml.safe_load(f)
  except yaml.YAMLError as e:
    raise ValueError(f"{path} is not YAML: {' '.join(str(e).split())}") from None
  if not isinstance(cfg, dict):
    raise ValueError(f"{path}: a mergekit config is a mapping with merge_method, models or slices")
  try:
    mapped = from_mergekit(cfg)
  except ValueError as e:
    raise ValueError(f"mergekit config {path}: {e}") from None
  if naming := _raw_axes_naming(mapped["inputs"]):
    mapped["naming"] = naming
  return mapped


# Hugging Face model types whose linear weights are Conv1D ([in, out]) and their block prefix
_CONV1D = {"gpt2": "transformer.h.{i}."}


def _raw_axes_naming(inputs: dict) -> str | None:
  """The naming that reads rows as mergekit does, by raw axis 0, for models whose weights are
  GPT-2's Conv1D (found from the inputs' config.json): xlt's "hf" rule takes their output units,
  mergekit their input units, so a YAML alone would not give mergekit's row-wise merges."""
  for model in (m for v in inputs.values() for m in (v if isinstance(v, list) else [v])):
    try:
      fileio.check_size(os.path.join(model, "config.json"), 1 << 20)
      with open(os.path.join(model, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
      continue
    if model_type in _CONV1D:
      return _CONV1D[model_type]
  return None


def from_mergekit(cfg: dict) -> dict:
  """{method, inputs, options, dtype} (and tokenizer, chat_template when given) for `python -m
  xlt.merge` from a parsed mergekit config; ValueError naming the first key that does not map."""
  if unknown := [k for k in cfg if k not in _TOP_KEYS]:
    raise ValueError(f"{unknown[0]}: not supported by xlt (it maps: {', '.join(_TOP_KEYS)})")
  name = cfg.get("merge_method")
  if name not in _METHODS:
    raise ValueError(f"merge_method: {name!r} is not one of the methods both tools have: {', '.join(_METHODS)}")
  base = _model(cfg.get("base_model"), "base_model") if cfg.get("base_model") else None
  params = dict(cfg.get("parameters") or {})
  tokenizer = _tokenizer(cfg)
  template = cfg.get("chat_template")
  if template is not None and (not isinstance(template, str) or not template):
    raise ValueError(f"chat_template: Jinja text or auto, got {template!r}")
  extra = ({"chat_template": template} if template else {}) | ({"tokenizer": tokenizer} if tokenizer else {})
  dtype = cfg.get("out_dtype") or cfg.get("dtype") or None
  if bool(cfg.get("models")) == bool(cfg.get("slices")):
    raise ValueError("models / slices: give exactly one of them")
  if cfg.get("slices") and name == "passthrough":
    if unknown := sorted(set(params) - {"scale"}):
      raise ValueError(f"parameters.{unknown[0]}: passthrough takes scale only")
    for key, value in params.items():
      _scalar_or_list(value, f"parameters.{key}", allow_list=True)
    return _passthrough(cfg["slices"], params.get("scale")) | {"dtype": dtype} | extra
  for key, value in params.items():
    _scalar_or_list(value, f"parameters.{key}", allow_list=key in _GRADIENTS)
  if cfg.get("slices") and not _whole_models(cfg["slices"]):
    return _over_slices(name, base, cfg["slices"], params) | {"dtype": dtype} | extra
  models = cfg.get("models") or _one_slice(cfg["slices"])
  method, inputs, options = _merge(name, base, [_entry(m, f"models[{i}]") for i, m in enumerate(models)], params)
  return {"method": method, "inputs": inputs, "options": options, "dtype": dtype} | extra


def _merge(name: str, base: str | None, entries: list, params: dict) -> tuple[str, dict, dict]:
  """(xlt method, inputs, options) of mergekit method `name` on the models `entries` with the
  global parameters `params`."""
  method, inputs, options = _method(name, base, entries, params)
  for key, value in params.items():
    if key in _IGNORED or key in ("weight", "density", "gamma", "epsilon"):  # read per model by _method
      continue
    value = _number(value) if key in _GRADIENTS and isinstance(value, (dict, list)) else value
    options = _set_global(method, options, _GLOBAL.get(key, key), value, key)
  return method, inputs, options


def _whole_models(slices) -> bool:
  """Whether `slices` is one slice whose sources each cover every layer of their model."""
  rows = _sources(slices)
  return len(rows) == 1 and all(lo == 0 and hi == _num_layers(m) for m, (lo, hi), _ in rows[0])


def _over_slices(name: str, base: str | None, slices, params: dict) -> dict:
  """layer_slices (xlt.merge.sliced): the merge of each slice's sources, their blocks stacked.
  Every slice lists the same models in the same order, ranges of one length within a slice."""
  rows = _sources(slices)
  models = [m for m, _, _ in rows[0]]
  if len(set(models)) != len(models):
    raise ValueError("slices[0]: a model appears twice in one slice; xlt merges each model once per slice")
  per_slice, ranges, first = [], [], None
  for i, row in enumerate(rows):
    if [m for m, _, _ in row] != models:
      raise ValueError(f"slices[{i}]: its sources are {[m for m, _, _ in row]}; xlt merges over slices that "
                       f"list the same models in the same order ({models})")
    if len({hi - lo for _, (lo, hi), _ in row}) != 1 or any(hi <= lo or lo < 0 for _, (lo, hi), _ in row):
      raise ValueError(f"slices[{i}]: its sources' layer ranges must be non-empty and of one length")
    for m, (lo, hi), _ in row:
      layers = _num_layers(m)
      if layers is not None and hi > layers:
        raise ValueError(f"slices[{i}]: layer_range [{lo}, {hi}] runs past {m}'s {layers} layers")
    entries = [_entry({"model": m, "parameters": p}, f"slices[{i}].sources[{j}]") for j, (m, _, p) in enumerate(row)]
    method, inputs, options = _merge(name, base, entries, params)
    first = first or (method, inputs)
    per_slice.append(options)
    ranges.append([list(r) for _, r, _ in row])
  if base is not None and base not in models:
    raise ValueError(f"base_model: {base} must be a source of every slice")
  return {"method": "layer_slices", "inputs": first[1],
          "options": {"merge_method": first[0], "models": models, "ranges": ranges, "per_slice": per_slice}}


def _model(ref, where: str) -> str:
  if not isinstance(ref, str) or not ref:
    raise ValueError(f"{where}: a model is a path, got {ref!r}")
  model, sep, adapter = ref.partition("+")
  if sep and not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
    raise ValueError(f"{where}: {ref!r} names a LoRA adapter {adapter!r} that is not a PEFT adapter directory "
                     "(adapter_config.json beside adapter_model.safetensors)")
  return ref  # "model+adapter": the tool merges the PEFT adapter into the model as it reads it


def _tokenizer(cfg: dict) -> dict | None:
  """xlt's tokenizer option (xlt.merge.vocabulary: the inputs aligned token by token, as mergekit
  does) of mergekit's `tokenizer: {source, tokens, pad_to_multiple_of}` or `tokenizer_source`
  (the same as `tokenizer: {source: ...}`); None when neither is given. A source base|union
  alone goes by row number where an input has no tokenizer.json and rows are unambiguous
  (tool.merge_files)."""
  if "tokenizer" in cfg and "tokenizer_source" in cfg:
    raise ValueError("tokenizer / tokenizer_source: give one of them")
  if "tokenizer" not in cfg:
    source = cfg.get("tokenizer_source")
    if source is None:
      return None
    if not isinstance(source, str) or not source:
      raise ValueError(f"tokenizer_source: base, union or a model directory, got {source!r}")
    block, where = {"source": source}, "tokenizer_source"
  else:
    block, where = cfg["tokenizer"], "tokenizer.source"
  keys = ("source", "tokens", "pad_to_multiple_of")
  if not isinstance(block, dict) or set(block) - set(keys):
    extra = sorted(set(block) - set(keys))[0] if isinstance(block, dict) else "source"
    raise ValueError(f"tokenizer.{extra}: not supported by xlt (it maps tokenizer: {{{', '.join(keys)}}})")
  source = block.get("source", "union")  # mergekit's default
  if not isinstance(source, str) or not source:
    raise ValueError(f"{where}: base, union or a model directory, got {source!r}")
  if "tokens" in block and not isinstance(block["tokens"], dict):
    raise ValueError(f"tokenizer.tokens: a mapping {{token: {{source, force}}}}, got {block['tokens']!r}")
  if source not in ("base", "union"):
    _model(source, where)
  return {"source": source, **{k: block[k] for k in keys[1:] if block.get(k) is not None}}


def _entry(m, where: str) -> tuple[str, dict]:
  if not isinstance(m, dict) or "model" not in m:
    raise ValueError(f"{where}: an entry is {{model: path, parameters: {{...}}}}")
  if unknown := [k for k in m if k not in ("model", "parameters")]:
    raise ValueError(f"{where}.{unknown[0]}: not supported by xlt")
  params = dict(m.get("parameters") or {})
  for k, v in params.items():
    _scalar_or_list(v, f"{where}.parameters.{k}", allow_list=k in _GRADIENTS)
  return _model(m["model"], f"{where}.model"), params


def _scalar_or_list(value, where: str, allow_list: bool) -> None:
  if isinstance(value, (bool, int, float, str)):
    return
  conditions = [value] if isinstance(value, dict) else value
  if allow_list and isinstance(conditions, list) and conditions and all(isinstance(c, dict) for c in conditions):
    for i, c in enumerate(conditions):  # mergekit's filtered value: [{filter, value}], the first match applies
      if "value" not in c or set(c) - {"filter", "value"} or not isinstance(c.get("filter") or "", str):
        raise ValueError(f"{where}[{i}]: a filtered value is {{filter: part of a tensor name, value: ...}}, "
                         f"got {c!r}")
      _scalar_or_list(c["value"], f"{where}[{i}].value", allow_list=True)
    return
  if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in value):
    if allow_list:
      return
    raise ValueError(f"{where}: a gradient (one value per layer range) is supported for "
                     f"{', '.join(_GRADIENTS)} only; give one value")
  raise ValueError(f"{where}: filtered or conditional values ({value!r}) are supported for "
                   f"{', '.join(_GRADIENTS)} only; give one value")


def _method(name: str, base: str | None, entries: list, params: dict) -> tuple[str, dict, dict]:
  """(xlt method, inputs, options) from mergekit's method, its models and the global
  parameters (a per-model parameter given globally applies to every model, as in mergekit)."""
  with_base, without = _METHODS[name]
  if name == "passthrough":
    if len(entries) != 1:
      raise ValueError("merge_method: passthrough of several models maps only as slices (a layer swap)")
    with_base, without = None, "soup"
  method = with_base if base and with_base else without
  if method is None:
    raise ValueError(f"base_model: mergekit's {name} {'needs' if base is None else 'takes no'} base_model here")
  experts = [(p, params) for p, params in entries if p != base or method in ("soup", "karcher")]
  if base and method in ("soup", "karcher") and base not in [p for p, _ in experts]:
    experts.insert(0, (base, {}))
  if not experts:
    raise ValueError("models: no model to merge besides the base")
  roles = _roles(method, base, [p for p, _ in experts])
  return method, roles, _per_model(method, name, experts, params)


def _roles(method: str, base: str | None, experts: list[str]) -> dict:
  if method in ("slerp", "nearswap", "arcee_fusion"):
    if len(experts) != 1:
      raise ValueError(f"models: {method} takes the base and one other model, got {len(experts)} others")
    return {"base": base, "other": experts[0]}
  if method in ("soup",):
    return {"experts": experts}
  if method in ("karcher", "nuslerp_nobase", "multislerp_nobase"):
    return {"models": experts}
  return {"base": base, "experts": experts}


def _per_model(method: str, name: str, experts: list, shared: dict) -> dict:
  """The options read from each model's parameters (else `shared`, the global ones), with
  mergekit's defaults where xlt's differ (density 1.0)."""
  given = {k for _, params in experts for k in params}
  value = lambda params, key: _number(params.get(key, shared.get(key, 1.0)))
  weights = [value(params, "weight") for _, params in experts]
  if method in ("task_arithmetic", "ties", "dare"):
    known = {"weight", "density"} if method != "task_arithmetic" else {"weight"}
    if unknown := sorted(given - known):
      raise ValueError(f"models[].parameters.{unknown[0]}: not a parameter of {name}")
    options = {"lambdas": weights}
    if method != "task_arithmetic":
      per_model = [value(params, "density") for _, params in experts]
      density = per_model[0]
      options |= {"convention": "mergekit"} | ({"density": density} if method == "ties" else
                                               {"drop": _one_minus(density)})
      if any(d != density for d in per_model):  # mergekit's per-model densities
        options |= {"densities": per_model} if method == "ties" else {"drops": [_one_minus(d) for d in per_model]}
    return options
  table = _PER_MODEL.get(method, {})
  if unknown := sorted(given - set(table)):
    raise ValueError(f"models[].parameters.{unknown[0]}: not a per-model parameter of {name} in xlt")
  if unknown := sorted({k for k in ("weight", "density", "gamma", "epsilon") if k in shared} - set(table)):
    raise ValueError(f"parameters.{unknown[0]}: not a parameter of {name} in xlt")
  defaults = {"density": 1.0, "gamma": 0.01, "epsilon": 0.15, "weight": 1.0}
  return {xlt: [_number(params.get(mk, shared.get(mk, defaults[mk]))) for _, params in experts]
          for mk, xlt in table.items() if mk in given or mk in shared or (mk == "density" and method in _SPARSE)}


def _set_global(method: str, options: dict, key: str, value, mk_key: str) -> dict:
  """options with mergekit's global parameter `mk_key` applied the way `method` takes it."""
  options = dict(options)
  if method in ("task_arithmetic", "dare") and mk_key in ("lambda", "normalize"):
    lambdas = options["lambdas"]
    if mk_key == "lambda":
      options["lambdas"] = [_mapped(w, lambda x: x * float(value)) for w in lambdas]
    elif value and any(isinstance(w, list) for w in lambdas):
      raise ValueError(f"parameters.normalize: true with per-layer or filtered weights is not supported for "
                       f"{method}; give each weight as one value")
    elif value:
      options["lambdas"] = [w / sum(lambdas) for w in lambdas]
    return options
  if method == "ties" and mk_key == "normalize":  # xlt's default is mergekit's normalize: true
    return options if value else options | {"normalize": False}
  if method == "soup" and mk_key == "normalize":
    if not value:
      raise ValueError("parameters.normalize: false is not supported for linear (xlt's soup normalises)")
    return options
  from xlt.merge import registry
  names = [o.name for o in registry.get(method).options]
  if key not in names:
    raise ValueError(f"parameters.{mk_key}: xlt's {method} has no such option (its options: {', '.join(names)})")
  return options | {key: value}


def _num_layers(model: str) -> int | None:
  try:
    with open(os.path.join(model, "config.json")) as f:
      return int(json.load(f)["num_hidden_layers"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _sources(slices) -> list[list[tuple[str, tuple[int, int], dict]]]:
  out = []
  for i, s in enumerate(slices):
    if not isinstance(s, dict) or set(s) - {"sources"}:
      extra = sorted(set(s) - {"sources"}) if isinstance(s, dict) else ["sources"]
      raise ValueError(f"slices[{i}].{extra[0]}: not supported by xlt (a slice maps with its sources only)")
    row = []
    for j, src in enumerate(s["sources"]):
      where = f"slices[{i}].sources[{j}]"
      if set(src) - {"model", "layer_range", "parameters"}:
        raise ValueError(f"{where}.{sorted(set(src) - {'model', 'layer_range', 'parameters'})[0]}: not supported")
      lo, hi = src["layer_range"]
      row.append((_model(src["model"], where), (int(lo), int(hi)), src.get("parameters") or {}))
    out.append(row)
  return out


def _one_slice(slices) -> list[dict]:
  """The models of a single slice whose sources all cover every layer of their model."""
  rows = _sources(slices)
  if len(rows) != 1:
    raise ValueError("slices: several slices map only for passthrough (a layer swap)")
  for model, (lo, hi), _ in rows[0]:
    layers = _num_layers(model)
    if lo != 0 or layers is None or hi != layers:
      raise ValueError(f"slices[0]: layer_range [{lo}, {hi}] of {model} must cover all its layers "
                       f"({layers if layers is not None else 'unknown: no config.json'}); "
                       "xlt merges whole models only")
  return [{"model": m, "parameters": p} for m, _, p in rows[0]]


def _passthrough(slices, scale=None) -> dict:
  """layer_swap from passthrough slices A [0, b), B [b, L-u), A [L-u, L) (each layer at its own
  position, the embedding and head from A); any other stack (slices that repeat, reorder or drop
  layers: a "frankenmerge" of another depth) is a layer_stack (xlt.merge.stack: the embedding
  from the first slice's model, the final norm and head from the last's, as mergekit takes them)."""
  rows = _sources(slices)
  parts = []
  for i, row in enumerate(rows):
    (model, (lo, hi), params), *more = row
    if more or set(params) - {"scale"}:
      raise ValueError(f"slices[{i}]: a passthrough slice takes one source, with parameters scale only")
    if hi <= lo or lo < 0:
      raise ValueError(f"slices[{i}]: layer_range [{lo}, {hi}] must be 0 <= lo < hi")
    if "scale" in params:
      _scalar_or_list(params["scale"], f"slices[{i}].sources[0].parameters.scale", allow_list=True)
    parts.append((model, lo, hi) + ((params["scale"],) if "scale" in params else ()))
  models = [p[0] for p in parts]
  contiguous = all(parts[i][1] == (parts[i - 1][2] if i else 0) for i in range(len(parts)))
  scaled = scale is not None or any(len(p) > 3 for p in parts)
  if contiguous and not scaled and len(parts) == 3 and models[0] == models[2] != models[1] and \
     _num_layers(models[0]) in (None, parts[-1][2]):  # every layer of A's depth at its own position
    outer, inner = models[0], models[1]
    bottom, top = parts[0][2], parts[2][2] - parts[2][1]
    return {"method": "layer_swap", "inputs": {"task_expert": inner, "language_expert": outer},
            "options": {"bottom": bottom, "top": top, "non_block": "language", "num_blocks": parts[-1][2]}}
  for i, (model, lo, hi, *_) in enumerate(parts):
    layers = _num_layers(model)
    if layers is not None and hi > layers:
      raise ValueError(f"slices[{i}]: layer_range [{lo}, {hi}] runs past {model}'s {layers} layers")
  return {"method": "layer_stack", "inputs": {"models": list(dict.fromkeys(models))},
          "options": {"slices": [list(p) for p in parts]} | ({"scale": scale} if scale is not None else {})}


def keyword_flag(arg: str) -> str:
  """A --config.<path>=... flag with each Python keyword of its path (mergekit's `lambda`)
  given a trailing underscore, which ml_collections' flag parser (it reads the path as Python)
  takes; flags_aliases takes the underscore off again."""
  if not arg.startswith("--config."):
    return arg
  path, eq, value = arg[len("--config."):].partition("=")
  return "--config." + ".".join(p + "_" if keyword.iskeyword(p) else p for p in path.split(".")) + eq + value


def flags_aliases(method: str, inputs: dict, options: dict) -> tuple[str, dict]:
  """(xlt method, options) of a command-line merge given in mergekit's names: a mergekit method
  (linear, dare_linear, a nuslerp or multislerp without a base: the xlt method of that name
  with or without a base, by whether `inputs` has one), `weight` for the per-model weights
  (xlt's weights or lambdas) and the global parameters mergekit's YAML takes (`lambda`,
  `normalize`, `nuslerp_flatten`, ...), mapped as from_mergekit maps them. xlt's own names pass
  unchanged; a keyword's flag name (`lambda_`: keyword_flag) is the keyword."""
  options = {k[:-1] if k.endswith("_") and keyword.iskeyword(k[:-1]) else k: v for k, v in options.items()}
  with_base, without = _METHODS.get(method, (None, None))
  if (method not in registry.METHODS and method in _METHODS) or (method == with_base and without and
                                                                  "base" not in inputs):
    xlt = with_base if "base" in inputs and with_base else without
    if xlt is None:
      raise ValueError(f"mergekit's {method} {'needs a' if 'base' not in inputs else 'takes no'} base here "
                       "(--config.inputs.base)")
    if method == "dare_linear":
      options.setdefault("convention", "mergekit")
      if "density" in options:
        options["drop"] = 1 - float(options.pop("density"))
    method = xlt
  if "weight" in options:
    table = _PER_MODEL.get(method, {})
    target = table.get("weight") or ("lambdas" if method in ("task_arithmetic", "ties", "dare") else None)
    if target is None:
      raise ValueError(f"option weight: xlt's {method} takes no per-model weight")
    options[target] = options.pop("weight")
  # mergekit normalises the weights first, then scales the merged delta by lambda
  globals_given = [k for k in options if k in _GLOBAL or (k == "normalize" and method in ("task_arithmetic", "dare"))]
  for key in sorted(globals_given, key=lambda k: k != "normalize"):
    value = options.pop(key)
    if key in ("lambda", "normalize") and method in ("task_arithmetic", "dare"):
      experts = inputs.get("experts") or [None]
      n = len([p for p in experts.split(",") if p]) if isinstance(experts, str) else len(experts)
      options["lambdas"] = core.per_expert(options.get("lambdas", 1.0), n, f"{method} lambdas")
    options = _set_global(method, options, _GLOBAL.get(key, key), value, key)
  return method, options
