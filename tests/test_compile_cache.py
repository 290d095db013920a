"""xlt's commands keep jax's persistent compilation cache when XLT_COMPILATION_CACHE asks (on:
a user cache folder; a path: that folder); jax's own variable wins; unset or off, none."""

import os
import subprocess
import sys

import pytest

from xlt import cli, compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def env(monkeypatch, tmp_path):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  return monkeypatch


def test_the_folder_by_precedence(env, tmp_path):
  assert compile_cache.folder() is None  # off unless asked for
  for on in ("1", "on", "ON", "yes", "true"):
    env.setenv(compile_cache.ENV, on)
    assert compile_cache.folder() == str(tmp_path / "xdg" / "xlt" / "jax")
  env.setenv(compile_cache.ENV, str(tmp_path / "mine"))
  assert compile_cache.folder() == str(tmp_path / "mine")
  for off in ("0", "off", "OFF", "false", "no"):
    env.setenv(compile_cache.ENV, off)
    assert compile_cache.folder() is None and compile_cache.enable() is None
  env.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
  assert compile_cache.folder() == str(tmp_path / "jax")  # jax's own variable wins, even over off


def _child(code: str, xdg, **variables) -> str:
  """`code`'s output in a fresh interpreter with none of the cache's variables but `variables`."""
  keep = ("JAX_COMPILATION_CACHE_DIR", compile_cache.ENV, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
  env = {k: v for k, v in os.environ.items() if k not in keep}
  env.update(XDG_CACHE_HOME=str(xdg), JAX_PLATFORMS="cpu", PYTHONPATH=REPO, **variables)
  r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  return r.stdout.strip()


def _compile_in_child(tmp_path, **variables):
  code = "from xlt import compile_cache; print(compile_cache.enable()); import jax; jax.jit(lambda x: x * 3)(2.0)"
  return _child(code, tmp_path / "xdg", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **variables)


def test_a_command_writes_compiled_programs_to_the_user_folder_when_asked(tmp_path):
  default = tmp_path / "xdg" / "xlt" / "jax"
  assert _compile_in_child(tmp_path, XLT_COMPILATION_CACHE="on") == str(default)
  assert any(default.iterdir())  # the jitted program is on disk
  other = tmp_path / "other"
  assert _compile_in_child(tmp_path, XLT_COMPILATION_CACHE=str(other)) == str(other) and any(other.iterdir())
  for off in ("off", ""):
    where = tmp_path / f"off{off}"
    assert _compile_in_child(where, XLT_COMPILATION_CACHE=off) == "None" and not (where / "xdg").exists()


def test_programs_quicker_than_jax_default_are_kept_unless_the_user_says(tmp_path):
  code = ("from xlt import compile_cache; import jax; compile_cache.enable(); "
          "print(jax.config.jax_persistent_cache_min_compile_time_secs)")
  assert float(_child(code, tmp_path, XLT_COMPILATION_CACHE="on")) == compile_cache.MIN_COMPILE_S < 1
  mine = {"XLT_COMPILATION_CACHE": "on", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2.5"}
  assert float(_child(code, tmp_path, **mine)) == 2.5


def test_a_folder_that_cannot_be_made_leaves_the_cache_off(env, tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  env.setenv(compile_cache.ENV, str(blocker / "below"))
  assert compile_cache.enable() is None


def test_every_cli_command_asks_for_the_cache(monkeypatch):
  calls = []
  monkeypatch.setattr(compile_cache, "enable", lambda: calls.append(1))
  assert cli.run_command("xlt.x", lambda argv: None, []) == 0 and calls == [1]
