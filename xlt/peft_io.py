"""xlt LoRA adapters (xlt.lora) as Hugging Face PEFT adapters and back: a directory with
adapter_config.json and adapter_model.safetensors that `peft.PeftModel.from_pretrained(base,
dir)` loads onto the base model xlt.pretrained writes (or read), with the same logits.

  peft_io.save(cfg, params, adapters, "runs/adapter")            # xlt -> PEFT
  adapters = peft_io.read("runs/adapter", cfg, params)           # PEFT -> xlt adapter tree
  composite = peft_io.load("runs/adapter", cfg, params)          # {"base", "lora"} (xlt.composite)
  model = peft_io.load("runs/adapter", cfg, params, merged=True) # the base with the deltas in

Each adapted xlt kernel maps onto the Hugging Face module(s) its weight is written as
(xlt.pretrained's table): the rows and columns of xlt's [out, in] view are found by writing a
kernel of entry indices through that table, so lora_B's rows and lora_A's columns are those of
the module's weight whatever reshape, transpose or split the family's mapping does (GPT-2's fused
attn/qkv is one Conv1D c_attn; a Llama qkv written as q/k/v shares its lora_A). PEFT's scale
is rsLoRA's (use_rslora: lora_alpha / sqrt(r)), xlt's; plain LoRA adapters (alpha / r) read in
with their scale folded into lora_B. Files a user brings are checked for size before reading.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import jax
import numpy as np

from xlt import model as model_lib
from xlt import pretrained
from xlt.io import fileio
from xlt.io import tensor_files as files
from xlt import merge
from xlt.param_paths import XLT, path_names, path_str

CONFIG, WEIGHTS, PREFIX = merge.PEFT_CONFIG, merge.PEFT_WEIGHTS, merge.PEFT_PREFIX


class _Index:
  """A kernel of entry indices (0 .. size-1 in its own shape), made only when read, so mapping
  a model's kernels holds one at a time."""

  def __init__(self, shape):
    self.shape, self.dtype = tuple(shape), np.dtype(np.int64)

  def __array__(self, dtype=None, copy=None):
    return np.arange(math.prod(self.shape), dtype=np.int64).reshape(self.shape)


def module_maps(cfg: model_lib.Config, params, kernels, family: str | None = None) -> dict:
  """{xlt kernel path: [(Hugging Face module name, out rows, in columns)]}: module m's weight
  holds, at [j, k] of its [out, in] view, entry [out_rows[j], in_cols[k]] of the kernel's
  xlt [out, in] view (xlt.param_paths rows: output units)."""
  family = family or pretrained.guess_family(cfg)
  kernels = {tuple(k) for k in kernels}
  flat = {path_names(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  if missing := sorted(kernels - set(flat)):
    raise ValueError(f"LoRA adapter for {path_str(missing[0])}, which the model does not have")
  index = {p: _Index(np.shape(flat[p])) for p in kernels}
  tree = jax.tree_util.tree_map_with_path(lambda p, x: index.get(path_names(p), x), params)
  out: dict = {p: [] for p in kernels}
  for name, t in pretrained.hf_tensors(cfg, tree, family).items():
    path = next((p for p, ix in index.items() if t.leaf is ix), None)
    if path is None:
      continue
    if len(t.shape) != 2 or not name.endswith(".weight"):
      raise ValueError(f"{path_str(path)} is written as {name} {list(t.shape)}, not a linear weight")
    rows = XLT.rows(path, np.asarray(index[path]))  # [out, in] view of entry indices
    out_of, in_of = np.empty(rows.size, np.int64), np.empty(rows.size, np.int64)
    out_of[rows.ravel()] = np.repeat(np.arange(rows.shape[0]), rows.shape[1])
    in_of[rows.ravel()] = np.tile(np.arange(rows.shape[1]), rows.shape[0])
    hf = np.asarray(t)
    hf = hf.T if family == "gpt2" else hf  # GPT-2's Conv1D weights are [in, out]
    out_rows, in_cols = out_of[hf[:, 0]], in_of[hf[0, :]]
    assert (out_of[hf] == out_rows[:, None]).all() and (in_of[hf] == in_cols[None, :]).all(), name
    out[path].append((name.removesuffix(".weight"), out_rows, in_cols))
  return out


def to_peft(cfg: model_lib.Config, params, adapters, family: str | None = None,
            base_model: str = "") -> tuple[dict, dict]:
  """(adapter_config.json's dict, {tensor name: array}) of an xlt adapter tree on `params`."""
  by_path = merge.factors(adapters)
  maps = module_maps(cfg, params, by_path, family)
  s = float(np.asarray(adapters["scale"]))
  tensors, ranks = {}, {}
  for path, (a, b) in by_path.items():
    for module, out_rows, in_cols in maps[path]:
      tensors[f"{PREFIX}{module}.lora_A.weight"] = a[:, in_cols].astype(np.float32)
      tensors[f"{PREFIX}{module}.lora_B.weight"] = b[out_rows].astype(np.float32)
      ranks[module] = a.shape[0]
  r = max(set(ranks.values()), key=list(ranks.values()).count)
  other = {m: k for m, k in ranks.items() if k != r}
  conv = (family or pretrained.guess_family(cfg)) == "gpt2"  # Conv1D: PEFT's fan_in_fan_out
  config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model or None,
            "r": r, "lora_alpha": s * math.sqrt(r), "use_rslora": True, "lora_dropout": 0.0, "bias": "none",
            "fan_in_fan_out": conv, "target_modules": _target_modules(cfg, params, set(ranks), family),
            "rank_pattern": {f"^{m}$": k for m, k in other.items()},
            "alpha_pattern": {f"^{m}$": s * math.sqrt(k) for m, k in other.items()},
            "inference_mode": True, "init_lora_weights": True, "modules_to_save": None, "use_dora": False}
  return config, tensors


def _target_modules(cfg, params, adapted: set, family) -> list[str]:
  """PEFT's target_modules for the `adapted` modules: their last names (q_proj, ...) when those
  name exactly them, else the full module names, so peft adapts only these (by last names, an
  adapter of some layers would get fresh adapters on the others' modules, peft warning of
  their missing keys)."""
  from xlt import lora
  short = {m.rsplit(".", 1)[-1] for m in adapted}
  every = {m for mods in module_maps(cfg, params, lora.targets(params), family).values() for m, _, _ in mods}
  named = {m for m in every if m.rsplit(".", 1)[-1] in short}
  return sorted(short) if named == adapted else sorted(adapted)


def save(cfg: model_lib.Config, params, adapters, out_dir: str, *, family: str | None = None,
         base_model: str = "", overwrite: bool = False) -> dict:
  """Writes `adapters` (on `params`, a model of config `cfg`) as a PEFT adapter directory; the
  directory is built aside and renamed into place. Returns the adapter config."""
  config, tensors = to_peft(cfg, params, adapters, family, base_model)
  if os.path.exists(out_dir) and os.listdir(out_dir) and not overwrite:
    raise ValueError(f"{out_dir} exists and is not empty (overwrite=True replaces it)")
  tmp = f"{out_dir.rstrip(os.sep)}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  fileio.write_text(os.path.join(tmp, CONFIG), json.dumps(config, indent=2) + "\n")
  files.save(tensors, os.path.join(tmp, WEIGHTS), {"format": "pt"})
  if os.path.exists(out_dir):
    shutil.rmtree(out_dir)
  os.replace(tmp, out_dir)
  return config


def read(adapter_dir: str, cfg: model_lib.Config, params, *, family: str | None = None) -> dict:
  """The xlt adapter tree of a PEFT LoRA adapter directory for `params` (config `cfg`): a kernel
  written as one module takes its factors (rows and columns reordered); several modules of one
  kernel (q, k and v of a fused qkv) share a lora_A when theirs are equal, else stack their
  ranks. One scale when every module has the same, else each folded into its lora_B (scale 1)."""
  _, modules = merge.read_peft(adapter_dir)
  by_module = _module_index(cfg, params, family)
  unknown = sorted(set(modules) - set(by_module))
  if unknown:
    raise ValueError(f"{adapter_dir}: module {unknown[0]} is no projection of this model xlt maps")
  scales = {m: scaling for m, (_, _, scaling) in modules.items()}
  one = len(set(scales.values())) == 1
  grouped: dict = {}
  for m, (a, b, scaling) in modules.items():
    path, out_rows, in_cols, shape = by_module[m]
    if a.shape[1] != len(in_cols) or b.shape[0] != len(out_rows):
      raise ValueError(f"{os.path.join(adapter_dir, WEIGHTS)}: module {m}'s lora_A {list(a.shape)} and lora_B "
                       f"{list(b.shape)} do not fit its weight [{len(out_rows)}, {len(in_cols)}] (lora_A [r, in], "
                       "lora_B [out, r])")
    grouped.setdefault(path, []).append((a, b * (1.0 if one else scaling), out_rows, in_cols, shape))
  out: dict = {"scale": np.float32(next(iter(scales.values())) if one else 1.0)}
  for path, parts in grouped.items():
    a, b = _factors(parts)
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = {"a": a.astype(np.float32), "b": b.astype(np.float32)}
  return out


def _module_index(cfg, params, family) -> dict:
  """{Hugging Face module: (xlt kernel, out rows, in columns, the kernel's [out, in] shape)} for
  every attn / mlp kernel of the model (the ones xlt's LoRA can adapt)."""
  from xlt import lora
  kernels = lora.targets(params)
  flat = {path_names(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  out = {}
  for path, mods in module_maps(cfg, params, kernels, family).items():
    shape = XLT.rows(path, np.empty(np.shape(flat[path]), np.int8)).shape
    out |= {m: (path, rows, cols, shape) for m, rows, cols in mods}
  return out


def _factors(parts) -> tuple[np.ndarray, np.ndarray]:
  """(a [r, in], b [out, r]) of one kernel from its modules' (A, B, out rows, in columns)."""
  n_out, n_in = parts[0][4]
  shared = all(p[0].shape == parts[0][0].shape and np.array_equal(p[0][:, np.argsort(p[3])],
                                                                  parts[0][0][:, np.argsort(parts[0][3])])
               for p in parts)
  ranks = [p[0].shape[0] for p in parts]
  total = ranks[0] if shared else sum(ranks)
  a, b = np.zeros((total, n_in)), np.zeros((n_out, total))
  start = 0
  for (a_m, b_m, out_rows, in_cols, _), r in zip(parts, ranks):
    cols = slice(0, r) if shared else slice(start, start + r)
    a[cols, in_cols] = a_m
    b[out_rows, cols] = b_m
    start += r
  return a, b


def load(adapter_dir: str, cfg: model_lib.Config, params, *, family: str | None = None, merged: bool = False):
  """A PEFT adapter on `params`: the xlt LoRA composite {"base": params, "lora": adapters}, or
  with merged=True the base with each delta added (xlt.lora.merge_into)."""
  from xlt import lora
  adapters = jax.tree.map(np.asarray, read(adapter_dir, cfg, params, family=family))
  return lora.merge_into(params, adapters) if merged else {"base": params, "lora": adapters}
