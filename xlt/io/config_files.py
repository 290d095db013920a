"""Where xlt's experiment configs (configs/*.py) are, in a checkout and in an installed wheel.

In a checkout (and an editable install) configs/ sits beside the package. A wheel ships it
inside the package, as xlt/configs (pyproject.toml maps the package xlt.configs onto the
configs/ directory), so a non-editable `pip install` has it too. `path("merge_files.py")` is
that file wherever it is: `python -m xlt.merge --mergekit_yaml=...` lays a YAML over it, and
`python -m xlt.main --config=configs/graph.py` finds the shipped file when the current
directory has no configs/. `config_argv(argv)` does that for any program's --config flag
(xlt.main, xlt.merge, xlt.merge_data), and makes the configs package importable as the configs
name themselves (`from configs import common`).

Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../xlt
# a checkout's configs/ first: an editable install runs the checkout's files
CANDIDATES = (os.path.join(os.path.dirname(_PACKAGE), "configs"), os.path.join(_PACKAGE, "configs"))


def configs_dir(candidates: tuple[str, ...] = CANDIDATES) -> str:
  """The directory that holds the configs: the first of `candidates` that is the configs
  package (has __init__.py and common.py)."""
  for d in candidates:
    if os.path.isfile(os.path.join(d, "__init__.py")) and os.path.isfile(os.path.join(d, "common.py")):
      return d
  raise FileNotFoundError(f"xlt's configs are in none of {', '.join(candidates)}: reinstall xlt "
                          "(pip install .), which ships them as xlt/configs")


def path(name: str) -> str:
  """The config file `name` ("merge_files.py", or "configs/merge_files.py")."""
  name = name.removeprefix("configs/")
  file = os.path.join(configs_dir(), name)
  if not os.path.isfile(file):
    raise FileNotFoundError(f"no config {name} in {configs_dir()}")
  return file


def get_config(name: str):
  """The config file `name`'s `get_config()` (with no argument), read from `path(name)`."""
  spec = importlib.util.spec_from_file_location(f"xlt_config_{os.path.splitext(os.path.basename(name))[0]}",
                                                path(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def config_spec(argv: list[str]) -> str | None:
  """The value of --config in `argv` (path[:argument]), or None."""
  for i, a in enumerate(argv):
    name, eq, value = a.lstrip("-").partition("=")
    if a.startswith("-") and name == "config":
      return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
  return None


def config_argv(argv: list[str]) -> list[str]:
  """`argv` with a --config=configs/... that the current directory lacks pointed at xlt's
  configs (`path`), so the documented commands run from any directory; the config's folder,
  when it is the configs package, made importable as `configs` (its files import
  `from configs import common`): xlt.configs in an install, the checkout's folder on sys.path."""
  spec = config_spec(argv)
  file = spec.split(":", 1)[0] if spec else ""
  out = list(argv)
  if file.startswith("configs/") and not os.path.exists(file):
    try:
      found = path(file)
    except FileNotFoundError:
      found = None  # the missing file is reported as it was given
    for i, a in enumerate(argv if found else ()):
      name, eq, value = a.lstrip("-").partition("=")
      if a.startswith("-") and name == "config":
        if eq:
          out[i] = a[: len(a) - len(value)] + found + spec[len(file):]
        else:
          out[i + 1] = found + spec[len(file):]
        break
  spec = config_spec(out)
  folder = os.path.dirname(os.path.abspath(spec.split(":", 1)[0])) if spec else None
  if folder and folder == os.path.join(_PACKAGE, "configs"):
    sys.modules.setdefault("configs", importlib.import_module("xlt.configs"))
  elif folder and os.path.isfile(os.path.join(folder, "__init__.py")):
    sys.path.insert(0, os.path.dirname(folder))
  return out
