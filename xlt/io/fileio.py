"""Atomic file writes: a file xlt writes is either its old self or complete, never torn; and
the size check before xlt reads a file a user brought.

Standard library only: it is the bottom of the I/O floor, and every part of xlt uses it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb") -> Iterator[IO]:
  """Opens a temporary file beside `path`; on a clean exit flushes it to disk and renames it
  onto `path`, on an exception removes it and leaves `path` as it was.

  The temporary file is in the same directory because a rename is atomic only within one file
  system; it is fsynced before the rename so that a power cut cannot leave a renamed but empty
  file. `mode` is "wb" or "w" (text, UTF-8).
  """
  if mode not in ("wb", "w"):
    raise ValueError(f"atomic_open writes whole files: mode 'wb' or 'w', not {mode!r}")
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp_", suffix="_" + os.path.basename(path))
  try:
    os.fchmod(fd, _mode_for(path))  # mkstemp's 0600 would make results readable by their owner alone
    with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def _umask() -> int:
  """The process's umask, read without changing it where Linux says it (os.umask can only set it:
  setting and restoring it would race with other threads creating files)."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _mode_for(path: str) -> int:
  try:
    return stat.S_IMODE(os.stat(path).st_mode)
  except OSError:  # a new file
    return 0o666 & ~_umask()


def write_bytes(path: str, data: bytes) -> None:
  with atomic_open(path, "wb") as f:
    f.write(data)


def write_text(path: str, text: str) -> None:
  with atomic_open(path, "w") as f:
    f.write(text)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def check_regular(path: str, error: type[Exception] = ValueError) -> os.stat_result:
  """`path`'s stat, after checking it is a regular file (a link to one is): opening a FIFO
  waits for a writer forever and a device reads without end, so neither is ever opened."""
  st = os.stat(path)
  if not stat.S_ISREG(st.st_mode):
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise error(f"{path} is {kind}, not a regular file")
  return st


def check_size(path: str, limit: int, error: type[Exception] = ValueError, why: str = "") -> int:
  """The size of `path`, a file a user brought, after checking it is a regular file of at most
  `limit` bytes: its reader then never holds more than that, nor waits on a FIFO (`error`: the
  caller's one-line error type)."""
  size = check_regular(path, error).st_size
  if size > limit:
    raise error(f"{path} is {size} bytes, over the {limit}-byte limit{why}")
  return size


def json_fault(error) -> tuple[str, int, int]:
  """(what, line, column) of a json.JSONDecodeError, at the fault rather than where the parser
  noticed it: after a trailing comma it stops at the next token (often column 1 of the next
  line), after a missing comma at the next key. Those point back to the comma, or to the end
  of the token that the comma should follow."""
  doc, pos, what = error.doc, error.pos, error.msg
  end = pos
  while end > 0 and doc[end - 1].isspace():
    end -= 1
  fault = pos
  if what.startswith(("Expecting property name", "Expecting value")) and end and doc[end - 1] == ",":
    fault, what = end - 1, "a trailing comma (nothing follows it)"
  elif what.startswith("Expecting ',' delimiter") and "\n" in doc[end:pos]:
    fault, what = end, "a missing comma after this value"
  line = doc.count("\n", 0, fault) + 1
  return what, line, fault - (doc.rfind("\n", 0, fault) + 1) + 1


def json_files(directory: str, error: type[Exception] = ValueError) -> Iterator[tuple[str, str, object]]:
  """(name, path, parsed JSON) of every *.json in `directory` (none when it is missing), sorted by
  name; an unreadable one raises `error` naming it."""
  for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
    if not name.endswith(".json"):
      continue
    path = os.path.join(directory, name)
    try:
      with open(path, encoding="utf-8") as f:
        yield name, path, json.load(f)
    except (OSError, ValueError) as e:
      raise error(f"{path}: not a readable JSON file ({e})") from e
