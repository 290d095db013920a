"""Multi-host training on one machine: two processes (2 fake CPU devices each, joined by
jax.distributed over localhost) run `xlt.main` as one experiment and match one process with 4
devices on the same mesh and global batch: losses, final parameters, predictions and results,
the two processes stopped at a step and resumed from their checkpoint.

Every subprocess has a timeout, so a hung collective fails the test instead of hanging CI.
"""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import COMPILE_FLAGS, REPO, built_once, child_env, small_graph_config
from xlt import checkpoint, distributed

# data across the processes, fsdp inside each: the batch is split between the processes and the
# parameters are neither process-local nor replicated, so fetching them needs a gather.
MESH = {"data": 2, "fsdp": 2, "devices": -1}
TIMEOUT = 240


def _config_flags() -> list[str]:
  """small_graph_config as --config flags over configs/graph.py, shrunk further for speed: one
  seed, one evaluation (at the end), vmap (one collective per step for all members)."""
  from configs import graph

  def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
      out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out

  c = small_graph_config()
  c.num_seeds, c.train.eval_every, c.train.ensemble = 1, 12, "vmap"
  c.graph.num_test_pairs = c.graph.num_val_pairs = 16
  c.mesh.update(MESH)
  small, base = flat(c.to_dict()), flat(graph.get_config().to_dict())
  return [f"--config.{k}={v}" for k, v in small.items() if base.get(k) != v]


def _env(devices: int) -> dict:
  # the tests' compile flags, with `devices` devices instead of conftest's 8
  return child_env(XLA_FLAGS=f"{COMPILE_FLAGS} --xla_force_host_platform_device_count={devices}",
                   JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))


def _main(workdir, *extra) -> list[str]:
  return [sys.executable, "-m", "xlt.main", "--config=configs/graph.py", f"--workdir={workdir}",
          *_config_flags(), *extra]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def run_processes(workdir, n: int, *extra) -> list[subprocess.CompletedProcess]:
  """xlt.main in `n` processes joined over localhost (n=1: one plain process with 4 devices)."""
  if n == 1:
    return [subprocess.run(_main(workdir, *extra), cwd=REPO, env=_env(4), capture_output=True, text=True,
                           timeout=TIMEOUT)]
  flags = [f"--coordinator_address=localhost:{_free_port()}", f"--num_processes={n}"]
  procs = [subprocess.Popen(_main(workdir, *extra, *flags, f"--process_id={i}"), cwd=REPO, env=_env(4 // n),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
  try:
    outs = [p.communicate(timeout=TIMEOUT) for p in procs]
  finally:
    for p in procs:  # a hung or failed peer: end every process of the run
      if p.poll() is None:
        p.kill()
        p.communicate()
  return [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def _ok(runs):
  for i, r in enumerate(runs):
    assert r.returncode == 0, f"process {i} failed:\n{r.stderr[-3000:]}"


def final_params(workdir, step: int = 12):
  path = os.path.join(workdir, "ckpt", str(step), "state")
  meta = ocp.StandardCheckpointer().metadata(path).item_metadata
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
  return ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=args))["params"]


def losses(workdir) -> list[tuple]:
  """(step, member, loss) as metrics.jsonl lists them: a second writer would repeat them."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [(r["step"], r["run"], r["loss"]) for r in rows if "loss" in r]


def _build_runs(root):
  """One process (4 devices) in root/one; in root/two, two processes (2 devices each) stopped
  after step 10 (its last checkpoint: step 8), then resumed to the end. What the stopped run left
  is listed in root/stopped.json, each resumed process's stdout in root/stdout_{i}.txt."""
  (root / "one").mkdir()
  (root / "two").mkdir()
  _ok(run_processes(root / "one", 1))
  _ok(run_processes(root / "two", 2, "--stop_after=10"))
  ckpt = root / "two" / "ckpt"
  (root / "stopped.json").write_text(json.dumps({
      "steps": sorted(os.listdir(ckpt)), "data": sorted(os.listdir(ckpt / "8" / "data")),
      "results": (root / "two" / "results.json").exists()}))
  two_runs = run_processes(root / "two", 2)  # resumes at step 8
  _ok(two_runs)
  for i, r in enumerate(two_runs):  # the tests read each process's output
    (root / f"stdout_{i}.txt").write_text(r.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The same experiment in one process (4 devices) and in two (2 devices each, stopped and
  resumed), run once per session (conftest.built_once): the workdirs, the two processes' stdout
  and what the stopped run left."""
  root = built_once(tmp_path_factory, "multihost_runs", _build_runs)
  stopped = json.loads((root / "stopped.json").read_text())
  return root / "one", root / "two", [(root / f"stdout_{i}.txt").read_text() for i in range(2)], stopped


def test_two_processes_train_as_one(runs):
  # the two-process run was stopped and resumed (steps 2-8 by the stopped run, 10 by the resumed
  # one): so this also checks that each process resumes its own share of the data and state
  one, two, (p0, p1), _ = runs
  assert len(losses(one)) == 3 * 5  # 3 members, steps 2, 4, .., 10 (12's is read after the loop ends)
  # every process computes, only process 0 writes: no duplicates; the sums' order may differ
  assert [r[:2] for r in losses(two)] == [r[:2] for r in losses(one)]
  np.testing.assert_allclose([r[2] for r in losses(two)], [r[2] for r in losses(one)], rtol=1e-6)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(final_params(one))[0],
                          jax.tree.leaves(final_params(two))):
    name = jax.tree_util.keystr(path)
    if name.endswith("['qkv']['bias']"):  # [E, q/k/v, heads, head_dim]
      # The key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by
      # every key): it is float noise that depends on the order of the sums, and Adam scales
      # noise up to steps of the learning rate's size.
      np.testing.assert_allclose(y[:, 1], x[:, 1], atol=1e-5, err_msg=name)
      x, y = np.delete(x, 1, axis=1), np.delete(y, 1, axis=1)
    np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-6, err_msg=name)
  for name in ("predictions.jsonl", "results.json"):  # decoded on the sharded params, on process 0
    assert (two / name).read_text() == (one / name).read_text(), name
  assert "graph_diff_grammar" in p0 and not p1  # process 0 prints the table, 1 nothing


def test_a_stopped_two_process_run_leaves_each_process_state_and_refuses_one_process(runs):
  _, two, _, stopped = runs
  assert stopped["steps"] == ["4", "8"] and not stopped["results"]
  assert stopped["data"] == ["commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]  # each iterator
  with pytest.raises(ValueError, match="written by 2 process.* this run has 1"):
    checkpoint._check_process_count(str(two / "ckpt"), 8)


@pytest.mark.parametrize("flags,message", [
    (("localhost:1234", 2, None), "--process_id missing"),
    ((None, 2, 0), "--coordinator_address missing"),
    (("localhost:1234", 2, 2), r"--process_id must be in 0\.\.1"),
    (("localhost:1234", 0, 0), "--num_processes must be >= 1"),
    (("localhost", 2, 0), "must be host:port"),
])
def test_incomplete_or_inconsistent_process_flags_are_clear_errors(flags, message):
  with pytest.raises(ValueError, match=message):
    distributed.check_flags(*flags)
  assert distributed.check_flags("node-1:12355", 2, 1) and not distributed.check_flags(None, None, None)


def test_bad_process_flags_end_main_with_one_line(tmp_path):
  cmd = [sys.executable, "-m", "xlt.main", "--config=configs/graph.py", f"--workdir={tmp_path}",
         "--coordinator_address=localhost:1234", "--num_processes=2", "--process_id=2"]
  out = subprocess.run(cmd, cwd=REPO, env=_env(1), capture_output=True, text=True, timeout=TIMEOUT)
  assert out.returncode == 2, out.stderr
  lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
  assert lines[-1].startswith("xlt: error: --process_id must be in 0..1") and "Traceback" not in out.stderr


def test_cluster_environment_only_with_several_slurm_tasks(monkeypatch):
  for var in distributed._SLURM_VARS:
    monkeypatch.setenv(var, "0")
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert distributed.cluster_environment() == "SLURM"
  monkeypatch.setenv("SLURM_NTASKS", "1")  # one task: a plain single-process run
  assert distributed.cluster_environment() is None
  monkeypatch.delenv("SLURM_STEP_NODELIST")  # not in a job step: jax could not join anyway
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert distributed.cluster_environment() is None
