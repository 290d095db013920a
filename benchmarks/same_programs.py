"""Whether a change leaves the programs a command compiles as they were: runs COMMAND once in a
git worktree of --base and once in this checkout, each with XLA's HLO dump on, and compares
every program XLA compiled, by name, as optimised HLO without its op metadata (source lines and
the file and function tables), which changes with any edit above it and computes nothing.

  python benchmarks/same_programs.py --base=70ec227 -- \\
      python benchmarks/finetune_step.py --child=xlt --job=tiny/full ...
  python benchmarks/same_programs.py --base=1b95bb6 --module_re='.*_start.*|.*_advance.*' -- \\
      python my_decode_script.py

A results file names the commit it was measured at. When every program its benchmark compiles
is the same at HEAD, its figures stand for HEAD's code without a rerun (the runtime around the
programs, an allocator or the host code, is not compared: check what else changed). COMMAND runs
with the tree as its working directory and first on PYTHONPATH, so relative script paths and
`import xlt` resolve in that tree, in its child processes too; run only the tool whose programs
matter (a benchmark's xlt child), not its PyTorch peer.

Prints one line per program name (a name compiled more than once, e.g. at several shapes, is
compared in compile order) and exits 0 when every program is the same, 1 when any differs or
is compiled on one side only, 2 when the command fails or --base is no commit.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_AFTER = re.compile(r"^module_(\d+)\.(.+)\.\w+_after_optimizations\.txt$")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")  # source, not computation
_METADATA = re.compile(r", (metadata|frontend_attributes)=\{[^{}]*\}")


def clean(hlo: str) -> list[str]:
  """An HLO dump's lines without the source tables and op metadata."""
  lines, skipping = [], False
  for line in hlo.splitlines():
    if line in _TABLES:
      skipping = True
    elif not line.strip():
      skipping = False
    if not skipping and line.strip():
      lines.append(_METADATA.sub("", line))
  return lines


def programs(dump_dir: str) -> dict[str, list[list[str]]]:
  """{program name: its cleaned HLO, one per compile in compile order} of an XLA dump folder."""
  found = []
  for path in glob.glob(os.path.join(dump_dir, "*_after_optimizations.txt")):
    m = _AFTER.match(os.path.basename(path))
    if m:
      with open(path) as f:
        found.append((int(m.group(1)), m.group(2), clean(f.read())))
  out: dict[str, list[list[str]]] = {}
  for _, name, lines in sorted(found):
    out.setdefault(name, []).append(lines)
  return out


def compare(base: dict, here: dict) -> list[tuple[str, str]]:
  """(program name, 'same' / what differs), every name of either side, sorted."""
  rows = []
  for name in sorted(set(base) | set(here)):
    a, b = base.get(name, []), here.get(name, [])
    if len(a) != len(b):
      rows.append((name, f"compiled {len(a)} time(s) at base, {len(b)} here"))
      continue
    diff = [d for x, y in zip(a, b) for d in difflib.unified_diff(x, y, n=0, lineterm="")
            if not d.startswith(("+++", "---", "@@"))]
    if diff:
      gone, new = sum(d[0] == "-" for d in diff), sum(d[0] == "+" for d in diff)
      rows.append((name, f"differs: {gone} lines of base's {sum(len(x) for x in a)} replaced by {new}"))
    else:
      rows.append((name, f"same ({sum(len(y) for y in b)} lines)"))
  return rows


def run_dumped(command: list[str], tree: str, dump_dir: str, module_re: str) -> str | None:
  """Runs `command` in `tree` with XLA's dump into `dump_dir`: None, or why it failed."""
  flags = f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
  if module_re:
    flags += f" --xla_dump_hlo_module_re={module_re}"
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip(),
             PYTHONPATH=os.pathsep.join([tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
             JAX_ENABLE_COMPILATION_CACHE="false")  # a program read from a persistent cache is never dumped
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  try:
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
  except OSError as e:
    return f"cannot run {command[0]!r}: {e.strerror}"
  if proc.returncode:
    last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
    return f"the command failed in {tree} (exit {proc.returncode}): {last}"
  return None


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--base", required=True, help="the commit to compare with (a results file's 'commit')")
  p.add_argument("--module_re", default="", help="dump (and compare) only the programs whose name matches")
  p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run in each tree")
  a = p.parse_args(argv)
  command = a.command[1:] if a.command[:1] == ["--"] else a.command
  if not command:
    p.error("give the command to compare after --")
  try:
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "--quiet", f"{a.base}^{{commit}}"],
                         capture_output=True, text=True)
  except OSError as e:
    print(f"same_programs: cannot run git: {e.strerror}", file=sys.stderr)
    return 2
  if rev.returncode:
    print(f"same_programs: --base {a.base!r} is no commit of {ROOT}", file=sys.stderr)
    return 2
  with tempfile.TemporaryDirectory(prefix="same_programs_") as tmp:
    tree = os.path.join(tmp, "base")
    added = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--quiet", tree, rev.stdout.strip()],
                           capture_output=True, text=True)
    if added.returncode:
      print(f"same_programs: git worktree add failed: {added.stderr.strip()[-300:]}", file=sys.stderr)
      return 2
    try:
      error = (run_dumped(command, tree, os.path.join(tmp, "dump_base"), a.module_re)
               or run_dumped(command, ROOT, os.path.join(tmp, "dump_here"), a.module_re))
      rows = compare(programs(os.path.join(tmp, "dump_base")), programs(os.path.join(tmp, "dump_here")))
    finally:
      subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], capture_output=True)
  if error:
    print(f"same_programs: {error}", file=sys.stderr)
    return 2
  if not rows:
    print("same_programs: the command compiled no XLA program", file=sys.stderr)
    return 2
  for name, verdict in rows:
    print(f"{name}: {verdict}")
  differ = sum(not v.startswith("same") for _, v in rows)
  print(f"{len(rows)} programs, {differ} differ ({a.base} against this checkout)")
  return 1 if differ else 0


if __name__ == "__main__":
  sys.exit(main())
