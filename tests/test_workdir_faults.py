"""A workdir that cannot be one (a file, an empty name, a read-only file system) is one line and
exit status 2 naming the user's path, never a traceback; an interrupted xlt.generate leaves its
output as it was (issue 69)."""

import errno
import json
import os
import subprocess
import sys

import pytest

from test_generate import LLAMA, fake_model, tiny  # noqa: F401 (fixtures)
from xlt import generate, workdir_lock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}


def main(workdir, cwd):
  r = subprocess.run([sys.executable, "-m", "xlt.main", f"--config={REPO}/configs/graph.py", f"--workdir={workdir}"],
                     cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)
  return r.returncode, [ln for ln in r.stderr.splitlines() if ln.strip()]


def test_a_workdir_that_is_a_file_or_empty_is_one_line(tmp_path):
  file = tmp_path / "notes.txt"
  file.write_text("mine")
  status, lines = main(file, tmp_path)
  assert status == 2 and len(lines) == 1, lines
  assert lines[0].startswith(f"xlt: error: workdir {file} exists and is not a directory"), lines
  assert file.read_text() == "mine"
  status, lines = main("", tmp_path)
  assert status == 2 and len(lines) == 1 and lines[0].startswith("xlt: error: --workdir is empty"), lines
  assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing ran in the current directory


def _read_only(*args, **kwargs):
  raise OSError(errno.EROFS, "Read-only file system", "/hidden/.tmp_x")


def test_a_read_only_workdir_names_the_users_path(tmp_path, monkeypatch):
  monkeypatch.setattr(os, "makedirs", _read_only)
  with pytest.raises(ValueError, match=rf"^workdir {tmp_path}/run cannot be created: a read-only file system$"):
    workdir_lock.make(str(tmp_path / "run"))
  monkeypatch.undo()
  monkeypatch.setattr(workdir_lock, "open", _read_only, raising=False)  # it exists, but nothing can be written
  with pytest.raises(ValueError, match=rf"^workdir {tmp_path} cannot be written: a read-only file system$"):
    with workdir_lock.hold(str(tmp_path), index=0):
      pass


def test_an_interrupted_generate_leaves_its_output_as_it_was(tmp_path, fake_model, monkeypatch, capsys):  # noqa: F811
  prompts = tmp_path / "p.jsonl"
  prompts.write_text("".join(json.dumps({"prompt": f"w{i}"}) + "\n" for i in range(4)))
  output = tmp_path / "out.jsonl"
  output.write_text('{"an earlier run": true}\n')
  decode = generate.decode

  def interrupted(*args, on_batch=None, **kwargs):  # the first batch done, then Ctrl-C
    on_batch([0, 1], [{"continuation": "x", "ids": [1]}] * 2)
    raise KeyboardInterrupt

  monkeypatch.setattr(generate, "decode", interrupted)
  argv = ["--model", LLAMA, "--prompts", str(prompts), "--output", str(output), "--max_new=2", "--batch=2"]
  with pytest.raises(KeyboardInterrupt):
    generate.main(argv)
  assert output.read_text() == '{"an earlier run": true}\n'
  assert len((tmp_path / "out.jsonl.partial").read_text().splitlines()) == 2
  assert "stopped after 2 of 4 prompts" in capsys.readouterr().err
  monkeypatch.setattr(generate, "decode", decode)
  assert generate.main(argv) == 0  # the next complete run replaces both
  assert len(output.read_text().splitlines()) == 4 and sorted(os.listdir(tmp_path)) == ["out.jsonl", "p.jsonl"]


FULL = ('RESOURCE_EXHAUSTED: Error writing "active/0" in OCDBT database at local file "{d}/2.orbax-checkpoint-tmp/'
        'state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed to write 723065 bytes to file 34: No space left on '
        "device [os_error_code='28']")


class _FullDisk:  # an orbax CheckpointManager whose previous background commit hit a full disk
  def __init__(self, directory):
    self.directory = directory

  def save(self, *args, **kwargs):
    raise ValueError(FULL.format(d=self.directory))

  wait_until_finished = save


def test_a_full_disk_is_one_line_naming_the_users_folder_not_orbaxs(tmp_path):
  # (end to end, on a 2 MB tmpfs: orbax's tracebacks no longer print before the line, issue 69)
  import logging

  from xlt import checkpoint
  mngr = _FullDisk(str(tmp_path / "ckpt"))
  for call in (lambda: checkpoint.save(mngr, 4, {}, None, {}), lambda: checkpoint.wait(mngr)):
    with pytest.raises(ValueError) as e:
      call()
    assert str(e.value).startswith(f"checkpoints in {tmp_path / 'ckpt'} cannot be written: no space left on the "
                                   "device; free the space") and "orbax-checkpoint-tmp" not in str(e.value)
  assert checkpoint.disk_error(ValueError("a shape differs"), "d") is None
  quiet = checkpoint.QuietBackgroundErrors()
  record = logging.LogRecord("absl", logging.ERROR, "/x/orbax/checkpoint/future.py", 1, FULL, None, None)
  assert not quiet.filter(record)
  assert quiet.filter(logging.LogRecord("absl", logging.ERROR, "/x/xlt/loop.py", 1, "mine", None, None))
