"""The entry point of every experiment: `run(c, workdir)` hands the config to the runner of its
task (`c.task`). main.py, grid.py, the tests and the benchmarks all start experiments here.

Runners are named by module, not imported, so this module depends on none of them and no
runner depends on it; the code they share is `xlt.runner`.
  graph, addition  xlt.transfer       language mixing on the synthetic tasks (Tables 2, 3)
  text             xlt.text_transfer  language modelling, perplexity (Table 4)
  arithmetic       xlt.testbed        the merge testbed: base -> experts -> merges -> evaluation
"""

from __future__ import annotations

import importlib

RUNNERS = {"graph": "xlt.transfer", "addition": "xlt.transfer", "text": "xlt.text_transfer",
           "arithmetic": "xlt.testbed"}


def run(c, workdir: str, **kw) -> list[dict]:
  """Runs the experiment `c` describes in `workdir` with the runner of `c.task`; returns its
  results rows (empty if stopped early). `kw` go to the runner's run (progress, stop_after...)."""
  if c.task not in RUNNERS:
    raise ValueError(f"unknown task {c.task!r}; known: {', '.join(RUNNERS)}")
  return importlib.import_module(RUNNERS[c.task]).run(c, workdir, **kw)
