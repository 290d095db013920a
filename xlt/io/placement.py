"""Host-side copies of checkpoint tensors into parameter buffers, in chunks over every core.

xlt.pretrained.load maps the safetensors files (tensor_files.Mapped) and copies each tensor that
is not stored as xlt holds it (a torch Linear's [out, in] weight, a dtype to cast, q/k/v into one
fused kernel, a padded vocabulary) straight from the file's pages into an aligned buffer that
jax can take without another copy. The copy is cut into chunks of about CHUNK_BYTES of the
source, run on a thread pool (numpy releases the GIL while it copies), and each chunk's file
pages are dropped from the resident set once copied, so the host holds the parameters plus a
few chunks in flight rather than a second copy of the largest tensor.

First touching fresh memory page by page was a load's largest cost on a CPU (more than the
transposes, in CPU time of every thread), so a parameter's buffer is mapped populated
(MAP_POPULATE: the kernel allocates and zeroes every page in one call, about half the cost) on a
thread of its own, one leaf ahead of the copies (`Copier.buffers`), so that it overlaps them.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os

import numpy as np

ALIGN = 64  # bytes: jax on a CPU takes a numpy buffer aligned so without copying it
CHUNK_BYTES = 8 * 2**20


def host_buffer(shape, dtype) -> np.ndarray:
  """A C-contiguous array for a parameter, ALIGN-aligned (jax on a CPU takes it without a
  copy); its contents are undefined. A large one (from 2 MiB) is a fresh anonymous mapping,
  populated in one call where the platform has MAP_POPULATE (else advised into transparent
  huge pages and faulted in as it is written): first touching fresh memory page by page was
  the largest cost of a load, larger than the transposes."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if nbytes < 2**21:
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)
  if hasattr(mmap, "MAP_POPULATE"):
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
  else:  # pragma: no cover (not Linux)
    mm = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE"):
      mm.madvise(mmap.MADV_HUGEPAGE)
  return np.frombuffer(mm, dtype, int(np.prod(shape, dtype=np.int64))).reshape(shape)


def workers() -> int:
  try:
    return max(1, min(8, len(os.sched_getaffinity(0))))
  except AttributeError:  # pragma: no cover (no sched_getaffinity)
    return max(1, min(8, os.cpu_count() or 1))


def aliases(x, host: np.ndarray) -> bool:
  """Whether the jax array `x` is `host`'s memory (a zero-copy device_put on a CPU)."""
  try:
    shards = x.addressable_shards
    return len(shards) == 1 and shards[0].data.unsafe_buffer_pointer() == host.ctypes.data
  except Exception:  # a platform without host pointers (no alias there)
    return False


class Copier:
  """A thread pool for `run`; a context manager (the pool shut down on exit)."""

  def __init__(self, threads: int | None = None):
    self.pool = concurrent.futures.ThreadPoolExecutor(threads or workers())
    self.allocator = concurrent.futures.ThreadPoolExecutor(1)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.pool.shutdown(wait=True)
    self.allocator.shutdown(wait=True)

  def buffers(self, specs):
    """host_buffer(shape, dtype) for each (shape, dtype) of `specs` in turn (None for a None
    spec), the next one allocated on a thread of its own while the caller fills this one. One
    buffer at most is ahead, and it is a parameter to be: the host never holds more than the
    parameters it is given."""
    specs = list(specs)
    submit = lambda spec: None if spec is None else self.allocator.submit(host_buffer, *spec)
    ahead = submit(specs[0]) if specs else None
    for i in range(len(specs)):
      this, ahead = ahead, submit(specs[i + 1]) if i + 1 < len(specs) else None
      yield None if this is None else this.result()

  def run(self, jobs) -> None:
    """Each job (dst [R, C], src, transpose, release): dst = src.T ([C, R]) when transpose,
    else src ([R, C]), cast to dst's dtype; release(begin, end) is called with the byte range
    of src's rows each chunk copied. Returns when every chunk is copied (re-raising the first
    error)."""
    futures = []
    for dst, src, transpose, release in jobs:
      rows = src.shape[0]
      step = max(1, CHUNK_BYTES // max(1, src[:1].nbytes))
      for r in range(0, rows, step):
        futures.append(self.pool.submit(_copy, dst, src, transpose, release, r, min(rows, r + step)))
    for f in futures:
      f.result()


def _copy(dst, src, transpose, release, begin: int, end: int) -> None:
  if transpose:
    # bands of source rows one cache line of the destination wide: numpy's strided copy of a
    # whole transposed matrix runs at a third of this speed (about 1 against 3 GB/s a core)
    band = max(1, 64 // dst.itemsize)
    for r in range(begin, end, band):
      np.copyto(dst[:, r:min(end, r + band)], src[r:min(end, r + band)].T, casting="unsafe")
  else:
    np.copyto(dst[begin:end], src[begin:end], casting="unsafe")
  row = src[:1].nbytes
  release(begin * row, end * row)
