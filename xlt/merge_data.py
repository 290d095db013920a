"""Data-aware merges from the command line: RegMean and Fisher merging of Hugging Face model
directories, each expert's statistics (xlt.merge_statistics) from its own data file
(configs/merge_data.py has the command). The merge library (xlt.merge) reads no data and runs no
model; this is where the two meet, beside training.

Each batch is split over the mesh's data axes (`c.mesh`, as training's), the parameters
replicated. It prints an estimate of the memory the statistics take before computing them, then writes the
merged model as a Hugging Face model directory (xlt.pretrained.save, the first expert's config
and tokenizer) with merge_config.json. A user error is one line on stderr and exit status 2. A non-empty output is
replaced only with --overwrite, never when it is an input or holds one (xlt.merge.check_output).
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from xlt import hf_tokenizer, lora, merge, merge_statistics, pretrained, sharding
from xlt.data import sft
from xlt.io import fileio
from xlt.merge import registry
from xlt.param_paths import path_names

STATISTICS = {"regmean": "grams", "fisher": "fishers"}


def _paths(value) -> list[str]:
  return [str(v) for v in value] if isinstance(value, (list, tuple)) else [p for p in str(value).split(",") if p]


def estimate_bytes(method: str, params, batch_size: int) -> int:
  """The statistics' memory beside one expert's parameters: a float32 Gram matrix per attn / mlp
  kernel (RegMean), or batch_size per-sequence gradients plus the running sum (Fisher)."""
  if method == "regmean":
    flat = {path_names(p): np.shape(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    return sum(4 * lora.in_out(k, flat[k])[0] ** 2 for k in lora.targets(params))
  return 4 * (batch_size + 2) * sum(int(np.size(x)) for x in jax.tree.leaves(params))


def _batches(path: str, tok, c) -> list[np.ndarray]:
  rows = sft.load(path, tok, block_size=int(c.block_size)).train["tokens"][:int(c.max_examples)]
  return [rows[i:i + int(c.batch_size)] for i in range(0, len(rows), int(c.batch_size))]


def run(c, *, log=print, overwrite: bool = False) -> dict:
  """Runs the data-aware merge config `c` describes; returns its summary."""
  method = str(c.method)
  if method not in STATISTICS:
    raise ValueError(f"method {method!r}: the data-aware methods are {', '.join(STATISTICS)}")
  experts, data = _paths(c.inputs.experts), _paths(c.data.experts)
  if len(experts) < 1 or len(data) != len(experts):
    raise ValueError(f"data.experts: one data file per expert ({len(experts)} experts, {len(data)} files)")
  options = dict(c.options.to_dict() if hasattr(c.options, "to_dict") else c.options or {})
  registry.check(method, {"experts": experts}, {**options, STATISTICS[method]: [None] * len(experts)})
  merge.check_output(str(c.output), overwrite, experts + data)
  tok = hf_tokenizer.load(experts[0])
  # the batches split over the mesh's data axes (data x fsdp), the parameters replicated
  mesh = sharding.make_mesh(c.mesh.to_dict() if hasattr(c.mesh, "to_dict") else dict(c.mesh)) if c.get("mesh") else None
  models, stats, first = [], [], None
  for path, file in zip(experts, data):
    cfg, params = pretrained.load(path)
    if first is not None and cfg != first:
      raise ValueError(f"{path}'s config differs from {experts[0]}'s: the experts must share one architecture")
    first = cfg
    if not models:
      log(f"xlt.merge_data: {method} statistics take ~{estimate_bytes(method, params, int(c.batch_size)) / 2**20:.1f}"
          f" MiB per expert beside its parameters")
    batches = _batches(file, tok, c)
    compute = merge_statistics.grams if method == "regmean" else merge_statistics.diagonal_fisher
    stats.append(compute(cfg, params, batches, mesh=mesh))
    models.append(jax.tree.map(np.asarray, params))
  merged = registry.merge(method, {"experts": models}, {**options, STATISTICS[method]: stats})
  summary = pretrained.save(first, merged, c.output, source_dir=experts[0], overwrite=overwrite,
                            card={"method": method, "inputs": experts, "data": data, "options": options})
  ran = {"method": method, "inputs": {"experts": experts}, "data": {"experts": data}, "options": options,
         "block_size": int(c.block_size), "batch_size": int(c.batch_size), "max_examples": int(c.max_examples)}
  fileio.write_text(os.path.join(c.output, "merge_config.json"), json.dumps(ran, indent=1) + "\n")
  return summary


def main(argv, config=None, overwrite: bool = False):
  if len(argv) > 1:
    print(f"xlt.merge_data: error: unexpected arguments {argv[1:]}", file=sys.stderr)
    return 2
  if config is None or config.value is None:
    print("xlt.merge_data: error: --config=configs/merge_data.py is required", file=sys.stderr)
    return 2
  try:
    summary = run(config.value, overwrite=overwrite)
  except (ValueError, TypeError, OSError) as e:
    print("xlt.merge_data: error: " + " ".join(str(e).split()), file=sys.stderr)
    return 2
  print(json.dumps(summary, indent=1, default=str))
  return 0


if __name__ == "__main__":
  # defined here, not on import: the library's functions import beside other absl programs
  _config = config_flags.DEFINE_config_file("config", None, "configs/merge_data.py", lock_config=False,
                                            accept_new_attributes=True)
  _overwrite = flags.DEFINE_bool("overwrite", False, "replace a non-empty output directory (never an input)")
  app.run(lambda argv: main(argv, _config, _overwrite.value))
