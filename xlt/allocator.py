"""A faster malloc for XLA:CPU, out of the box.

XLA:CPU allocates and frees many short-lived buffers per step; with glibc's malloc much of a
small model's step goes to mmap/munmap (../shared/PERF.md). A malloc must be chosen before the
process starts, so `preload()` re-executes the current command with one preloaded
(LD_PRELOAD), once: `python -m xlt.main` and the training benchmarks call it first thing
(decoding's entry points and benchmarks keep the system malloc).

XLT_ALLOCATOR picks it:
  auto (default)  mimalloc from the `cmeel-mimalloc` wheel that xlt's install brings; else
                  tcmalloc if the system has it (Debian: libtcmalloc-minimal4); else none
  mimalloc, tcmalloc   that one (an error if it cannot be found)
  system          glibc's malloc (no re-execution)
With mimalloc, freed pages are purged with MADV_FREE (MIMALLOC_PURGE_DECOMMITS=0, unless set):
a step frees and reallocates buffers of hundreds of MB, and mimalloc's default purge (MADV_DONTNEED)
made the next step fault them in and zero them again, and some steps ran much slower
(`benchmarks/allocator_purge.py` measures both). The kernel still takes MADV_FREE pages when
memory runs short.
Only Linux is handled; elsewhere `preload` does nothing.
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig

CHOICES = ("auto", "mimalloc", "tcmalloc", "system")
_TCMALLOC_GLOBS = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4*", "/usr/lib64/libtcmalloc_minimal.so.4*",
                   "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4*")
_MARK = "XLT_ALLOCATOR_LOADED"  # set in the re-executed process: never re-execute twice


def _mimalloc() -> str | None:
  """libmimalloc from the cmeel-mimalloc wheel (installed under <site-packages>/cmeel.prefix)."""
  roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
  found = sorted(p for r in roots if r for p in glob.glob(os.path.join(r, "cmeel.prefix", "lib", "libmimalloc.so*")))
  return found[0] if found else None


def _tcmalloc() -> str | None:
  found = sorted(p for g in _TCMALLOC_GLOBS for p in glob.glob(g))
  return found[0] if found else None


def library(choice: str | None = None) -> str | None:
  """The shared library to preload for `choice` (default: $XLT_ALLOCATOR or auto), or None."""
  choice = (choice or os.environ.get("XLT_ALLOCATOR") or "auto").lower()
  if choice not in CHOICES:
    raise ValueError(f"XLT_ALLOCATOR={choice!r}; expected one of {', '.join(CHOICES)}")
  if choice == "system" or not sys.platform.startswith("linux"):
    return None
  if choice == "auto":
    return _mimalloc() or _tcmalloc()
  lib = _mimalloc() if choice == "mimalloc" else _tcmalloc()
  if lib is None:
    raise FileNotFoundError(f"XLT_ALLOCATOR={choice}: no lib{choice} found ("
                            + ("pip install cmeel-mimalloc" if choice == "mimalloc" else
                               "apt-get install libtcmalloc-minimal4") + ")")
  return lib


def in_use() -> str:
  """Which malloc this process runs with: the preloaded library's name, or "system"."""
  preloaded = os.environ.get("LD_PRELOAD", "")
  for name in ("mimalloc", "tcmalloc"):
    if name in preloaded:
      return name
  return "system"


def preload():
  """Re-executes this command with the chosen malloc preloaded; returns only when no
  re-execution is needed (already done, none chosen, or not Linux). Call it before importing
  jax: a re-execution discards the process."""
  if os.environ.get(_MARK) or in_use() != "system":
    return
  lib = library()
  if lib is None:
    return
  env = dict(os.environ, LD_PRELOAD=":".join(filter(None, [lib, os.environ.get("LD_PRELOAD")])), **{_MARK: "1"})
  if "mimalloc" in os.path.basename(lib):
    env.setdefault("MIMALLOC_PURGE_DECOMMITS", "0")
  # the command exactly as started (-m module, script or -c code, interpreter flags included)
  argv = [sys.executable, *sys.orig_argv[1:]]
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, argv, env)
