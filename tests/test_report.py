"""xlt.report: docs/results.md is the render of the committed results/ files; render, collect and
the check on small hand-made inputs; a bad workdir is one line and exit status 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from xlt import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _row(experiment, task, language, role, condition, metric, values, samples):
  mean = sum(values) / len(values)
  std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
  return dict(experiment=experiment, task=task, language=language, role=role, condition=condition,
              metric=metric, samples=samples, mean=mean, std=std, seeds=len(values), values=values)


def _workdir(tmp_path, name="run"):
  """A finished graph run's outputs, as xlt.runner.write_outputs leaves them (two seeds)."""
  w = tmp_path / name
  w.mkdir()
  rows = [_row("g", "graph", "edge_plain", "target", "alone", "valid", [0.5, 0.4], 256),
          _row("g", "graph", "edge_plain", "target", "mixed", "valid", [0.95, 0.9], 256),
          _row("g", "graph", "node_plain", "source", "mixed", "valid", [0.99, 0.98], 2048),
          _row("g", "graph", "edge_plain", "target", "mixed", "shortest", [0.9, 0.8], 256)]
  (w / "results.json").write_text(json.dumps(rows))
  (w / "summary.json").write_text(json.dumps({"wall_s": 612.4, "train_tokens_per_s": 20000.4}))
  return w


def test_results_doc_is_the_render_of_the_results_files():
  # edit a results/*.json without `python -m xlt.report` and this fails
  assert report.check() is None
  assert report.load(), "results/ holds no files"


def test_render_of_a_tiny_results_dir(tmp_path):
  result = {"name": "toy", "config": "configs/toy.py", "command": "python -m xlt.main --config=configs/toy.py",
            "reproduces": "Table 9", "headline": "It transfers.", "metric": "valid", "unit": "%",
            "measured": {"commit": "abc1234", "date": "2026-01-02", "machine": "2-core CPU", "wall_time": "60 s"},
            "measurements": [
                {"key": "t", "label": "lang 2", "summary": True,
                 "reference": {"mean": 98.05, "std": 1.8, "decimals": None, "alone": {"mean": 23.9, "decimals": None}},
                 "xlt": {"mean": 94.3, "std": 1.32, "seeds": 3, "values": [95.8, 93.3, 93.8],
                         "alone": {"mean": 45.1, "std": 4.64, "seeds": 3}}},
                {"key": "s", "label": "lang 1", "summary": False, "reference": None,
                 "xlt": {"mean": 98.0, "seeds": 1}, "measured": {"commit": "def5678"}}]}
  (tmp_path / "toy.json").write_text(json.dumps(result))
  text = report.render(report.load(str(tmp_path)))
  assert ("| toy: lang 2 (valid %) | 23.9 → 98.05 ± 1.8 | 45.10 ± 4.64 → 94.30 ± 1.32 (3 seeds) | 60 s | "
          "2-core CPU | abc1234 | 2026-01-02 |") in text.splitlines()
  assert "| toy: lang 1" not in text  # not a summary figure: only in its experiment's section
  assert ("| lang 1 (valid %) | – | 98.00 (1 seed) |  | 60 s | 2-core CPU | def5678 | 2026-01-02 |"
          in text.splitlines())
  assert "| lang 2 (valid %) | 23.9 → 98.05 ± 1.8 | 45.10 ± 4.64 → 94.30 ± 1.32 (3 seeds) | 95.8 / 93.3 / 93.8 |" in text
  assert "## toy" in text and "python -m xlt.main --config=configs/toy.py" in text and "It transfers." in text
  assert report.render(report.load(str(tmp_path))) == text  # deterministic


def test_check_names_a_stale_doc_in_one_line(tmp_path, capsys):
  (tmp_path / "results").mkdir()
  doc = tmp_path / "results.md"
  doc.write_text("old\n")
  assert report.main(["--check", f"--results_dir={tmp_path / 'results'}", f"--out={doc}"]) == 1
  assert len(capsys.readouterr().err.strip().splitlines()) == 1
  speed = open(report.SPEED_DOC, encoding="utf-8").read()
  assert report.main([f"--results_dir={tmp_path / 'results'}", f"--out={doc}"]) == 0
  assert report.main(["--check", f"--results_dir={tmp_path / 'results'}", f"--out={doc}"]) == 0
  # another results directory leaves the repository's speed tables alone
  assert open(report.SPEED_DOC, encoding="utf-8").read() == speed


def test_collect_builds_the_results_file(tmp_path):
  w = _workdir(tmp_path)
  out = tmp_path / "results"
  got = report.collect(str(w), "configs/graph.py", "toy", results_dir=str(out), commit="abc1234",
                       date="2026-01-02", where="2-core Test CPU, AVX2, no AVX-512")
  assert json.loads((out / "toy.json").read_text()) == got
  assert got == {
      "name": "toy", "config": "configs/graph.py", "command": "python -m xlt.main --config=configs/graph.py "
      "--workdir=runs/toy", "reproduces": "",
      "headline": "target edge_plain: alone → mixed: 45.00 ± 7.07 → 92.50 ± 3.54 (2 seeds).",
      "metric": "valid", "unit": "%",
      "measured": {"commit": "abc1234", "date": "2026-01-02", "machine": "2-core Test CPU, AVX2, no AVX-512",
                   "wall_time": "612 s", "tokens_per_s": 20000},
      "measurements": [
          {"key": "target/edge_plain", "label": "target edge_plain: alone → mixed", "summary": True,
           "reference": None, "xlt": {"mean": 92.5, "std": 3.54, "seeds": 2, "values": [95.0, 90.0],
                                      "alone": {"mean": 45.0, "std": 7.07, "seeds": 2, "values": [50.0, 40.0]}}},
          {"key": "source/node_plain/mixed", "label": "source node_plain: mixed", "summary": False,
           "reference": None, "xlt": {"mean": 98.5, "std": 0.71, "seeds": 2, "values": [99.0, 98.0]}}]}


def test_collect_updates_keeping_references_and_other_runs(tmp_path):
  out = tmp_path / "results"
  out.mkdir()
  ref = {"mean": 98.05, "std": 1.8, "decimals": None}
  old = {"name": "toy", "config": "configs/graph.py", "command": "python -m xlt.main --config=configs/graph.py",
         "reproduces": "Table 3", "headline": "old", "metric": "valid", "unit": "%",
         "measured": {"commit": "0000000", "date": "2025-12-31", "machine": "old CPU", "wall_time": "9 s"},
         "measurements": [{"key": "target/edge_plain", "label": "lang 2", "summary": True, "reference": ref,
                           "xlt": {"mean": 1.0}},
                          {"key": "seed_700/target/edge_plain", "label": "second graph", "summary": False,
                           "reference": ref, "xlt": {"mean": 2.0}}]}
  (out / "toy.json").write_text(json.dumps(old))
  got = report.collect(str(_workdir(tmp_path)), "configs/graph.py", "toy", results_dir=str(out),
                       commit="abc1234", date="2026-01-02", where="cpu")
  first, _, kept = got["measurements"]
  assert (first["label"], first["reference"], first["xlt"]["mean"]) == ("lang 2", ref, 92.5)
  assert got["reproduces"] == "Table 3" and got["command"] == old["command"]
  assert got["headline"] == "lang 2: 45.00 ± 7.07 → 92.50 ± 3.54 (2 seeds), reference 98.05 ± 1.8."
  assert kept["measured"] == old["measured"] and kept["xlt"] == {"mean": 2.0}  # where and when it was measured


def test_collect_of_a_grid_reads_each_points_summary(tmp_path):
  w = tmp_path / "grid"
  for point, wall in (("a", 100.0), ("b", 200.0)):
    (w / point).mkdir(parents=True)
    (w / point / "summary.json").write_text(json.dumps({"wall_s": wall}))
  rows = [_row(f"g/{p}", "addition", "letter", "target", c, "exact_match", [v], 160)
          for p in ("a", "b") for c, v in (("alone", 0.0), ("mixed", 0.5))]
  (w / "results.json").write_text(json.dumps(rows))
  got = report.collect(str(w), "configs/x.py:cpu", "grid", results_dir=str(tmp_path / "r"), commit="c",
                       date="d", where="m")
  assert [(m["key"], m["measured"]["wall_time"]) for m in got["measurements"]] == [
      ("a/target/letter", "100 s"), ("b/target/letter", "200 s")]


def test_machine_reads_cpuinfo(tmp_path):
  info = tmp_path / "cpuinfo"
  block = "processor\t: {}\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 {}\n\n"
  info.write_text(block.format(0, "") + block.format(1, ""))
  assert report.machine(str(info)) == "2-core AMD EPYC 7B13, AVX2, no AVX-512"
  info.write_text(block.format(0, "avx512f"))
  assert report.machine(str(info)) == "1-core AMD EPYC 7B13, AVX-512"


def _collect_cli(*args):
  return subprocess.run([sys.executable, "-m", "xlt.report", "collect", *args], capture_output=True, text=True,
                        cwd=ROOT, timeout=60)


def test_a_bad_workdir_is_one_line_and_exit_2(tmp_path):
  (tmp_path / "unfinished").mkdir()  # a run that has not written results.json yet
  (tmp_path / "broken").mkdir()
  (tmp_path / "broken" / "results.json").write_text("[{")
  for workdir in (tmp_path / "missing", tmp_path / "unfinished", tmp_path / "broken"):
    out = _collect_cli(f"--workdir={workdir}", "--config=configs/graph.py", "--name=x",
                       f"--results_dir={tmp_path / 'results'}")
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and str(workdir) in out.stderr
  assert not (tmp_path / "results").exists()


def _numbers(text: str) -> list[float]:
  return [float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", text.replace(",", ""))]


def test_readme_results_table_quotes_the_results_files():
  """Each README row's xlt figures are figures of its config's results file: the README is a
  headline, results/*.json the record, and they cannot drift apart."""
  by_config = {}
  for result in report.load():
    by_config[result["config"].removeprefix("configs/")] = json.dumps(result)
  studies = os.path.join(report.RESULTS_DIR, "studies")  # preregistered studies (xlt.claims), their own record
  for name in sorted(os.listdir(studies)) if os.path.isdir(studies) else []:
    with open(os.path.join(studies, name), encoding="utf-8") as f:
      study = json.load(f)
    by_config[study["prereg"]["config"].removeprefix("configs/")] = json.dumps(study, ensure_ascii=False)
  readme = open(os.path.join(report.ROOT, "README.md"), encoding="utf-8").read()
  rows = [line.split("|")[1:-1] for line in readme.splitlines() if line.startswith("| `")]
  assert len(rows) >= len(by_config) - 1, "the README's results table lost rows"
  for cells in rows:
    config = cells[0].strip().strip("`")
    assert config in by_config, f"README row {config} has no results/*.json"
    have = _numbers(by_config[config])
    derived = re.sub(r"\([^)]*\)", "", cells[3])  # parenthesised notes (relative changes) are derived
    for x in _numbers(derived):
      assert any(abs(x - y) < 0.006 for y in have), f"README row {config}: {x} is not in its results file"


def test_speed_doc_tables_are_the_render_of_the_benchmark_files():
  # edit a results/benchmarks/*.json without `python -m xlt.report` and this fails
  assert report.check_speed() is None


def test_speed_doc_renders_one_table_per_file_grouped_by_machine(tmp_path):
  from xlt import speed_doc

  bench = tmp_path / "results" / "benchmarks"
  bench.mkdir(parents=True)
  base = {"command": "python benchmarks/x.py", "commit": "abc1234", "date": "2026-01-02", "wall_s": 61.2,
          "versions": {"jax": "0.10.2"}, "columns": ["shape", "xlt tok/s", "xlt / PyTorch"]}
  (bench / "a.json").write_text(json.dumps({**base, "benchmark": "a", "title": "Step A", "machine": "CPU 1",
                                            "rows": [["tiny", 3017.2, 1.034], ["small", 12.34, None]]}))
  (bench / "b.json").write_text(json.dumps({**base, "benchmark": "b", "title": "Step B", "machine": "CPU 2",
                                            "rows": [["tiny", 5, 0.5]], "notes": "busy machine"}))
  (bench / "c.json").write_text(json.dumps({"no": "columns"}))  # another record: not rendered
  doc = tmp_path / "speed.md"
  doc.write_text("# Speed\n\nprose kept\n\n" + speed_doc.BEGIN + "\nold\n" + speed_doc.END + "\n\ntail kept\n")
  assert report.check_speed(str(tmp_path / "results"), str(doc)) is not None  # stale
  have, want = speed_doc.update(str(bench), str(doc))
  lines = want.splitlines()
  assert lines[:3] == ["# Speed", "", "prose kept"] and lines[-1] == "tail kept" and "old" not in lines
  assert lines.index("## CPU 1") < lines.index("### Step A") < lines.index("## CPU 2") < lines.index("### Step B")
  assert "| tiny | 3,017 | 1.03 |" in lines and "| small | 12.3 | – |" in lines and "| tiny | 5 | 0.50 |" in lines
  assert "From `results/benchmarks/a.json` (commit abc1234, date 2026-01-02, 61 s; jax 0.10.2)." in lines
  assert "busy machine" in lines and "`python benchmarks/x.py`" in lines
  doc.write_text(want)
  assert report.check_speed(str(tmp_path / "results"), str(doc)) is None


def test_speed_doc_bad_file_is_one_line_and_exit_2(tmp_path):
  bench = tmp_path / "benchmarks"
  bench.mkdir()
  (bench / "bad.json").write_text(json.dumps({"title": "t", "command": "c", "machine": "m",
                                              "columns": ["a", "b"], "rows": [[1]]}))
  out = subprocess.run([sys.executable, "-m", "xlt.report", "--results_dir", str(tmp_path / "none"),
                        "--out", str(tmp_path / "r.md"), "--speed_out", str(tmp_path / "s.md")],
                       cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  (tmp_path / "none").mkdir()
  (tmp_path / "none" / "benchmarks").symlink_to(bench)
  out = subprocess.run([sys.executable, "-m", "xlt.report", "--results_dir", str(tmp_path / "none"),
                        "--out", str(tmp_path / "r.md"), "--speed_out", str(tmp_path / "s.md")],
                       cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "a row of 1 cells" in out.stderr


def test_speed_cells_keep_small_differences_visible():
  from xlt import speed_doc
  assert [speed_doc.cell(x) for x in (3017.2, 12.34, 1.034, 4.63e-05, 0.0, None)] == [
      "3,017", "12.3", "1.03", "4.6e-05", "0.00", "–"]
