"""The house rules the code keeps: ruff's checks pass, no function over ~80 lines, no file
over ~500, no import cycle among xlt's modules, and the merge library imports nothing of xlt
but the path vocabulary (so it stays usable on its own and its "pure" docstring stays true)."""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODE = [p for d in ("xlt", "configs", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 500


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _xlt_imports(path: pathlib.Path) -> set[str]:
  """The xlt modules `path` imports, at any depth of the file (function-level imports count:
  they are dependencies all the same)."""
  out = set()
  package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name.split(".")[0] == "xlt"}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative import
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
      if base.split(".")[0] != "xlt":
        continue
      out.add(base)
      out |= {f"{base}.{a.name}" for a in node.names}  # `from xlt import model` imports xlt.model
  return out


def _xlt_modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted((ROOT / "xlt").rglob("*.py"))}


def test_ruff_passes():
  ruff = shutil.which("ruff")
  if ruff is None:
    pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
  out = subprocess.run([ruff, "check", "--no-cache", str(ROOT)], capture_output=True, text=True)
  assert out.returncode == 0, out.stdout + out.stderr


def test_no_long_functions_or_files():
  long = []
  for path in CODE:
    text = path.read_text()
    if len(text.splitlines()) > MAX_FILE_LINES:
      long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES:
          long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
  assert not long, "\n".join(long)


def test_no_import_cycle():
  modules = _xlt_modules()
  graph = {m: {d for d in _xlt_imports(p) if d in modules and d != m} for m, p in modules.items()}
  # a package's __init__ importing its own submodules is not a cycle of ideas
  graph = {m: {d for d in ds if not (p.name == "__init__.py" and d.startswith(m + "."))}
           for (m, ds), p in zip(graph.items(), modules.values())}
  state: dict[str, int] = {}

  def visit(m, stack):
    state[m] = 1
    for d in sorted(graph[m]):
      if state.get(d) == 1:
        raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
      if d not in state:
        visit(d, stack + [d])
    state[m] = 2

  for m in sorted(graph):
    if m not in state:
      visit(m, [m])


def test_merge_library_imports_only_the_path_module():
  modules = _xlt_modules()
  for name, path in modules.items():
    if name == "xlt.merge" or name.startswith("xlt.merge."):
      outside = {d for d in _xlt_imports(path) if d in modules and not d.startswith("xlt.merge")} - {"xlt", "xlt.paths"}
      assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_paths_imports_nothing_of_xlt():
  assert _xlt_imports(ROOT / "xlt" / "paths.py") == set()


def test_merge_library_loads_without_training_code():
  # in a fresh interpreter: importing xlt.merge pulls in no model, optimizer or runner
  code = ("import sys, xlt.merge; bad = sorted(m for m in sys.modules if m.startswith('xlt.') and not "
          "(m.startswith('xlt.merge') or m == 'xlt.paths')); print(bad); sys.exit(1 if bad else 0)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stdout + out.stderr
