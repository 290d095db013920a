"""Hugging Face model directories: what a merge (or a trained model) is written as, so that
`transformers.AutoModelForCausalLM.from_pretrained(dir)` loads it, and how one is read back.

A directory written here holds
  config.json               from the source model (or a given dict): model_type and
                            architectures tell transformers which class to build
  tokenizer files           copied from the source model, whichever it has (TOKENIZER_FILES)
  model.safetensors         every tensor, with {"format": "pt"} metadata (transformers 4.x
                            refuses a header that has metadata but not this), or, above
                            max_shard_bytes,
  model-0000k-of-0000n.safetensors + model.safetensors.index.json (name -> shard)
  README.md                 a model card: the inputs, method and options that made it

Nothing is ever half written: the directory is built under a hidden temporary sibling
(.tmp_<name>_*) and renamed into place once complete; a previous output is moved aside
(.old_<name>_*) and deleted only after the new one is in place. A process killed mid-way
leaves that hidden sibling behind, never a broken `out_dir`; the siblings' names carry the
writing process's id, so the next write of the same `out_dir` removes those whose process is
gone (saying so on stderr), and names any it cannot tell are stale (`remove_stale`).

Tensors are written one at a time by `tensor_files.save`, so a tree of
`tensor_files.LazyTensor`s (or any leaf that becomes an array on `np.asarray`) is read tensor
by tensor: peak memory is about one tensor beyond what the caller holds.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import struct
import sys

import numpy as np

from xlt.io import fileio, tensor_files

# Files of a Hugging Face model directory that are not weights or config.json, copied from
# `source_dir` when present: tokenizers (fast, sentencepiece, GPT-2 BPE), generation defaults
# and chat templates (transformers >= 4.43 may keep the template in its own file).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json",
                   "chat_template.jinja", "chat_template.json")
TOKENIZER_DIRS = ("additional_chat_templates",)  # transformers' named extra chat templates

CONFIG, SINGLE, INDEX, CARD = "config.json", "model.safetensors", "model.safetensors.index.json", "README.md"
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30
_TAG = "xlt"  # the model card's tag that marks a directory as xlt's output (safe to replace)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def write_model_dir(tensors: dict, out_dir: str, *, source_dir: str | None = None, config: dict | None = None,
                    max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES, card: dict | None = None,
                    dtype: str | None = None, metadata: dict | None = None, overwrite: bool = False,
                    weights_only: bool = False, files: dict | None = None) -> dict:
  """Writes `tensors` as a Hugging Face model directory `out_dir`; returns a summary
  {"dir", "files", "tensors", "total_size"}.

  tensors: flat {Hugging Face name: array}; numpy arrays, `tensor_files.LazyTensor`s (read one at a
    time, as they are written) or anything `np.asarray` takes.
  source_dir: the model the tensors come from (an input of the merge): its config.json and
    tokenizer files are copied.
  config: the config as a dict, used instead of source_dir's config.json. Either must carry
    `model_type` and `architectures`. Its dtype entry is set to the tensors' float dtype.
  max_shard_bytes: the most tensor bytes per file (an int, or "2GB" / "500MiB"); above it the
    weights are split into shards in sorted name order, as `save_pretrained` does. A tensor larger
    than this gets a shard of its own.
  card: what to say in README.md, e.g. {"method": "soup", "inputs": {"experts": [a, b]},
    "options": {...}}; any keys, rendered as a list.
  dtype: "bfloat16", "float16", "float32", ... : floating tensors are cast to it as they are
    written (integer ones are kept); None keeps each tensor's dtype.
  metadata: extra string entries for each safetensors header (beside format: pt).
  overwrite: replace `out_dir` even when it is a non-empty directory that xlt did not write.
    Without it only an empty directory or an earlier output of this function is replaced.
  weights_only: with neither source_dir nor config (tensors of no Hugging Face model, e.g.
    xlt's own checkpoints), write the weights and the card without a config.json.
  files: {name: text} written after the copied tokenizer files, replacing them (a merge's own
    tokenizer); a name mapped to None drops the copied file of that name (or folder of
    TOKENIZER_DIRS); "<folder>/<file>" writes a file into such a folder.
  """
  _check_tensors(tensors)
  max_bytes = _bytes(max_shard_bytes)
  cast = _dtype(dtype) if dtype is not None else None
  if cast is not None:
    tensors = {k: _Cast(x, cast) if _is_float(tensor_files.dtype_of(x)) else x for k, x in tensors.items()}
  cfg = None if weights_only and source_dir is None and config is None else _config(source_dir, config)
  floats = {tensor_files.dtype_of(x) for x in tensors.values() if _is_float(tensor_files.dtype_of(x))}
  if len(floats) == 1 and cfg is not None:  # transformers' dtype="auto" loads in this dtype
    name = floats.pop().name
    keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["torch_dtype"]
    cfg |= {k: name for k in keys}

  out_dir = os.path.abspath(out_dir)
  _check_replaceable(out_dir, overwrite)
  parent, base = os.path.split(out_dir)
  os.makedirs(parent, exist_ok=True)
  remove_stale(out_dir)
  tmp = _fresh_dir(parent, f".tmp_{base}_{os.getpid()}_")
  try:
    written = _write_into(tmp, tensors, cfg, source_dir, max_bytes, card, metadata)
    for name, text in (files or {}).items():
      folder, _, leaf = name.rpartition("/")
      if (folder not in ("", *TOKENIZER_DIRS) or not leaf or os.path.basename(leaf) != leaf or leaf in ("..", ".")
          or name in (CONFIG, CARD, INDEX) or name.endswith(".safetensors")):
        raise ValueError(f"files: {name!r} is not a tokenizer file name")
      path = os.path.join(tmp, name)
      if os.path.lexists(path):
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        if name in written:
          written.remove(name)
      if text is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fileio.write_text(path, text)
        if (folder or name) not in written:
          written.append(folder or name)
    _share_files(tmp)
    _replace(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return {"dir": out_dir, "files": written, "tensors": len(tensors),
          "total_size": int(sum(_nbytes(x) for x in tensors.values()))}


def read_model_dir(path: str) -> tuple[dict, dict]:
  """(config dict, {name: tensor_files.LazyTensor}) of a Hugging Face model directory: its
  config.json and either model.safetensors or the shards model.safetensors.index.json names.
  Only headers are read; every problem (a missing shard, a truncated file, a tensor named
  twice or missing from its shard) is a one-line error naming the file."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"{path} is not a directory (a Hugging Face model directory holds config.json and "
                            "model.safetensors)")
  cfg = _read_json(os.path.join(path, CONFIG), dict)
  index = os.path.join(path, INDEX)
  if os.path.exists(index):
    weight_map = _read_json(index, dict).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(f, str) for f in weight_map.values()):
      raise ValueError(f"{index} has no weight_map (tensor name -> shard file name)")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
      file = os.path.join(path, shard)
      if not os.path.exists(file):
        raise FileNotFoundError(f"{index} names the shard {shard}, which is missing from {path}")
      for name, x in _load(file).items():
        if name in tensors:
          raise ValueError(f"tensor {name} is in two shards of {path}: {os.path.basename(tensors[name].file)} "
                           f"and {shard}")
        if weight_map.get(name) != shard:
          raise ValueError(f"{file} holds tensor {name}, which {INDEX} places in {weight_map.get(name)}")
        tensors[name] = x
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
      raise ValueError(f"{index} places {len(missing)} tensor(s) in shards that do not hold them, "
                       f"e.g. {missing[0]} in {weight_map[missing[0]]}")
  elif os.path.exists(os.path.join(path, SINGLE)):
    tensors = _load(os.path.join(path, SINGLE))
  elif any(f.endswith(".bin") for f in os.listdir(path)):
    raise FileNotFoundError(f"{path} has only PyTorch .bin weights; save it with safe_serialization=True")
  else:
    raise FileNotFoundError(f"{path} has neither {SINGLE} nor {INDEX}")
  return cfg, tensors


def _load(file: str) -> dict:
  """tensor_files.load of one file, its errors made one line that names the file."""
  try:
    return tensor_files.load(file)
  except (ValueError, KeyError, TypeError, struct.error) as e:
    message = (str(e).splitlines() or [type(e).__name__])[0]
    raise ValueError(message if file in message else f"{file}: {message}") from None


# ---- writing


def _write_into(tmp: str, tensors: dict, cfg: dict | None, source_dir: str | None, max_bytes: int,
                card: dict | None, metadata: dict | None) -> list[str]:
  """Fills the empty directory `tmp`; returns the names of the files written."""
  written = []
  if cfg is not None:
    fileio.write_text(os.path.join(tmp, CONFIG), json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    written.append(CONFIG)
  if source_dir is not None:
    for name in TOKENIZER_FILES:
      src = os.path.join(source_dir, name)
      if os.path.isfile(src):
        with open(src, "rb") as f:
          fileio.write_bytes(os.path.join(tmp, name), f.read())
        written.append(name)
    for name in TOKENIZER_DIRS:
      if os.path.isdir(os.path.join(source_dir, name)):
        shutil.copytree(os.path.join(source_dir, name), os.path.join(tmp, name))
        written.append(name)

  meta = {**{str(k): str(v) for k, v in (metadata or {}).items()}, "format": "pt"}
  shards = _shards(tensors, max_bytes)
  shard_files = [SINGLE] if len(shards) == 1 else [
      f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  for file, names in zip(shard_files, shards):
    tensor_files.save({k: tensors[k] for k in names}, os.path.join(tmp, file), meta)
  written += shard_files
  if len(shards) > 1:
    index = {"metadata": {"total_size": int(sum(_nbytes(x) for x in tensors.values()))},
             "weight_map": {k: file for file, names in zip(shard_files, shards) for k in sorted(names)}}
    fileio.write_text(os.path.join(tmp, INDEX), json.dumps(index, indent=2) + "\n")
    written.append(INDEX)

  fileio.write_text(os.path.join(tmp, CARD), _card(card, cfg, tensors, shard_files))
  written.append(CARD)
  return written


def _shards(tensors: dict, max_bytes: int) -> list[list[str]]:
  """Names in sorted order, cut into consecutive groups of at most `max_bytes` (a larger
  tensor alone), as transformers' `save_pretrained` splits a state dict."""
  shards, size = [[]], 0
  for name in sorted(tensors):
    n = _nbytes(tensors[name])
    if shards[-1] and size + n > max_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += n
  return shards


def _replace(tmp: str, out_dir: str) -> None:
  """Renames the finished `tmp` onto `out_dir`. A directory cannot be renamed over a
  non-empty one, so a previous output is first moved into a hidden sibling, then deleted."""
  aside = None
  if os.path.lexists(out_dir):
    aside = _fresh_dir(os.path.dirname(out_dir), f".old_{os.path.basename(out_dir)}_{os.getpid()}_")
    os.rename(out_dir, os.path.join(aside, "previous"))
  try:
    os.rename(tmp, out_dir)
  except BaseException:
    if aside is not None:
      os.rename(os.path.join(aside, "previous"), out_dir)
      os.rmdir(aside)
    raise
  _fsync_dir(os.path.dirname(out_dir))
  if aside is not None:
    shutil.rmtree(aside, ignore_errors=True)


def remove_stale(out_dir: str) -> list[str]:
  """Removes the temporary siblings (.tmp_<name>_<pid>_*, .old_<name>_<pid>_*) that a killed
  write of `out_dir` left, when their process is gone; returns the paths removed. Siblings
  without a process id (older xlt) or of a live process are named on stderr, not removed."""
  parent, base = os.path.split(os.path.abspath(out_dir))
  pattern = re.compile(rf"\.(tmp|old)_{re.escape(base)}_(?:(\d+)_)?[0-9a-f]{{12}}")
  removed = []
  for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
    found = pattern.fullmatch(entry)
    if not found or not os.path.isdir(os.path.join(parent, entry)):
      continue
    path, pid = os.path.join(parent, entry), found.group(2)
    if pid is not None and int(pid) != os.getpid() and not _alive(int(pid)):
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
      print(f"xlt: removed {path}, left by an interrupted write of {out_dir}", file=sys.stderr, flush=True)
    elif pid is None:
      print(f"xlt: {path} may be left by an interrupted write of {out_dir}; remove it if no other process is "
            "writing there", file=sys.stderr, flush=True)
  return removed


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _fresh_dir(parent: str, prefix: str) -> str:
  """A new empty directory `parent`/`prefix`<random>, with the permissions the umask gives
  a directory (tempfile.mkdtemp's are 0700: a model others cannot read)."""
  while True:
    path = os.path.join(parent, prefix + secrets.token_hex(6))
    try:
      os.mkdir(path)
      return path
    except FileExistsError:  # pragma: no cover (a 48-bit name taken)
      continue


def _share_files(directory: str) -> None:
  """Gives the files in `directory` the umask's permissions (as the directory has): fileio's
  temporary files are 0600, and a model directory is for others to read too."""
  mode = os.stat(directory).st_mode & 0o666
  for root, _, names in os.walk(directory):
    for name in names:
      os.chmod(os.path.join(root, name), mode)


def _fsync_dir(path: str) -> None:
  """Makes the renames in `path` durable (a power cut after this finds the new directory)."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:  # pragma: no cover (a file system that cannot open directories)
    return
  try:
    os.fsync(fd)
  except OSError:  # pragma: no cover
    pass
  finally:
    os.close(fd)


def _check_replaceable(out_dir: str, overwrite: bool) -> None:
  if not os.path.lexists(out_dir):
    return
  if not os.path.isdir(out_dir) or os.path.islink(out_dir):
    raise ValueError(f"{out_dir} exists and is not a directory; the model directory goes elsewhere")
  if overwrite or not os.listdir(out_dir) or is_xlt_output(out_dir):
    return
  raise ValueError(f"{out_dir} is a non-empty directory that xlt did not write; "
                   "pass overwrite=True to replace it, or choose another output directory")


def is_xlt_output(path: str) -> bool:
  """Whether `path` is a directory this module wrote: its README.md's front matter carries
  the tag `xlt` (so replacing it loses nothing a person put there)."""
  try:
    with open(os.path.join(path, CARD), encoding="utf-8") as f:
      text = f.read(4096)
  except OSError:
    return False
  parts = text.split("---\n", 2)
  return text.startswith("---\n") and len(parts) == 3 and f"- {_TAG}\n" in parts[1]


def _card(card: dict | None, cfg: dict | None, tensors: dict, shard_files: list[str]) -> str:
  """README.md: a Hugging Face model card (YAML front matter, then markdown)."""
  card = dict(card or {})
  title = card.pop("title", "Model written by xlt")
  tags = [_TAG] + (["merge"] if "method" in card else [])
  lines = ["---", "library_name: transformers", "tags:"] + [f"- {t}" for t in tags] + ["---", "", f"# {title}", ""]
  description = card.pop("description", None)
  if description:
    lines += [str(description), ""]
  first = [k for k in ("method", "inputs", "options") if k in card]
  for key in first + [k for k in card if k not in first]:
    lines += _card_item(key, card[key], 0)
  dtypes = sorted({tensor_files.dtype_of(x).name for x in tensors.values()})
  what = (f"Architecture {cfg.get('architectures', ['?'])[0]} ({cfg['model_type']}); " if cfg is not None else
          "Weights only (no config.json: the inputs were no Hugging Face model); ")
  load = ("load it with `transformers.AutoModelForCausalLM.from_pretrained`" if cfg is not None else
          "read it with `xlt.merge.load`")
  lines += ["", f"{what}{len(tensors)} tensors, {', '.join(dtypes)}, {sum(_nbytes(x) for x in tensors.values()):,} "
            f"bytes in {len(shard_files)} file(s). Written by `xlt.io.hf_dir.write_model_dir`; {load}.", ""]
  return "\n".join(lines)


def _card_item(key, value, depth: int) -> list[str]:
  pad = "  " * depth
  if isinstance(value, dict) and value:
    out = [f"{pad}- {key}:"]
    for k, v in value.items():
      out += _card_item(k, v, depth + 1)
    return out
  if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
    return [f"{pad}- {key}: " + ", ".join(f"`{v}`" for v in value)]
  text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
  return [f"{pad}- {key}: `{text}`"]


class _Cast:
  """A leaf cast to `dtype` when it is read (so a lazy tensor stays lazy)."""

  def __init__(self, x, dtype: np.dtype):
    self.x, self.dtype, self.shape = x, dtype, tuple(np.shape(x))

  def __array__(self, dtype=None, copy=None):
    a = np.asarray(self.x).astype(self.dtype)
    return a if dtype is None else a.astype(dtype)


# ---- checks and small helpers


def _config(source_dir: str | None, config: dict | None) -> dict:
  if config is not None:
    cfg, where = dict(config), "the given config"
  elif source_dir is not None:
    where = os.path.join(source_dir, CONFIG)
    cfg = _read_json(where, dict)
  else:
    raise ValueError("write_model_dir needs source_dir (a model directory with config.json) or config (a dict)")
  for key in ("model_type", "architectures"):
    if not cfg.get(key):
      raise ValueError(f"{where} has no {key!r} key: transformers needs it to build the model; use the "
                       "config.json of the model the tensors come from")
  return cfg


def _read_json(file: str, kind: type | None = None):
  """The JSON of `file` (`kind`: the type its top level must be, e.g. dict for a config)."""
  if not os.path.exists(file):
    raise FileNotFoundError(f"{file} does not exist")
  fileio.check_regular(file)

  def no_duplicates(pairs):  # json.loads keeps the last of two equal keys without a word
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
      raise ValueError(f"{file} names {dup!r} twice")
    return dict(pairs)

  with open(file, encoding="utf-8") as f:
    try:
      out = json.load(f, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
      what, line, column = fileio.json_fault(e)
      raise ValueError(f"{file} is not valid JSON ({what} at line {line} column {column})") from None
  if kind is dict and not isinstance(out, dict):
    raise ValueError(f"{file} holds a JSON {type(out).__name__}, not an object ({{\"key\": value, ...}})")
  return out


def _check_tensors(tensors) -> None:
  if not isinstance(tensors, dict) or not tensors:
    raise ValueError("write_model_dir takes a non-empty flat dict {Hugging Face name: array}")
  for k, x in tensors.items():
    if not isinstance(k, str) or isinstance(x, dict):
      raise ValueError(f"write_model_dir takes a flat dict {{name: array}}; {k!r} is "
                       f"{'a nested dict' if isinstance(x, dict) else 'not a string'}")


def _nbytes(x) -> int:
  return int(np.prod(np.shape(x), dtype=np.int64)) * tensor_files.dtype_of(x).itemsize


def _bytes(n: int | str) -> int:
  if isinstance(n, str):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", n, re.IGNORECASE)
    if not m:
      raise ValueError(f"max_shard_bytes {n!r}: expected a number of bytes, or e.g. '5GB', '500MiB'")
    n = int(float(m.group(1)) * _UNITS[(m.group(2) or "B").upper()])
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
    raise ValueError(f"max_shard_bytes must be a positive number of bytes, not {n!r}")
  return int(n)


def _is_float(dtype: np.dtype) -> bool:
  return dtype.kind == "f" or dtype in tensor_files._BF16.values()  # bfloat16 is kind "V" to numpy


def _dtype(name) -> np.dtype:
  if str(name) in ("bfloat16", "bf16"):
    if "BF16" not in tensor_files._DTYPES:
      raise ValueError("dtype bfloat16 needs the ml_dtypes package (installed with jax)")
    return tensor_files._DTYPES["BF16"]
  try:
    dtype = np.dtype(name)
  except TypeError:
    raise ValueError(f"dtype {name!r} is not a numpy dtype name (float32, float16, bfloat16)") from None
  if not _is_float(dtype):
    raise ValueError(f"dtype {name!r}: only a floating dtype can be cast to")
  return dtype
