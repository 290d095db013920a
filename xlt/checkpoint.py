"""Checkpoints with orbax: the train state, the grain iterator position and the loop's
own bookkeeping (early stopping, history) are saved together, atomically (orbax writes
to a temporary directory and renames it), so a run killed at any point resumes where
the last checkpoint left it and ends with the same parameters as an uninterrupted run.

A checkpoint damaged after it was written (a half-synced copy, a failing disk) is reported in
one line, renamed aside to `<step>.damaged` (kept for inspection, never deleted; orbax no
longer sees it) and the run resumes from the newest one that restores.
"""

from __future__ import annotations

import os
import sys
import tempfile

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp


def manager(directory: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  # orbax needs an absolute path (a relative one fails in its background commit thread)
  return ocp.CheckpointManager(
      os.path.abspath(directory), options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def save(mngr: ocp.CheckpointManager, step: int, state, data_iter, loop: dict):
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iter),
      loop=ocp.args.JsonSave(loop)))


class CheckpointError(RuntimeError):
  """No checkpoint of a run can be restored."""


def restore(mngr: ocp.CheckpointManager, abstract_state, data_iter):
  """Restores the newest checkpoint that restores into `abstract_state`'s shapes and
  shardings (and `data_iter`'s position, in place). Returns (state, loop), or None when there
  is none. Damaged ones are reported and set aside; if every one is damaged, CheckpointError."""
  directory, failures = str(mngr.directory), []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      out = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iter),
          loop=ocp.args.JsonRestore()))
      return out["state"], out["loop"]
    except Exception as e:  # orbax, tensorstore and json each raise their own kinds
      why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
      failures.append(f"step {step} ({why})")
      aside = _set_aside(directory, step)
      print(f"xlt: checkpoint step {step} in {directory} cannot be restored ({why}); moved to {aside}, "
            f"trying an older one", file=sys.stderr, flush=True)
      mngr.reload()
  if failures:
    raise CheckpointError(f"no checkpoint in {directory} can be restored: {'; '.join(failures)}. The damaged "
                          f"ones are kept as <step>.damaged; move {os.path.dirname(directory)} away (or delete "
                          f"{directory}) to start the run fresh")
  return None


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
    host = [np.asarray(x) for x in jax.tree.leaves(params)]
    if self.leaves is None:
      if len(ids) != len(self.scores):
        raise ValueError(f"{self.path} is missing but some members already stopped: use a fresh workdir")
      self.leaves = [h.copy() for h in host]
    for best, new in zip(self.leaves, host):
      best[ids[improved]] = new[improved]
    self.scores[ids[improved]] = scores[improved]
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".npz.tmp")
    with os.fdopen(fd, "wb") as f:
      np.savez(f, scores=self.scores, **{f"leaf_{k}": x for k, x in enumerate(self.leaves)})
    os.replace(tmp, self.path)

  def params(self, like):
    """The best parameters in `like`'s tree structure (`like` itself if none were recorded)."""
    if self.leaves is None:
      return like
    shapes = [x.shape for x in jax.tree.leaves(like)]
    if shapes != [x.shape for x in self.leaves]:
      raise ValueError(f"{self.path} does not match the model: use a fresh workdir")
    return jax.tree.unflatten(jax.tree.structure(like), jax.device_put(self.leaves))
