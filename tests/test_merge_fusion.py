"""Parity of xlt.merge.subspace / xlt.merge.localize with fusion-bench: every case of
tests/fixtures/make_fusion_fixtures.py against its fixture (fusion-bench's output), live against
fusion-bench where it is importable, and the recorded differences (docs/merge.md's parity table)."""

import json
import os

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from conftest import load_script
from xlt.merge import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "fusion")
TOLERANCE = 1e-5  # float32 rounding of SVDs (xlt: float64; fusion-bench: float32)


SCRIPT = load_script("tests/fixtures/make_fusion_fixtures.py")
PARITY = load_script("benchmarks/merge_parity_fusion.py")


def xlt_merge(case: str) -> dict:
  return PARITY.xlt_merge(*SCRIPT.CASES[case])


def max_diff(got: dict, want: dict) -> float:
  assert got.keys() == want.keys()
  return max(float(np.abs(np.asarray(got[k], np.float64) - want[k]).max()) for k in want)


def test_the_fixtures_are_the_scripts_cases_and_inputs():
  inputs = PARITY.inputs()
  want = SCRIPT.inputs()
  assert len(inputs["experts"]) == SCRIPT.NUM_EXPERTS
  for got, expected in zip([inputs["base"], *inputs["experts"]], [want["base"], *(want[f"expert{i}"] for i in
                                                                                   range(SCRIPT.NUM_EXPERTS))]):
    assert max_diff(got, expected) == 0
  assert PARITY._models().keys() == want.keys()
  for case, (method, options) in SCRIPT.CASES.items():
    with safe_open(os.path.join(FIXTURES, f"{case}.safetensors"), "numpy") as f:
      meta = f.metadata()
    assert meta["method"] == method and json.loads(meta["options"]) == options, case


@pytest.mark.parametrize("case", sorted(SCRIPT.CASES))
def test_same_tensors_as_fusion_bench(case):
  want = load_file(os.path.join(FIXTURES, f"{case}.safetensors"))
  got = xlt_merge(case)
  assert max_diff(got, want) < TOLERANCE, case
  assert all(np.asarray(got[k]).dtype == np.float32 for k in want)


def test_the_fixtures_are_not_trivial():
  inputs = PARITY.inputs()
  base, experts = inputs["base"], inputs["experts"]
  arithmetic = registry.merge("task_arithmetic", inputs)
  outputs = {case: load_file(os.path.join(FIXTURES, f"{case}.safetensors")) for case in SCRIPT.CASES}
  for case, out in outputs.items():  # every merge moves the base, and not as task arithmetic does
    assert max_diff(out, base) > 0.05 and max_diff(out, arithmetic) > 0.01, case
  # the masks keep some entries and drop others; the retrieved experts differ from each other
  kept = np.abs(outputs["consensus"]["0.weight"] - base["0.weight"]) > 0
  assert 0.1 < kept.mean() < 0.9
  assert max_diff(outputs["tall_mask_e0"], outputs["tall_mask_e1"]) > 0.01
  assert max_diff(outputs["iso_cts"], outputs["iso_c"]) > 0.01 and max_diff(outputs["iso_cts"],
                                                                           outputs["iso_cts_half"]) > 1e-3
  assert len(experts) == 3


def test_the_recorded_parity_is_the_fixtures_cases():
  with open(PARITY.RESULT) as f:
    result = json.load(f)
  assert list(result["cases"]) == list(SCRIPT.CASES)
  for case, (method, options) in SCRIPT.CASES.items():
    c = result["cases"][case]
    assert c["method"] == method and c["options"] == options and 0 <= c["max_abs_diff"] < TOLERANCE, case
  with safe_open(os.path.join(FIXTURES, "tsv_m.safetensors"), "numpy") as f:
    assert result["fusion_bench"] == f.metadata()["fusion_bench"]


@pytest.mark.parametrize("case", sorted(SCRIPT.CASES))
def test_live_against_fusion_bench(case):
  pytest.importorskip("torch")
  pytest.importorskip("fusion_bench")
  assert max_diff(xlt_merge(case), SCRIPT.run_fusion(case)) < TOLERANCE


def test_the_speed_benchmark_merges_its_methods_rows_across_runs(tmp_path):
  bench = load_script("benchmarks/merge_vs_fusion.py")
  inputs = {"hidden": 64, "layers": 1}
  first = {"command": "a", "commit": "c1", "wall_s": 10.0}
  measure = [{"method": "tsv_m", "tool": "xlt", "wall_s": 1.0}, {"method": "regmean", "tool": "xlt", "wall_s": 2.0}]
  old = bench.merged_record({}, ["tsv_m", "regmean"], [["tsv_m", 1], ["regmean", 2]], measure, first)
  old["inputs"] = inputs
  second = {"command": "b", "commit": "c2", "wall_s": 5.0}
  new = bench.merged_record(old, ["iso_c", "tsv_m"], [["tsv_m", 3], ["iso_c", 4]],
                            [{"method": "tsv_m", "tool": "xlt", "wall_s": 3.0}], second)
  assert new["rows"] == [["tsv_m", 3], ["iso_c", 4], ["regmean", 2]]  # the registry's order
  assert new["runs"] == {"tsv_m": second, "iso_c": second, "regmean": first} and new["wall_s"] == 15.0
  assert [(m["method"], m["wall_s"]) for m in new["measurements"]] == [("regmean", 2.0), ("tsv_m", 3.0)]
  path = tmp_path / "r.json"
  assert bench.earlier(str(path), inputs) == {}
  path.write_text(json.dumps(old))
  assert bench.earlier(str(path), inputs)["rows"] == old["rows"]
  with pytest.raises(SystemExit, match="other inputs"):
    bench.earlier(str(path), {"hidden": 128, "layers": 1})


def test_wudi_from_the_command_line_is_fusion_benchs(tmp_path):
  # the fixtures' inputs as model files: base and experts; the command line's merge equals the case
  import subprocess
  import sys
  from safetensors.numpy import save_file
  inputs = PARITY.inputs()
  paths = []
  for name, tree in [("base", inputs["base"])] + [(f"e{i}", e) for i, e in enumerate(inputs["experts"])]:
    paths.append(str(tmp_path / f"{name}.safetensors"))
    save_file({k: np.asarray(v) for k, v in tree.items()}, paths[-1])
  r = subprocess.run([sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py", "--config.method=wudi",
                      f"--config.inputs.base={paths[0]}", f"--config.inputs.experts={','.join(paths[1:])}",
                      "--config.options.steps=50", "--config.options.exclude_keys=0.weight", "--config.heatmaps=false",
                      f"--config.output={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True,
                     env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO})
  assert r.returncode == 0, r.stderr
  got = load_file(str(tmp_path / "out" / "model.safetensors"))
  assert max_diff(got, load_file(os.path.join(FIXTURES, "wudi_exclude.safetensors"))) < TOLERANCE


def test_excluded_keys_take_the_mean_task_vector():
  # fusion-bench's exclude_keys (TSV-M, WUDI): the named tensors skip the method, the others do not
  inputs = PARITY.inputs()
  mean = lambda k: np.mean([np.asarray(e[k], np.float64) for e in inputs["experts"]], axis=0) - inputs["base"][k]
  for case, key, scale in (("tsv_m_exclude", "1.weight", 0.7), ("wudi_exclude", "0.weight", 1.0)):
    got = xlt_merge(case)
    np.testing.assert_allclose(got[key], inputs["base"][key] + scale * mean(key), atol=1e-6)
    other = "0.weight" if key == "1.weight" else "1.weight"
    assert np.abs(got[other] - (inputs["base"][other] + scale * mean(other))).max() > 1e-3
