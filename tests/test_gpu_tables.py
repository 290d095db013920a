"""benchmarks/gpu_tables.sh, the prepared GPU run of Tables 2 and 3 at the reference's size, at a
tiny size on the CPU: the same commands end to end, each table's results kept."""

import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_tiny_gpu_tables_run_writes_both_tables(tmp_path):
  env = {**os.environ, "XLT_TABLES_TINY": "1", "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)  # one device, as on the GPU
  subprocess.run(["bash", "benchmarks/gpu_tables.sh", str(tmp_path), "240", "240"], cwd=ROOT, env=env,
                 check=True, capture_output=True, timeout=600)
  for name, point in (("table2", "addition_table2/standard+letter"), ("table3", "graph_table3/diff_grammar_m256")):
    assert f"{name} exit: 0" in (tmp_path / f"{name}.log").read_text()
    rows = json.loads((tmp_path / f"{name}.results.json").read_text())
    assert {r["experiment"] for r in rows} == {point}
    assert {r["condition"] for r in rows} == {"alone", "mixed"}
    assert all(r["steps"] == [4] * r["seeds"] for r in rows)  # the tiny budget, not the reference's
    assert (tmp_path / f"{name}.tgz").stat().st_size > 0
