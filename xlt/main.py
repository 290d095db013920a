"""Runs an experiment from a config file.

  python -m xlt.main --config=configs/graph.py --workdir=runs/graph \
      [--config.mixture.target_samples=512 ...]

XLA:CPU spends much of a small model's step in malloc, so the process first re-executes
itself with a faster one preloaded (xlt.allocator: mimalloc from xlt's own install, or
tcmalloc; XLT_ALLOCATOR=system keeps glibc's). On CPU the cores become separate XLA devices,
so the default mesh trains data-parallel over them (xlt.cpu_devices; XLT_CPU_DEVICES=1: one).

Several processes run one experiment together when started with `--coordinator_address
--num_processes --process_id` (launch/slurm.sh passes them), or in a Cloud TPU VM slice or a
multi-task `srun` step, which jax detects (xlt.distributed). Only process 0 prints and writes.

A grid config's points run one after another, or with `--point_workers=N` on a CPU N at a
time, each in its own process pinned to its own cores (xlt.grid.run_in_workers). Any other
config is one experiment, run by xlt.runner.

Errors a user can fix (a bad flag or config field, a missing file, a damaged checkpoint, a
mesh that does not fit the devices, incomplete process flags) end the command with one line
on stderr and exit status 2, so cluster scripts can tell them apart from a crash;
`--traceback` shows the whole trace.
"""

import difflib
import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from xlt import allocator, cpu_devices, workers
from xlt.io import config_files

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "where checkpoints, metrics and results go")
_TRACEBACK = flags.DEFINE_bool("traceback", False, "show the full traceback of a user error")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0, with several processes")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "how many processes run the experiment")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "this process's rank, 0 .. num_processes - 1")
_STOP_AFTER = flags.DEFINE_integer(
    "stop_after", None, "end the run at this training step, as a preemption would; the same command "
    "without it resumes from the last checkpoint")
_POINTS = flags.DEFINE_list(
    "points", None, "with a grid config: run only these points (comma-separated names), e.g. to "
    "split a grid over machines")
_POINT_WORKERS = flags.DEFINE_integer(
    "point_workers", 1, "with a grid config on a CPU: train this many points at once, each in its "
    "own process on its own cores (xlt.grid.run_in_workers), e.g. 2 on a 2-core machine")
flags.mark_flags_as_required(["config", "workdir"])

_WORKER_DROPS = ("points", "point_workers")  # flags a worker's command sets itself


def worker_command(argv: list[str], *extra: str) -> list[str]:
  """The command of a worker: this command's flags (the config and its overrides) without
  the worker flags, and with `extra` (e.g. --points=<point>)."""
  out, skip = [], False
  for arg in argv[1:]:
    if skip:
      skip = False
      continue
    name = arg.lstrip("-").split("=", 1)[0]
    if arg.startswith("-") and name in _WORKER_DROPS:
      skip = "=" not in arg  # "--points a,b": its value is the next argument
      continue
    out.append(arg)
  return [sys.executable, "-m", "xlt.main", *out, *extra]


def _user_error(message: str):
  print(f"xlt: error: {message}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (app.run's flags_parser), with its errors as user errors: an unknown
  config field (named with the nearest one), a bad value, a missing config file."""
  # a configs/... the current directory lacks read from xlt's own; `from configs import common` found
  argv = config_files.config_argv(argv)
  try:
    rest = flags.FLAGS(argv)
    _CONFIG.value.get("task")  # a config file that failed to load raises only when read
    return rest
  except Exception as e:  # noqa: BLE001  (each is explained in one line below, or re-raised)
    if "--traceback" in argv:
      raise
    _user_error(_flag_error(argv, e))


def _flag_error(argv: list[str], error: Exception) -> str:
  """One line saying what is wrong with the command line `argv`, which failed with `error`."""
  spec = config_files.config_spec(argv)
  path = spec.split(":", 1)[0] if spec else None
  if path and not os.path.isfile(path):
    return f"--config={spec}: no such config file"
  if path and isinstance(error, (AttributeError, KeyError)):
    try:
      unknown = _unknown_field(spec, argv)
    except Exception:  # noqa: BLE001  (the config file itself fails: its own error says more)
      unknown = None
    if unknown:
      return unknown
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  if any(line.startswith("Traceback") for line in lines):  # the config file raised: its message, not its class
    return f"{lines[0].removeprefix('flag ').rstrip(':')}: {re.sub(r'^[A-Za-z_.]*(Error|Exception): ', '', lines[-1])}"
  return " ".join(lines).removeprefix("flag ")




def _unknown_field(spec: str, argv: list[str]) -> str | None:
  """The first `--config.<field>` override of `argv` that the config `spec` lacks, named with
  the nearest field it has; None if every one exists (the error was something else)."""
  import importlib.util

  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("xlt_config_of_the_error", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  fields = _dotted(module.get_config(arg) if arg else module.get_config())
  for a in argv:
    if not a.lstrip("-").startswith("config."):
      continue
    field = a.lstrip("-")[len("config."):].split("=", 1)[0]
    if field in fields:
      continue
    near = difflib.get_close_matches(field, [f for f in fields if not field.startswith(f + ".")], n=1)
    if near:
      return f"--config.{field}: the config has no field {field!r} (nearest: {near[0]!r})"
    parts = field.split(".")
    group = next((".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1) if ".".join(parts[:k]) in fields), "")
    siblings = [f for f in fields if f.rpartition(".")[0] == group]
    return (f"--config.{field}: the config has no field {field!r} (the fields of "
            f"{repr(group) if group else 'the config'}: {', '.join(siblings)})")
  return None


def _dotted(node, prefix: str = "") -> list[str]:
  """Every field of a config, dotted ("train.steps"), groups included."""
  out = []
  for k, v in node.items():
    out.append(prefix + k)
    if hasattr(v, "items"):
      out += _dotted(v, prefix + k + ".")
  return out


def _message(error: Exception) -> str:
  """An error's message as one line, without Python's class name (a KeyError's own quotes
  dropped); the class name only where there is no message."""
  text = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else error
  lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
  return " ".join(lines) if lines else type(error).__name__


def _check_command(c):
  """The command line's own mistakes: flags for a grid on a config without one, --stop_after on
  a grid, point workers without a core each. Checked before jax and the experiment's modules
  are imported, so that these errors come at once instead of seconds later."""
  if not c.get("grid"):
    if _POINTS.value is not None or _POINT_WORKERS.value != 1:
      raise ValueError("--points and --point_workers are for a grid config; this config has no grid")
  elif _STOP_AFTER.value is not None:
    raise ValueError("--stop_after stops one experiment; a grid config runs several")
  elif _POINT_WORKERS.value > 1:
    workers.worker_cores(_POINT_WORKERS.value, cpu_devices.available_cores(), "point workers")


def _exit_with(error: Exception):
  """A user error's one line and exit status 2 (its traceback with --traceback)."""
  if _TRACEBACK.value:
    raise error
  print(f"xlt: error: {_message(error)} (--traceback for the full trace)", file=sys.stderr)
  sys.exit(2)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint file at INFO
  c = _CONFIG.value
  try:
    _check_command(c)
  except ValueError as e:
    _exit_with(e)
  from xlt import checkpoint, compile_cache, distributed, grid, runner

  compile_cache.enable()

  if not _TRACEBACK.value:
    checkpoint.quiet_background_errors()  # a full disk: one line, not orbax's tracebacks first
  try:
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    if not distributed.is_main():
      # process 0 prints the tables and summaries; the others (C++ libraries included) nothing
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if not c.get("grid"):
      runner.run(c, _WORKDIR.value, stop_after=_STOP_AFTER.value)
    elif _POINT_WORKERS.value > 1:
      grid.run_in_workers(c, _WORKDIR.value, lambda p: worker_command(sys.argv, f"--points={p}"),
                          _POINT_WORKERS.value, only=_POINTS.value)
    else:
      grid.run(c, _WORKDIR.value, only=_POINTS.value)
  except workers.WorkerFailed as e:  # the worker's log has the trace
    print(f"xlt: error: {e}", file=sys.stderr)
    sys.exit(1)
  except (ValueError, KeyError, FileNotFoundError, checkpoint.CheckpointError) as e:
    # xlt checks configs, data files, meshes and checkpoints and raises these with a message
    # that says what to change; anything else is a bug and keeps its traceback.
    _exit_with(e)


if __name__ == "__main__":
  workers.die_with_parent()  # a grid's worker ends with its parent
  cpu_devices.configure()  # before jax is imported, and before a re-execution inherits the env
  allocator.preload()
  app.run(main, flags_parser=parse_flags)
