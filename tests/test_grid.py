import ast
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from configs import addition, addition_table2
from xlt import grid, workers
from xlt.data import addition as addition_data
from xlt.experiments import synthetic


def _tiny(c):
  c.num_seeds = 1
  c.model.num_layers, c.model.num_heads, c.model.d_model = 1, 2, 16
  c.addition.max_digits, c.addition.num_test, c.addition.num_val = 4, 32, 16
  c.train.batch_size, c.train.steps, c.train.eval_every, c.train.checkpoint_every = 16, 4, 2, 2
  c.opt.warmup_steps = 1
  c.eval.batch_size = 32
  c.mesh.data, c.mesh.devices = 1, 1
  return c


def test_addition_task_holds_out_every_languages_test_problems():
  c = addition.get_config()
  c.addition.max_digits, c.addition.num_test, c.addition.num_val = 4, 200, 50
  task = synthetic.get_task(c, [synthetic.Cell("mixed", (("standard", 3000), ("letter", 3000)), 0)])
  held = set()
  for lang in ("standard", "letter"):
    for es in (task.test[lang], task.val[lang]):
      held |= {tuple(sorted(_operands(p, lang))) for p in es.prompts}
  for lang in ("standard", "letter"):
    trained = {tuple(sorted(addition_data.parse_example(ex, lang)[:2])) for ex in task.train[lang]}
    assert not trained & held
  # the base-10 languages share their test problems (parallel test sets)
  assert [_operands(p, "standard") for p in task.test["standard"].prompts] == \
         [_operands(p, "letter") for p in task.test["letter"].prompts]
  # exact match scores the true answer 1 and a wrong one 0
  es = task.test["letter"]
  a, b = _operands(es.prompts[0], "letter")
  right = list(addition_data.encode_number(a + b, "letter"))[::-1]
  assert es.score(0, right) == {"exact_match": 1.0}
  assert es.score(0, right[:-1]) == {"exact_match": 0.0}


def _operands(prompt, lang):
  a, b, _ = addition_data._parse_prompt(tuple(prompt), lang)
  return a, b


def test_sweep_cells_share_one_ensemble_and_use_prefixes():
  c = _tiny(addition.get_config())
  c.sweep = {"language": "standard", "samples": (20, 40)}
  cells = synthetic.plan(c)
  assert [cell.samples for cell in cells] == [(("standard", 20),), (("standard", 40),)]
  task = synthetic.get_task(c, cells)
  assert len(task.train["standard"]) == 40


def test_grid_runs_each_point_and_resumes(tmp_path, capsys):
  c = _tiny(addition_table2.get_config())
  c.grid = [dict(p, **{"mixture.source_samples": 64, "mixture.target_samples": 16}) for p in c.grid[:2]]
  rows = grid.run(c, str(tmp_path), progress=False)
  assert {r["experiment"] for r in rows} == {"addition_table2/standard+letter", "addition_table2/standard+roman"}
  assert json.load(open(tmp_path / "results.json")) == rows
  assert "standard+roman" in (tmp_path / "table.md").read_text()
  capsys.readouterr()
  assert grid.run(c, str(tmp_path), progress=False) == rows  # finished points are not retrained
  assert capsys.readouterr().out.count("finished earlier") == 2


def test_bad_grid_point_fails_before_training(tmp_path):
  c = _tiny(addition_table2.get_config())
  c.grid = [{"name": "x", "mixture.sauce": "standard"}]
  with pytest.raises(ValueError, match="unknown config field"):
    grid.run(c, str(tmp_path), progress=False)


def test_grid_points_selected_by_name(tmp_path):
  points = [{"name": n} for n in ("a", "b", "c")]
  assert grid.select(points) == points
  assert grid.select(points, ["c", "a"]) == [{"name": "a"}, {"name": "c"}]  # the grid's order
  for bad in (["a", "d"], []):
    with pytest.raises(ValueError, match="not in the grid"):
      grid.select(points, bad)
  with pytest.raises(ValueError, match="unique"):
    grid.select(points + [{"name": "a"}])
  c = _tiny(addition_table2.get_config())
  c.grid = [dict(p, **{"mixture.source_samples": 64, "mixture.target_samples": 16}) for p in c.grid[:2]]
  rows = grid.run(c, str(tmp_path), progress=False, only=["standard+roman"])
  assert {r["experiment"] for r in rows} == {"addition_table2/standard+roman"}
  assert not (tmp_path / "standard+letter").exists()


def test_graph_table3_grid_points_are_valid_experiments():
  from configs import graph_table3

  c = graph_table3.get_config()
  points = [grid.point_config(c, p) for p in c.grid]
  assert [p.name for p in points] == [f"graph_table3/{n}_m{m}" for m in (256, 512)
                                      for n in ("diff_vocab", "diff_grammar", "diff_grammar_vocab")]
  for p in points:
    cells = synthetic.plan(p)
    assert {cell.condition for cell in cells} == {"target_alone", "source_alone", "mixed"}
    assert dict(next(cell for cell in cells if cell.condition == "mixed").samples) == {
        p.mixture.source: 2048, p.mixture.target: p.mixture.target_samples}


# A stand-in point worker: reports its cores and XLA_FLAGS, then writes the point's results
# (or fails with exit status 3 for a point named "fail..."), without training anything.
_FAKE_WORKER = """
import json, os, sys
from xlt import cpu_devices, results
cpu_devices.configure()
name, workdir = sys.argv[1], sys.argv[2]
print("cores", sorted(os.sched_getaffinity(0)), "flags", os.environ["XLA_FLAGS"], flush=True)
if name.startswith("fail"):
  sys.exit(3)
row = results.make_row(experiment="addition_table2/" + name, task="addition", language="standard", role="source",
                       condition="mixed", metric="exact_match", samples=64, values=[1.0])
results.write(os.path.join(workdir, name), [row])
"""


def _fake_grid(names):
  c = _tiny(addition_table2.get_config())
  c.grid = [{"name": n} for n in names]
  return c


def test_point_workers_run_each_point_pinned_and_gather(tmp_path, capsys):
  cores = sorted(os.sched_getaffinity(0))
  workers = min(2, len(cores))
  c = _fake_grid(["a", "b", "c"])
  started = []

  def command(name):
    started.append(name)
    return [sys.executable, "-c", _FAKE_WORKER, name, str(tmp_path)]

  rows = grid.run_in_workers(c, str(tmp_path), command, workers, progress=False, poll_s=0.05)
  assert sorted(started) == ["a", "b", "c"]
  assert [r["experiment"] for r in rows] == [f"addition_table2/{n}" for n in "abc"]  # the grid's order
  assert json.load(open(tmp_path / "results.json")) == rows
  used = set()
  for n in "abc":
    log = (tmp_path / "logs" / f"{n}.log").read_text()
    got = ast.literal_eval(log.split("cores ")[1].split(" flags")[0])
    assert len(got) == len(cores) // workers and set(got) <= set(cores)  # a core set of its own
    flags = log.split(" flags ")[1].split()
    # the parent's device count is not passed on: the worker makes one device per core of its own
    assert [f for f in flags if "device_count" in f] == [f"--xla_force_host_platform_device_count={len(got)}"]
    used.add(tuple(got))
    assert (tmp_path / n / "config.json").exists()  # each point's config recorded before it ran
  assert len(used) == workers
  capsys.readouterr()
  assert grid.run_in_workers(c, str(tmp_path), lambda n: 1 / 0, workers, progress=False) == rows  # all finished
  assert "started" not in capsys.readouterr().out


def test_a_failed_point_worker_stops_the_grid_and_keeps_the_others(tmp_path, capsys):
  c = _fake_grid(["a", "fail_b", "c"])
  command = lambda name: [sys.executable, "-c", _FAKE_WORKER, name, str(tmp_path)]
  with pytest.raises(workers.WorkerFailed, match=r"fail_b \(exit 3, see .*fail_b.log\)"):
    grid.run_in_workers(c, str(tmp_path), command, 1, progress=False, poll_s=0.05)
  assert (tmp_path / "a" / "results.json").exists()
  assert not (tmp_path / "c").joinpath("results.json").exists()  # nothing starts after a failure
  assert not (tmp_path / "results.json").exists()
  assert "cores" in capsys.readouterr().err  # the end of the failed worker's log is shown
  with pytest.raises(ValueError, match="each worker needs a core of its own"):
    grid.run_in_workers(c, str(tmp_path), command, len(os.sched_getaffinity(0)) + 1)


def test_worker_cores_split_evenly():
  assert workers.worker_cores(2, [3, 0, 1, 2]) == [[0, 1], [2, 3]]
  assert workers.worker_cores(2, [0, 1, 2]) == [[0, 1], [2]]
  assert workers.worker_cores(1, [5]) == [[5]]
  for bad in (0, 3):
    with pytest.raises(ValueError, match=r"point workers on 2 cores.*1 <= point_workers <= 2"):
      workers.worker_cores(bad, [0, 1], "point workers")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_grids_end_stops_its_workers(tmp_path, sig):
  # a scheduler's SIGTERM to the parent must not leave its point workers running; nor may
  # SIGKILL, which runs no handler (the kernel signals the workers: workers.die_with_parent)
  if sig == signal.SIGKILL and sys.platform != "linux":
    pytest.skip("PR_SET_PDEATHSIG is Linux's")
  script = f"""
import sys
from xlt import grid
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_grid import _fake_grid
c = _fake_grid(["a", "b"])
sleeper = ("import os, time; from xlt import workers; workers.die_with_parent(); "  # as xlt.main does
           "open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w').close(); time.sleep(600)")
grid.run_in_workers(c, {str(tmp_path)!r}, lambda n: [sys.executable, "-c", sleeper], 1, poll_s=0.05)
"""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  parent = subprocess.Popen([sys.executable, "-c", script], cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.time() + 120
  while time.time() < deadline and not [p for p in tmp_path.iterdir() if p.name.isdigit()]:
    time.sleep(0.05)
  worker = int(next(p.name for p in tmp_path.iterdir() if p.name.isdigit()))
  parent.send_signal(sig)
  assert parent.wait(timeout=60) == (128 + sig if sig == signal.SIGTERM else -sig), parent.stderr.read()
  deadline = time.time() + 30
  while time.time() < deadline and _alive(worker):
    time.sleep(0.05)
  assert not _alive(worker)


def _alive(pid: int) -> bool:
  """Running: neither gone nor a zombie (an orphan's zombie waits for init to reap it)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False
