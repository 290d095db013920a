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
time, each in its own process pinned to its own cores (xlt.grid.run_in_workers). So can the
members of one synthetic-task experiment: `--member_workers=N` trains them in N shares, one
process each (xlt.transfer.run_in_workers).

Errors a user can fix (a bad config value, a missing file, a damaged checkpoint, a mesh that
does not fit the devices, incomplete process flags) end the command with one line on stderr
and exit status 2, so cluster scripts can tell them apart from a crash; `--traceback` shows
the whole trace.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from xlt import allocator, cpu_devices, workers

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
_MEMBER_WORKERS = flags.DEFINE_integer(
    "member_workers", 1, "with a graph or addition experiment on a CPU: train its members in this many "
    "shares at once, each in its own process on its own cores (xlt.transfer.run_in_workers)")
_MEMBER_SHARE = flags.DEFINE_string(
    "member_share", None, "i/N: train only share i of N of the experiment's members (what "
    "--member_workers=N starts its workers with)")
flags.mark_flags_as_required(["config", "workdir"])

# flags a worker's command sets itself
_WORKER_DROPS = ("points", "point_workers", "member_workers", "member_share")


def worker_command(argv: list[str], *extra: str) -> list[str]:
  """The command of a worker: this command's flags (the config and its overrides) without
  the worker flags, and with `extra` (e.g. --points=<point>, --member_share=0/2)."""
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


def parse_share(value: str) -> tuple[int, int]:
  try:
    share, shares = (int(v) for v in value.split("/"))
  except ValueError:
    raise ValueError(f"--member_share={value!r}: expected i/N, e.g. 0/2") from None
  return share, shares


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
    if _MEMBER_WORKERS.value < 1:
      raise ValueError(f"--member_workers={_MEMBER_WORKERS.value}: expected >= 1")
    split_members = _MEMBER_WORKERS.value != 1 or _MEMBER_SHARE.value is not None
    if split_members and (c.get("grid") or experiment.RUNNERS.get(c.task) != "xlt.transfer"):
      raise ValueError("--member_workers splits one graph or addition experiment; "
                       + ("a grid config's points split with --point_workers" if c.get("grid") else
                          f"the {c.task!r} runner trains its members in one process"))
    if c.get("grid"):
      if _STOP_AFTER.value is not None:
        raise ValueError("--stop_after stops one experiment; a grid config runs several")
      if _POINT_WORKERS.value > 1:
        grid.run_in_workers(c, _WORKDIR.value, lambda p: worker_command(sys.argv, f"--points={p}"),
                            _POINT_WORKERS.value, only=_POINTS.value)
      else:
        grid.run(c, _WORKDIR.value, only=_POINTS.value)
    elif _POINTS.value is not None or _POINT_WORKERS.value != 1:
      raise ValueError("--points and --point_workers are for a grid config; this config has no grid")
    elif _MEMBER_SHARE.value is not None:
      share, shares = parse_share(_MEMBER_SHARE.value)
      experiment.run(c, _WORKDIR.value, stop_after=_STOP_AFTER.value, share=share, shares=shares)
    elif _MEMBER_WORKERS.value > 1:
      if _STOP_AFTER.value is not None:
        raise ValueError("--stop_after stops one process's training; with --member_workers use --member_share")
      from xlt import transfer
      n = _MEMBER_WORKERS.value
      transfer.run_in_workers(c, _WORKDIR.value, lambda i: worker_command(sys.argv, f"--member_share={i}/{n}"), n)
    else:
      experiment.run(c, _WORKDIR.value, stop_after=_STOP_AFTER.value)
  except workers.WorkerFailed as e:  # the worker's log has the trace
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
  workers.die_with_parent()  # a grid's or an experiment's worker ends with its parent
  cpu_devices.configure()  # before jax is imported, and before a re-execution inherits the env
  allocator.preload()
  app.run(main)
