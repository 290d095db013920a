"""Merging checkpoint files into a model directory: what `python -m xlt.merge` runs.

Inputs are read lazily (xlt.merge.files), merged by a registry method tensor by tensor, and
written by xlt.merge.hf as a Hugging Face model directory: when an input is a Hugging Face
model directory (config.json beside its safetensors), its config and tokenizer files come
along, so transformers loads the merge as it loads the input; otherwise (xlt's own
checkpoints, bare .safetensors files) the directory holds the weights and the model card.
Memory of a file merge: the merged model (its leaves are computed one by one and kept until
written) plus a few tensors of the inputs.
"""

from __future__ import annotations

import json
import os

from xlt import paths as naming_lib
from xlt.merge import analysis, hf, registry
from xlt.merge.files import load


def source_model(inputs: dict, roles: list[str], config_from: str | None = None) -> str | None:
  """The input whose config.json and tokenizer files the merge takes: `config_from` (a role),
  else the base, else the first input (in the method's role order) that is a Hugging Face
  model directory; None when no input is one."""
  if config_from:
    if config_from not in inputs:
      raise ValueError(f"config_from={config_from!r} is not one of the inputs {sorted(inputs)}")
    path = inputs[config_from]
    path = path[0] if isinstance(path, (list, tuple)) else path
    if not os.path.isfile(os.path.join(path, hf.CONFIG)):
      raise ValueError(f"config_from={config_from!r}: {path} has no {hf.CONFIG}")
    return path
  for role in ["base"] + roles:
    paths = inputs.get(role, [])
    for path in paths if isinstance(paths, (list, tuple)) else [paths]:
      if os.path.isfile(os.path.join(path, hf.CONFIG)):
        return path
  return None


def merge_files(inputs: dict, method: str, output: str, options: dict | None = None, *,
                naming: str | naming_lib.Naming = "auto", heatmaps: bool = True, config_from: str | None = None,
                max_shard_bytes: int | str = hf.DEFAULT_MAX_SHARD_BYTES, dtype: str | None = None) -> dict:
  """Merges checkpoint files with one of the registry's methods and writes `output` as a model
  directory (xlt.merge.hf: model.safetensors or shards with their index, config.json and
  tokenizer files from `source_model`, README.md naming inputs, method and options), plus
  delta_<role>.png heatmaps of where each fine-tune changed the base when a base is among the
  inputs; returns a summary dict.

  inputs: {role: checkpoint path or list of paths}: the method's roles
    (`registry.describe(method)`; e.g. layer_swap: task_expert, language_expert) and
    optionally `base` for the heatmaps.
  options: the method's options (layer_swap: bottom, top, ...); not those that take trees.
  naming: "auto" (the first naming that recognises every name), "hf", "xlt" or a Naming.
  max_shard_bytes, dtype: as `hf.write_model_dir` takes them.
  Every check (method, roles, options, file headers) runs before any tensor is read, and the
  output directory is replaced only once the new one is complete.
  """
  options = dict(options or {})
  m = registry.get(method)
  roles = [r.name for r in m.roles]
  registry.check(method, {r: v for r, v in inputs.items() if r in roles or r != "base"}, options,
                 trees_allowed=False)
  source = source_model(inputs, roles, config_from)
  trees = {r: [load(p) for p in v] if isinstance(v, (list, tuple)) else load(v) for r, v in inputs.items()}
  first = next(iter(trees.values()))
  first = first[0] if isinstance(first, list) else first
  nm = naming_lib.naming_for(list(first), naming)
  merged = registry.merge(method, {r: trees[r] for r in roles}, options, naming=nm)
  card = {"title": f"{method} merge", "method": method, "inputs": inputs, "options": options}
  written = hf.write_model_dir(merged, output, source_dir=source, card=card, max_shard_bytes=max_shard_bytes,
                               dtype=dtype, metadata={"merge_method": method,
                                                      "options": json.dumps(options, sort_keys=True)},
                               weights_only=source is None)
  del merged
  summary = {"output": written["dir"], "files": written["files"], "config_from": source, "naming": nm.name,
             "tensors": len(first), "bytes": int(sum(x.nbytes for x in first.values())), "heatmaps": []}
  if heatmaps and "base" in trees:
    summary["heatmaps"] = _heatmaps(trees, [r for r in roles if r != "base"], output, nm)
  return summary


def _heatmaps(trees: dict, roles: list[str], output: str, nm: naming_lib.Naming) -> list[str]:
  """delta_<role>.png (delta_<role>_<i>.png in a list) for every model of `roles`: where
  it changed trees["base"]."""
  pngs = []
  for role in roles:
    experts = trees[role] if isinstance(trees[role], list) else [trees[role]]
    for i, expert in enumerate(experts):
      name = role if len(experts) == 1 else f"{role}_{i}"
      change = analysis.row_change(expert, trees["base"], naming=nm,
                                   threshold=analysis.default_threshold(expert, trees["base"], naming=nm))
      png = os.path.join(output, f"delta_{name}.png")
      analysis.plot_row_change(change, png, title=f"where {name} changed the base")
      pngs.append(png)
  return pngs
