"""Packed rows of token ids, what the Table 4 models train and are scored on: documents packed
into rows of block_size + 1 tokens, written once to .npy and memory-mapped, and read as
batches (grain datasets, or the row arrays a `loop.Member` trains on).

Every step streams, because the full corpora are ~2 GB each:

  CorpusSpec --corpus.iter_documents--> documents (str), in file order
    --corpus.iter_split(docs, "train" | "limited" | "held_out", SplitSpec)--> one split's documents
    --spm_tokenizer.encode_documents(sp, docs)--> token ids per document
    --pack_documents--> rows {"tokens", "segment_ids", "loss_mask"} of block_size + 1 tokens
    --packed_arrays (N rows in memory) | pack_split_to_npy (all rows, once, on disk)
    --grain_dataset--> shuffled, repeated (reshuffled per epoch), batched grain.MapDataset

For the full corpora: `spm_tokenizer.train_or_load_tokenizer` once, then `pack_split_to_npy` per
(corpus, split) — one streaming tokenize+pack pass that writes an int32 [N, block_size + 1]
.npy — then `grain_dataset(open_packed_tokens(path), ...)` reads batches by random access from
the memmap. The arrays also fit `xlt.data.pipeline.member_batches` (tokens [N, T], loss_mask
[N, T-1]) without loading them: `LossMaskView` derives the loss mask of the rows a batch reads,
and `RowConcat` reads several row arrays as one (the mixed condition's two languages).

Packing convention. Each document becomes [bos, *ids, eos]; documents are concatenated into one
stream, cut into rows of block_size + 1 tokens with a stride of block_size (consecutive rows
share one token, so every token after the first is a target exactly once); the last partial row
is padded with pad=0 (`pad_last=True`). Row arrays:
  tokens       int32[block+1]  inputs are tokens[:-1], targets tokens[1:]
  segment_ids  int32[block+1]  1, 2, ... for the documents in the row in order (a document
               continued from the previous row is 1), 0 for padding; they are a function of the
               tokens alone (a new segment starts at every bos), see `row_features`.
  loss_mask    float32[block]  loss_mask[j] = 1 iff segment_ids[j+1] != 0 and
               segment_ids[j+1] == segment_ids[j]: the target is real and from the same
               document as its input. The only real targets masked are the bos tokens (eos of
               document k -> bos of k+1, which says nothing about language); each document's
               first word is predicted from its bos and its eos is predicted, so every document
               scores len(ids) + 1 targets. Models that support it should also restrict
               attention to equal segment_ids[:-1].
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import logging
import os
import struct
from typing import Iterable, Iterator, Mapping, Sequence

import grain
import numpy as np
import sentencepiece as spm

from xlt.io import fileio
from xlt.data import corpus
from xlt.data import spm_tokenizer

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ packing


def row_features(tokens: np.ndarray, bos_id: int = spm_tokenizer.BOS_ID,
                 pad_id: int = spm_tokenizer.PAD_ID) -> dict[str, np.ndarray]:
  """{"tokens", "segment_ids", "loss_mask"} of packed rows [..., block+1] (see module doc)."""
  tokens = np.asarray(tokens, np.int32)
  is_bos = tokens == bos_id
  # A row that starts inside a document gives that document segment 1, hence the offset.
  segment_ids = np.cumsum(is_bos, axis=-1, dtype=np.int32) + ~is_bos[..., :1]
  segment_ids = np.where(tokens == pad_id, 0, segment_ids).astype(np.int32)
  same_document = (segment_ids[..., 1:] == segment_ids[..., :-1]) & (segment_ids[..., 1:] != 0)
  return {"tokens": tokens, "segment_ids": segment_ids,
          "loss_mask": same_document.astype(np.float32)}


def pack_documents(token_documents: Iterable[Sequence[int]], *, block_size: int,
                   bos_id: int = spm_tokenizer.BOS_ID, eos_id: int = spm_tokenizer.EOS_ID,
                   pad_id: int = spm_tokenizer.PAD_ID,
                   pad_last: bool = True) -> Iterator[dict[str, np.ndarray]]:
  """Streams packed rows of block_size + 1 tokens, stride block_size (see module doc).

  pad_last: also yield the last, partial row, padded with pad_id (keep it for evaluation, so
  every token is scored).
  """
  if len({bos_id, eos_id, pad_id}) != 3:
    raise ValueError(f"bos_id={bos_id}, eos_id={eos_id}, pad_id={pad_id} must differ")
  row_len = block_size + 1
  pending: list[np.ndarray] = []
  n_pending = 0
  for ids in token_documents:
    ids = np.asarray(ids, np.int32)
    if np.any((ids == bos_id) | (ids == pad_id)):  # segment ids are derived from bos and pad
      raise ValueError("document ids contain bos_id or pad_id")
    doc = np.concatenate([[bos_id], ids, [eos_id]]).astype(np.int32)
    pending.append(doc)
    n_pending += len(doc)
    if n_pending < row_len:
      continue
    stream = np.concatenate(pending)
    n_rows = (len(stream) - 1) // block_size  # rows whose block_size + 1 tokens are all here
    for r in range(n_rows):
      yield row_features(stream[r * block_size: r * block_size + row_len], bos_id, pad_id)
    pending = [stream[n_rows * block_size:]]  # starts with the last row's final token
    n_pending = len(pending[0])
  if pad_last and n_pending > 1:  # 1 token left = already the target of the last row
    row = np.full(row_len, pad_id, np.int32)
    row[:n_pending] = np.concatenate(pending)
    yield row_features(row, bos_id, pad_id)


def packed_arrays(rows: Iterable[Mapping[str, np.ndarray]],
                  num_rows: int | None = None) -> dict[str, np.ndarray]:
  """The first num_rows rows (all if None; fewer if the stream is shorter), stacked [N, ...]."""
  taken = list(itertools.islice(rows, num_rows))
  if not taken:
    raise ValueError("no packed rows: the documents hold fewer than 2 tokens")
  return {k: np.stack([r[k] for r in taken]) for k in taken[0]}


# ------------------------------------------------------------------------ packed on disk

_NPY_HEADER_BYTES = 128  # fixed, so the row count can be filled in after streaming


def _npy_header(shape: tuple[int, ...]) -> bytes:
  """A .npy v1.0 header for int32 `shape`, space-padded to _NPY_HEADER_BYTES (per the spec)."""
  body = repr({"descr": "<i4", "fortran_order": False, "shape": tuple(int(d) for d in shape)})
  body_len = _NPY_HEADER_BYTES - 10  # magic (6) + version (2) + length (2)
  return b"\x93NUMPY\x01\x00" + struct.pack("<H", body_len) + (
      body.ljust(body_len - 1) + "\n").encode("latin1")


def write_packed_tokens(path: str, rows: Iterable[Mapping[str, np.ndarray]]) -> int:
  """Streams the rows' tokens into an int32 [N, block+1] .npy at `path`, atomically; returns N.

  Segment ids and loss masks are not stored: `row_features` rederives them from the tokens.
  """
  with fileio.atomic_open(path) as f:
    f.write(_npy_header((0, 0)))  # placeholder, same size
    n_rows, row_len = 0, None
    for row in rows:
      tokens = np.asarray(row["tokens"], np.int32)
      if row_len is None:
        row_len = len(tokens)
      elif len(tokens) != row_len:
        raise ValueError(f"row {n_rows} has {len(tokens)} tokens, earlier rows {row_len}")
      f.write(tokens.astype("<i4").tobytes())
      n_rows += 1
    if row_len is None:
      raise ValueError(f"no packed rows to write to {path}")
    f.seek(0)
    f.write(_npy_header((n_rows, row_len)))
  return n_rows


def open_packed_tokens(path: str) -> np.ndarray:
  """The int32 [N, block+1] token rows of a packed .npy, memory-mapped (read lazily)."""
  return np.load(path, mmap_mode="r")


def pack_split_to_npy(workdir: str, spec: corpus.CorpusSpec, split_name: str,
                      split: corpus.SplitSpec, sp: spm.SentencePieceProcessor, *,
                      block_size: int) -> str:
  """Tokenizes and packs one split of a corpus once (streaming) into workdir/packed/; the path.

  Reused when the spec, split, input files' sizes, tokenizer and block size are unchanged.
  """
  key = corpus.cache_key(dict(spec=dataclasses.asdict(spec), inputs=corpus.input_files([spec]),
                              split_name=split_name, split=dataclasses.asdict(split),
                              block_size=block_size,
                              tokenizer=hashlib.sha256(sp.serialized_model_proto()).hexdigest()))
  name = spec.language or os.path.splitext(os.path.basename(spec.path))[0]
  path = os.path.join(workdir, "packed", f"{name}_{split_name}_{key}.npy")
  if not os.path.isfile(path):
    documents = corpus.iter_split(corpus.iter_documents(spec), split_name, split)
    rows = pack_documents(spm_tokenizer.encode_documents(sp, documents), block_size=block_size,
                          bos_id=sp.bos_id(), eos_id=sp.eos_id(), pad_id=sp.pad_id())
    n_rows = write_packed_tokens(path, rows)
    log.info("packed %s %s: %d rows of %d tokens -> %s", name, split_name, n_rows,
             block_size + 1, path)
  return path


# -------------------------------------------------------------------------------- grain


def _gather_rows(token_arrays: Sequence[np.ndarray], offsets: np.ndarray, indices,
                 bos_id: int, pad_id: int) -> dict[str, np.ndarray]:
  """Rows at global `indices` of the concatenation of token_arrays, as batch features."""
  indices = np.asarray(indices)
  source = np.searchsorted(offsets, indices, side="right") - 1
  rows = np.empty((len(indices), token_arrays[0].shape[1]), np.int32)
  for s in np.unique(source):
    rows[source == s] = token_arrays[s][indices[source == s] - offsets[s]]
  return row_features(rows, bos_id, pad_id)


def grain_dataset(tokens: np.ndarray | Sequence[np.ndarray], *, batch_size: int, seed: int,
                  num_epochs: int | None = None, shuffle: bool = True,
                  drop_remainder: bool = True, bos_id: int = spm_tokenizer.BOS_ID,
                  pad_id: int = spm_tokenizer.PAD_ID) -> grain.MapDataset:
  """Batches {"tokens", "segment_ids", "loss_mask"} [B, ...] of packed token rows.

  tokens: [N, block+1] rows (in memory, or `open_packed_tokens` memmaps), or several such
  arrays, concatenated: e.g. [limited Czech, English] for the mixed row, so the mix follows
  their sizes. Shuffled with `seed`, reshuffled every epoch (num_epochs=None: forever).
  Random access: batch i is a function of (seed, i), so the iterator's get_state/set_state
  resumes exactly.
  """
  token_arrays = [tokens] if isinstance(tokens, np.ndarray) else list(tokens)
  if len({a.shape[1:] for a in token_arrays}) != 1 or token_arrays[0].ndim != 2:
    raise ValueError(f"expected [N, block+1] arrays of one width, got "
                     f"{[a.shape for a in token_arrays]}")
  offsets = np.cumsum([0] + [len(a) for a in token_arrays])
  if offsets[-1] == 0:
    raise ValueError("cannot build batches from zero packed rows")
  ds = grain.MapDataset.range(int(offsets[-1]))
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(num_epochs, reseed_each_epoch=True)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  # Read whole batches: one fancy index per batch, not one memmap read per row.
  return ds.map(functools.partial(_gather_rows, token_arrays, offsets[:-1],
                                  bos_id=bos_id, pad_id=pad_id))


# ---------------------------------------------------------------------------- row views
# What a `loop.Member` trains on when its rows are memory-mapped: the input pipeline indexes
# these views by batch, so only the rows of a batch are read and featurized.


class RowConcat:
  """Read-only view of several [N_i, T] row arrays (e.g. memmaps) as one [sum N_i, T] array.

  Supports what the input pipeline needs: len, shape, and indexing by an int array.
  """

  def __init__(self, arrays):
    self.arrays = list(arrays)
    if len({a.shape[1:] for a in self.arrays}) != 1:
      raise ValueError(f"rows of different widths: {[a.shape for a in self.arrays]}")
    self.offsets = np.cumsum([0] + [len(a) for a in self.arrays])
    self.shape = (int(self.offsets[-1]),) + tuple(self.arrays[0].shape[1:])
    self.dtype = self.arrays[0].dtype

  def __len__(self):
    return self.shape[0]

  def __getitem__(self, idx):
    idx = np.arange(len(self))[idx] if isinstance(idx, slice) else np.asarray(idx)
    flat = idx.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
      raise IndexError(f"row index out of range [0, {len(self)})")
    source = np.searchsorted(self.offsets, flat, side="right") - 1
    out = np.empty((len(flat),) + self.shape[1:], self.dtype)
    for s in np.unique(source):
      sel = source == s
      local = flat[sel] - self.offsets[s]
      order = np.argsort(local)  # sorted reads are kinder to a memmap
      out[np.flatnonzero(sel)[order]] = self.arrays[s][local[order]]
    return out.reshape(idx.shape + self.shape[1:])


class LossMaskView:
  """loss_mask [N, T-1] of packed token rows, computed from the rows when indexed."""

  def __init__(self, tokens):
    self.tokens = tokens
    self.shape = (len(tokens), tokens.shape[1] - 1)
    self.dtype = np.dtype(np.float32)

  def __len__(self):
    return self.shape[0]

  def __getitem__(self, idx):
    return row_features(np.asarray(self.tokens[idx]))["loss_mask"]


def packed_counts(tokens, chunk: int = 65536) -> dict[str, int]:
  """{"documents", "targets"} of packed rows: documents started (bos) and scored targets."""
  docs = targets = 0
  for start in range(0, len(tokens), chunk):
    rows = np.asarray(tokens[start:start + chunk])
    # Consecutive rows share one token: count position 0 of the very first row only.
    docs += int((rows[:, 1:] == spm_tokenizer.BOS_ID).sum()) + int(start == 0 and rows[0, 0] == spm_tokenizer.BOS_ID)
    targets += int(row_features(rows)["loss_mask"].sum())
  return {"documents": docs, "targets": targets}
