"""xlt's subspace and mask merges against fusion-bench's, on the fixtures of
tests/fixtures/make_fusion_fixtures.py: the largest absolute difference per case, written to
results/benchmarks/merge_fusion_parity.json, which docs/merge.md's parity table is rendered from
(`python -m xlt.merge.methods_doc docs/merge.md`).

  python benchmarks/merge_parity_fusion.py      # xlt only: fusion-bench's side is the fixtures

tests/test_merge_fusion.py checks the same differences against a tolerance.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

from xlt.io import fileio
from xlt.merge import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "fusion")
RESULT = os.path.join(ROOT, "results", "benchmarks", "merge_fusion_parity.json")


def fixture_script():
  spec = importlib.util.spec_from_file_location("make_fusion_fixtures",
                                                os.path.join(ROOT, "tests", "fixtures", "make_fusion_fixtures.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _models() -> dict:
  models: dict = {}
  for key, value in load_file(os.path.join(FIXTURES, "inputs.safetensors")).items():
    model, name = key.split("/", 1)
    models.setdefault(model, {})[name] = value
  return models


def inputs() -> dict:
  """{"base": tree, "experts": [trees]} of the fixtures' inputs."""
  models = _models()
  return {"base": models["base"], "experts": [models[k] for k in sorted(models) if k.startswith("expert")]}


def xlt_merge(method: str, options: dict) -> dict:
  """xlt's merge of a fixture case: the data-aware methods take the experts alone, with the
  fixtures' statistics (their names are "0.weight", ...: blocks by the pattern "{i}.", rows axis 0)."""
  if method not in ("regmean", "fisher"):
    return registry.merge(method, inputs(), options, naming="auto")
  models = _models()
  stats = "gram" if method == "regmean" else "fisher"
  statistics = [models[k] for k in sorted(models) if k.startswith(stats)]
  return registry.merge(method, {"experts": inputs()["experts"]}, {**options, f"{stats}s": statistics},
                        naming="{i}.")


def case_diff(case: str, method: str, options: dict) -> float:
  """max |xlt - fusion-bench| over every tensor of `case`."""
  path = os.path.join(FIXTURES, f"{case}.safetensors")
  with safe_open(path, "numpy") as f:
    meta = f.metadata()
  assert meta["method"] == method and json.loads(meta["options"]) == options, f"{case}: the fixture is stale"
  want = load_file(path)
  got = xlt_merge(method, options)
  return max(float(np.abs(np.asarray(got[k], np.float64) - want[k]).max()) for k in want)


def main():
  script = fixture_script()
  with safe_open(os.path.join(FIXTURES, "tsv_m.safetensors"), "numpy") as f:
    version = f.metadata()["fusion_bench"]
  cases = {case: {"method": method, "options": options, "max_abs_diff": case_diff(case, method, options)}
           for case, (method, options) in script.CASES.items()}
  result = {"fusion_bench": version, "inputs": "tests/fixtures/fusion (float32 MLP 10-12-8, 3 experts)",
            "cases": cases}
  fileio.write_text(RESULT, json.dumps(result, indent=1) + "\n")
  for case, c in cases.items():
    print(f"{case}: {c['max_abs_diff']:.2e}")


if __name__ == "__main__":
  main()
