"""The one rule every xlt command keeps with a user's mistakes: a bad input ends in one line
on stderr and exit status 2, never a traceback (`--traceback` shows it)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from xlt import compile_cache


class UserError(ValueError):
  """A bad command line or input file: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
  """argparse whose errors are UserErrors (one line, exit 2) instead of its usage and exit."""

  def error(self, message):
    raise UserError(message)


def run_command(prog: str, run: Callable[[list[str]], object], argv: list[str] | None = None) -> int:
  """`run(argv)`, with the persistent compilation cache where asked for (xlt.compile_cache); a
  ValueError or OSError (xlt's user errors, a file that cannot be read, a model the loader
  refuses) is printed as "<prog>: error: <its first line>" and returns 2."""
  argv = sys.argv[1:] if argv is None else argv
  compile_cache.enable()
  try:
    run(argv)
  except (ValueError, OSError) as e:
    if "--traceback" in argv:
      raise
    print(f"{prog}: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 2
  return 0
