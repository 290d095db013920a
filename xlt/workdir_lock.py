"""One run per workdir: a second process on a workdir another holds is refused in one line.

Two runs writing one workdir's checkpoints corrupt each other (both commit orbax steps, and the
survivor resumes from a mix). The lock is an flock on <workdir>/.lock, held as long as the run
is: the kernel drops it when its process ends, however it ends, so a killed run never blocks
the next. The processes of one multi-host run share the workdir (xlt.distributed), so each
locks its own file (.lock.<process index> beyond process 0): a second run is refused on every
host, the run's own processes never. A grid's point workers (xlt.grid.run_in_workers) run in
<workdir>/<point>, each its own lock; their parent holds the grid's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from typing import Iterator

_HELD: dict[str, list] = {}  # real path -> [open lock file, depth]: nested holds in one process


def lock_name(index: int) -> str:
  return ".lock" if index == 0 else f".lock.{index}"


def _process_index() -> int:
  import jax  # only to tell which process of a multi-host run this is
  return jax.process_index() if jax.distributed.is_initialized() else 0


def make(workdir: str) -> str:
  """`workdir` created (its parents too) as an absolute path; a path that cannot be one (a
  file, a read-only or full file system, an empty name) is a one-line ValueError naming it."""
  if not str(workdir).strip():
    raise ValueError("--workdir is empty: name the directory the run writes to")
  path = os.path.abspath(workdir)
  if os.path.lexists(path) and not os.path.isdir(path):
    raise ValueError(f"workdir {workdir} exists and is not a directory: name a directory")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ValueError(f"workdir {workdir} cannot be created: {describe(e)}") from e
  return path


def describe(e: OSError) -> str:
  """An OSError's reason in words, without the path (the caller names the user's)."""
  reason = {errno.EROFS: "a read-only file system", errno.ENOSPC: "no space left on the device",
            errno.EACCES: "permission denied", errno.EDQUOT: "the disk quota is exceeded"}
  return reason.get(e.errno, e.strerror or type(e).__name__)


@contextlib.contextmanager
def hold(workdir: str, index: int | None = None) -> Iterator[str]:
  """Holds the lock of `workdir` (created if need be; ValueError when another process holds
  it) for the body; yields the workdir's absolute path. Nested holds of one workdir in one
  process are one."""
  path = make(workdir)
  key = os.path.realpath(path)
  if key in _HELD:
    _HELD[key][1] += 1
  else:
    i = _process_index() if index is None else index
    created = not os.path.lexists(os.path.join(path, lock_name(i)))
    _HELD[key] = [_acquire(path, workdir, i), 1, created]
  failed = False
  try:
    yield path
  except BaseException:
    failed = True
    raise
  finally:
    held = _HELD.get(key)  # gone when `release` dropped it inside the body
    if held is not None:
      held[1] -= 1
      if not held[1]:
        _HELD.pop(key)
        if failed and held[2]:  # a refused or failed run leaves the workdir as it found it
          with contextlib.suppress(OSError):
            os.remove(held[0].name)
        held[0].close()


def release(workdir: str) -> None:
  """Drops this process's lock of `workdir` and its file, whatever the depth of its holds (a run
  that failed before training removes the workdir it made)."""
  held = _HELD.pop(os.path.realpath(workdir), None)
  if held is not None:
    with contextlib.suppress(OSError):
      os.remove(held[0].name)
    held[0].close()


def _acquire(path: str, workdir: str, index: int):
  file = os.path.join(path, lock_name(index))
  try:
    f = open(file, "a+")
  except OSError as e:
    raise ValueError(f"workdir {workdir} cannot be written: {describe(e)}") from e
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    owner = f.read().strip()
    f.close()
    raise ValueError(f"workdir {workdir} is in use by another run{f' (process {owner})' if owner else ''}: "
                     "wait for it to end, or choose another workdir") from None
  with contextlib.suppress(OSError):  # the process id only names the holder to a refused run
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
  return f
