"""xlt.io.fileio: a write is all or nothing."""

import json
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


@pytest.mark.parametrize("text, what, line, column", [
    ('{\n  "vocab_size": 32000,\n  "hidden_size": 64,\n}\n', "a trailing comma", 3, 20),  # noticed at 4:1
    ('{\n  "vocab_size": 32000\n  "hidden_size": 64\n}', "a missing comma", 2, 22),  # noticed at 3:3
    ('{"prompt": "w1", "completion": }', "Expecting value", 1, 32),  # already where it is
])
def test_json_fault_points_at_the_fault(text, what, line, column):
  with pytest.raises(json.JSONDecodeError) as e:
    json.loads(text)
  got = fileio.json_fault(e.value)
  assert got[0].startswith(what) and got[1:] == (line, column)
