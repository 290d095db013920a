"""Checkpoints with orbax: the train state, the grain iterator position and the loop's
own bookkeeping (early stopping, history) are saved together, atomically (orbax writes
to a temporary directory and renames it), so a run killed at any point resumes where
the last checkpoint left it and ends with the same parameters as an uninterrupted run.
"""

from __future__ import annotations

import os
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


def restore(mngr: ocp.CheckpointManager, abstract_state, data_iter):
  """Restores the latest checkpoint into `abstract_state`'s shapes and shardings (and
  `data_iter`'s position, in place). Returns (state, loop) or None when there is none."""
  step = mngr.latest_step()
  if step is None:
    return None
  out = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iter),
      loop=ocp.args.JsonRestore()))
  return out["state"], out["loop"]


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
