"""Runs an experiment from a config file.

  python -m xlt.main --config=configs/graph.py --workdir=/tmp/graph \
      [--config.mixture.target_samples=512 ...]

XLA:CPU spends much of a small model's step in malloc, so the process first re-executes
itself with a faster one preloaded (xlt.allocator: mimalloc from xlt's own install, or
tcmalloc; XLT_ALLOCATOR=system keeps glibc's). On CPU the cores become separate XLA devices,
so the default mesh trains data-parallel over them (xlt.cpu_devices; XLT_CPU_DEVICES=1: one).

Several processes run one experiment together when started with `--coordinator_address
--num_processes --process_id` (launch/slurm.sh passes them), or in a Cloud TPU VM slice or a
multi-task `srun` step, which jax detects (xlt.distributed). Only process 0 prints and writes.

A grid config's points run one after another, or with `--point_workers=N` on a CPU N at a
time, each in its own process pinned to its own cores (xlt.grid.run_in_workers).

Errors a user can fix (a bad config value, a missing file, a damaged checkpoint, a mesh that
does not fit the devices, incomplete process flags) end the command with one line on stderr
and exit status 2, so cluster scripts can tell them apart from a crash; `--traceback` shows
the whole trace.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from xlt import allocator, cpu_devices

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

_WORKER_DROPS = ("points", "point_workers")  # flags a point worker's command sets itself


def worker_command(argv: list[str], point: str) -> list[str]:
  """The command that trains grid point `point` alone: this command's flags (the config and
  its overrides) with --points=point and without --point_workers."""
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
  return [sys.executable, "-m", "xlt.main", *out, f"--points={point}"]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint file at INFO
  from xlt import checkpoint, distributed, experiment, grid

  c = _CONFIG.value
  try:
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    if not distributed.is_main():
      # process 0 prints the tables and summaries; the others (C++ libraries included) nothing
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if c.get("grid"):
      if _STOP_AFTER.value is not None:
        raise ValueError("--stop_after stops one experiment; a grid config runs several")
      if _POINT_WORKERS.value > 1:
        grid.run_in_workers(c, _WORKDIR.value, lambda p: worker_command(sys.argv, p),
                            _POINT_WORKERS.value, only=_POINTS.value)
      else:
        grid.run(c, _WORKDIR.value, only=_POINTS.value)
    elif _POINTS.value is not None or _POINT_WORKERS.value != 1:
      raise ValueError("--points and --point_workers are for a grid config; this config has no grid")
    else:
      experiment.run(c, _WORKDIR.value, stop_after=_STOP_AFTER.value)
  except grid.PointFailed as e:  # the worker's log has the trace
    print(f"xlt: error: {e}", file=sys.stderr)
    sys.exit(1)
  except (ValueError, KeyError, FileNotFoundError, checkpoint.CheckpointError) as e:
    # xlt checks configs, data files, meshes and checkpoints and raises these with a message
    # that says what to change; anything else is a bug and keeps its traceback.
    if _TRACEBACK.value:
      raise
    print(f"xlt: error: {type(e).__name__}: {e} (--traceback for the full trace)", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  cpu_devices.configure()  # before jax is imported, and before a re-execution inherits the env
  allocator.preload()
  app.run(main)
