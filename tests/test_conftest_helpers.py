"""The test suite's own helpers (tests/conftest.py) that the suite's speed relies on."""

import pytest

from conftest import built_once


def test_built_once_builds_a_folder_once_and_redoes_a_failed_build(tmp_path_factory):
  calls = []

  def build(folder):
    calls.append(folder)
    (folder / "x").write_text("1")

  first, again = built_once(tmp_path_factory, "once", build), built_once(tmp_path_factory, "once", build)
  assert first == again and calls == [first] and (first / "x").read_text() == "1"

  def fail(folder):
    (folder / "partial").write_text("")
    raise RuntimeError("the build failed")

  with pytest.raises(RuntimeError, match="the build failed"):
    built_once(tmp_path_factory, "redone", fail)
  redone = built_once(tmp_path_factory, "redone", build)
  assert sorted(p.name for p in redone.iterdir()) == ["x"] and len(calls) == 2  # the failed build's file is gone
