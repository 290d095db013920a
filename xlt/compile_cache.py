"""jax's persistent compilation cache for xlt's commands, on request.

A command's first run pays XLA's compilation; a second run of the same programs (the same
model, shapes, mesh, flags and jax version: jax's cache key) loads them from disk instead. The
folder, in order of precedence:

  JAX_COMPILATION_CACHE_DIR   jax's own setting, used as it is (xlt changes nothing)
  XLT_COMPILATION_CACHE       1 / on / yes / true: $XDG_CACHE_HOME/xlt/jax (~/.cache/xlt/jax);
                              another value: that folder; 0 / off / unset: no persistent cache

Off unless asked for: the test suite run in one process (`python -m pytest -n 0`, every program
written) ends in a segmentation fault inside XLA:CPU's `executable.serialize()` (jaxlib 0.10.2,
about 87% of the way, in tests/test_pretrained.py); until that is understood a default cache
could crash a user's run (docs/speed.md).

Programs that took at least MIN_COMPILE_S to compile are written: jax's own default, 1 s,
leaves out most programs of a small model, which then compile again on every run
(benchmarks/cold_start.py measures both); JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS sets
another. The cache holds compiled code, never a user's data; deleting the folder is always
safe. A folder that cannot be made leaves the cache off, with no error: a cache is a saving,
never a condition of running.
"""

from __future__ import annotations

import os

import jax

ENV = "XLT_COMPILATION_CACHE"
MIN_COMPILE_S = 0.1
OFF = ("", "0", "off", "false", "no")
ON = ("1", "on", "true", "yes")


def default_dir() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "xlt", "jax")


def folder() -> str | None:
  """The folder xlt's commands cache compiled programs in, or None (off)."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  value = os.environ.get(ENV, "").strip()
  if value.lower() in OFF:
    return None
  return default_dir() if value.lower() in ON else value


def enable() -> str | None:
  """Turn the cache on for this process (before its first compilation); the folder, or None."""
  path = folder()
  if path is None or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return path  # off, or jax reads its own variable
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  return path
