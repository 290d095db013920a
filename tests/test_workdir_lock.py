"""xlt.workdir_lock: a second run on a workdir another process holds is refused in one line;
a killed run's lock never blocks; one multi-host run's processes and a grid's point workers
share their workdir without refusing each other (issue 69)."""

import os
import signal
import subprocess
import sys

import pytest

from xlt import grid, workdir_lock, workers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
HOLDER = ("import sys, time\nfrom xlt import workdir_lock\n"
          "with workdir_lock.hold(sys.argv[1], index=int(sys.argv[2])):\n"
          "  print('held', flush=True)\n  time.sleep(120)\n")


@pytest.fixture
def holder(tmp_path):
  """Starts a process that holds a workdir's lock (of process index `index`); returns it."""
  started = []

  def start(workdir, index=0, env=ENV):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir), str(index)], env=env, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    started.append(p)
    return p

  yield start
  for p in started:
    if p.poll() is None:
      p.kill()
    p.wait()


def snapshot(root) -> dict:
  out = {}
  for d, _, names in os.walk(root):
    for name in names:
      with open(os.path.join(d, name), "rb") as f:
        out[os.path.relpath(os.path.join(d, name), root)] = f.read()
  return out


def test_a_second_run_on_a_held_workdir_is_refused_in_one_line(tmp_path, holder):
  workdir = tmp_path / "run"
  p = holder(workdir)
  (workdir / "config.json").write_text("{}")  # the first run's files, as it left them
  before = snapshot(workdir)
  r = subprocess.run([sys.executable, "-m", "xlt.main", "--config=configs/graph.py", f"--workdir={workdir}"],
                     cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert r.returncode == 2 and len(lines) == 1, r.stderr
  assert lines[0].startswith(f"xlt: error: workdir {workdir} is in use by another run (process {p.pid})"), lines
  assert snapshot(workdir) == before


def test_a_killed_runs_lock_never_blocks(tmp_path, holder):
  p = holder(tmp_path)
  with pytest.raises(ValueError, match="in use by another run"):
    with workdir_lock.hold(str(tmp_path), index=0):
      pass
  p.send_signal(signal.SIGKILL)
  p.wait()
  with workdir_lock.hold(str(tmp_path), index=0) as path:  # the kernel dropped the dead process's lock
    assert path == str(tmp_path)
  with workdir_lock.hold(str(tmp_path), index=0), workdir_lock.hold(str(tmp_path), index=0):
    pass  # nested holds in one process are one


def test_the_processes_of_one_multi_host_run_share_the_workdir(tmp_path, holder):
  holder(tmp_path, index=0)  # process 0 of the run
  with workdir_lock.hold(str(tmp_path), index=1):  # process 1 of the same run: its own file
    assert sorted(os.listdir(tmp_path)) == [".lock", ".lock.1"]
    r = subprocess.run([sys.executable, "-c", HOLDER, str(tmp_path), "1"], env=ENV, timeout=60, capture_output=True,
                       text=True)
    assert r.returncode == 1 and "is in use by another run" in r.stderr  # but a second run's process 1 is refused


def test_a_point_worker_does_not_take_its_parents_grid_lock(tmp_path, holder, monkeypatch):
  holder(tmp_path)  # the grid's parent
  with pytest.raises(ValueError, match="in use"):
    with grid._lock(str(tmp_path)):
      pass
  monkeypatch.setenv(workers.PARENT_ENV, "1")
  with grid._lock(str(tmp_path)) as path:  # a worker: the parent holds it (runner.run locks the point's)
    assert path == str(tmp_path)
