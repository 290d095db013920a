"""Runs an experiment from a config file.

  python -m xlt.main --config=configs/graph.py --workdir=/tmp/graph \
      [--config.mixture.target_samples=512 ...]

XLA:CPU spends much of a small model's step in malloc, so the process first re-executes
itself with a faster one preloaded (xlt.allocator: mimalloc from xlt's own install, or
tcmalloc; XLT_ALLOCATOR=system keeps glibc's).
"""

from absl import app, flags, logging
from ml_collections import config_flags

from xlt import allocator

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "where checkpoints, metrics and results go")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint file at INFO
  from xlt import experiment, grid

  c = _CONFIG.value
  (grid.run if c.get("grid") else experiment.run)(c, _WORKDIR.value)


if __name__ == "__main__":
  allocator.preload()
  app.run(main)
