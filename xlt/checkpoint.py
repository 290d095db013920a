"""Checkpoints with orbax: the train state, the grain iterator position and the loop's
own bookkeeping (early stopping, history) are saved together, atomically (orbax writes
to a temporary directory and renames it), so a run killed at any point resumes where
the last checkpoint left it and ends with the same parameters as an uninterrupted run.
"""

from __future__ import annotations

import os

import grain
import jax
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
