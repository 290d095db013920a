"""A benchmark's results file in docs/speed.md's schema (xlt.speed_doc), written atomically.

Every benchmark that feeds docs/speed.md writes one results/benchmarks/<name>.json through
`write`: the command that ran it, git HEAD, the machine (xlt.report.machine: CPU model, cores,
vector extensions), the date (UTC), the wall time, the versions compared, and its table as
columns and raw rows (the renderer formats them), plus whatever else the benchmark records.
Imports neither jax nor torch (the benchmarks' parents must not).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command_line(argv: list[str] | None = None) -> str:
  """`python benchmarks/x.py --flag ...` as it was run (the script relative to the checkout)."""
  argv = list(sys.argv if argv is None else argv)
  script = os.path.relpath(os.path.abspath(argv[0]), ROOT) if argv else ""
  return " ".join(["python", shlex.quote(script)] + [shlex.quote(x) for x in argv[1:]])


def write(path: str, *, benchmark: str, title: str, columns: list[str], rows: list[list], wall_s: float,
          versions: dict, notes: str = "", machine: str | None = None, **extra) -> dict:
  """Writes (temp + rename) and returns the record; `machine` defaults to this host's CPU."""
  from xlt import report
  from xlt.io import fileio

  record = {"benchmark": benchmark, "title": title, "command": command_line(), "commit": report.git_commit(ROOT),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_s": round(wall_s, 1), "machine": machine or report.machine(), "versions": versions,
            "columns": columns, "rows": rows, **({"notes": notes} if notes else {}), **extra}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fileio.write_text(path, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
  return record
