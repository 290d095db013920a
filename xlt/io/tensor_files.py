"""Checkpoints on disk: safetensors files read and written one tensor at a time, so a merge
of checkpoint files (xlt.merge.tool) never holds much more than one model.

`load` returns a flat {name: LazyTensor}: a leaf that knows its shape and dtype from the
file's header and reads its bytes only when a merge asks for it (`np.asarray`), so every
merge in xlt.merge runs unchanged on lazy trees, reading each input tensor when it
reaches that tensor and dropping it afterwards. `save` writes the header first and then
each tensor in turn, so a lazy or computed tree is never gathered into one buffer.

A checkpoint is one .safetensors file or a directory of them (Hugging Face's sharded
model-0000k-of-0000n.safetensors); names are flat ("model.layers.0.mlp.up_proj.weight"),
or xlt paths joined by "/" ("block_0/mlp/fc/kernel").
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import struct

import jax
import numpy as np

from xlt import param_paths as naming_lib
from xlt.io import fileio

try:  # bfloat16 as numpy knows it (a jax dependency)
  import ml_dtypes
  _BF16 = {"BF16": np.dtype(ml_dtypes.bfloat16)}
except ImportError:  # pragma: no cover
  _BF16 = {}

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
           "U8": np.uint8, "BOOL": np.bool_}
_DTYPES = {k: np.dtype(v) for k, v in _DTYPES.items()} | _BF16
_CODES = {v: k for k, v in _DTYPES.items()}
DATA_ALIGN = 64  # where `save` starts the tensors' bytes (a multiple of the format's 8)


class LazyTensor:
  """One tensor of a safetensors file, read on `np.asarray` (every time: nothing is cached,
  so a merge that visits a leaf twice reads it twice rather than keeping it)."""

  def __init__(self, file: str, name: str, shape, dtype, offset: int | None = None):
    self.file, self.name, self.shape, self.dtype = file, name, tuple(shape), np.dtype(dtype)
    self.offset = offset  # of the tensor's bytes in the file, when known from its header

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def size(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64))

  @property
  def nbytes(self) -> int:
    return self.size * self.dtype.itemsize

  def __array__(self, dtype=None, copy=None):
    if self.offset is not None:
      x = self._read()
    else:
      from safetensors import safe_open
      try:
        with safe_open(self.file, framework="numpy") as f:
          x = f.get_tensor(self.name)
      except Exception as e:  # safetensors' own error types: one line naming the file and tensor
        raise ValueError(f"{self.file}: tensor {self.name} could not be read ({' '.join(str(e).split())})") from e
    if not finite(x):  # a NaN would pass silently through every merge into the output
      raise ValueError(f"{self.file}: tensor {self.name} holds NaN or infinite values")
    return x if dtype is None else x.astype(dtype)

  def _read(self) -> np.ndarray:
    """The bytes read straight into an aligned array: one host copy, which XLA:CPU can take
    without copying again (safetensors' numpy reader maps the file and copies out of it)."""
    out = aligned_empty(self.shape, self.dtype)
    with open(self.file, "rb") as f:
      f.seek(self.offset)
      n = f.readinto(memoryview(out.reshape(-1).view(np.uint8))) if out.size else 0
    if n != self.nbytes:
      raise ValueError(f"{self.file}: tensor {self.name} could not be read (file truncated: {n} of "
                       f"{self.nbytes} bytes)")
    return out

  def __repr__(self):
    return f"LazyTensor({self.name!r}, {self.shape}, {self.dtype}, {os.path.basename(self.file)})"


_FINITE_CHUNK = 1 << 22  # elements per isfinite pass: its temporary is 4 MiB, whatever the tensor


def finite(x: np.ndarray) -> bool:
  """Whether the array holds no NaN and no infinity (True for any non-float dtype): one pass,
  in chunks, so the check never allocates a temporary the size of the tensor."""
  if not (np.issubdtype(x.dtype, np.floating) or x.dtype in _BF16.values()):
    return True
  flat = x.reshape(-1)
  return all(np.isfinite(flat[i:i + _FINITE_CHUNK]).all() for i in range(0, flat.size, _FINITE_CHUNK))


def aligned_empty(shape, dtype, alignment: int = 64) -> np.ndarray:
  """An uninitialised C-contiguous array whose data starts on an `alignment`-byte boundary:
  jax.device_put on a CPU can use such a buffer as it is instead of copying it."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + alignment, np.uint8)
  start = -raw.ctypes.data % alignment
  return raw[start:start + nbytes].view(dtype).reshape(shape)


class Mapped:
  """The safetensors files of one read, memory-mapped copy-on-write (MAP_PRIVATE, so nothing
  written through a view ever reaches the file), each once: `view` gives a tensor's bytes as
  a numpy array without a copy, `release` drops its pages from this process's resident set
  once they have been copied elsewhere (they stay in the page cache). Sizes come from the
  headers `load` checked against each file's size; a file that shrank since is a ValueError."""

  def __init__(self):
    self.maps = {}

  def view(self, x: LazyTensor) -> np.ndarray:
    if x.offset is None:
      raise ValueError(f"{x.file}: tensor {x.name} has no known offset to map")
    if not x.nbytes:
      return np.zeros(x.shape, x.dtype)
    mm = self.maps.get(x.file)
    if mm is None:
      with open(x.file, "rb") as f:
        mm = self.maps[x.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if x.offset + x.nbytes > len(mm):
      raise ValueError(f"{x.file}: tensor {x.name} could not be read (file truncated: it ends at byte "
                       f"{x.offset + x.nbytes}, the file has {len(mm)})")
    return np.frombuffer(mm, x.dtype, x.size, x.offset).reshape(x.shape)

  def release(self, x: LazyTensor, begin: int = 0, end: int | None = None) -> None:
    """Drops the whole pages of bytes [begin, end) of `x` from the resident set (a later
    view reads them from the file again)."""
    mm = self.maps.get(x.file)
    if mm is None or x.offset is None:
      return
    page = mmap.PAGESIZE
    start = -(-(x.offset + begin) // page) * page
    stop = (x.offset + (x.nbytes if end is None else end)) // page * page
    if stop > start:
      mm.madvise(mmap.MADV_DONTNEED, start, stop - start)


def checkpoint_files(path: str) -> list[str]:
  """The .safetensors files of a checkpoint: `path` itself, or every one in a directory."""
  if os.path.isdir(path):
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
      raise FileNotFoundError(f"no .safetensors files in the directory {path}")
    return files
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint {path} does not exist")
  return [path]


def _header(file: str) -> tuple[dict, int]:
  """(the JSON header of a safetensors file, where its tensors' bytes start), checked against
  the file's size: a truncated or foreign file is a ValueError here, before any merge starts."""
  size = fileio.check_regular(file).st_size  # a FIFO named model.safetensors would block the open
  with open(file, "rb") as f:
    head = f.read(8)
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
    if n is None or 8 + n > size:
      raise ValueError(f"{file} is not a complete safetensors file: {size} bytes, too short for its header")
    try:
      header = json.loads(f.read(n))
    except ValueError as e:
      raise ValueError(f"{file} is not a safetensors file: its header is not JSON ({e})") from None
  try:
    end = max((int(info["data_offsets"][1]) for k, info in header.items() if k != "__metadata__"), default=0)
  except (AttributeError, KeyError, IndexError, TypeError, ValueError):
    raise ValueError(f"{file} is not a safetensors file: a tensor's header has no data_offsets") from None
  if 8 + n + end > size:
    raise ValueError(f"{file} is truncated: its tensors end at byte {8 + n + end}, the file has {size}")
  return header, 8 + n


def load(path: str, *, lazy: bool = True, nested: bool = False) -> dict:
  """{name: LazyTensor} (or numpy arrays with lazy=False) of a checkpoint; nested=True
  splits names on "/" into xlt's nested dicts. Only the headers are read here."""
  tree = {}
  for file in checkpoint_files(path):
    header, data_start = _header(file)
    for name, info in header.items():
      if name == "__metadata__":
        continue
      if info["dtype"] not in _DTYPES:
        raise ValueError(f"{file}: tensor {name} has dtype {info['dtype']}, which numpy cannot hold")
      if name in tree:
        raise ValueError(f"tensor {name} appears in two files of {path}")
      tree[name] = x = LazyTensor(file, name, info["shape"], _DTYPES[info["dtype"]],
                                  data_start + int(info["data_offsets"][0]))
      begin, end = (int(o) for o in info["data_offsets"])
      if not 0 <= begin <= end or end - begin != x.nbytes or min(x.shape, default=1) < 0:
        raise ValueError(f"{file}: tensor {name}'s data_offsets [{begin}, {end}] do not hold its shape "
                         f"{list(x.shape)} of {info['dtype']} ({x.nbytes} bytes)")
  if not lazy:
    tree = {k: np.asarray(v) for k, v in tree.items()}
  return _nest(tree) if nested else tree


def _nest(flat: dict) -> dict:
  out = {}
  for name, x in flat.items():
    *parents, leaf = name.split("/")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = x
  return out


def dtype_of(x) -> np.dtype:
  """A leaf's dtype without copying a device array to the host."""
  return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def save(tree, file: str, metadata: dict | None = None) -> None:
  """Writes `tree` (a flat {name: array}, or a nested tree whose paths are joined by "/")
  as one safetensors file, one tensor at a time (a LazyTensor leaf is read just before
  it is written). Written to a temporary file and renamed: `file` is never half written."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  leaves = [(naming_lib.path_str(naming_lib.path_names(p)), x) for p, x in flat]
  header, offset = {}, 0
  for name, x in leaves:
    dtype = dtype_of(x)
    if dtype not in _CODES:
      raise ValueError(f"{name}: dtype {dtype} has no safetensors code")
    nbytes = int(np.prod(np.shape(x), dtype=np.int64)) * dtype.itemsize
    header[name] = {"dtype": _CODES[dtype], "shape": list(np.shape(x)), "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  if metadata:
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  raw = json.dumps(header, separators=(",", ":")).encode()
  # The format pads the header with spaces to a multiple of 8 bytes; padded further, the tensors'
  # bytes start on a 64-byte boundary, so each tensor whose predecessors' sizes are multiples of
  # 64 bytes is aligned as jax on a CPU needs to take a view of the file without a copy.
  raw += b" " * (-(8 + len(raw)) % DATA_ALIGN)
  with fileio.atomic_open(file) as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    for _, x in leaves:
      a = np.ascontiguousarray(np.asarray(x))
      f.write(a.view(np.uint8).reshape(-1).data if a.size else b"")
      del a
