"""Layer stacks ("frankenmerges"): mergekit's passthrough over slices that repeat, reorder or
drop blocks, so the output has a depth of its own.

slices: [(model, lo, hi)], in output order; the output's blocks are model's blocks lo..hi-1 of
each slice, one after the other, renumbered from 0, and its config's num_hidden_layers is their
count. As mergekit does, the embedding comes from the first slice's model and every other
tensor outside the blocks (final norm, head) from the last slice's; the config and tokenizer
come from the first slice's model. A config's per-layer list (`layer_types`: sliding or full
attention) follows its blocks. Nothing is computed: each output tensor is an input tensor under
a new name, read as it is written.
"""

from __future__ import annotations

import json
import os
import re

from xlt import paths as naming_lib
from xlt.io import fileio
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


def check_slices(slices: list) -> list[tuple[str, int, int]]:
  """[(model, lo, hi)] of `slices` (each a [model, lo, hi] or {model, layer_range}), checked."""
  out = []
  for i, s in enumerate(slices):
    model, (lo, hi) = (s["model"], s["layer_range"]) if isinstance(s, dict) else (s[0], s[1:])
    if int(lo) != lo or int(hi) != hi or not 0 <= lo < hi:
      raise ValueError(f"slices[{i}]: layer_range [{lo}, {hi}] must be 0 <= lo < hi")
    out.append((str(model), int(lo), int(hi)))
  if not out:
    raise ValueError("slices: a layer stack needs at least one slice")
  return out


def stack_trees(trees: dict[str, dict], slices: list[tuple[str, int, int]], nm: naming_lib.Naming) -> dict:
  """The stacked flat tree: {new name: input tensor} from {model: flat tree} and the slices."""
  by_block: dict[str, dict[int, list[str]]] = {}
  for model, tree in trees.items():
    blocks = by_block.setdefault(model, {})
    for name in tree:
      block, _ = nm.block_kind(name)
      if block is not None:
        blocks.setdefault(block, []).append(name)
  first, last = slices[0][0], slices[-1][0]
  out = {}
  for name, x in trees[first].items():
    if nm.block_kind(name)[0] is None and naming_lib.outside_kind(name) == "embedding":
      out[name] = x
  for name, x in trees[last].items():
    if nm.block_kind(name)[0] is None and naming_lib.outside_kind(name) != "embedding":
      out[name] = x
  at = 0
  for i, (model, lo, hi) in enumerate(slices):
    have = len(by_block[model])
    if hi > have:
      raise ValueError(f"slices[{i}]: layer_range [{lo}, {hi}] runs past {model}'s {have} layers")
    for block in range(lo, hi):
      for name in by_block[model][block]:
        out[renamed(name, block, at)] = trees[model][name]
      at += 1
  return out


def stacked_config(source: str, slices: list[tuple[str, int, int]]) -> dict:
  """source's config.json with num_hidden_layers (and layer_types, when per layer) for the stack."""
  fileio.check_size(os.path.join(source, hf.CONFIG), 1 << 20)
  with open(os.path.join(source, hf.CONFIG)) as f:
    cfg = json.load(f)
  text = cfg.get("text_config") if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict) else cfg
  text["num_hidden_layers"] = sum(hi - lo for _, lo, hi in slices)
  if isinstance(text.get("layer_types"), list):
    types = {}
    for model, _, _ in slices:
      try:
        with open(os.path.join(model, hf.CONFIG)) as f:
          other = json.load(f)
        types[model] = (other.get("text_config") or other).get("layer_types") or text["layer_types"]
      except (OSError, ValueError):
        types[model] = text["layer_types"]
    text["layer_types"] = [types[m][b] for m, lo, hi in slices for b in range(lo, hi)]
  return cfg


def stack_files(slices: list, output: str, *, naming: str | naming_lib.Naming = "auto", dtype: str | None = None,
                max_shard_bytes: int | str = hf.DEFAULT_MAX_SHARD_BYTES, overwrite: bool = False) -> dict:
  """Writes the layer stack of `slices` ([model, lo, hi] or {model, layer_range}) as a model
  directory `output`; returns a summary dict as tool.merge_files does."""
  slices = check_slices(slices)
  models = list(dict.fromkeys(m for m, _, _ in slices))
  trees = {m: tool.load_input(m) for m in models}
  nm = naming_lib.naming_for(list(trees[models[0]]), naming)
  if nm is naming_lib.UNNAMED:
    raise ValueError(f"no naming places {models[0]}'s tensors in blocks; pass --config.naming (a block prefix "
                     "pattern such as gpt_neox.layers.{i}.)")
  stacked = stack_trees(trees, slices, nm)
  source = slices[0][0]
  has_config = os.path.isfile(os.path.join(tool._adapter_of(source)[0], hf.CONFIG))
  config = stacked_config(tool._adapter_of(source)[0], slices) if has_config else None
  tool._check_output(output, overwrite)
  card = {"title": "layer stack", "method": "layer_stack", "slices": [list(s) for s in slices]}
  written = hf.write_model_dir(stacked, output, source_dir=tool._adapter_of(source)[0] if has_config else None,
                               config=config, card=card, max_shard_bytes=max_shard_bytes, dtype=dtype,
                               metadata={"merge_method": "layer_stack"}, weights_only=not has_config,
                               overwrite=overwrite)
  return {"output": written["dir"], "files": written["files"], "config_from": source if has_config else None,
          "naming": nm.name, "tensors": len(stacked), "layers": sum(hi - lo for _, lo, hi in slices),
          "heatmaps": []}
