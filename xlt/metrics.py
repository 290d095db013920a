"""Metric writers: TensorBoard event files (tensorboardX, no TensorFlow) and a JSONL log.
With several processes only process 0 writes them; the others' writers do nothing."""

from __future__ import annotations

import json
import os
import time

from xlt import distributed


class Writer:
  """Writes scalars for several runs (ensemble members) under one directory:
  `<logdir>/tb/<run>/events.*` and one `<logdir>/metrics.jsonl`."""

  def __init__(self, logdir: str, runs: list[str]):
    from tensorboardX import SummaryWriter  # light: protobuf only

    self._on = distributed.is_main()
    if not self._on:
      return
    os.makedirs(logdir, exist_ok=True)
    self._tb = {r: SummaryWriter(os.path.join(logdir, "tb", r.replace("/", "_"))) for r in runs}
    self._jsonl = open(os.path.join(logdir, "metrics.jsonl"), "a")

  def write(self, step: int, run: str, scalars: dict[str, float]):
    if not self._on:
      return
    tb = self._tb[run]
    for k, v in scalars.items():
      tb.add_scalar(k, float(v), step)
    self._jsonl.write(json.dumps({"step": int(step), "run": run, "time": time.time(),
                                  **{k: float(v) for k, v in scalars.items()}}) + "\n")

  def flush(self):
    if not self._on:
      return
    self._jsonl.flush()
    for tb in self._tb.values():
      tb.flush()

  def close(self):
    if not self._on:
      return
    self.flush()
    self._jsonl.close()
    for tb in self._tb.values():
      tb.close()
