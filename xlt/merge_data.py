"""Data-aware merges from the command line: RegMean, RegMean++ and Fisher merging of Hugging Face
model directories, each expert's statistics (xlt.merge_statistics) from its own data file
(configs/merge_data.py has the command). The merge library (xlt.merge) reads no data and runs no
model; this is where the two meet, beside training. Data files hold {"text": ...} lines or the
SFT reader's kinds; `data.convention` is xlt's (packed rows, each example ended with the EOS) or
fusion-bench's (one text per row, no EOS), and padding never enters a statistic
(configs/merge_data.py; docs/merge.md has the conventions against fusion-bench).

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

from xlt import compile_cache, hf_tokenizer, lora, merge, merge_statistics, pretrained, sharding
from xlt.data import sft
from xlt.io import config_files, fileio
from xlt.merge import registry
from xlt.param_paths import path_names, path_str

STATISTICS = {"regmean": "grams", "regmean_plusplus": "measure", "fisher": "fishers"}
GRAMS = ("regmean", "regmean_plusplus")  # the methods measuring Gram matrices of kernels' inputs
# data.convention -> (packing, add_eos): xlt's packs examples into rows and ends each with the
# EOS, as fine-tuning reads them; fusion-bench's is one text per row, as its tokenizer gives it
CONVENTIONS = {"xlt": (True, True), "fusion_bench": (False, False)}
# statistics.fisher: merge_statistics.FISHERS; statistics.head: RegMean measures the untied head
STATISTICS_DEFAULTS = {"fisher": "empirical", "head": True}


def _paths(value) -> list[str]:
  return [str(v) for v in value] if isinstance(value, (list, tuple)) else [p for p in str(value).split(",") if p]


def estimate_bytes(method: str, params, batch_size: int) -> int:
  """The statistics' memory beside one expert's parameters: a float32 Gram matrix per attn / mlp
  kernel (RegMean; RegMean++ holds one stage's at a time), or batch_size per-sequence gradients
  plus the running sum (Fisher)."""
  if method in GRAMS:
    flat = {path_names(p): np.shape(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    return sum(4 * lora.in_out(k, flat[k])[0] ** 2 for k in merge_statistics.regmean_kernels(params))
  return 4 * (batch_size + 2) * sum(int(np.size(x)) for x in jax.tree.leaves(params))


def _example(tok, rec, where: str, add_eos: bool):
  """(ids, targets) of one line: {"text": ...} is encoded as the tokenizer encodes a text (its
  BOS, if any), every token after the first a target, then the EOS with `add_eos`; the SFT
  reader's kinds (prompt / completion, messages) as it encodes them (xlt.data.sft.encode)."""
  if isinstance(rec, dict) and "text" in rec:
    if not isinstance(rec["text"], str):
      raise ValueError(f"{where}: 'text' must be a string")
    ids = list(tok.encode(rec["text"])) + ([tok.eos_id] if add_eos and tok.eos_id is not None else [])
    targets = np.arange(len(ids)) > 0
    return np.asarray(ids, np.int32), targets
  return sft.encode(tok, sft.check_record(rec, where), add_eos, where)


def read_examples(path: str, tok, add_eos: bool) -> list[tuple[np.ndarray, np.ndarray]]:
  """The (ids, targets) of each non-blank line of a JSON-lines file (`_example`)."""
  if not os.path.isfile(path):
    raise ValueError(f"{path}: no such file")
  fileio.check_size(path, sft.MAX_FILE_BYTES, ValueError)
  out = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if line.strip():
        try:
          rec = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        out.append(_example(tok, rec, f"{path}:{lineno}", add_eos))
  if not out:
    raise ValueError(f"{path} has no examples")
  return out


def batches(path: str, tok, c, method: str) -> list[tuple[np.ndarray, np.ndarray]]:
  """(tokens [B, block_size + 1], mask) batches of the first max_examples rows of a data file,
  in the convention `c.data.convention` names (CONVENTIONS): the mask of a Gram matrix (GRAMS)
  the positions up to each row's last target, not the padding; of a Fisher the targets."""
  convention = str(c.data.get("convention", "xlt"))
  if convention not in CONVENTIONS:
    raise ValueError(f"data.convention {convention!r}: one of {', '.join(CONVENTIONS)}")
  packing, add_eos = CONVENTIONS[convention]
  pad = next((i for i in (tok.pad_id, tok.eos_id) if i is not None), 0)
  rows, _ = sft.pack(read_examples(path, tok, add_eos), int(c.block_size), pad, packing=packing)
  if not len(rows["tokens"]):
    raise ValueError(f"{path}: no example has a target within block_size + 1 = {int(c.block_size) + 1} tokens")
  tokens, targets = rows["tokens"][:int(c.max_examples)], rows["loss_mask"][:int(c.max_examples)]
  mask = merge_statistics.input_mask(targets) if method in GRAMS else targets
  b = int(c.batch_size)
  return [(tokens[i:i + b], mask[i:i + b]) for i in range(0, len(tokens), b)]


def _statistics(c) -> dict:
  """c.statistics' fields over STATISTICS_DEFAULTS, checked."""
  given = c.get("statistics") or {}
  given = dict(given.to_dict() if hasattr(given, "to_dict") else given)
  if unknown := sorted(set(given) - set(STATISTICS_DEFAULTS)):
    raise ValueError(f"statistics has no field {', '.join(unknown)}; its fields: {', '.join(STATISTICS_DEFAULTS)}")
  out = {**STATISTICS_DEFAULTS, **given}
  if out["fisher"] not in merge_statistics.FISHERS:
    raise ValueError(f"statistics.fisher {out['fisher']!r}: one of {', '.join(merge_statistics.FISHERS)}")
  if not isinstance(out["head"], bool):
    raise ValueError(f"statistics.head must be True or False, got {out['head']!r}")
  return out


def staged_grams(cfg, batches_per_expert: list, mesh=None, head: bool = True):
  """RegMean++'s `measure` (xlt.merge.data_aware.regmean_plusplus): the Gram matrices of a
  stage's kernels in each model it is given (the merge so far, then expert i's own) over expert
  i's batches; a stage with no kernel measured (the embedding) runs no model. Each stage runs the
  whole model: L + 1 passes over the data where RegMean takes one."""

  def measure(models, paths):
    out, wanted = [], set(paths)
    for params, data_batches in zip(models, batches_per_expert):
      kernels = [k for k in merge_statistics.regmean_kernels(params, head) if path_str(k) in wanted]
      out.append(merge_statistics.grams(cfg, params, data_batches, kernels=kernels, mesh=mesh) if kernels else {})
    return out

  return measure


def run(c, *, log=print, overwrite: bool = False) -> dict:
  """Runs the data-aware merge config `c` describes; returns its summary."""
  method = str(c.method)
  if method not in STATISTICS:
    raise ValueError(f"method {method!r}: the data-aware methods are {', '.join(STATISTICS)}")
  experts, data = _paths(c.inputs.experts), _paths(c.data.experts)
  if len(experts) < 1 or len(data) != len(experts):
    raise ValueError(f"data.experts: one data file per expert ({len(experts)} experts, {len(data)} files)")
  options = dict(c.options.to_dict() if hasattr(c.options, "to_dict") else c.options or {})
  measured = _statistics(c)
  registry.check(method, {"experts": experts}, {**options, STATISTICS[method]: [None] * len(experts)})
  merge.check_output(str(c.output), overwrite, experts + data)
  tok = hf_tokenizer.load(experts[0])
  # the batches split over the mesh's data axes (data x fsdp), the parameters replicated
  mesh = sharding.make_mesh(c.mesh.to_dict() if hasattr(c.mesh, "to_dict") else dict(c.mesh)) if c.get("mesh") else None
  models, stats, first, all_batches = [], [], None, []
  for path, file in zip(experts, data):
    cfg, params = pretrained.load(path)
    if first is not None and cfg != first:
      raise ValueError(f"{path}'s config differs from {experts[0]}'s: the experts must share one architecture")
    first = cfg
    if not models:
      log(f"xlt.merge_data: {method} statistics take ~{estimate_bytes(method, params, int(c.batch_size)) / 2**20:.1f}"
          f" MiB per expert beside its parameters")
    data_batches = batches(file, tok, c, method)
    if method == "regmean_plusplus":  # measured while it merges, on the merge so far
      all_batches.append(data_batches)
    elif method == "regmean":
      stats.append(merge_statistics.grams(cfg, params, data_batches, mesh=mesh, head=measured["head"]))
    else:
      stats.append(merge_statistics.diagonal_fisher(cfg, params, data_batches, mesh=mesh, fisher=measured["fisher"]))
    models.append(jax.tree.map(np.asarray, params))
  if method == "regmean_plusplus":
    stats = staged_grams(first, all_batches, mesh, measured["head"])
  merged = registry.merge(method, {"experts": models}, {**options, STATISTICS[method]: stats})
  summary = pretrained.save(first, merged, c.output, source_dir=experts[0], overwrite=overwrite,
                            card={"method": method, "inputs": experts, "data": data, "options": options})
  ran = {"method": method, "inputs": {"experts": experts}, "data": {"experts": data}, "options": options,
         "block_size": int(c.block_size), "batch_size": int(c.batch_size), "max_examples": int(c.max_examples),
         "convention": str(c.data.get("convention", "xlt")), "statistics": measured}
  fileio.write_text(os.path.join(c.output, "merge_config.json"), json.dumps(ran, indent=1) + "\n")
  return summary


def main(argv, config=None, overwrite: bool = False):
  if len(argv) > 1:
    print(f"xlt.merge_data: error: unexpected arguments {argv[1:]}", file=sys.stderr)
    return 2
  if config is None or config.value is None:
    print("xlt.merge_data: error: --config=configs/merge_data.py is required", file=sys.stderr)
    return 2
  compile_cache.enable()
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
  # --config=configs/merge_data.py from any directory (xlt's configs, `from configs import common` found)
  app.run(lambda argv: main(argv, _config, _overwrite.value),
          flags_parser=lambda argv: flags.FLAGS(config_files.config_argv(argv)))
