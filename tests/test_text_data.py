import gzip
import json
import logging
import os
import random

import numpy as np
import pytest
import sentencepiece as spm

from xlt.data import corpus, packing, spm_tokenizer

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared")


def write(path, content: str | bytes):
  mode = "wb" if isinstance(content, bytes) else "w"
  with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
    f.write(content)
  return str(path)


def jsonl(records) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


# ------------------------------------------------------------------------------ loaders


def test_text_eot_documents(tmp_path):
  path = write(tmp_path / "a.txt",
               "Once upon a time.\n\nThe end.\n<|endoftext|>\n"
               "Second story.<|endoftext|>Third, same line.\n"
               "<|endoftext|>\n  \n<|endoftext|>\nLast, no marker.\n")
  docs = list(corpus.iter_documents(corpus.CorpusSpec(path, "text")))
  assert docs == ["Once upon a time.\n\nThe end.", "Second story.", "Third, same line.",
                  "Last, no marker."]


def test_text_custom_marker_and_blank_lines(tmp_path):
  path = write(tmp_path / "b.txt", "one\ntwo\n\n\nthree\r\n\nfour\n  five\n\n")
  docs = list(corpus.iter_documents(corpus.CorpusSpec(path, "text", separator="blank_line")))
  assert docs == ["one\ntwo", "three", "four\n  five"]
  path = write(tmp_path / "c.txt", "a b ### c\nd ###")
  marked = corpus.CorpusSpec(path, "text", eot_marker="###")
  assert list(corpus.iter_documents(marked)) == ["a b", "c\nd"]


def test_jsonl_field_and_parallel(tmp_path):
  path = write(tmp_path / "d.jsonl", jsonl([{"text": "Hallo\nWelt", "id": 1}, {"text": "zwei"}])
               + "\n")  # a trailing blank line is not a record
  assert list(corpus.iter_documents(corpus.CorpusSpec(path, "jsonl"))) == ["Hallo\nWelt", "zwei"]
  path = write(tmp_path / "p.jsonl", jsonl([{"en": "The cat.", "de": "Die Katze."},
                                            {"en": "A dog.", "de": "Ein Hund."}]))
  assert list(corpus.iter_documents(corpus.CorpusSpec(path, "jsonl", field="de"))) == [
      "Die Katze.", "Ein Hund."]
  assert list(corpus.iter_documents(corpus.CorpusSpec(path, "jsonl", field="en"))) == [
      "The cat.", "A dog."]


def test_glob_shards_gzip_and_max_documents(tmp_path):
  write(tmp_path / "s-00.jsonl", jsonl([{"text": "a"}, {"text": "b"}]))
  with gzip.open(tmp_path / "s-01.jsonl.gz", "wt", encoding="utf-8") as f:
    f.write(jsonl([{"text": "c"}, {"text": ""}, {"text": "d"}]))  # "" is dropped
  spec = corpus.CorpusSpec(str(tmp_path / "s-*"), "jsonl")
  assert list(corpus.iter_documents(spec)) == ["a", "b", "c", "d"]
  assert corpus.count_documents(spec) == corpus.CorpusCount(documents=4, skipped_lines=0)
  capped = corpus.CorpusSpec(spec.path, "jsonl", max_documents=3)
  assert list(corpus.iter_documents(capped)) == ["a", "b", "c"]
  assert corpus.count_documents(capped).documents == 3
  assert corpus.take_documents(corpus.iter_documents(spec), 2) == ["a", "b"]
  assert corpus.take_documents(corpus.iter_documents(spec), 99) == ["a", "b", "c", "d"]


BAD_LINES = [
    (2, b'{"text": "unterminated\n', "invalid JSON"),
    (3, b'{"title": "no text"}\n', "missing field 'text'"),
    (4, b'{"text": 42}\n', "field 'text' is int, not a string"),
    (5, b'["a list"]\n', "expected a JSON object"),
    (6, b'{"text": "\xff\xfe bad utf-8"}\n', "invalid UTF-8"),
]


@pytest.mark.parametrize("lineno, line, message", BAD_LINES)
def test_malformed_line_names_file_and_line(tmp_path, lineno, line, message):
  content = b'{"text": "ok"}\n' + b'{"text": "ok"}\n' * (lineno - 2) + line + b'{"text": "ok"}\n'
  path = write(tmp_path / "bad.jsonl", content)
  with pytest.raises(ValueError, match=f"^{path}:{lineno}: {message}"):
    list(corpus.iter_documents(corpus.CorpusSpec(path, "jsonl")))


def test_skip_mode_counts_malformed_lines(tmp_path, caplog):
  bad = b"".join(line for _, line, _ in BAD_LINES)
  content = b'{"text": "first"}\n' + bad + b'{"text": "last"}\n'
  path = write(tmp_path / "bad.jsonl", content)
  spec = corpus.CorpusSpec(path, "jsonl", on_error="skip")
  with caplog.at_level(logging.WARNING, logger=corpus.__name__):
    assert list(corpus.iter_documents(spec)) == ["first", "last"]
  assert f"skipped 5 malformed lines (first: {path}:2: invalid JSON" in caplog.text
  assert corpus.count_documents(spec) == corpus.CorpusCount(documents=2, skipped_lines=5)


def test_text_invalid_utf8_names_line(tmp_path):
  path = write(tmp_path / "bad.txt", b"good\n<|endoftext|>\nbad \xff\n")
  with pytest.raises(ValueError, match=f"^{path}:3: invalid UTF-8"):
    list(corpus.iter_documents(corpus.CorpusSpec(path, "text")))
  skip = corpus.CorpusSpec(path, "text", on_error="skip")
  assert list(corpus.iter_documents(skip)) == ["good"]
  assert corpus.count_documents(skip).skipped_lines == 1


def test_missing_files_raise_at_call(tmp_path):
  missing = str(tmp_path / "nope.jsonl")
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    corpus.iter_documents(corpus.CorpusSpec(missing, "jsonl"))  # before any iteration
  with pytest.raises(FileNotFoundError, match="no corpus files match"):
    corpus.iter_documents(corpus.CorpusSpec(str(tmp_path / "shard-*.jsonl"), "jsonl"))


def test_spec_validation():
  with pytest.raises(ValueError, match="format"):
    corpus.CorpusSpec("x", "csv")
  with pytest.raises(ValueError, match="separator"):
    corpus.CorpusSpec("x", "text", separator="newline")
  with pytest.raises(ValueError, match="on_error"):
    corpus.CorpusSpec("x", "jsonl", on_error="ignore")
  # Plain fields: a config dict round-trips.
  spec = corpus.CorpusSpec("x.jsonl", "jsonl", field="cs", language="cs")
  assert corpus.CorpusSpec(**{k: v for k, v in vars(spec).items()}) == spec


# ------------------------------------------------------------------------------- splits


def test_splits_deterministic_disjoint_nested():
  docs = [f"doc {i}" for i in range(5000)]
  split = corpus.SplitSpec(seed=3, held_out_fraction=0.1, limited_fraction=0.2)
  parts = {name: list(corpus.iter_split(docs, name, split)) for name in corpus.SPLITS}
  again = {name: list(corpus.iter_split(iter(docs), name, split)) for name in corpus.SPLITS}
  assert parts == again
  held, train, limited = (set(parts[n]) for n in ("held_out", "train", "limited"))
  assert not held & train and held | train == set(docs)
  assert limited <= train
  assert 0.08 < len(held) / len(docs) < 0.12
  assert 0.17 < len(limited) / len(train) < 0.23
  # Another seed, another split; the held-out set does not depend on limited_fraction,
  # and a larger limited fraction is a superset.
  other_seed = corpus.SplitSpec(seed=4, held_out_fraction=0.1)
  assert list(corpus.iter_split(docs, "held_out", other_seed)) != (
      parts["held_out"])
  wider = corpus.SplitSpec(seed=3, held_out_fraction=0.1, limited_fraction=0.5)
  assert list(corpus.iter_split(docs, "held_out", wider)) == parts["held_out"]
  assert limited <= set(corpus.iter_split(docs, "limited", wider))
  with pytest.raises(ValueError, match="unknown split"):
    corpus.iter_split(docs, "test", split)


# ---------------------------------------------------------------------------- tokenizer

EN_WORDS = ("the little girl", "a happy dog", "her brother", "the old cat", "a small bird")
EN_VERBS = ("found", "wanted", "played with", "looked at", "shared")
EN_OBJECTS = ("a red ball", "the big tree", "some sweet cake", "a shiny stone", "the blue boat")
DE_WORDS = ("das kleine Mädchen", "ein fröhlicher Hund", "ihr Bruder", "die alte Katze",
            "ein kleiner Vogel")
DE_VERBS = ("fand", "wollte", "spielte mit", "schaute auf", "teilte")
DE_OBJECTS = ("einen roten Ball", "den großen Baum", "süßen Kuchen", "einen glänzenden Stein",
              "das blaue Boot")


def stories(words, verbs, objects, n, seed):
  rng = random.Random(seed)
  sentence = lambda: " ".join(rng.choice(x) for x in (words, verbs, objects)) + "."
  return ["\n\n".join(s[0].upper() + s[1:] for s in (sentence() for _ in range(4)))
          for _ in range(n)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpora")
  en_stories = stories(EN_WORDS, EN_VERBS, EN_OBJECTS, 60, seed=0)
  de_stories = stories(DE_WORDS, DE_VERBS, DE_OBJECTS, 60, seed=1)
  en = write(root / "en.jsonl", jsonl({"text": s} for s in en_stories))
  de = write(root / "de.txt", "\n<|endoftext|>\n".join(de_stories))  # a text file, eot marker
  return [corpus.CorpusSpec(en, "jsonl", language="en"),
          corpus.CorpusSpec(de, "text", language="de")]


@pytest.fixture(scope="module")
def sp(corpora, tmp_path_factory):
  return spm_tokenizer.train_or_load_tokenizer(str(tmp_path_factory.mktemp("work")), corpora, vocab_size=400)


def test_tokenizer_special_ids(sp):
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (
      spm_tokenizer.PAD_ID, spm_tokenizer.UNK_ID, spm_tokenizer.BOS_ID, spm_tokenizer.EOS_ID) == (0, 1, 2, 3)
  assert sp.get_piece_size() == 400
  assert sp.id_to_piece(4) == "\n" and sp.id_to_piece(5) == "<0x00>"


@pytest.mark.parametrize("string", [
    "The little girl found a red ball.",
    "Das kleine Mädchen fand einen roten Ball.\n\nIhr Bruder teilte süßen Kuchen.",
    # Characters outside the training text are encoded as bytes.
    "Unseen: Žluťoučký kůň 🙂🚀 漢字かな 데이터 ∑√",
    "  leading and  double spaces, trailing \n",
])
def test_tokenizer_round_trip(sp, string):
  ids = spm_tokenizer.encode(sp, string)
  assert spm_tokenizer.UNK_ID not in ids
  assert spm_tokenizer.decode(sp, ids) == string
  specials = [spm_tokenizer.BOS_ID, *ids, spm_tokenizer.EOS_ID, spm_tokenizer.PAD_ID]
  assert spm_tokenizer.decode(sp, specials) == string  # specials decode to ""


def test_tokenizer_learns_both_languages(sp):
  # Frequent words of both languages became single pieces (the budget is balanced).
  assert len(spm_tokenizer.encode(sp, "the")) == 1 and len(spm_tokenizer.encode(sp, "einen")) == 1
  assert len(spm_tokenizer.encode(sp, "Mädchen")) < len("Mädchen".encode())


def test_tokenizer_cache_reuse_and_invalidation(corpora, tmp_path, monkeypatch):
  calls = []
  train = spm.SentencePieceTrainer.train
  monkeypatch.setattr(spm.SentencePieceTrainer, "train",
                      lambda **kw: calls.append(kw["vocab_size"]) or train(**kw))
  workdir = str(tmp_path)
  models = lambda: sorted((tmp_path / "tokenizer").glob("*.model"))
  first = spm_tokenizer.train_or_load_tokenizer(workdir, corpora, vocab_size=350)
  [path] = models()
  mtime = path.stat().st_mtime_ns
  second = spm_tokenizer.train_or_load_tokenizer(workdir, corpora, vocab_size=350)
  assert calls == [350] and models() == [path] and path.stat().st_mtime_ns == mtime
  assert second.serialized_model_proto() == first.serialized_model_proto()
  assert not list((tmp_path / "tokenizer").glob("*.tmp"))  # no temporary file left behind
  spm_tokenizer.train_or_load_tokenizer(workdir, corpora, vocab_size=360)  # a setting changed
  assert calls == [350, 360] and len(models()) == 2
  spm_tokenizer.train_or_load_tokenizer(workdir, corpora, vocab_size=350, split=corpus.SplitSpec(seed=1))
  assert calls == [350, 360, 350] and len(models()) == 3


def test_tokenizer_input_change_retrains(corpora, tmp_path):
  en = write(tmp_path / "en.jsonl", open(corpora[0].path, encoding="utf-8").read())
  specs = [corpus.CorpusSpec(en, "jsonl"), corpora[1]]
  spm_tokenizer.train_or_load_tokenizer(str(tmp_path), specs, vocab_size=350)
  with open(en, "a", encoding="utf-8") as f:
    f.write(jsonl([{"text": "A new story about a purple elephant."}]))
  spm_tokenizer.train_or_load_tokenizer(str(tmp_path), specs, vocab_size=350)
  assert len(list((tmp_path / "tokenizer").glob("*.model"))) == 2


def test_tokenizer_vocab_too_large_is_clear(corpora, tmp_path):
  with pytest.raises(ValueError, match="smaller vocab_size"):
    spm_tokenizer.train_or_load_tokenizer(str(tmp_path), corpora, vocab_size=50_000)
  with pytest.raises(ValueError, match="use a larger vocab_size"):
    spm_tokenizer.train_or_load_tokenizer(str(tmp_path), corpora, vocab_size=262)
  assert not list(tmp_path.glob("tokenizer/*"))  # nothing cached after a failure


def test_tokenizer_sentences_balanced():
  long_lines = ["x" * 10] * 100  # 1,000 characters
  short_lines = ["y" * 10] * 20  # 200 characters
  sentences = spm_tokenizer.tokenizer_sentences([["\n".join(long_lines)], ["\n\n".join(short_lines)]], 1000)
  assert sentences.count("x" * 10) == sentences.count("y" * 10) == 20
  assert sentences[:4] == ["x" * 10, "y" * 10, "x" * 10, "y" * 10]  # interleaved


def test_text_stats(sp):
  docs = ["Grüße 🙂", "abc"]
  stats = corpus.text_stats(docs, sp)
  assert (stats.documents, stats.chars, stats.bytes) == (2, 7 + 3, 6 + 1 + 1 + 4 + 3)
  assert stats.tokens == sum(len(spm_tokenizer.encode(sp, d)) for d in docs)
  assert corpus.text_stats(iter(docs)).tokens is None


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


def test_pack_split_to_npy_end_to_end(corpora, sp, tmp_path):
  split = corpus.SplitSpec(seed=0, held_out_fraction=0.2)
  pack = lambda: packing.pack_split_to_npy(str(tmp_path), corpora[1], "held_out", split, sp,
                                    block_size=16)
  path = pack()
  mtime = os.stat(path).st_mtime_ns
  assert pack() == path
  assert os.stat(path).st_mtime_ns == mtime  # reused
  tokens = packing.open_packed_tokens(path)
  held_out = list(corpus.iter_split(corpus.iter_documents(corpora[1]), "held_out", split))
  stats = corpus.text_stats(held_out, sp)
  features = packing.row_features(tokens)
  assert features["loss_mask"].sum() == stats.tokens + stats.documents
  # Undo the packing: drop the overlap token of each row, split at bos, decode each document.
  stream = np.concatenate([tokens[0], *(row[1:] for row in tokens[1:])])
  documents = np.split(stream, np.flatnonzero(stream == spm_tokenizer.BOS_ID))[1:]
  assert [spm_tokenizer.decode(sp, d) for d in documents] == held_out


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


# -------------------------------------------------------------------------------- proxy


def test_proxy_corpora_missing_dir(tmp_path):
  with pytest.raises(FileNotFoundError, match="proxy corpus"):
    corpus.proxy_corpora(str(tmp_path))


def test_proxy_corpora_on_shared_data(tmp_path):
  if not os.path.isdir(os.path.join(SHARED, "data")):
    pytest.skip("../shared/data is not present")
  specs = corpus.proxy_corpora(SHARED)
  assert [s.language for s in specs.values()] == ["en", "ru"]
  small = [corpus.CorpusSpec(s.path, s.format, max_documents=150, language=s.language)
           for s in specs.values()]
  en, ru = (corpus.take_documents(corpus.iter_documents(s), 2) for s in small)
  assert "the" in en[0].split() and any("\u0400" <= c <= "\u04ff" for c in ru[0])  # Cyrillic
  sp = spm_tokenizer.train_or_load_tokenizer(str(tmp_path), small, vocab_size=500)
  for doc in en + ru:
    assert spm_tokenizer.decode(sp, spm_tokenizer.encode(sp, doc)) == doc
