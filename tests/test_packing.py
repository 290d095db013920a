"""xlt.data.packing: documents packed into rows at document boundaries, .npy files of rows,
row views and counts, and grain datasets over them (deterministic, resumable, mixed)."""

import os

import numpy as np
import pytest

from xlt.data import corpus, packing, spm_tokenizer


# ------------------------------------------------------------------------------ packing


def test_packing_exact_rows_at_document_boundaries():
  docs = [[10, 11, 12], [20, 21], [30]]  # stream: 2 10 11 12 3 | 2 20 21 3 | 2 30 3
  rows = list(packing.pack_documents(docs, block_size=4))
  assert [r["tokens"].tolist() for r in rows] == [
      [2, 10, 11, 12, 3],
      [3, 2, 20, 21, 3],  # rows overlap by one token: every token is a target once
      [3, 2, 30, 3, 0],   # last row padded with 0
  ]
  assert [r["segment_ids"].tolist() for r in rows] == [
      [1, 1, 1, 1, 1],
      [1, 2, 2, 2, 2],  # the eos of the previous document is segment 1
      [1, 2, 2, 2, 0],
  ]
  assert [r["loss_mask"].tolist() for r in rows] == [
      [1, 1, 1, 1],
      [0, 1, 1, 1],  # eos -> bos of the next document is not scored
      [0, 1, 1, 0],  # nor the padding
  ]
  for r in rows:
    assert r["tokens"].dtype == r["segment_ids"].dtype == np.int32
    assert r["loss_mask"].dtype == np.float32 and r["loss_mask"].shape == (4,)
  # Scored targets = text tokens + one eos per document.
  assert sum(r["loss_mask"].sum() for r in rows) == 6 + 3
  assert len(list(packing.pack_documents(docs, block_size=4, pad_last=False))) == 2


def test_packing_long_document_spans_rows():
  doc = list(range(10, 20))  # stream: 2 10..19 3 (12 tokens)
  rows = packing.packed_arrays(packing.pack_documents([doc, [40]], block_size=4))
  assert rows["tokens"].tolist() == [[2, 10, 11, 12, 13], [13, 14, 15, 16, 17],
                                     [17, 18, 19, 3, 2], [2, 40, 3, 0, 0]]
  assert rows["segment_ids"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1],
                                          [1, 1, 1, 1, 2], [1, 1, 1, 0, 0]]
  assert rows["loss_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1],
                                        [1, 1, 1, 0], [1, 1, 0, 0]]
  # The batched features equal the per-row ones; N rows can be taken from the stream.
  batched = packing.row_features(rows["tokens"])
  assert all(np.array_equal(batched[k], rows[k]) for k in rows)
  first_two = packing.packed_arrays(packing.pack_documents([doc], block_size=4), num_rows=2)
  assert first_two["tokens"].shape == (2, 5)


def test_packing_rejects_special_ids_in_text():
  with pytest.raises(ValueError, match="bos_id or pad_id"):
    list(packing.pack_documents([[5, 2, 6]], block_size=4))


def test_packed_npy_round_trip(tmp_path):
  docs = [list(range(10, 10 + n)) for n in (3, 7, 1, 12, 5)]
  rows = packing.packed_arrays(packing.pack_documents(docs, block_size=8))
  path = str(tmp_path / "packed" / "rows.npy")
  written = packing.write_packed_tokens(path, packing.pack_documents(docs, block_size=8))
  assert written == len(rows["tokens"])
  stored = packing.open_packed_tokens(path)
  assert isinstance(stored, np.memmap) and stored.dtype == np.int32
  assert np.array_equal(stored, rows["tokens"]) and np.array_equal(np.load(path), stored)
  assert os.listdir(tmp_path / "packed") == ["rows.npy"]  # no temporary file left
  with pytest.raises(ValueError, match="no packed rows"):
    packing.write_packed_tokens(str(tmp_path / "empty.npy"), [])
  assert not (tmp_path / "empty.npy").exists()


def test_pack_split_to_npy_end_to_end(story_corpora, story_sp, tmp_path):
  split = corpus.SplitSpec(seed=0, held_out_fraction=0.2)
  pack = lambda: packing.pack_split_to_npy(str(tmp_path), story_corpora[1], "held_out", split, story_sp,
                                    block_size=16)
  path = pack()
  mtime = os.stat(path).st_mtime_ns
  assert pack() == path
  assert os.stat(path).st_mtime_ns == mtime  # reused
  tokens = packing.open_packed_tokens(path)
  held_out = list(corpus.iter_split(corpus.iter_documents(story_corpora[1]), "held_out", split))
  stats = corpus.text_stats(held_out, story_sp)
  features = packing.row_features(tokens)
  assert features["loss_mask"].sum() == stats.tokens + stats.documents
  # Undo the packing: drop the overlap token of each row, split at bos, decode each document.
  stream = np.concatenate([tokens[0], *(row[1:] for row in tokens[1:])])
  documents = np.split(stream, np.flatnonzero(stream == spm_tokenizer.BOS_ID))[1:]
  assert [spm_tokenizer.decode(story_sp, d) for d in documents] == held_out


def _random_rows(n, t, seed):
  tokens = np.random.default_rng(seed).integers(4, 50, (n, t)).astype(np.int32)
  tokens[:, 0] = spm_tokenizer.BOS_ID
  return tokens


def test_row_views_and_counts():
  a, b = _random_rows(3, 9, seed=5), _random_rows(4, 9, seed=6)
  a[2, 4:] = spm_tokenizer.PAD_ID
  view = packing.RowConcat([a, b])
  both = np.concatenate([a, b])
  idx = np.asarray([6, 0, 2, 3, 2])
  assert view.shape == (7, 9) and len(view) == 7
  np.testing.assert_array_equal(view[idx], both[idx])
  np.testing.assert_array_equal(packing.LossMaskView(view)[idx],
                                packing.row_features(both[idx])["loss_mask"])
  counts = packing.packed_counts(both, chunk=2)
  assert counts["targets"] == packing.row_features(both)["loss_mask"].sum()
  assert counts["documents"] == 1 + (both[:, 1:] == spm_tokenizer.BOS_ID).sum()


# -------------------------------------------------------------------------------- grain


@pytest.fixture
def packed_tokens():
  rng = np.random.default_rng(0)
  docs = [rng.integers(4, 100, size=rng.integers(1, 20)).tolist() for _ in range(40)]
  return packing.packed_arrays(packing.pack_documents(docs, block_size=8))["tokens"]


def test_grain_dataset_deterministic_and_reshuffled(packed_tokens):
  n = len(packed_tokens)
  ds = packing.grain_dataset(packed_tokens, batch_size=4, seed=7)
  same = packing.grain_dataset(packed_tokens, batch_size=4, seed=7)
  other = packing.grain_dataset(packed_tokens, batch_size=4, seed=8)
  first = [ds[i]["tokens"] for i in range(6)]
  assert all(np.array_equal(a, same[i]["tokens"]) for i, a in enumerate(first))
  assert not all(np.array_equal(a, other[i]["tokens"]) for i, a in enumerate(first))
  batch = ds[0]
  assert batch["tokens"].shape == (4, 9) and batch["loss_mask"].shape == (4, 8)
  assert all(np.array_equal(batch[k], packing.row_features(batch["tokens"])[k]) for k in batch)
  # Two epochs without batching: each is a permutation of the rows, in a different order.
  rows = packing.grain_dataset(packed_tokens, batch_size=1, seed=7, num_epochs=2)
  assert len(rows) == 2 * n
  order = [next(i for i in range(n) if np.array_equal(packed_tokens[i], rows[j]["tokens"][0]))
           for j in range(2 * n)]
  assert sorted(order[:n]) == sorted(order[n:]) == list(range(n)) and order[:n] != order[n:]


def test_grain_iterator_resumes(packed_tokens):
  ds = packing.grain_dataset(packed_tokens, batch_size=3, seed=1)
  it = iter(ds)
  for _ in range(5):
    next(it)
  state = it.get_state()
  expected = [next(it)["tokens"] for _ in range(4)]
  resumed = iter(packing.grain_dataset(packed_tokens, batch_size=3, seed=1))
  resumed.set_state(state)
  assert all(np.array_equal(a, next(resumed)["tokens"]) for a in expected)


def test_grain_dataset_mixes_sources(packed_tokens, tmp_path):
  path = str(tmp_path / "b.npy")
  marked = ({"tokens": r} for r in packed_tokens[:5] + 1000)  # marked rows
  packing.write_packed_tokens(path, marked)
  mixed = packing.grain_dataset([packed_tokens, packing.open_packed_tokens(path)], batch_size=1,
                                seed=0,
                          num_epochs=1)
  rows = np.concatenate([mixed[i]["tokens"] for i in range(len(mixed))])
  assert len(rows) == len(packed_tokens) + 5 and (rows.min(axis=1) >= 1000).sum() == 5
