"""Runs an experiment from a config file.

  python -m xlt.main --config=configs/graph.py --workdir=/tmp/graph \
      [--config.mixture.target_samples=512 ...]

XLA:CPU spends much of a small model's step in malloc, so the process first re-executes
itself with a faster one preloaded (xlt.allocator: mimalloc from xlt's own install, or
tcmalloc; XLT_ALLOCATOR=system keeps glibc's).

Errors a user can fix (a bad config value, a missing file, a damaged checkpoint, a mesh that
does not fit the devices) end the command with one line on stderr and exit status 2, so
cluster scripts can tell them apart from a crash; `--traceback` shows the whole trace.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from xlt import allocator

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "where checkpoints, metrics and results go")
_TRACEBACK = flags.DEFINE_bool("traceback", False, "show the full traceback of a user error")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint file at INFO
  from xlt import checkpoint, experiment, grid

  c = _CONFIG.value
  try:
    (grid.run if c.get("grid") else experiment.run)(c, _WORKDIR.value)
  except (ValueError, KeyError, FileNotFoundError, checkpoint.CheckpointError) as e:
    # xlt checks configs, data files, meshes and checkpoints and raises these with a message
    # that says what to change; anything else is a bug and keeps its traceback.
    if _TRACEBACK.value:
      raise
    print(f"xlt: error: {type(e).__name__}: {e} (--traceback for the full trace)", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  allocator.preload()
  app.run(main)
