"""The synthetic kind (xlt.experiments.synthetic: graph, addition) end to end through the runner and
the command line: results, best-parameter selection, resumption after SIGKILL, grid points."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import child_env
from configs import addition, addition_sweep, addition_table2
from xlt import checkpoint, results, runner
from xlt.experiments import synthetic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_graph_experiment_writes_results(graph_config, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path.parent)  # a relative workdir, as on the command line
  rows = runner.run(graph_config, tmp_path.name, progress=False)
  on_disk = json.load(open(tmp_path / "results.json"))
  assert on_disk == rows
  keys = {(r["language"], r["role"], r["condition"], r["metric"]) for r in rows}
  for lang, role in (("node_plain", "source"), ("edge_plain", "target")):
    for cond in ("alone", "mixed"):
      assert (lang, role, cond, "valid") in keys and (lang, role, cond, "shortest") in keys
  for r in rows:
    assert set(results.FIELDS) <= set(r)
    assert r["seeds"] == 2 and len(r["values"]) == 2
    assert all(0.0 <= v <= 1.0 for v in r["values"])
    assert r["mean"] == pytest.approx(np.mean(r["values"]))
  assert {r["samples"] for r in rows if r["role"] == "target"} == {64}
  for name in ("results.csv", "table.md", "curves.png", "summary.json", "metrics.jsonl", "predictions.jsonl"):
    assert (tmp_path / name).exists(), name
  assert "| graph_diff_grammar | node_plain | edge_plain | 256 | 64 |" in (tmp_path / "table.md").read_text()
  # every test prompt's answer, per member; their scores average to the rows' values
  preds = [json.loads(l) for l in open(tmp_path / "predictions.jsonl")]
  mixed0 = [p for p in preds if p["member"].startswith("mixed") and p["member"].endswith("seed_0")
            and p["set"] == "edge_plain"]
  assert len(mixed0) == graph_config.graph.num_test_pairs
  row = next(r for r in rows if r["condition"] == "mixed" and r["language"] == "edge_plain" and r["metric"] == "valid")
  assert np.mean([p["scores"]["valid"] for p in mixed0]) == pytest.approx(row["values"][0])
  assert {"prompt", "answer", "scores"} <= set(mixed0[0])
  assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["12", "8"]  # max_to_keep=2
  # tested: each member at its best validation score, recorded per row
  assert (tmp_path / "best_params.npz").exists()
  for r in rows:
    assert all(b <= s for b, s in zip(r["best_steps"], r["steps"]))
    assert len(r["best_val"]) == r["seeds"] and all(0.0 <= v <= 1.0 for v in r["best_val"])
  # a finished experiment is not trained again
  assert runner.run(graph_config, str(tmp_path), progress=False) == rows


def test_best_params_keeps_each_members_best_and_survives_a_restart(tmp_path):
  path = str(tmp_path / "best.npz")
  like = {"w": np.zeros((3, 2))}
  best = checkpoint.BestParams(path, 3)
  assert best.params(like) is like  # nothing recorded yet
  best.update({"w": np.full((3, 2), 1.0)}, [0.5, 0.2, 0.1], [0, 1, 2])
  best.update({"w": np.full((2, 2), 2.0)}, [0.4, 0.3], [0, 2])  # member 0 got worse
  want = np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]])
  np.testing.assert_array_equal(best.params(like)["w"], want)
  again = checkpoint.BestParams(path, 3)  # a resumed run reads the same models back
  np.testing.assert_array_equal(again.params(like)["w"], want)
  np.testing.assert_array_equal(again.scores, [0.5, 0.2, 0.3])
  with pytest.raises(ValueError, match="fresh workdir"):
    checkpoint.BestParams(path, 4)


def test_seeds_per_condition_and_reduced_addition_configs():
  c = addition.get_config("cpu")
  cells = synthetic.plan(c)
  assert [(cell.condition, cell.seed) for cell in cells] == [
      ("target_alone", 0), ("source_alone", 0), ("mixed", 0), ("mixed", 1), ("mixed", 2)]
  assert (c.model.dropout, c.opt.weight_decay, c.train.steps) == (0.05, 1.0, 5000)
  assert dict(cells[2].samples) == {"standard": 11520 // 8, "letter": 1280 // 8}
  c.seeds_per_condition = {"mixed": 0}
  with pytest.raises(ValueError, match="needs >= 1 seed"):
    synthetic.plan(c)
  # the reduced grid keeps the reference's N/M ratios; a Roman pair gets a block that fits
  full, cpu = addition_table2.get_config(), addition_table2.get_config("cpu")
  for f, r in zip(full.grid, cpu.grid):
    assert r["mixture.source_samples"] * 8 == f["mixture.source_samples"]
    assert r["mixture.target_samples"] * 8 == f["mixture.target_samples"]
  assert [g["model.block_size"] for g in full.grid] == [64, 128, 64, 64, 128, 64]
  assert all(g["model.block_size"] == 64 for g in cpu.grid)
  assert addition_sweep.get_config("cpu").sweep.samples == (125, 250, 500, 1000, 2000)
  assert full.model.pos_embedding == "rope"  # LitGPT, the reference's implementation


def test_make_row_validates():
  with pytest.raises(ValueError, match="missing"):
    results.make_row(language="x", values=[1.0])
  r = results.make_row(experiment="e", task="t", language="l", role="target", condition="alone",
                       metric="valid", samples=3, values=[0.5, 1.0])
  assert r["mean"] == 0.75 and r["std"] == pytest.approx(np.std([0.5, 1.0], ddof=1))


def _main(workdir, *extra):
  overrides = ["--config.num_seeds=1", "--config.model.num_layers=2", "--config.model.d_model=32",
               "--config.model.num_heads=2", "--config.mixture.source_samples=256",
               "--config.mixture.target_samples=64", "--config.graph.num_test_pairs=64",
               "--config.graph.num_val_pairs=32", "--config.train.batch_size=16",
               "--config.train.steps=20", "--config.train.eval_every=10", "--config.train.checkpoint_every=5",
               "--config.eval.batch_size=64", "--config.mesh.data=1", "--config.mesh.devices=1"]
  return [sys.executable, "-m", "xlt.main", "--config=configs/graph.py", f"--workdir={workdir}",
          *overrides, *extra], child_env(PYTHONUNBUFFERED="1")


def test_sigkill_and_rerun_gives_the_uninterrupted_result(tmp_path):
  cmd, env = _main(tmp_path / "full")
  subprocess.run(cmd, env=env, cwd=REPO, check=True, capture_output=True)
  cmd, env = _main(tmp_path / "killed")
  proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  ckpt = tmp_path / "killed" / "ckpt"
  deadline = time.time() + 120
  # killed at its first checkpoint (step 5 of 20): the rerun resumes there and trains through
  # both evaluations (steps 10, 20), as the uninterrupted run did
  while time.time() < deadline and not (ckpt.exists() and any(p.name.isdigit() and int(p.name) >= 5 for p in ckpt.iterdir())):
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (tmp_path / "killed" / "results.json").exists()
  subprocess.run(cmd, env=env, cwd=REPO, check=True, capture_output=True)
  full = json.load(open(tmp_path / "full" / "results.json"))
  resumed = json.load(open(tmp_path / "killed" / "results.json"))
  assert [r["values"] for r in full] == [r["values"] for r in resumed]


def test_points_flag_errors(tmp_path):
  # --points outside a grid, or naming a point the grid lacks, workers that cannot split the
  # run, --stop_after on a grid: one line, exit 2, nothing trained (no allocator re-execution:
  # one interpreter start each). All but the unknown point are found before jax is imported.
  env = child_env(PYTHONUNBUFFERED="1")
  for config, flag, want in (("configs/graph.py", "--points=diff_vocab_m256,no_such_point", "has no grid"),
                             ("configs/graph_table3.py", "--points=diff_vocab_m256,no_such_point", "not in the grid"),
                             ("configs/graph.py", "--point_workers=2", "has no grid"),
                             ("configs/graph_table3.py", "--point_workers=10000", "each worker needs a core of its own"),
                             ("configs/graph_table3.py", "--stop_after=3", "a grid config runs several")):
    r = subprocess.run([sys.executable, "-m", "xlt.main", f"--config={config}", f"--workdir={tmp_path}", flag],
                       env=env, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
  assert not any(tmp_path.iterdir())


def test_a_workdir_of_another_config_is_a_user_error(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"name": "someone else's run"}))
  cmd, env = _main(tmp_path)
  r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
  assert r.returncode == 2 and "holds an experiment run with another config (" in r.stderr, r.stderr
  assert "name: \"someone else's run\" there, 'graph_diff_grammar' now" in r.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # nothing trained or written


def test_point_workers_train_a_grid_from_the_command_line(tmp_path):
  # two points at once, each a `python -m xlt.main --points=...` of its own (the command's
  # overrides passed on), pinned to its own core; the parent gathers their results
  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("two point workers need two cores")
  cmd, env = _main(tmp_path)
  cmd = [a.replace("configs/graph.py", "configs/graph_table3.py") for a in cmd]
  cmd = [a for a in cmd if not a.startswith(("--config.mixture", "--config.train.steps", "--config.train.eval"))]
  cmd = [a for a in cmd if not a.startswith("--config.graph.num_")]
  cmd += ["--config.mixture.source_samples=128", "--config.train.steps=10", "--config.train.eval_every=10",
          "--config.conditions=('mixed',)", "--config.graph.num_test_pairs=16", "--config.graph.num_val_pairs=16",
          "--points", "diff_vocab_m256,diff_grammar_m256", "--point_workers=2"]
  r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.count("started on core(s)") == 2 and r.stdout.count(": finished in") == 2
  rows = json.load(open(tmp_path / "results.json"))
  assert {row["experiment"] for row in rows} == {"graph_table3/diff_vocab_m256", "graph_table3/diff_grammar_m256"}
  for point in ("diff_vocab_m256", "diff_grammar_m256"):
    assert json.load(open(tmp_path / point / "config.json"))["train"]["steps"] == 10  # the overrides reached it
    assert "task graph:" in (tmp_path / "logs" / f"{point}.log").read_text()  # the worker's own output
