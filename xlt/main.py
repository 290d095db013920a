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
flags.mark_flags_as_required(["config", "workdir"])


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
      grid.run(c, _WORKDIR.value, only=_POINTS.value)
    elif _POINTS.value is not None:
      raise ValueError("--points selects points of a grid config; this config has no grid")
    else:
      experiment.run(c, _WORKDIR.value, stop_after=_STOP_AFTER.value)
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
