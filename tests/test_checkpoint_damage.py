"""A damaged newest checkpoint: reported, set aside, and the run resumes from an older one,
ending with the same parameters as an uninterrupted run; with none restorable, a clear error."""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import child_env
from xlt import checkpoint, loop
from xlt.data import common
from xlt.experiments import synthetic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _members(c):
  task = synthetic.get_task(c)
  enc = common.encode_examples(task.train[c.mixture.source], task.tokenizer, task.seq_len)
  arrays = {"tokens": enc.tokens, "loss_mask": enc.loss_mask}
  return synthetic.model_config(c, task), [loop.Member(f"m{s}", s, arrays) for s in (0, 1)]


def _files(path):
  return sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)


def _truncate(step_dir):
  for f in _files(step_dir):
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)


def _remove_one(step_dir):  # the largest file of the train state's arrays goes missing
  os.remove(max((f for f in _files(step_dir) if os.sep + "state" + os.sep in f), key=os.path.getsize))


def _empty(step_dir):
  for entry in os.listdir(step_dir):
    p = os.path.join(step_dir, entry)
    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  from conftest import small_graph_config
  c = small_graph_config()
  cfg, members = _members(c)
  out = loop.train_ensemble(c, cfg, members, None, str(tmp_path_factory.mktemp("full")), progress=False)
  return c, cfg, members, jax.device_get(out["state"])


@pytest.fixture(scope="module")
def stopped(uninterrupted, tmp_path_factory):
  """The same run stopped after step 8 (checkpoints 4 and 8), trained once for the module: each
  test damages a copy of its workdir. (its step, the workdir)"""
  c, cfg, members, _ = uninterrupted
  workdir = tmp_path_factory.mktemp("stopped")
  part = loop.train_ensemble(c, cfg, members, None, str(workdir), stop_after=8, progress=False)
  return part["step"], workdir


def _copy_of(stopped, tmp_path):
  step, workdir = stopped
  assert step == 8
  shutil.copytree(workdir, tmp_path, dirs_exist_ok=True)
  return tmp_path


@pytest.mark.parametrize("damage", [_truncate, _remove_one, _empty], ids=["truncated", "missing_file", "emptied"])
def test_damaged_newest_checkpoint_resumes_from_older(uninterrupted, stopped, tmp_path, damage, capfd):
  c, cfg, members, full = uninterrupted
  _copy_of(stopped, tmp_path)
  ckpt = tmp_path / "ckpt"
  assert sorted(os.listdir(ckpt)) == ["4", "8"]
  damage(str(ckpt / "8"))
  resumed = loop.train_ensemble(c, cfg, members, None, str(tmp_path), progress=False)
  assert resumed["finished"]
  for x, y in zip(jax.tree.leaves(full), jax.tree.leaves(resumed["state"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  err = capfd.readouterr().err
  # orbax does not list an emptied directory as a step at all; the others are reported and set aside
  if damage is not _empty:
    assert "xlt: checkpoint step 8 in" in err and "cannot be restored" in err
    line = next(ln for ln in err.splitlines() if "cannot be restored" in ln)
    assert len(line) - len(str(ckpt)) <= 250 and " at 0x" not in line, line  # the path, and a short why
    assert (ckpt / "8.damaged").is_dir()


def test_every_checkpoint_damaged_is_a_clear_error(uninterrupted, stopped, tmp_path):
  c, cfg, members, _ = uninterrupted
  _copy_of(stopped, tmp_path)
  for step in ("4", "8"):
    _truncate(str(tmp_path / "ckpt" / step))
  with pytest.raises(checkpoint.CheckpointError, match=r"no checkpoint in .* can be restored.*start the run fresh"):
    loop.train_ensemble(c, cfg, members, None, str(tmp_path), progress=False)
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["4.damaged", "8.damaged"]  # kept, not deleted


def test_user_errors_end_main_with_one_line(tmp_path):
  env = child_env(PYTHONPATH=REPO)
  cmd = [sys.executable, "-m", "xlt.main", "--config=configs/graph.py", f"--workdir={tmp_path}",
         "--config.mixture.target=edge_klingon"]
  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2
  lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and lines[0].startswith("xlt: error: unknown graph language 'edge_klingon'"), lines
  assert "Traceback" not in out.stderr
  out = subprocess.run(cmd + ["--traceback"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode != 0 and "Traceback" in out.stderr
