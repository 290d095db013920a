"""Checkpoints with orbax: the train state, the grain iterator position and the loop's
own bookkeeping (early stopping, history) are saved together, atomically (orbax writes
to a temporary directory and renames it), so a run killed at any point resumes where
the last checkpoint left it and ends with the same parameters as an uninterrupted run.

A checkpoint damaged after it was written (a half-synced copy, a failing disk) is reported in
one line, renamed aside to `<step>.damaged` (kept for inspection, never deleted; orbax no
longer sees it) and the run resumes from the newest one that restores.

With several processes (xlt.distributed) every process saves and restores together (orbax
writes the arrays' shards from the processes that hold them; grain one iterator file per
process), and process 0 alone reports and sets aside a damaged checkpoint and writes the best
parameters. A checkpoint restores only with the number of processes that wrote it.
"""

from __future__ import annotations

import logging
import os
import re
import sys

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from xlt import distributed
from xlt.io import fileio


def manager(directory: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  # orbax needs an absolute path (a relative one fails in its background commit thread)
  return ocp.CheckpointManager(
      os.path.abspath(directory), options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def save(mngr: ocp.CheckpointManager, step: int, state, data_iter, loop: dict):
  """Starts saving checkpoint `step` (orbax commits it in the background; a failure of the
  previous one surfaces here or in `wait`: a full or read-only disk as one line, `disk_error`)."""
  try:
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iter),
        loop=ocp.args.JsonSave(loop)))
  except Exception as e:
    if (disk := disk_error(e, str(mngr.directory))) is None:
      raise
    raise disk from e


def wait(mngr: ocp.CheckpointManager):
  """Waits for the checkpoint being saved (its failure as `save`'s)."""
  try:
    mngr.wait_until_finished()
  except Exception as e:
    if (disk := disk_error(e, str(mngr.directory))) is None:
      raise
    raise disk from e


# orbax and tensorstore report a full or read-only disk in their own words, naming the
# checkpoint's hidden temporary folder
_DISK = {"No space left on device": "no space left on the device", "os_error_code='28'": "no space left on the device",
         "Read-only file system": "a read-only file system", "os_error_code='30'": "a read-only file system",
         "Disk quota exceeded": "the disk quota is exceeded"}


def disk_error(error: Exception, directory: str) -> ValueError | None:
  """A one-line ValueError naming `directory` (the run's ckpt folder, not orbax's temporary one)
  when `error` says the disk is full or read-only; None for any other error."""
  text = str(error)
  why = next((v for k, v in _DISK.items() if k in text), None)
  if why is None:
    return None
  return ValueError(f"checkpoints in {directory} cannot be written: {why}; free the space (or make it writable) and "
                    "run the same command again: it resumes from the last checkpoint")


class QuietBackgroundErrors(logging.Filter):
  """Drops orbax's logged tracebacks of a failed background commit: the same error reaches the
  training loop at the next save or wait, and xlt reports it in one line (`disk_error`)."""

  def filter(self, record) -> bool:
    if record.levelno < logging.ERROR:
      return True
    if f"{os.sep}orbax{os.sep}" in (record.pathname or ""):
      return False
    # asyncio's "exception was never retrieved" of the writes in flight, at exit
    return not (record.name == "asyncio" and any(k in record.getMessage() for k in _DISK))


def quiet_background_errors():
  """Installs QuietBackgroundErrors on absl's logger (orbax logs through absl) and asyncio's, and
  hooks that drop the closed event loop's tracebacks; main does it unless --traceback."""
  for logger in (logging.getLogger("absl"), logging.getLogger("asyncio")):
    if not any(isinstance(f, QuietBackgroundErrors) for f in logger.filters):
      logger.addFilter(QuietBackgroundErrors())
  previous = sys.excepthook
  if getattr(previous, "quiet_closed_loop", False):
    return

  def hook(kind, value, tb):
    # tensorstore's writes still in flight call back into the event loop orbax closed on the
    # failure (printed through this hook, one traceback each); the failure itself is reported
    if not (kind is RuntimeError and str(value) == "Event loop is closed"):
      previous(kind, value, tb)

  def unraisable(u):
    if not (u.exc_type is RuntimeError and str(u.exc_value) == "Event loop is closed"):
      previous_unraisable(u)

  previous_unraisable = sys.unraisablehook
  hook.quiet_closed_loop = True
  sys.excepthook, sys.unraisablehook = hook, unraisable


class CheckpointError(RuntimeError):
  """No checkpoint of a run can be restored."""


def restore(mngr: ocp.CheckpointManager, abstract_state, data_iter):
  """Restores the newest checkpoint that restores into `abstract_state`'s shapes and
  shardings (and `data_iter`'s position, in place). Returns (state, loop), or None when there
  is none. Damaged ones are reported and set aside; if every one is damaged, CheckpointError."""
  directory, failures = str(mngr.directory), []
  for step in sorted(mngr.all_steps(), reverse=True):
    _check_process_count(directory, step)
    try:
      out = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iter),
          loop=ocp.args.JsonRestore()))
      return out["state"], out["loop"]
    except Exception as e:  # orbax, tensorstore and json each raise their own kinds
      why = reason(e)
      failures.append(f"step {step} ({why})")
      # every process fails on the same files; one renames them, the others wait for it
      if distributed.is_main():
        aside = _set_aside(directory, step)
        print(f"xlt: checkpoint step {step} in {directory} cannot be restored ({why}); set aside as "
              f"{os.path.basename(aside)}, trying an older one", file=sys.stderr, flush=True)
      distributed.barrier(f"xlt_set_aside_{step}")
      mngr.reload()
  if failures:
    raise CheckpointError(f"no checkpoint in {directory} can be restored: {'; '.join(failures)}. The damaged "
                          f"ones are kept as <step>.damaged; move {os.path.dirname(directory)} away (or delete "
                          f"{directory}) to start the run fresh")
  return None


# what a library's error may carry that says nothing to a person: pybind11 / Python object
# reprs and tensorstore's spec dumps
_NOISE = re.compile(r"<[^<>]*\bat 0x[0-9a-fA-F]+>|\{[^{}]*\}|\[source locations=[^\]]*\]")
REASON_CHARS = 120


def reason(error: Exception) -> str:
  """A short why of a failed restore: the error's first line without object reprs or specs,
  at most REASON_CHARS characters."""
  lines = str(error).strip().splitlines()
  text = " ".join(_NOISE.sub("", lines[0] if lines else "").split()).strip(" :;,") or type(error).__name__
  return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3].rstrip() + "..."


def _check_process_count(directory: str, step: int):
  """A ValueError (not damage: nothing is set aside) when checkpoint `step` was written by a
  different number of processes: grain's iterator files are per process."""
  data = os.path.join(directory, str(step), "data")
  counts = {f.rsplit("-of-", 1)[1].removesuffix(".json") for f in os.listdir(data)
            if f.startswith("process_") and "-of-" in f} if os.path.isdir(data) else set()
  want = str(jax.process_count())
  if counts and want not in counts:
    raise ValueError(f"checkpoint step {step} in {directory} was written by {' or '.join(sorted(counts))} "
                     f"process(es), this run has {want}: resume it with as many processes (or use a new workdir)")


def _set_aside(directory: str, step: int) -> str:
  """Renames checkpoint `step` to `<step>.damaged` (numbered if that exists) and returns the new path."""
  src, dst, k = os.path.join(directory, str(step)), os.path.join(directory, f"{step}.damaged"), 1
  while os.path.exists(dst):
    dst, k = os.path.join(directory, f"{step}.damaged.{k}"), k + 1
  os.rename(src, dst)
  return dst


def abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


class BestParams:
  """Each member's parameters at its best validation score so far: the models that are tested.

  Kept on the host and written to `path` (.npz, atomically) whenever a member improves, so a
  resumed run tests the same models. (The loop freezes a member `patience` evaluations after
  its best; on a small training set that is already overfit.)
  """

  def __init__(self, path: str, num_members: int):
    self.path, self.scores, self.leaves = path, np.full(num_members, -np.inf), None
    if os.path.isfile(path):
      with np.load(path) as f:
        self.scores = np.array(f["scores"], float)
        self.leaves = [f[f"leaf_{k}"] for k in range(len(f.files) - 1)]
      if len(self.scores) != num_members:
        raise ValueError(f"{path} holds {len(self.scores)} members, the config {num_members}: "
                         f"use a fresh workdir")

  def update(self, params, scores, ids):
    """`params` and `scores` are those of the members `ids` (the ones still training)."""
    ids, scores = np.asarray(ids), np.asarray(scores, float)
    improved = scores > self.scores[ids]
    if not improved.any():
      return
    host = jax.tree.leaves(distributed.to_host(params))  # gathered if sharded across processes
    if self.leaves is None:
      if len(ids) != len(self.scores):
        raise ValueError(f"{self.path} is missing but some members already stopped: use a fresh workdir")
      self.leaves = [h.copy() for h in host]
    for best, new in zip(self.leaves, host):
      best[ids[improved]] = new[improved]
    self.scores[ids[improved]] = scores[improved]
    if not distributed.is_main():  # every process keeps the best params; one writes them
      return
    with fileio.atomic_open(self.path) as f:
      np.savez(f, scores=self.scores, **{f"leaf_{k}": x for k, x in enumerate(self.leaves)})

  def params(self, like):
    """The best parameters in `like`'s tree structure (`like` itself if none were recorded)."""
    if self.leaves is None:
      return like
    shapes = [x.shape for x in jax.tree.leaves(like)]
    if shapes != [x.shape for x in self.leaves]:
      raise ValueError(f"{self.path} does not match the model: use a fresh workdir")
    return jax.tree.unflatten(jax.tree.structure(like), jax.device_put(self.leaves))
