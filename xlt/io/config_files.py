"""Where xlt's experiment configs (configs/*.py) are, in a checkout and in an installed wheel.

In a checkout (and an editable install) configs/ sits beside the package. A wheel ships it
inside the package, as xlt/configs (pyproject.toml maps the package xlt.configs onto the
configs/ directory), so a non-editable `pip install` has it too. `path("merge_files.py")` is
that file wherever it is: `python -m xlt.merge --mergekit_yaml=...` lays a YAML over it, and
`python -m xlt.main --config=configs/graph.py` finds the shipped file when the current
directory has no configs/.

Standard library only.
"""

from __future__ import annotations

import importlib.util
import os

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
