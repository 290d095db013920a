"""benchmarks/same_programs.py: HLO dumps compared without their source metadata, and a command
run in a worktree of a commit and in this checkout."""

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import same_programs  # noqa: E402

_DUMP = """HloModule jit_f, entry_computation_layout={{(f32[4]{{0}})->f32[4]{{0}}}}

FileNames
1 "{path}"

FunctionNames
1 "f"

ENTRY %main (x: f32[4]) -> f32[4] {{
  %x = f32[4]{{0}} parameter(0), metadata={{op_name="x" source_file="{path}" source_line={line}}}
  ROOT %y = f32[4]{{0}} {op}(%x, %x), metadata={{op_name="jit(f)/{op}" source_file="{path}" source_line={line}}}
}}
"""


def _write(folder, number, name, **kw):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, f"module_{number:04d}.{name}.cpu_after_optimizations.txt"), "w") as f:
    f.write(_DUMP.format(**kw))
  with open(os.path.join(folder, f"module_{number:04d}.{name}.before_optimizations.txt"), "w") as f:
    f.write("not compared")


def test_source_lines_and_paths_do_not_count_but_an_op_does(tmp_path):
  base, here = str(tmp_path / "base"), str(tmp_path / "here")
  _write(base, 0, "jit_f", path="/old/xlt/model.py", line=10, op="add")
  _write(here, 3, "jit_f", path="/new/xlt/model.py", line=99, op="add")  # another tree, lines moved
  _write(base, 1, "jit_g", path="/old/g.py", line=1, op="add")
  _write(here, 4, "jit_g", path="/old/g.py", line=1, op="multiply")
  _write(here, 5, "jit_h", path="/old/h.py", line=1, op="add")
  rows = dict(same_programs.compare(same_programs.programs(base), same_programs.programs(here)))
  assert rows["jit_f"].startswith("same")
  assert rows["jit_g"] == "differs: 1 lines of base's 5 replaced by 1"
  assert rows["jit_h"] == "compiled 0 time(s) at base, 1 here"
  assert same_programs.clean(_DUMP.format(path="p", line=1, op="add"))[-2] == "  ROOT %y = f32[4]{0} add(%x, %x)"


def test_a_name_compiled_twice_is_compared_in_compile_order(tmp_path):
  base, here = str(tmp_path / "base"), str(tmp_path / "here")
  for folder, ops in ((base, ("add", "multiply")), (here, ("multiply", "add"))):
    for i, op in enumerate(ops):
      _write(folder, i, "jit_f", path="p", line=1, op=op)
  assert dict(same_programs.compare(same_programs.programs(base), same_programs.programs(here)))[
      "jit_f"].startswith("differs")


@pytest.mark.skipif(shutil.which("git") is None or subprocess.run(
    ["git", "-C", same_programs.ROOT, "rev-parse", "HEAD"], capture_output=True).returncode != 0,
    reason="needs this repository's git checkout")
def test_the_command_runs_in_a_worktree_of_the_commit_and_here(capsys):
  # the checkout's own model at HEAD and here: the same programs unless this tree changed the
  # model since (then 1); a broken command and an unknown commit are exit 2 with one line
  code = ("import jax, jax.numpy as jnp, xlt, os; from xlt import model as m; "
          "assert os.path.realpath(xlt.__file__).startswith(os.path.realpath(os.getcwd())); "
          "c = m.Config(vocab_size=11, block_size=8, num_layers=1, num_heads=2, d_model=8); "
          "params = m.init_params(c, jax.random.key(0)); "
          "jax.jit(lambda p, t: m.apply(c, p, t)[0])(params, jnp.zeros((1, 4), jnp.int32))")
  changed = subprocess.run(["git", "-C", same_programs.ROOT, "diff", "--quiet", "HEAD", "--", "xlt"]).returncode
  assert same_programs.main(["--base=HEAD", "--module_re=.*lambda.*", "--", sys.executable, "-c", code]) in (
      (0, 1) if changed else (0,))
  out = capsys.readouterr().out
  assert "jit__lambda: " in out and out.strip().endswith("(HEAD against this checkout)")
  assert same_programs.main(["--base=HEAD", "--", sys.executable, "-c", "raise SystemExit('boom')"]) == 2
  assert "the command failed" in capsys.readouterr().err
  assert same_programs.main(["--base=no-such-commit", "--", "true"]) == 2
