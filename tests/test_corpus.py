"""xlt.data.corpus: text and JSONL corpora read lazily (documents, shards, gzip, malformed
lines named by file and line), deterministic held-out / limited splits, text statistics, and the
proxy corpora of the shared data."""

import gzip
import logging
import os

import pytest

from conftest import jsonl, write
from xlt.data import corpus, spm_tokenizer

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared")


# ------------------------------------------------------------------------------ loaders


def test_text_eot_documents(tmp_path):
  path = write(tmp_path / "a.txt",
               "Once upon a time.\n\nThe end.\n<|endoftext|>\n"
               "Second story.<|endoftext|>Third, same line.\n"
               "<|endoftext|>\n  \n<|endoftext|>\nLast, no marker.\n")
  docs = list(corpus.iter_documents(corpus.CorpusSpec(path, "text")))
  assert docs == ["Once upon a time.\n\nThe end.", "Second story.", "Third, same line.",
                  "Last, no marker."]


def test_line_groups_skip_and_refusals(tmp_path):
  path = write(tmp_path / "s.txt", "a.\nb.\n\nc.\nd.\ne.\nf.\ng.\n")
  spec = corpus.CorpusSpec(path, "text", separator="line", lines_per_document=2, skip_lines=1)
  assert list(corpus.iter_documents(spec)) == ["b. c.", "d. e.", "f. g."]
  last_short = corpus.CorpusSpec(path, "text", separator="line", lines_per_document=3)
  assert list(corpus.iter_documents(last_short)) == ["a. b. c.", "d. e. f.", "g."]
  one = corpus.CorpusSpec(path, "text", separator="line")
  assert len(list(corpus.iter_documents(one))) == 7
  assert list(corpus.iter_split(iter("xyz"), "all", corpus.SplitSpec(held_out_fraction=1.0))) == list("xyz")
  with pytest.raises(ValueError, match="need separator='line'"):
    corpus.CorpusSpec(path, "text", skip_lines=2)
  with pytest.raises(ValueError, match="lines_per_document=0 must be >= 1"):
    corpus.CorpusSpec(path, "text", separator="line", lines_per_document=0)


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


def test_text_stats(story_sp):
  docs = ["Grüße 🙂", "abc"]
  stats = corpus.text_stats(docs, story_sp)
  assert (stats.documents, stats.chars, stats.bytes) == (2, 7 + 3, 6 + 1 + 1 + 4 + 3)
  assert stats.tokens == sum(len(spm_tokenizer.encode(story_sp, d)) for d in docs)
  assert corpus.text_stats(iter(docs)).tokens is None


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
