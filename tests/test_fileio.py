"""xlt.io.fileio: a write is all or nothing."""

import os

import pytest

from xlt.io import fileio


def test_write_replaces_whole_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "sub" / "a.json"
  fileio.write_text(str(path), "first")
  fileio.write_text(str(path), "second")
  assert path.read_text() == "second"
  assert os.listdir(path.parent) == ["a.json"]


def test_a_crash_mid_write_keeps_the_old_file(tmp_path):
  path = tmp_path / "a.bin"
  fileio.write_bytes(str(path), b"old")
  with pytest.raises(RuntimeError, match="disk on fire"):
    with fileio.atomic_open(str(path)) as f:
      f.write(b"half of the new")
      raise RuntimeError("disk on fire")
  assert path.read_bytes() == b"old"
  assert os.listdir(tmp_path) == ["a.bin"]


def test_only_whole_file_modes():
  with pytest.raises(ValueError, match="mode 'wb' or 'w'"):
    with fileio.atomic_open("x", "a"):
      pass


def test_a_file_over_its_limit_is_refused_before_it_is_read(tmp_path):
  path = tmp_path / "user.jsonl"
  path.write_bytes(b"x" * 11)
  assert fileio.check_size(str(path), 11) == 11
  with pytest.raises(KeyError, match="is 11 bytes, over the 10-byte limit for tests"):
    fileio.check_size(str(path), 10, KeyError, " for tests")
