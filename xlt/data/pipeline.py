"""grain input pipelines: one shuffled, repeated, batched stream per ensemble member,
stacked into [E, B, ...] batches.

Every stream is a random-access `grain.MapDataset` (batch i is a pure function of the
seed and i), so the iterator position is all the state a checkpoint needs, and a
resumed run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

from typing import Sequence

import grain
import numpy as np


def member_batches(arrays: dict[str, np.ndarray], batch_size: int, seed: int) -> grain.MapDataset:
  """Infinite stream of batches of rows of `arrays`, reshuffled every epoch."""
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise ValueError("cannot build batches from an empty training set")
  ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(reseed_each_epoch=True)
  ds = ds.batch(batch_size, drop_remainder=True)
  return ds.map(lambda idx: {k: v[np.asarray(idx)] for k, v in arrays.items()})


class _Stack(grain.MapDataset):
  """Batch i of every member, stacked along a new leading (ensemble) axis."""

  def __init__(self, members: Sequence[grain.MapDataset]):
    super().__init__(list(members))
    self._members = list(members)

  def __len__(self):
    return min(len(m) for m in self._members)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    parts = [m[index] for m in self._members]
    return {k: np.stack([p[k] for p in parts]) for k in parts[0]}


def ensemble_batches(member_arrays: Sequence[dict[str, np.ndarray]], batch_size: int,
                     seeds: Sequence[int], prefetch: int = 8) -> grain.DatasetIterator:
  """Iterator over stacked batches [E, B, ...]; `get_state`/`set_state` resume it."""
  members = [member_batches(a, batch_size, s) for a, s in zip(member_arrays, seeds)]
  ds = _Stack(members).to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch))
  return iter(ds)
