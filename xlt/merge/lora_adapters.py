"""Merging LoRA adapters into one adapter, without forming a model: the task arithmetic of their
dense deltas, sum_i lambda_i s_i b_i @ a_i per adapted kernel, kept low-rank.

An adapter tree is xlt.lora's: {"scale": s, <kernel path>: {"a": [r, in], "b": [out, r]}}, the
delta of a kernel s * b @ a in its [out, in] view (xlt.peft_io reads and writes Hugging Face
PEFT adapters as such trees). Two ways to merge:

  concat  a = [a_1; a_2; ...] and b = [lambda_1 s_1 b_1, lambda_2 s_2 b_2, ...] with scale 1: the
          sum exactly, at rank sum_i r_i.
  svd     the truncated SVD of the summed delta at a given rank (U_r S_r as b, V_r^T as a,
          scale 1): the best rank-r approximation of the sum (Eckart-Young), exact when the rank
          reaches the sum's.
  knots   KnOTS: TIES on each adapter's coordinates in the shared singular basis of the deltas
          side by side.

Pure numpy over pytrees (no training code), so it merges adapter files anywhere; a kernel some
adapters lack contributes only from those that have it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from xlt.merge import core
from xlt.param_paths import path_names, path_str


def factors(adapters) -> dict:
  """{kernel path: (a, b)} of an adapter tree (float64 numpy)."""
  found: dict = {}
  for p, x in jax.tree_util.tree_flatten_with_path(adapters)[0]:
    names = path_names(p)
    if names[-1] in ("a", "b"):
      found.setdefault(names[:-1], {})[names[-1]] = np.asarray(x, np.float64)
  return {p: (ab["a"], ab["b"]) for p, ab in found.items()}


def _tree(by_path: dict, scale: float) -> dict:
  out: dict = {"scale": np.float32(scale)}
  for path, (a, b) in by_path.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = {"a": a.astype(np.float32), "b": b.astype(np.float32)}
  return out


def _terms(adapters_list, lambdas) -> tuple[list, dict]:
  """(lambda_i * s_i per adapter, {kernel path: [(i, a, b)]}) after checking the shapes agree."""
  adapters_list = core.expert_list(adapters_list, "adapters")
  lambdas = core.per_expert(lambdas, len(adapters_list), "adapter lambdas")
  weights = [lam * float(np.asarray(ad["scale"])) for lam, ad in zip(lambdas, adapters_list)]
  by_path: dict = {}
  for i, ad in enumerate(adapters_list):
    for path, (a, b) in factors(ad).items():
      if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise ValueError(f"adapter {i}, {path_str(path)}: a {a.shape} and b {b.shape} are not [r, in] and [out, r]")
      first = by_path.setdefault(path, [])
      if first and (first[0][1].shape[1], first[0][2].shape[0]) != (a.shape[1], b.shape[0]):
        raise ValueError(f"{path_str(path)}: adapter {i}'s delta is {b.shape[0]} x {a.shape[1]}, adapter "
                         f"{first[0][0]}'s {first[0][2].shape[0]} x {first[0][1].shape[1]}")
      first.append((i, a, b))
  return weights, by_path


def concat(adapters_list, lambdas: float | Sequence[float] = 1.0) -> dict:
  """One adapter whose delta is exactly sum_i lambda_i * (adapter i's delta): the factors side by
  side (rank: the sum of the ranks), each b times lambda_i s_i, scale 1.

  lambdas: the task-arithmetic scale of each adapter's delta, one for all or one per adapter.
  """
  weights, by_path = _terms(adapters_list, lambdas)
  merged = {path: (np.concatenate([a for _, a, _ in terms]), np.concatenate([weights[i] * b for i, _, b in terms],
                                                                            axis=1))
            for path, terms in by_path.items()}
  return _tree(merged, 1.0)


def svd(adapters_list, rank: int, lambdas: float | Sequence[float] = 1.0) -> dict:
  """One adapter of rank at most `rank` per kernel: the truncated SVD of sum_i lambda_i *
  (adapter i's delta), b = U_r diag(S_r), a = V_r^T, scale 1 (the best rank-r approximation of
  the summed delta; exact when `rank` reaches its rank). Computed from the factors' QR
  decompositions, so no [out, in] matrix is formed.

  rank: a positive integer (a kernel whose summed delta is smaller keeps min(out, in)).
  lambdas: the task-arithmetic scale of each adapter's delta, one for all or one per adapter.
  """
  if int(rank) != rank or rank < 1:
    raise ValueError(f"adapter SVD rank must be a positive integer, got {rank}")
  weights, by_path = _terms(adapters_list, lambdas)
  merged = {}
  for path, terms in by_path.items():
    a = np.concatenate([a for _, a, _ in terms])  # [R, in]
    b = np.concatenate([weights[i] * b for i, _, b in terms], axis=1)  # [out, R]: the sum is b @ a
    qb, rb = np.linalg.qr(b)  # b = qb rb, a^T = qa ra: b @ a = qb (rb ra^T) qa^T
    qa, ra = np.linalg.qr(a.T)
    u, s, vt = np.linalg.svd(rb @ ra.T)
    k = min(int(rank), len(s))
    merged[path] = ((vt[:k] @ qa.T), (qb @ u[:, :k]) * s[:k])
  return _tree(merged, 1.0)


def delta(adapters, path) -> np.ndarray:
  """The dense [out, in] delta s * b @ a of one kernel (float64): what the merges are checked by."""
  a, b = factors(adapters)[tuple(path)]
  return float(np.asarray(adapters["scale"])) * (b @ a)


def knots(adapters_list, *, density: float = 1.0, lambdas: float | Sequence[float] = 1.0) -> dict:
  """KnOTS (Stoica et al. 2025, Model merging with SVD to tie the KnOTS): the adapters' deltas
  aligned in one basis, then TIES-merged there. Per kernel, the SVD of the deltas side by side,
  [d_1 ... d_n] = U S [V_1; ...; V_n]^T, gives each adapter's coordinates V_i in the shared basis
  U S; TIES (trim to `density` per V_i, elect each entry's sign, disjoint mean: xlt.merge.combine's
  ties in its "xlt" convention) merges the V_i, and the adapter is b = U S, a = V_merged^T at
  the rank of the deltas side by side (the sum of the ranks), scale 1.

  density: in (0, 1], the fraction of each V_i's entries kept by magnitude (1: no trim).
  lambdas: the scale of each adapter's delta before the alignment.
  """
  from xlt.merge import combine  # TIES on the coordinates
  weights, by_path = _terms(adapters_list, lambdas)
  merged = {}
  for path, terms in by_path.items():
    b = np.concatenate([weights[i] * b for i, _, b in terms], axis=1)  # [out, R]
    qb, rb = np.linalg.qr(b)
    blocks, start = [], 0  # rb @ blockdiag(a_i): the deltas side by side in qb's basis, [R, n * in]
    for _, a, _ in terms:
      blocks.append(rb[:, start:start + a.shape[0]] @ a)
      start += a.shape[0]
    u, s, vt = np.linalg.svd(np.concatenate(blocks, axis=1), full_matrices=False)
    coords = [{"v": v} for v in np.split(vt, len(terms), axis=1)]  # V_i^T: [R, in] each
    zero = {"v": np.zeros_like(coords[0]["v"])}
    v = combine.ties(zero, coords, density=density, convention="xlt")["v"]
    merged[path] = (v, (qb @ u) * s)
  return _tree(merged, 1.0)


# ---- PEFT adapter files, by Hugging Face module name (xlt.peft_io maps them onto xlt's kernels)

PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PEFT's name of the wrapped model's modules
MAX_CONFIG_BYTES, MAX_WEIGHTS_BYTES = 1 << 20, 1 << 34


def read_peft(adapter_dir: str) -> tuple[dict, dict]:
  """(adapter_config.json, {module name: (A [r, in], B [out, r], scaling)}) of a PEFT LoRA adapter
  directory, float64, each scaling PEFT's (lora_alpha / sqrt(r) with use_rslora, else / r;
  alpha_pattern per module). Only plain LoRA on linear modules is read: anything else (DoRA,
  biases, embedding factors, saved modules) is a one-line ValueError; sizes are checked first."""
  import json
  import os
  from xlt.io import fileio
  from xlt.io import tensor_files as files
  path = os.path.join(adapter_dir, PEFT_CONFIG)
  if not os.path.isfile(path):
    raise ValueError(f"{adapter_dir} is not a PEFT adapter: no {PEFT_CONFIG}")
  fileio.check_size(path, MAX_CONFIG_BYTES)
  with open(path) as f:
    try:
      config = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not JSON: {e}") from None
  if config.get("peft_type") != "LORA" or config.get("use_dora") or config.get("bias", "none") != "none":
    raise ValueError(f"{path}: only plain LoRA adapters are read (peft_type LORA, no DoRA, bias none)")
  _check_fields(path, config)
  weights = os.path.join(adapter_dir, PEFT_WEIGHTS)
  fileio.check_size(weights, MAX_WEIGHTS_BYTES)
  modules: dict = {}
  for name, x in files.load(weights, lazy=False).items():
    if not name.startswith(PEFT_PREFIX) or not name.endswith((".lora_A.weight", ".lora_B.weight")):
      raise ValueError(f"{weights}: tensor {name} is not a LoRA factor of a linear module (embedding, "
                       "DoRA and saved modules are not read)")
    module, which = name[len(PEFT_PREFIX):].rsplit(".lora_", 1)
    modules.setdefault(module, {})[which[0]] = np.asarray(x, np.float64)
  if bad := next((m for m, ab in modules.items() if set(ab) != {"A", "B"}), None):
    raise ValueError(f"{weights}: module {bad} has {sorted(modules[bad])} of the factors A and B")
  for m, ab in modules.items():
    _check_factors(weights, config, m, ab["A"], ab["B"])
  return config, {m: (ab["A"], ab["B"], _peft_scaling(config, m, ab["A"].shape[0])) for m, ab in modules.items()}


# LoraConfig fields (peft 0.21) that change what an adapter computes, or what base it applies to,
# and that xlt does not model: each must have its default (None, False or empty), else the adapter
# is refused rather than applied as plain LoRA
_UNMODELLED = ("alora_invocation_tokens", "layer_replication", "target_parameters", "trainable_token_indices",
               "modules_to_save", "lora_bias", "use_qalora", "use_bdlora", "megatron_config", "loftq_config",
               "velora_config", "monteclora_config", "kasa_config", "arrow_config")
# init_lora_weights: these only draw the factors; PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA also change
# the base's weights, so their adapter applies to a base that is not the one it names
_INITS = (True, False, "gaussian", "eva", "orthogonal")


def _check_fields(path: str, config: dict):
  for field in _UNMODELLED:
    if config.get(field) not in (None, False, {}, [], ""):
      raise ValueError(f"{path}: {field}={config[field]!r} is a LoRA variant xlt does not model (only plain LoRA "
                       "adapters are read)")
  init = config.get("init_lora_weights", True)
  if init not in _INITS:
    raise ValueError(f"{path}: init_lora_weights={init!r} changes the base's weights, which xlt does not model "
                     f"(plain LoRA initialisations: {', '.join(map(repr, _INITS))})")


def _pattern_key(patterns: dict, module: str):
  """The first key of peft's rank_pattern / alpha_pattern that matches `module` as peft matches
  it (peft.utils.other.get_pattern_key: the key grouped, after any dotted prefix), or None."""
  import re
  return next((k for k in patterns or {} if re.match(rf"(.*\.)?({k})$", module)), None)


def _targeted(config: dict, module: str) -> bool:
  """Whether peft adapts `module` by this config (peft's check_target_module_exists: excluded
  modules first; target_modules a regex matched whole, or names matched whole or as a dotted
  suffix, a suffix match then filtered by layers_to_transform: the first index after
  layers_pattern, or after any name, in the module's path)."""
  import re
  exclude, targets = config.get("exclude_modules"), config.get("target_modules")
  if exclude and (re.fullmatch(exclude, module) if isinstance(exclude, str)
                  else module in exclude or any(module.endswith("." + e) for e in exclude)):
    return False
  if targets is None or targets == "all-linear":
    return True
  if isinstance(targets, str):
    return re.fullmatch(targets, module) is not None
  if module in targets:
    return True
  if not any(module.endswith("." + t) for t in targets):
    return False
  layers = config.get("layers_to_transform")
  if layers is None or layers == []:
    return True
  pattern = config.get("layers_pattern")
  if not pattern:
    found = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module)
  else:
    found = next((m for p in ([pattern] if isinstance(pattern, str) else pattern)
                  if (m := re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", module))), None)
  if found is None:
    return False
  return int(found["idx"]) == layers if isinstance(layers, int) else int(found["idx"]) in layers


def _check_factors(weights: str, config: dict, module: str, a, b):
  """A [r, in] and B [out, r] of `module` as the config says: r its rank_pattern's or r, and a
  module the config adapts; each error names the file and the module."""
  if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
    raise ValueError(f"{weights}: module {module}'s lora_A {list(a.shape)} and lora_B {list(b.shape)} are not "
                     "[r, in] and [out, r]")
  key = _pattern_key(config.get("rank_pattern"), module)
  r = config["rank_pattern"][key] if key is not None else config.get("r", a.shape[0])
  if int(r) != a.shape[0]:
    where = f"rank_pattern[{key!r}]" if key is not None else "r"
    raise ValueError(f"{weights}: module {module} has rank-{a.shape[0]} factors, adapter_config.json's {where} "
                     f"says {r}")
  if not _targeted(config, module):
    raise ValueError(f"{weights}: module {module} has LoRA factors that adapter_config.json does not target "
                     "(target_modules / exclude_modules / layers_to_transform): peft would not load them")


def _peft_scaling(config: dict, module: str, rank: int) -> float:
  key = _pattern_key(config.get("alpha_pattern"), module)
  alpha = config["alpha_pattern"][key] if key is not None else config.get("lora_alpha", 8)
  return float(alpha) / (np.sqrt(rank) if config.get("use_rslora") else rank)


def with_peft(tensors: dict, adapter_dir: str) -> dict:
  """Hugging Face-named tensors with a PEFT LoRA adapter merged in: each adapted module's weight
  plus scaling * B @ A ([out, in]; its transpose for GPT-2's Conv1D [in, out], PEFT's
  fan_in_fan_out), in the weight's dtype; the other tensors as they are (mergekit's
  `model+adapter` reference)."""
  _, modules = read_peft(adapter_dir)
  out = dict(tensors)
  for module, (a, b, scaling) in modules.items():
    name = next((n for n in (f"{module}.weight", f"{module.split('.', 1)[-1]}.weight") if n in tensors), None)
    if name is None:
      raise ValueError(f"{adapter_dir}: the adapter's module {module} has no weight in the model")
    w = np.asarray(tensors[name])
    d = scaling * (b @ a)
    if d.shape != w.shape:
      if d.T.shape != w.shape:
        raise ValueError(f"{adapter_dir}: {module}'s delta is {d.shape}, its weight {w.shape}")
      d = d.T
    out[name] = (w.astype(np.float64) + d).astype(w.dtype)
  return out
