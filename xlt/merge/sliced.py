"""mergekit's merges over slices: `slices` of several sources each, merged by a method other than
passthrough ("linear over slices"), possibly with other layer ranges, other parameters per
slice, and another depth than the inputs'.

Each input model becomes a virtual model, the stack of its layer ranges over the slices
(xlt.merge.stack: renumbered blocks; its embedding and head its own), and the method merges the
virtual models as whole models. A slice's parameters hold for its blocks, gradients along the
slice (t = the block's position in it), and tensors outside the blocks take the first slice's
parameters (the embedding) or the last slice's (final norm, head) at t = 0, as mergekit's
planner gives them: the options reach the method as values by tensor name
(xlt.merge.layerwise's filtered values).
"""

from __future__ import annotations


from xlt import param_paths as naming_lib
from xlt.io import hf_dir as hf
from xlt.merge import registry, stack, tool


def _scalar_at(value, name: str, t: float):
  return stack.setting(value, name, t)


def _per_expert(m, key: str, value) -> bool:
  """Whether option `key`'s list value lists the experts (else it is a gradient or filtered)."""
  option = next((o for o in m.options if o.name == key), None)
  return (option is not None and "Sequence[float]" in option.type and key != "t" and isinstance(value, list)
          and not (value and all(isinstance(c, dict) for c in value)))


def _varies(m, key: str, value) -> bool:
  """Whether the value changes along a slice or by tensor name (a gradient, a filtered value)."""
  if _per_expert(m, key, value):
    return any(isinstance(e, (list, dict)) for e in value)
  return isinstance(value, (list, dict))


def _numeric(value) -> bool:
  if isinstance(value, bool) or isinstance(value, str):
    return False
  if isinstance(value, dict):
    return "value" in value
  return isinstance(value, (int, float)) or (isinstance(value, list) and all(_numeric(v) for v in value))


def slice_options(m, names: list[str], where: dict, per_slice: list[dict]) -> dict:
  """The options of the merge over the virtual models: an option the slices give alike and that
  holds no gradient stays as it is; any other numeric one becomes a value by tensor name."""
  keys = list(dict.fromkeys(k for o in per_slice for k in o))
  out = {}
  for key in keys:
    values = [o.get(key) for o in per_slice]
    if all(v == values[0] for v in values) and not _varies(m, key, values[0]):
      out[key] = values[0]
      continue
    if not all(_numeric(v) for v in values if v is not None) or any(v is None for v in values):
      raise ValueError(f"slices: option {key} differs between the slices ({values}); xlt takes per-slice "
                       "numbers only (weights, densities, t, ...)")
    if _per_expert(m, key, values[0]):
      experts = len(values[0])
      out[key] = [[{"filter": n, "value": _scalar_at(values[where[n][0]][j], n, where[n][1])} for n in names]
                  for j in range(experts)]
    else:
      out[key] = [{"filter": n, "value": _scalar_at(values[where[n][0]], n, where[n][1])} for n in names]
  return out


def merge_sliced(method: str, inputs: dict, ranges: list[list[list[int]]], models: list[str], per_slice: list[dict],
                 output: str, *, naming: str | naming_lib.Naming = "auto", dtype: str | None = None,
                 max_shard_bytes: int | str = hf.DEFAULT_MAX_SHARD_BYTES, overwrite: bool = False) -> dict:
  """Writes the merge over slices as a model directory `output`. inputs: the method's roles over
  `models` (paths); ranges[s][j]: the layer range of models[j] in slice s; per_slice[s]: the
  method's options for slice s."""
  m = registry.get(method)
  trees = {p: tool.load_input(p) for p in models}
  nm = registry.naming_for_method(m, None, list(trees[models[0]]), naming)  # a block pattern too (GPT-2's YAML)
  virtual = {p: stack.stack_trees({p: trees[p]}, [(p, *r[j]) for r in ranges], nm) for j, p in enumerate(models)}
  names = list(virtual[models[0]])
  where, starts, at = {}, [], 0
  for r in ranges:
    starts.append(at)
    at += r[0][1] - r[0][0]
  for n in names:
    block = nm.block_kind(n)[0]
    if block is None:
      where[n] = (0 if naming_lib.outside_kind(n) == "embedding" else len(ranges) - 1, 0.0)
    else:
      s = max(i for i, start in enumerate(starts) if start <= block)
      length = ranges[s][0][1] - ranges[s][0][0]
      where[n] = (s, (block - starts[s]) / (length - 1) if length > 1 else 1.0)
  options = slice_options(m, names, where, per_slice)
  roles = {r: [virtual[p] for p in v] if isinstance(v, list) else virtual[v] for r, v in inputs.items()}
  merged = registry.merge(method, roles, options, naming=nm)
  source = tool.source_model(inputs, [r.name for r in m.roles])
  config = None
  if source is not None:
    j = models.index(source) if source in models else 0
    config = stack.stacked_config(source, [(source, *r[j]) for r in ranges])
  tool.check_output(output, overwrite, tool.input_paths({**inputs, "models": models}))
  card = {"title": f"{method} merge over slices", "method": method, "inputs": inputs, "ranges": ranges}
  written = hf.write_model_dir(merged, output, source_dir=source, config=config, card=card, dtype=dtype,
                               max_shard_bytes=max_shard_bytes, metadata={"merge_method": method},
                               weights_only=source is None, overwrite=overwrite)
  return {"output": written["dir"], "files": written["files"], "config_from": source, "naming": nm.name,
          "tensors": len(names), "layers": at, "heatmaps": []}
