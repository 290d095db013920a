"""Hugging Face decoders in and out of xlt: `load` reads a model directory (config.json and
safetensors, one file or shards) into xlt's decoder (xlt.model), `save` writes one back.

  cfg, params = pretrained.load("path/to/Llama-3.2-1B", mesh=mesh)
  pretrained.save(cfg, params, "out", source_dir="path/to/Llama-3.2-1B")

Families: llama (2, 3.x with llama3 rope scaling), mistral, qwen2, qwen3, gemma, gemma2, gpt2, starcoder2,
one record each in xlt.families (config.json both ways, weight table, detection). What each
computes, and so which model.Config options it maps to, is in docs/families.md; the logits
equal transformers' (tests/test_pretrained.py).

Each family's table is {xlt path: Map}: the Hugging Face tensor(s) behind one xlt leaf and
their layout. The families with torch Linear layers load as `dense_layout="weight"` models
(xlt.model.Config): their [out, in] weights are xlt's [out..., in...] weight leaves as stored
(the axes split into heads by a reshape); GPT-2's Conv1D weights [in, out] are xlt's [in...,
out...] kernels as stored. A leaf in the other layout is transposed on the way (an own model
saved as a Llama). q, k and v stack into the fused qkv kernel [D, 3, H, K] of a kernel model
with as many key/value heads as query heads (a weight model keeps them apart). A tied lm_head
is not a tensor (the embedding table serves).

Loading maps the files and places one leaf at a time (`_place`): a tensor stored as xlt holds it
is a view of the file (on a CPU, the parameter itself); any other is copied once, transposed and
cast, into the parameter's buffer, its file pages dropped as they are copied, so the host holds
the model plus a few chunks. Saving reads one leaf per written tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from xlt import hf_sizes
from xlt import model
from xlt import param_paths as paths
from xlt import sharding
from xlt.families import BY_NAME, Map, of_config, of_config_json
from xlt.io import hf_dir, placement, tensor_files

FAMILIES = tuple(BY_NAME)  # xlt.families' records, in detection order
ARCHITECTURES = {name: f.architecture for name, f in BY_NAME.items()}
DTYPES = ("float32", "bfloat16", "float16")
# buffers some checkpoints carry that are not parameters (rotary tables, GPT-2's causal mask)
_BUFFERS = re.compile(r"(rotary_emb\.inv_freq|attn\.bias|attn\.masked_bias)$")


def family_of(hf: dict) -> str:
  """The family of a config.json: its model_type, else its architecture."""
  return of_config_json(hf).name


def config_from_hf(hf: dict, *, dtype: str | None = None) -> model.Config:
  """The model.Config of a Hugging Face config.json (dict). `dtype` (compute and parameter
  dtype) defaults to the config's own, else float32."""
  family = of_config_json(hf)
  dtype = str(dtype or hf.get("dtype") or hf.get("torch_dtype") or "float32")
  if dtype not in DTYPES:
    raise ValueError(f"dtype {dtype!r} is not supported: xlt.pretrained loads {', '.join(DTYPES)}")
  return family.from_hf(hf, dtype, bool(hf.get("tie_word_embeddings", family.tied)))


def guess_family(cfg: model.Config) -> str:
  """The family whose config.json describes `cfg`, for a model with no Hugging Face config."""
  return of_config(cfg).name


def config_to_hf(cfg: model.Config, family: str, base: dict | None = None) -> dict:
  """A config.json (dict) for `cfg` as a `family` model: `base`'s entries (token ids, ...)
  with every entry that decides the computation set from `cfg` (the family's `to_hf`)."""
  record = BY_NAME[family]
  out = dict(base or {}, model_type=family, architectures=[record.architecture], vocab_size=cfg.vocab_size,
             tie_word_embeddings=cfg.tie_embeddings, dtype=cfg.param_dtype)
  return out | record.to_hf(cfg)


def _normal(cfg: model.Config) -> model.Config:
  """`cfg` with every option spelt one way (defaults resolved), so that two configs that build
  the same model compare equal."""
  local = tuple(i for i in range(cfg.num_layers) if cfg.window(i))
  return dataclasses.replace(
      cfg, mlp_dim=cfg.mlp_width, mlp_ratio=4, head_dim=cfg.head_width, num_kv_heads=cfg.kv_heads, dropout=0.0,
      qkv_bias=cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias, sliding_window=cfg.sliding_window if local else 0,
      sliding_layers=local or None, rope_base=cfg.rope_base if cfg.pos_embedding == "rope" else 10000.0,
      dense_layout="kernel")  # a layout, not a computation: either saves as the family's tensors


# ---- the tables: {xlt path: families.Map}


def table(cfg: model.Config, family: str, shapes: dict) -> dict:
  """{xlt path: Map} for the leaves of `shapes` ({path: shape-like}); every leaf has one."""
  full = BY_NAME[family].table(cfg)
  missing = [paths.path_str(p) for p in shapes if p not in full]
  if missing:
    raise ValueError(f"xlt parameter {missing[0]} has no {family} tensor: this config is not a {family} model")
  return {p: full[p] for p in shapes}


def _leaf_2d(m: Map, name: str, shape: tuple[int, ...]) -> tuple[int, int]:
  """The xlt leaf `name` of `shape` as 2-D, its input axes and its other axes each flattened,
  in its own order: a kernel is [in..., out...], a weight [out..., in...]."""
  split = len(shape) - m.num_in if name == "weight" else m.num_in
  return math.prod(shape[:split]), math.prod(shape[split:])


def _hf_shape(m: Map, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The shape of each of `m`'s Hugging Face tensors for an xlt leaf `name` of `shape`."""
  if m.stack is not None:
    shape = shape[:m.stack] + shape[m.stack + 1:]
  if m.layout == "copy" and m.num_in:
    return tuple(shape)
  if m.num_in == 0:
    return (math.prod(shape),)
  two = _leaf_2d(m, name, shape)
  return two[::-1] if _transposed(m, name) else two


def _to_hf(m: Map, name: str, x: np.ndarray) -> list[np.ndarray]:
  if m.stack is not None:
    one = dataclasses.replace(m, stack=None)
    return [_to_hf(one, name, np.take(x, i, axis=m.stack))[0] for i in range(len(m.names))]
  shape = _hf_shape(m, name, x.shape)
  if _transposed(m, name):
    return [np.ascontiguousarray(x.reshape(shape[::-1]).T)]
  return [np.ascontiguousarray(x.reshape(shape))]


# ---- reading and writing


def _tensor(tensors: dict, name: str, path: str):
  """The tensor `name`, also when saved without the model's prefix (a bare LlamaModel or
  GPT2Model names its tensors layers.{i}... / h.{i}...)."""
  for key in (name, re.sub(r"^(model|transformer)\.", "", name)):
    if key in tensors:
      return tensors[key]
  raise ValueError(f"{path} has no tensor {name}")


def _file_dtype(tensors: dict) -> str:
  """The dtype the checkpoint's float tensors share (float32 when they differ)."""
  params = {k: x for k, x in tensors.items() if not _BUFFERS.search(k)}
  names = {np.dtype(x.dtype).name for x in params.values()}
  bad = sorted(n for n in names if n not in DTYPES)
  if bad:
    name = next(k for k, x in params.items() if np.dtype(x.dtype).name == bad[0])
    raise ValueError(f"tensor {name} has dtype {bad[0]}: xlt.pretrained reads {', '.join(DTYPES)}")
  return names.pop() if len(names) == 1 else "float32"


@functools.lru_cache(maxsize=16)
def _one_block(cfg: model.Config):
  """(shapes, logical axes) of a one-block model of `cfg`: every block of a model has the same
  parameters (windows and layer indices change no shape), so block_0 stands for each, and
  tracing one block instead of all of them takes a large model's shapes in a fraction of the
  time. tests/test_pretrained.py checks the result against the whole model's."""
  one = dataclasses.replace(cfg, num_layers=1, sliding_window=0, sliding_layers=None)
  shapes = jax.eval_shape(lambda: model.init_params(one, jax.random.key(0)))
  return shapes, model.logical_axes(one)


def _per_layer(cfg: model.Config, tree: dict) -> dict:
  return {k: v for k, v in tree.items() if k != "block_0"} | {f"block_{i}": tree["block_0"]
                                                               for i in range(cfg.num_layers)}


def _leaf_shapes(cfg: model.Config) -> dict:
  """{leaf path: shape} of `cfg`'s parameters."""
  shapes = _per_layer(cfg, _one_block(cfg)[0])
  return {paths.path_names(p): tuple(s.shape) for p, s in jax.tree_util.tree_flatten_with_path(shapes)[0]}


def _leaf_axes(cfg: model.Config):
  """model.logical_axes(cfg), from one block."""
  return _per_layer(cfg, _one_block(cfg)[1])


def _nest(flat: dict) -> dict:
  tree = {}
  for path, x in flat.items():
    node = tree
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = x
  return tree


def load(path: str, *, mesh=None, rules=None, dtype: str | None = None, dense_layout: str | None = None):
  """(model.Config, params) of the Hugging Face model directory `path`.

  mesh / rules: place each parameter with its sharding (xlt.sharding.param_shardings of
    model.logical_axes; rules default to sharding.DEFAULT_RULES) as it is read; without a mesh,
    on the default device. The params have no ensemble axis. When the mesh's share of the
    vocabulary axis does not divide the vocabulary (GPT-2's 50257 over tensor=2), the
    embedding and head are padded with zero rows up to a multiple (cfg.vocab_padding, as
    MaxText pads), which the logits never show and `save` cuts off.
  dtype: float32, bfloat16 or float16 for the parameters and the computation; default the
    checkpoint's.
  dense_layout: "kernel" or "weight" (model.Config.dense_layout); default the family's, the
    layout its files hold (no transpose): "weight" for torch Linear layers, "kernel" for GPT-2.
  Every tensor's shape is checked against the config; a tensor the model does not use (besides
  rotary/mask buffers and a tied lm_head) is an error, as is a missing one."""
  hf, tensors = hf_dir.read_model_dir(path)
  hf_sizes.check(hf, tensors, path)  # before any shape is built from config.json
  cfg = config_from_hf(hf, dtype=dtype or _file_dtype(tensors))
  if dense_layout is not None:
    if dense_layout == "weight" and family_of(hf) == "gpt2":  # weights are never fused (model._qkv)
      raise ValueError(f"{path}: gpt2 holds q, k and v in one Conv1D tensor (c_attn), so it loads as kernels "
                       "only (dense_layout='kernel')")
    cfg = dataclasses.replace(cfg, dense_layout=dense_layout)
  if mesh is not None:
    cfg = dataclasses.replace(cfg, vocab_padding=vocab_padding(cfg.vocab_size, mesh, rules or sharding.DEFAULT_RULES))
  family, shapes = family_of(hf), _leaf_shapes(cfg)
  maps = table(cfg, family, shapes)
  used = {n for m in maps.values() for n in m.names}
  extra = sorted(n for n in tensors if not _BUFFERS.search(n) and n not in used and
                 not any(n == re.sub(r"^(model|transformer)\.", "", u) for u in used) and
                 not (cfg.tie_embeddings and n == "lm_head.weight"))
  if extra:
    raise ValueError(f"{path}: tensor {extra[0]} is not a parameter of this {family} config "
                     f"({len(extra)} such tensor(s))")
  wheres = dict.fromkeys(shapes)
  if mesh is not None:
    specs = sharding.param_shardings(_leaf_axes(cfg), mesh, rules or sharding.DEFAULT_RULES, ensemble=False)
    wheres = {paths.path_names(p): s for p, s in jax.tree_util.tree_flatten_with_path(specs)[0]}
  sources = {}
  for leaf, m in maps.items():
    sources[leaf] = arrays = [_tensor(tensors, n, path) for n in m.names]
    want = _hf_shape(m, leaf[-1], _unpadded(cfg, leaf, shapes[leaf]))
    for n, a in zip(m.names, arrays):
      if tuple(a.shape) != want:
        raise ValueError(f"tensor {n}: expected shape {list(want)} (for xlt's {paths.path_str(leaf)} "
                         f"{list(shapes[leaf])}), found {list(a.shape)}")
  out, mapped, dtype = {}, tensor_files.Mapped(), np.dtype(cfg.param_dtype)
  with placement.Copier() as copier:
    # each copied leaf's buffer is allocated while the previous leaf is copied
    specs = [None if _is_view(cfg, leaf, m, sources[leaf], shapes[leaf]) else (shapes[leaf], dtype) for leaf, m in
             maps.items()]
    for (leaf, m), host in zip(maps.items(), copier.buffers(specs)):
      out[leaf] = _place(cfg, leaf, m, sources[leaf], shapes[leaf], host, wheres[leaf], mapped, copier)
  check_finite(out, maps, path)
  return cfg, _nest(out)


@functools.lru_cache(maxsize=8)
def _finite_fn(stacks: tuple):
  """One jitted program over every leaf: whether each is finite (per Hugging Face tensor of a
  stacked leaf: every axis but `stack` reduced)."""
  stack_of = dict(stacks)

  def finite(tree):
    return {k: jnp.all(jnp.isfinite(x), axis=tuple(a for a in range(x.ndim) if a != stack_of[k]))
            for k, x in tree.items()}

  return jax.jit(finite)


def check_finite(params: dict, maps: dict, path: str) -> None:
  """A ValueError naming the first Hugging Face tensor of `path` that holds a NaN or an
  infinity, which would otherwise pass silently through fine-tuning, decoding and merging:
  one reduction per tensor on the devices that hold it, one small transfer back."""
  floats = {k: x for k, x in params.items() if jnp.issubdtype(x.dtype, jnp.floating)}
  stacks = tuple(sorted((k, maps[k].stack) for k in floats))
  ok = jax.device_get(_finite_fn(stacks)(floats))
  for leaf, m in maps.items():
    if leaf in ok and not np.all(ok[leaf]):
      bad = m.names[int(np.argmin(np.atleast_1d(ok[leaf])))]
      raise ValueError(f"{path}: tensor {bad} holds NaN or infinite values")


def vocab_padding(vocab: int, mesh, rules=sharding.DEFAULT_RULES) -> int:
  """The rows to add to a `vocab`-row embedding (and head) so that the mesh axes `rules` put
  the vocabulary on divide it: 0 when they already do."""
  axes = dict(rules).get("vocab")
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  shards = math.prod(dict(mesh.shape).get(a, 1) for a in axes)
  return -vocab % shards


def pad_vocab(cfg: model.Config, params, mesh, rules=sharding.DEFAULT_RULES):
  """(cfg, params) with the embedding and head padded as `load(mesh=...)` pads them, for params
  loaded without a mesh and placed on one later (decode.place, training's sharding)."""
  pad = vocab_padding(cfg.vocab_size, mesh, rules) if not cfg.vocab_padding else 0
  if not pad:
    return cfg, params
  out = dict(params, wte=dict(params["wte"], embedding=jnp.pad(params["wte"]["embedding"], ((0, pad), (0, 0)))))
  if "lm_head" in params:  # a kernel [D, V] pads its columns, a weight [V, D] its rows
    name, = params["lm_head"]
    widths = ((0, 0), (0, pad)) if name == "kernel" else ((0, pad), (0, 0))
    out["lm_head"] = {name: jnp.pad(params["lm_head"][name], widths)}
  return dataclasses.replace(cfg, vocab_padding=pad), out


def _unpadded(cfg: model.Config, leaf: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The shape of `leaf` without the vocabulary padding: what the checkpoint holds."""
  if cfg.vocab_padding and leaf in (("wte", "embedding"), ("lm_head", "weight")):
    return (shape[0] - cfg.vocab_padding,) + tuple(shape[1:])
  if cfg.vocab_padding and leaf == ("lm_head", "kernel"):
    return tuple(shape[:-1]) + (shape[-1] - cfg.vocab_padding,)
  return tuple(shape)


def _transposed(m: Map, name: str) -> bool:
  """Whether the leaf `name` holds its tensors transposed (a torch Linear's [out, in] as an
  [in, out] kernel, a Conv1D's [in, out] as a weight): copied on load, never a view of the file."""
  return m.layout != "copy" and m.num_in > 0 and (m.layout == "linear") == (name == "kernel")


def _is_view(cfg, leaf, m: Map, arrays: list, shape: tuple[int, ...]) -> bool:
  """Whether the leaf is its one Hugging Face tensor as stored: the same layout, shape and dtype,
  and ALIGN-aligned in its file (the mapping starts on a page), so a view of the file is it."""
  a = arrays[0]
  return (m.stack is None and not _transposed(m, leaf[-1]) and _unpadded(cfg, leaf, shape) == tuple(shape)
          and a.dtype == np.dtype(cfg.param_dtype) and a.offset is not None and a.offset % placement.ALIGN == 0)


def _place(cfg, leaf, m: Map, arrays: list, shape: tuple[int, ...], host, where, mapped, copier):
  """One leaf on its device(s) from its Hugging Face tensors `arrays`. A tensor stored as the
  leaf is (`_is_view`; `host` None) is handed to jax as a view of the mapped file: on a CPU
  without a mesh that is the parameter, with no copy at all (as transformers maps its tensors).
  Any other is copied once, transposed and cast on the way, into the aligned host buffer `host`
  (the leaf's shape and dtype), in chunks over every core (placement.Copier), each chunk's file
  pages dropped once copied; that buffer is the parameter on a CPU, or what the devices' shards
  are copied from."""
  views = [mapped.view(a) for a in arrays]
  if host is None:
    x = jax.device_put(views[0].reshape(shape), where)
    if not placement.aliases(x, views[0]):
      jax.block_until_ready(x)
      mapped.release(arrays[0])
    return x
  stored = _unpadded(cfg, leaf, shape)
  inner = host[tuple(slice(0, n) for n in stored)]
  for axis, n in enumerate(stored):  # the vocabulary padding: zero rows (or columns) no logit shows
    if n < host.shape[axis]:
      host[(slice(None),) * axis + (slice(n, None),)] = 0
  transposed = _transposed(m, leaf[-1])
  jobs = []
  for i, (a, v) in enumerate(zip(arrays, views)):
    member = inner if m.stack is None else inner[(slice(None),) * m.stack + (i,)]
    jobs.append((_dst_2d(m, leaf[-1], member), v.reshape(v.shape[0], -1) if v.ndim else v.reshape(1, 1),
                 transposed, functools.partial(mapped.release, a)))
  copier.run(jobs)
  x = jax.device_put(host, where)
  if not placement.aliases(x, host):
    jax.block_until_ready(x)
  return x


def _dst_2d(m: Map, name: str, member: np.ndarray) -> np.ndarray:
  """`member` (one Hugging Face tensor's part of the leaf `name`) as the 2-D view the tensor's
  rows (or, when `_transposed`, columns) are copied into, without a copy."""
  shape = _leaf_2d(m, name, member.shape) if m.num_in else (member.size, 1)
  view = member.view()
  view.shape = shape  # raises rather than copy: every table's member is a reshapable view
  return view


def abstract(path: str, *, dtype: str | None = None):
  """(model.Config, the params' shapes and dtypes as jax.ShapeDtypeStruct) of the model
  directory `path`, from config.json and the safetensors headers alone: no weight is read, so
  a memory estimate can refuse a model before it loads (`load`'s dtype argument)."""
  hf, tensors = hf_dir.read_model_dir(path)
  hf_sizes.check(hf, tensors, path)
  return abstract_of_config(hf, dtype=dtype or _file_dtype(tensors))


def abstract_of_config(hf: dict, *, dtype: str | None = None):
  """(model.Config, the params' shapes and dtypes) of a Hugging Face config.json (dict) alone,
  without weight files (xlt.plan): `dtype` defaults to the config's own."""
  cfg = config_from_hf(hf, dtype=dtype)
  return cfg, _per_layer(cfg, _one_block(cfg)[0])


class _HfTensor:
  """One Hugging Face tensor of an xlt leaf, computed when written (np.asarray), so a save
  holds one leaf on the host at a time."""

  def __init__(self, m: Map, name: str, leaf, index: int, shape: tuple[int, ...], stored: tuple[int, ...]):
    self.m, self.leaf_name, self.leaf, self.index, self.shape, self.stored = m, name, leaf, index, shape, stored
    self.dtype = np.dtype(leaf.dtype)

  def __array__(self, dtype=None, copy=None):
    x = np.asarray(self.leaf)[tuple(slice(0, n) for n in self.stored)]  # without the vocabulary padding
    x = _to_hf(self.m, self.leaf_name, x)[self.index]
    return x if dtype is None else x.astype(dtype)


def hf_tensors(cfg: model.Config, params, family: str) -> dict:
  """{Hugging Face name: lazy tensor} of xlt params (one model: no ensemble axis)."""
  flat = {paths.path_names(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  shapes = _leaf_shapes(cfg)
  if set(flat) != set(shapes) or any(tuple(flat[p].shape) != s for p, s in shapes.items()):
    bad = next(p for p in shapes if p not in flat or tuple(flat[p].shape) != shapes[p])
    raise ValueError(f"params do not fit the config: {paths.path_str(bad)} should be {list(shapes[bad])}, is "
                     f"{list(flat[bad].shape) if bad in flat else 'missing'} (one model's params, no ensemble axis)")
  out = {}
  for leaf, m in table(cfg, family, shapes).items():
    stored = _unpadded(cfg, leaf, shapes[leaf])
    for i, name in enumerate(m.names):
      out[name] = _HfTensor(m, leaf[-1], flat[leaf], i, _hf_shape(m, leaf[-1], stored), stored)
  return out


def save(cfg: model.Config, params, out_dir: str, *, hf_config: dict | None = None, source_dir: str | None = None,
         max_shard_bytes: int | str = hf_dir.DEFAULT_MAX_SHARD_BYTES, dtype: str | None = None,
         card: dict | None = None, overwrite: bool = False) -> dict:
  """Writes xlt params as a Hugging Face model directory (xlt.io.hf_dir.write_model_dir: the
  weights in format pt, one file or shards + index, config.json, a card); returns its summary.

  hf_config / source_dir: the config.json to start from (token ids, ...): the given dict, else
    source_dir's; source_dir's tokenizer files are copied. Without either, the family comes
    from `guess_family(cfg)`. The entries that decide the computation are written from `cfg`
    (`config_to_hf`), and `cfg` must be what that config loads as (ValueError otherwise).
  dtype: the tensors' dtype (float32, bfloat16, float16); default the params'.
  overwrite: as write_model_dir's (replace a non-empty directory xlt did not write)."""
  if dtype is not None and str(dtype) not in DTYPES:
    raise ValueError(f"dtype {dtype!r} is not supported: xlt.pretrained writes {', '.join(DTYPES)}")
  base = hf_config if hf_config is not None else (
      hf_dir.read_model_dir(source_dir)[0] if source_dir is not None else None)
  family = family_of(base) if base and (base.get("model_type") or base.get("architectures")) else guess_family(cfg)
  out_dtype = str(dtype or cfg.param_dtype)
  config = config_to_hf(cfg, family, base)  # write_model_dir sets its dtype (and torch_dtype) to the tensors'
  back = config_from_hf(config, dtype=cfg.param_dtype)
  mine = _normal(dataclasses.replace(cfg, dtype=cfg.param_dtype, vocab_padding=0))  # save cuts the padding
  if _normal(back) != mine:
    diff = [f.name for f in dataclasses.fields(mine) if getattr(mine, f.name) != getattr(_normal(back), f.name)]
    raise ValueError(f"this config is not a {family} model: {', '.join(diff)} differ from what its config.json "
                     f"describes ({', '.join(f'{k}={getattr(mine, k)!r}' for k in diff)})")
  return hf_dir.write_model_dir(hf_tensors(cfg, params, family), out_dir, source_dir=source_dir, config=config,
                                max_shard_bytes=max_shard_bytes, dtype=out_dtype,
                                card=card or {"method": "xlt.pretrained.save", "family": family}, overwrite=overwrite)
