"""Option values that vary over the layers, as mergekit's "gradients" do: a float option given
as a list of floats is interpolated over the blocks (`geometric.per_block`: block i of n at
i / (n - 1) along the list; tensors outside the blocks take the first value), so a transition
zone or a layer-dependent density is one option; so is one expert's entry of a per-expert
option (mergekit's per-model gradient: `lambdas=[[0.2, 1.0], 0.5]`). Any of these may be
mergekit's filtered value instead, a value by tensor name: `[{"filter": "self_attn", "value":
[0, 1]}, {"value": 0.5}]` (the first entry whose filter is part of the tensor's name).

It serves every method that merges tensor by tensor (the registry's `layer_aware` is False):
the tensors are grouped by the values their blocks get, and the method runs once per group
with plain floats, so each tensor is merged exactly as a call with its own value would merge
it. Methods whose tensors depend on each other (MAET's tensor selection, magnitude-weighted
soups) take per-layer values only where they implement them themselves.
"""

from __future__ import annotations


from xlt import param_paths as naming_lib
from xlt.merge import core
from xlt.merge.declare import filtered, per_layer_options  # noqa: F401 (callers read it here too)
from xlt.merge.geometric import per_block


def _tree(paths: list, leaf_of):
  """The nested dict with a leaf `leaf_of(path)` at each of `paths` (tuples of names), in order."""
  out: dict = {}
  for path in paths:
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf_of(path)
  return out


def _value_at(value, tree, naming: naming_lib.Naming, name: str):
  """path -> the option's value there: a float (a gradient over the blocks, or a filtered
  value), or for a per-expert list whose entries may be either, the tuple of each expert's."""
  if isinstance(value, (list, tuple)) and not filtered(value) and any(isinstance(v, (list, tuple)) for v in value):
    each = [_float_at(v, tree, naming, f"option {name}[{i}]") for i, v in enumerate(value)]  # per expert
    return lambda path: tuple(f(path) for f in each)
  return _float_at(value, tree, naming, f"option {name}")


def _float_at(value, tree, naming: naming_lib.Naming, what: str):
  """path -> float of one value: a number, a gradient (`per_block`), or mergekit's filtered
  value (the first entry whose filter is in the tensor's name, or has none, or is "*")."""
  if not filtered(value):
    at = per_block(value, tree, naming, what)
    return lambda path: round(at(path), 12)
  entries = [(c.get("filter"), _float_at(c["value"], tree, naming, what)) for c in value]

  def at(path) -> float:
    tensor = naming_lib.path_str(path)
    for pattern, value_at in entries:
      if pattern in (None, "*") or str(pattern) in tensor:
        return value_at(path)
    raise ValueError(f"{what}: no filter matches tensor {tensor}; end the list with an entry without a filter")

  return at


def merge(m, args: list, options: dict, names: list[str], naming: naming_lib.Naming):
  """`m.fn(*args, **options, naming=naming)` with the options `names` varying over the blocks:
  one call per group of tensors that share their values, the results joined into one tree."""
  if m.layer_aware is True:
    raise ValueError(f"merge method {m.name} reads tensors together (blocks or rows), so option "
                     f"{', '.join(names)} must be one number, not a per-layer list")
  first = args[0][0] if isinstance(args[0], list) else args[0]
  order = [p for p, _ in core.leaves_with_paths(first)]
  if all(naming.block_kind(p)[0] is None for p in order):
    raise ValueError(f"option {', '.join(names)} varies over the layers, but naming {naming.name!r} places no "
                     "tensor in a block: name a rule (naming=hf, xlt or a block pattern like 'model.layers.{i}.')")
  value_at = {k: _value_at(options[k], first, naming, k) for k in names}
  groups: dict[tuple, list] = {}
  for path in order:
    groups.setdefault(tuple(value_at[k](path) for k in names), []).append(path)
  flat = [[dict(core.leaves_with_paths(t)) for t in a] if isinstance(a, list) else dict(core.leaves_with_paths(a))
          for a in args]
  merged = {}
  for values, keep in groups.items():
    sub = [[_tree(keep, f.__getitem__) for f in a] if isinstance(a, list) else _tree(keep, a.__getitem__)
           for a in flat]
    out = m.fn(*sub, **{**options, **dict(zip(names, values))}, naming=naming)
    merged.update(core.leaves_with_paths(out))
  return _tree(order, merged.__getitem__)
