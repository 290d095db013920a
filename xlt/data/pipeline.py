"""grain input pipelines: one shuffled, repeated, batched stream per ensemble member,
stacked into [E, B, ...] batches.

Every stream is a random-access `grain.MapDataset` (batch i is a pure function of the
seed and i), so the iterator position is all the state a checkpoint needs, and a
resumed run sees exactly the batches an uninterrupted run would.

A member may *alternate* between training sets (simultaneous partition training): phase
p = (i // steps_per_phase) % P of step i draws the next batch of phase p's own stream (one
iterator per dataset, each advancing only on its own steps), and the batch carries that
phase's `trainable` flags (which partition cells the step updates, see xlt.partition).

With several processes, each reads only `rows` of every batch (the rows its devices hold,
xlt.distributed): the same batches, split, so the iterator position is the same on all.
"""

from __future__ import annotations

from typing import Sequence

import grain
import numpy as np


def member_batches(arrays: dict[str, np.ndarray], batch_size: int, seed: int,
                   rows: np.ndarray | None = None) -> grain.MapDataset:
  """Infinite stream of batches of rows of `arrays`, reshuffled every epoch; with `rows`,
  only those rows of each batch."""
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise ValueError("cannot build batches from an empty training set")
  ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(reseed_each_epoch=True)
  ds = ds.batch(batch_size, drop_remainder=True)
  take = slice(None) if rows is None else np.asarray(rows)
  return ds.map(lambda idx: {k: v[np.asarray(idx)[take]] for k, v in arrays.items()})


class _Phases(grain.MapDataset):
  """Batch i of a member that takes turns between datasets, `steps_per_phase` steps each."""

  def __init__(self, streams: Sequence[grain.MapDataset], trainable: np.ndarray, steps_per_phase: int):
    super().__init__(list(streams))
    self._streams, self._trainable, self._k = list(streams), trainable, steps_per_phase

  def __len__(self):
    return min(len(s) for s in self._streams)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    k, p = self._k, len(self._streams)
    phase = (index // k) % p
    # batches phase `phase` drew before step `index`: k per completed round, plus this round's
    return {**self._streams[phase][(index // (k * p)) * k + index % k], "trainable": self._trainable[phase]}


def phased_batches(phases: Sequence[dict[str, np.ndarray]], trainable, batch_size: int, seed: int,
                   steps_per_phase: int = 1, rows: np.ndarray | None = None) -> grain.MapDataset:
  """A member's stream over its phases' training sets; `trainable` [P, C] flags per phase
  (None: a plain stream of the one set, without flags). Phase p shuffles with seed + p.
  `rows`: only those rows of each batch (this process's share)."""
  if trainable is None:
    if len(phases) != 1:
      raise ValueError(f"{len(phases)} training sets need trainable flags for each phase")
    return member_batches(phases[0], batch_size, seed, rows)
  trainable = np.asarray(trainable, np.bool_)
  if trainable.ndim != 2 or len(trainable) != len(phases):
    raise ValueError(f"need one row of trainable flags per phase ({len(phases)}), got shape {trainable.shape}")
  if steps_per_phase < 1:
    raise ValueError(f"steps_per_phase must be >= 1, got {steps_per_phase}")
  streams = [member_batches(a, batch_size, seed + p, rows) for p, a in enumerate(phases)]
  return _Phases(streams, trainable, steps_per_phase)


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


def stack(member_streams: Sequence[grain.MapDataset], prefetch: int = 8) -> grain.DatasetIterator:
  """Iterator over the members' streams stacked into [E, ...] batches."""
  ds = _Stack(member_streams).to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch))
  return iter(ds)
