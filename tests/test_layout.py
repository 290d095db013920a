"""The house rules the code keeps: ruff's checks pass, no function over ~80 lines, no file
over ~500, no import cycle among xlt's modules, and the floors hold:

  xlt.param_paths  the parameter-path vocabulary: imports nothing of xlt
  xlt.io           the I/O floor (atomic writes, safetensors, Hugging Face directories): imports
                   only xlt.param_paths, neither the merge library nor training
  xlt.merge        the pure merge library: imports only xlt.param_paths and xlt.io (so it stays
                   usable on its own and its "pure" docstring stays true)
  the rest         training, experiments, evaluation: reach the merge library only through its
                   package (`from xlt import merge`: the registry's public functions), never a
                   merge module directly, but for the exceptions listed in MERGE_INTERNALS_USED."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pathlib
import re
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


def _in_package(name: str, package: str) -> bool:
  return name == package or name.startswith(package + ".")


def _imports_outside(package: str, allowed: set[str]) -> dict[str, list[str]]:
  """{module of `package`: the xlt modules it imports that are neither in the package nor
  `allowed` (nor a package of them)}."""
  modules, bad = _xlt_modules(), {}
  for name, path in modules.items():
    if _in_package(name, package):
      outside = {d for d in _xlt_imports(path) if d in modules and not _in_package(d, package)
                 and not any(_in_package(d, a) for a in allowed)} - {"xlt"}
      if outside:
        bad[str(path.relative_to(ROOT))] = sorted(outside)
  return bad


def test_merge_library_imports_only_the_path_vocabulary_and_io():
  assert _imports_outside("xlt.merge", {"xlt.param_paths", "xlt.io"}) == {}


def test_io_imports_neither_merge_nor_training():
  assert _imports_outside("xlt.io", {"xlt.param_paths"}) == {}


def test_layering_check_catches_an_import_across_a_floor(tmp_path, monkeypatch):
  # the check itself can fail: an io module that imports a merge module is reported
  fake = tmp_path / "xlt"
  (fake / "io").mkdir(parents=True)
  (fake / "merge").mkdir()
  for f in ("__init__.py", "param_paths.py", "io/__init__.py", "merge/__init__.py", "merge/core.py"):
    (fake / f).write_text("")
  (fake / "io" / "bad.py").write_text("from xlt import param_paths\nfrom xlt.merge import core\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  assert _imports_outside("xlt.io", {"xlt.param_paths"}) == {"xlt/io/bad.py": ["xlt.merge", "xlt.merge.core"]}


# Merge modules that training code still uses directly, and why each needs more than the
# package's public functions (`from xlt import merge`: check_compatible, check_range, the methods,
# the registry); what a public function serves is reached through it, so this only shrinks.
# none left: neurons (MAET's key rows, the leaf-mask helpers) and peft_io (the adapter reader)
# reach them through the merge package's public names
MERGE_INTERNALS_USED: dict[str, set[str]] = {}
MERGE_PUBLIC = {"xlt.merge", "xlt.merge.registry"}


def _merge_modules_used(path: pathlib.Path, merge_modules: set[str], merge_package) -> set[str]:
  """The merge modules `path` imports, or reaches as attributes of the package
  (`from xlt import merge` ... `merge.core.x`)."""
  used = {d for d in _xlt_imports(path) if d in merge_modules}
  tree = ast.parse(path.read_text())
  aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "xlt" for a in node.names if a.name == "merge"}
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
      # a module, not a function the package exports under a module's name (merge.maet)
      if f"xlt.merge.{node.attr}" in merge_modules and inspect.ismodule(getattr(merge_package, node.attr, None)):
        used.add(f"xlt.merge.{node.attr}")
  return used - MERGE_PUBLIC


def test_training_reaches_merge_only_through_its_public_functions():
  merge_package = importlib.import_module("xlt.merge")
  modules = _xlt_modules()
  merge_modules = {m for m in modules if _in_package(m, "xlt.merge")}
  used = {}
  for name, path in modules.items():
    if not any(_in_package(name, p) for p in ("xlt.merge", "xlt.io", "xlt.param_paths")):
      if internals := _merge_modules_used(path, merge_modules, merge_package):
        used[name] = internals
  # equality, not a subset: an exception that is gone must leave the list too
  assert used == MERGE_INTERNALS_USED


def test_param_paths_imports_nothing_of_xlt():
  assert _xlt_imports(ROOT / "xlt" / "param_paths.py") == set()


def test_merge_library_loads_without_training_code():
  # in a fresh interpreter: importing xlt.merge pulls in no model, optimizer or runner
  code = ("import sys, xlt.merge; bad = sorted(m for m in sys.modules if m.startswith('xlt.') and not "
          "(m.startswith(('xlt.merge', 'xlt.io')) or m == 'xlt.param_paths')); print(bad); sys.exit(1 if bad else 0)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stdout + out.stderr


def test_io_loads_without_merge_or_training_code():
  code = ("import sys, xlt.io.fileio, xlt.io.tensor_files, xlt.io.hf_dir; bad = sorted(m for m in sys.modules if "
          "m.startswith('xlt.') and not (m.startswith('xlt.io') or m == 'xlt.param_paths')); print(bad); "
          "sys.exit(1 if bad else 0)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stdout + out.stderr


# Roots of paths that exist on one machine only (a home, a mount, a scratch or temporary
# directory): the repository must work wherever it is cloned, so it names none of them.
MACHINE_PATH = re.compile(r"(?<![\w.~$/:-])/(?:work|home|Users|opt|tmp|mnt|root|scratch|data|private|srv)/")
# What may name one, and why: results/ records each run's command and directories as they were
# (rewriting them would change a recorded result), docs/results.md and docs/speed.md are rendered from results/,
# and test_launch gives the launch scripts an absolute workdir to pass through unchanged.
MACHINE_PATH_ALLOWED = {"tests/test_launch.py": "/" + "mnt/shared/graph"}
MACHINE_PATH_RECORDS = ("results/", "docs/results.md", "docs/speed.md")


def _repository_text_files() -> list[str]:
  """Every file git knows or would add (tracked, or untracked and not ignored), relative."""
  out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True)
  if out.returncode:
    pytest.skip("not a git checkout: " + out.stderr.strip())
  return sorted({f for f in out.stdout.splitlines() if (ROOT / f).is_file()})


def _machine_paths(files: list[str], root: pathlib.Path = ROOT) -> list[str]:
  found = []
  for f in files:
    if f.startswith(MACHINE_PATH_RECORDS):
      continue
    try:
      text = (root / f).read_text(encoding="utf-8")
    except UnicodeDecodeError:  # binary: weights, arrays, images
      continue
    for n, line in enumerate(text.splitlines(), 1):
      if f in MACHINE_PATH_ALLOWED:
        line = line.replace(MACHINE_PATH_ALLOWED[f], "")
      if m := MACHINE_PATH.search(line):
        found.append(f"{f}:{n}: {line.strip()[:100]} ({m.group(0)!r})")
  return found


def test_no_absolute_or_machine_specific_path():
  found = _machine_paths(_repository_text_files())
  assert not found, "paths of one machine (use a relative path, or tempfile.gettempdir()):\n" + "\n".join(found)


def test_machine_path_check_finds_one(tmp_path):
  (tmp_path / "a.md").write_text("run ~/venv/bin/python x.py --out=runs/x https://host/tmp/x\n")
  (tmp_path / "b.py").write_text('"""see ' + "/wo" + 'rk/shared/notes.md"""\n')
  (tmp_path / "c.md").write_text("python -m xlt.main --workdir=" + "/tm" + "p/graph\n")
  found = _machine_paths(["a.md", "b.py", "c.md"], tmp_path)
  assert [f.split(":")[0] for f in found] == ["b.py", "c.md"]
