"""Layer stacks ("frankenmerges"): mergekit's passthrough over slices that repeat, reorder or
drop blocks, so the output has a depth of its own.

slices: [(model, lo, hi)], in output order; the output's blocks are model's blocks lo..hi-1 of
each slice, one after the other, renumbered from 0, and its config's num_hidden_layers is their
count. As mergekit does, the embedding comes from the first slice's model and every other
tensor outside the blocks (final norm, head) from the last slice's; the config and tokenizer
come from the first slice's model. A config's per-layer list (`layer_types`: sliding or full
attention) follows its blocks. Each output tensor is an input tensor under a new name, read as
it is written; mergekit's passthrough `scale` (per slice or global: a number, a gradient along
the slice, or filtered by tensor name, e.g. 0 for o_proj and down_proj of a repeated block)
multiplies it in its own dtype.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from xlt import param_paths as naming_lib
from xlt.io import fileio, tensor_files
from xlt.io import hf_dir as hf
from xlt.merge import tool

_INDEX = re.compile(r"(^|\.)(\d+)(?=\.)")


def renamed(name: str, block: int, new_block: int) -> str:
  """`name` (a tensor of block `block`) as a tensor of block `new_block`: its first number
  component, which must be the block index (model.layers.3.mlp... -> model.layers.5.mlp...)."""
  m = _INDEX.search(name)
  if m is None or int(m.group(2)) != block:
    raise ValueError(f"tensor {name}: its block index {block} is not the first number in its name; "
                     "xlt stacks layers of Hugging Face models whose names hold the block index")
  return f"{name[:m.start(2)]}{new_block}{name[m.end(2):]}"


def check_slices(slices: list) -> list[tuple]:
  """[(model, lo, hi[, scale])] of `slices` (each a [model, lo, hi] or [model, lo, hi, scale]),
  checked."""
  out = []
  for i, s in enumerate(slices):
    if not isinstance(s, (list, tuple)) or len(s) not in (3, 4):
      raise ValueError(f"slices[{i}]: a slice is [model, lo, hi] or [model, lo, hi, scale], got {s!r}")
    model, lo, hi = s[:3]
    if int(lo) != lo or int(hi) != hi or not 0 <= lo < hi:
      raise ValueError(f"slices[{i}]: layer_range [{lo}, {hi}] must be 0 <= lo < hi")
    out.append((str(model), int(lo), int(hi)) + tuple(s[3:]))
  if not out:
    raise ValueError("slices: a layer stack needs at least one slice")
  return out


def setting(value, name: str, t: float) -> float | None:
  """mergekit's value of a setting for tensor `name` at position t (0..1) along its slice: a
  number, a gradient (a list: interpolated at t), or a filtered list [{filter, value}] (the
  first entry whose filter is part of `name`, or has none); None when no entry matches."""
  if value is None:
    return None
  if isinstance(value, dict):
    value = [value]
  if isinstance(value, (list, tuple)) and value and all(isinstance(c, dict) for c in value):
    for c in value:
      if c.get("filter") in (None, "*") or str(c["filter"]) in name:
        return setting(c["value"], name, t)
    return None
  if isinstance(value, (list, tuple)):
    scaled = t * (len(value) - 1)
    i0 = int(scaled)
    i1 = min(len(value) - 1, i0 + 1)
    return (1 - (scaled - i0)) * float(value[i0]) + (scaled - i0) * float(value[i1])
  return float(value)


class _Scaled:
  """Tensor x times `scale`, computed in x's dtype as it is read (mergekit's passthrough scale)."""

  def __init__(self, x, scale: float):
    self.x, self.scale = x, scale
    self.shape, self.dtype = tuple(x.shape), np.dtype(tensor_files.dtype_of(x))
    self.ndim, self.size = len(self.shape), int(np.prod(self.shape, dtype=np.int64))
    self.nbytes = self.size * self.dtype.itemsize

  def __array__(self, dtype=None, copy=None):
    a = np.asarray(self.x)
    out = (a * np.asarray(self.scale, a.dtype)).astype(a.dtype)
    return out if dtype is None else out.astype(dtype)


def _scaled(x, scale: float | None):
  return x if scale is None else _Scaled(x, scale)


def stack_trees(trees: dict[str, dict], slices: list[tuple], nm: naming_lib.Naming, scale=None) -> dict:
  """The stacked flat tree: {new name: input tensor} from {model: flat tree} and the slices.
  A slice's scale (else `scale`, the global one; see `setting`, filters matched against the
  output's tensor names) multiplies its tensors, at t = the block's position in its slice; the
  embedding takes the first slice's scale, the other tensors outside the blocks the last
  slice's, at t = 0 (as mergekit's passthrough does)."""
  by_block: dict[str, dict[int, list[str]]] = {}
  for model, tree in trees.items():
    blocks = by_block.setdefault(model, {})
    for name in tree:
      block, _ = nm.block_kind(name)
      if block is not None:
        blocks.setdefault(block, []).append(name)
  def value(own: list, name: str, t: float):  # the slice's own scale first, then the global one
    found = setting(own[0], name, t) if own else None
    return setting(scale, name, t) if found is None else found

  (first, *first_own), (last, *last_own) = (slices[0][:1] + slices[0][3:]), (slices[-1][:1] + slices[-1][3:])
  out = {}
  for name, x in trees[first].items():
    if nm.block_kind(name)[0] is None and naming_lib.outside_kind(name) == "embedding":
      out[name] = _scaled(x, value(first_own, name, 0.0))
  for name, x in trees[last].items():
    if nm.block_kind(name)[0] is None and naming_lib.outside_kind(name) != "embedding":
      out[name] = _scaled(x, value(last_own, name, 0.0))
  at = 0
  for i, (model, lo, hi, *own) in enumerate(slices):
    have = len(by_block[model])
    if hi > have:
      raise ValueError(f"slices[{i}]: layer_range [{lo}, {hi}] runs past {model}'s {have} layers")
    for block in range(lo, hi):
      t = (block - lo) / (hi - lo - 1) if hi - lo > 1 else 1.0
      for name in by_block[model][block]:
        new_name = renamed(name, block, at)  # filters match the output's name, as in mergekit
        out[new_name] = _scaled(trees[model][name], value(own, new_name, t))
      at += 1
  return out


def stacked_config(source: str, slices: list[tuple[str, int, int]]) -> dict:
  """source's config.json with num_hidden_layers (and layer_types, when per layer) for the stack."""
  fileio.check_size(os.path.join(source, hf.CONFIG), 1 << 20)
  with open(os.path.join(source, hf.CONFIG)) as f:
    cfg = json.load(f)
  text = cfg.get("text_config") if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict) else cfg
  text["num_hidden_layers"] = sum(s[2] - s[1] for s in slices)
  if isinstance(text.get("layer_types"), list):
    types = {}
    for model, *_ in slices:
      try:
        with open(os.path.join(model, hf.CONFIG)) as f:
          other = json.load(f)
        types[model] = (other.get("text_config") or other).get("layer_types") or text["layer_types"]
      except (OSError, ValueError):
        types[model] = text["layer_types"]
    text["layer_types"] = [types[m][b] for m, lo, hi, *_ in slices for b in range(lo, hi)]
  return cfg


def stack_files(slices: list, output: str, *, scale=None, naming: str | naming_lib.Naming = "auto",
                dtype: str | None = None, max_shard_bytes: int | str = hf.DEFAULT_MAX_SHARD_BYTES,
                overwrite: bool = False) -> dict:
  """Writes the layer stack of `slices` ([model, lo, hi] or [model, lo, hi, scale]) as a model
  directory `output`; returns a summary dict as tool.merge_files does. scale: the global
  scale (`stack_trees`)."""
  slices = check_slices(slices)
  models = list(dict.fromkeys(s[0] for s in slices))
  trees = {m: tool.load_input(m) for m in models}
  nm = naming_lib.naming_for(list(trees[models[0]]), naming)
  if nm is naming_lib.UNNAMED:
    raise ValueError(f"no naming places {models[0]}'s tensors in blocks; pass --config.naming (a block prefix "
                     "pattern such as gpt_neox.layers.{i}.)")
  stacked = stack_trees(trees, slices, nm, scale)
  source = slices[0][0]
  has_config = os.path.isfile(os.path.join(tool._adapter_of(source)[0], hf.CONFIG))
  config = stacked_config(tool._adapter_of(source)[0], slices) if has_config else None
  tool.check_output(output, overwrite, tool.input_paths({"slices": models}))
  card = {"title": "layer stack", "method": "layer_stack", "slices": [list(s) for s in slices]}
  if scale is not None:
    card["scale"] = scale
  written = hf.write_model_dir(stacked, output, source_dir=tool._adapter_of(source)[0] if has_config else None,
                               config=config, card=card, max_shard_bytes=max_shard_bytes, dtype=dtype,
                               metadata={"merge_method": "layer_stack"}, weights_only=not has_config,
                               overwrite=overwrite)
  return {"output": written["dir"], "files": written["files"], "config_from": source if has_config else None,
          "naming": nm.name, "tensors": len(stacked), "layers": sum(s[2] - s[1] for s in slices),
          "heatmaps": []}
