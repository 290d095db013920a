"""A non-editable install works: the wheel holds every package and the configs (as xlt/configs),
and `python -m xlt.merge --mergekit_yaml=...` runs from a directory with no checkout in sight.

The install is the wheel itself, built and unpacked onto PYTHONPATH (what pip does with a pure
wheel), where this Python can build one (setuptools >= 68 and wheel); elsewhere, the same files
laid out as setuptools' build_py copies them (setup.py: the package trees, configs/ as xlt/configs,
modules and DATA files)."""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import zipfile

import numpy as np
import pytest

from xlt.io import config_files, tensor_files

ROOT = pathlib.Path(__file__).resolve().parent.parent
LLAMA, LLAMA_B = (str(ROOT / "tests" / "fixtures" / "hf" / n) for n in ("llama", "llama_b"))


def _setup():
  """setup.py's PACKAGES and PACKAGE_DIR (its setup() runs only as a script)."""
  spec = importlib.util.spec_from_file_location("xlt_setup", ROOT / "setup.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _xlt_packages() -> set[str]:
  return {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "xlt").rglob("__init__.py")}


def test_every_package_ships_and_configs_ship_inside_xlt():
  assert set(_setup().PACKAGES) == _xlt_packages() | {"xlt.configs"}
  assert _setup().PACKAGE_DIR == {"xlt.configs": "configs"}
  assert "packages" not in tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})


def test_config_lookup_takes_a_checkout_first_then_the_package(tmp_path):
  checkout, package = tmp_path / "configs", tmp_path / "xlt" / "configs"
  for d in (checkout, package):
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("")
  (package / "common.py").write_text("")
  candidates = (str(checkout), str(package))
  assert config_files.configs_dir(candidates) == str(package)  # a configs/ without common.py is not ours
  (checkout / "common.py").write_text("")
  assert config_files.configs_dir(candidates) == str(checkout)
  with pytest.raises(FileNotFoundError, match="reinstall xlt"):
    config_files.configs_dir((str(tmp_path / "nowhere"),))
  assert config_files.path("configs/merge_files.py") == str(ROOT / "configs" / "merge_files.py")


def _can_build_wheels() -> bool:
  if importlib.util.find_spec("wheel") is None:
    return False
  import setuptools
  return int(setuptools.__version__.split(".")[0]) >= 68


def _install(site: pathlib.Path, tmp: pathlib.Path) -> str:
  """xlt's files under `site` as a non-editable install lays them out; returns how."""
  if _can_build_wheels():
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
      shutil.copy(ROOT / name, src / name)
    for name in ("xlt", "configs"):
      shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp / "dist").glob("xlt-*.whl")
    zipfile.ZipFile(wheel).extractall(site)
    return "wheel"
  # every module and data file of the package trees (setuptools takes data from subfolders
  # without an __init__.py too), configs/ under xlt/ as PACKAGE_DIR maps it
  trees = {"xlt": ROOT / "xlt"} | {k.replace(".", "/"): ROOT / v for k, v in _setup().PACKAGE_DIR.items()}
  for target, source in trees.items():
    for f in source.rglob("*"):
      if f.is_file() and "__pycache__" not in f.parts and (f.suffix == ".py" or any(f.match(d) for d in _setup().DATA)):
        (site / target / f.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, site / target / f.relative_to(source))
  return "layout"


def _shipped_files() -> set[str]:
  """Where each file of xlt/ and configs/ that git knows lands in an install."""
  out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "xlt",
                        "configs"], capture_output=True, text=True)
  if out.returncode:
    pytest.skip("not a git checkout: " + out.stderr.strip())
  return {"xlt/" + f if f.startswith("configs/") else f for f in out.stdout.splitlines() if (ROOT / f).is_file()}


def test_installed_package_runs_a_mergekit_yaml_outside_the_checkout(tmp_path):
  site, work = tmp_path / "site", tmp_path / "work"
  site.mkdir()
  work.mkdir()
  how = _install(site, tmp_path)
  installed = {".".join(p.parent.relative_to(site).parts) for p in site.rglob("__init__.py")}
  assert installed == _xlt_packages() | {"xlt.configs"}, how
  # every file of the package ships, modules and data (setup.py's DATA) alike
  missing = sorted(f for f in _shipped_files() if not (site / f).is_file())
  assert not missing, f"not in the install ({how}); add their kind to setup.py's DATA: {missing}"
  assert (site / "xlt" / "configs" / "merge_files.py").is_file() and not (site / "configs").exists()
  (work / "merge.yml").write_text(f"models:\n  - model: {LLAMA}\n  - model: {LLAMA_B}\n"
                                  "merge_method: linear\nparameters:\n  weight: 0.5\ndtype: float32\n")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
  where = subprocess.run([sys.executable, "-c", "import xlt, xlt.io.config_files as c, xlt.report as r; "
                          "print(xlt.__file__, c.path('merge_files.py'), r.ROOT)"],
                         cwd=work, env=env, capture_output=True, text=True)
  assert where.returncode == 0, where.stderr
  package, config, report_root = where.stdout.split()
  assert package.startswith(str(site)) and config.startswith(str(site)), (how, where.stdout)
  assert report_root == str(work)  # results/ and docs/ of the checkout the command runs in
  run = subprocess.run([sys.executable, "-m", "xlt.merge", "--mergekit_yaml=merge.yml", "--config.output=out",
                        "--config.heatmaps=false"], cwd=work, env=env, capture_output=True, text=True)
  assert run.returncode == 0, (how, run.stderr[-2000:])
  assert json.loads((work / "out" / "summary.json").read_text())["config_from"] == LLAMA
  a, b = (tensor_files.load(os.path.join(d, "model.safetensors")) for d in (LLAMA, LLAMA_B))
  got = tensor_files.load(str(work / "out" / "model.safetensors"))
  name = "model.layers.0.mlp.up_proj.weight"
  np.testing.assert_allclose(np.asarray(got[name]), (np.asarray(a[name]) + np.asarray(b[name])) / 2,
                             rtol=1e-6, atol=1e-7)


def test_installed_package_finds_the_documented_configs(tmp_path):
  site, work = tmp_path / "site", tmp_path / "work"
  site.mkdir()
  work.mkdir()
  how = _install(site, tmp_path)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu",
                                                                     "XLT_ALLOCATOR": "system"}
  # the config loads (it imports `configs.common`) and its fields are checked: only then is a
  # misspelt override named with the config's own fields
  run = subprocess.run([sys.executable, "-m", "xlt.main", "--config=configs/graph.py", "--workdir=w",
                        "--config.no_such_field=1"], cwd=work, env=env, capture_output=True, text=True)
  assert run.returncode == 2 and "no field 'no_such_field'" in run.stderr and "mixture" in run.stderr, (how, run.stderr)
  run = subprocess.run([sys.executable, "-m", "xlt.main", "--config=configs/no_such_config.py", "--workdir=w"],
                       cwd=work, env=env, capture_output=True, text=True)
  assert run.returncode == 2 and "no such config file" in run.stderr, run.stderr
