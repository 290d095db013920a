"""The tokenizer of the Table 4 language-modelling runs: trained once on the languages' train
splits and cached in the workdir, loaded, and the encode / decode the rest of xlt uses.
Corpora and their splits are `xlt.data.corpus`; packing ids into rows is `xlt.data.packing`.

Recipe. One sentencepiece BPE model over both languages' train text, ids
pad=0, unk=1, bos=2 (<s>), eos=3 (</s>), "\\n"=4 (a user-defined piece, so paragraph breaks
are one token), then the 256 byte pieces <0x00>..<0xFF> (ids 5..260), then merges. pad must be
0 because xlt pads with 0; sentencepiece needs an unk id even though byte_fallback means it is
never produced. Normalisation is "identity" with whitespace kept, so decode(encode(s)) == s for
every string (emoji, CJK... fall back to UTF-8 bytes) and the text a perplexity is measured on
is exactly the file's text. Training sentences are document lines; each language contributes at
most `max_sentences_per_language` lines, then all are cut to the same number of characters so
neither language dominates the vocabulary. A vocab_size too large for the text is a ValueError
that says so (we keep sentencepiece's hard limit: runs compared in one table must have the
vocabulary size the config says). Cached as workdir/tokenizer/spm_<key>.model, key = hash of
the settings, the corpus specs, the split and the input files' paths and sizes; written to a
temporary file and renamed, so a crash never leaves a partial model.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import logging
import os
from typing import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from xlt.io import fileio
from xlt.data import corpus

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_TOKENIZER_VERSION = 1  # bump when the training recipe changes, to invalidate caches


def _lines(documents: Iterable[str]) -> Iterator[str]:
  for doc in documents:
    yield from (line for line in doc.split("\n") if line.strip())


def _head_by_chars(lines: Sequence[str], budget: int) -> list[str]:
  n_chars = np.cumsum([len(s) for s in lines])
  return list(lines[: int(np.searchsorted(n_chars, budget, side="right"))])


def tokenizer_sentences(corpora_documents: Sequence[Iterable[str]],
                        max_sentences_per_language: int) -> list[str]:
  """Training lines: the first lines of each language, cut to equal characters, interleaved.

  Holds at most max_sentences_per_language lines per language in memory.
  """
  per_language = [list(itertools.islice(_lines(docs), max_sentences_per_language))
                  for docs in corpora_documents]
  budget = min(sum(len(s) for s in lines) for lines in per_language)
  balanced = [_head_by_chars(lines, budget) for lines in per_language]
  return [s for group in itertools.zip_longest(*balanced) for s in group if s is not None]


def load_tokenizer(path: str) -> spm.SentencePieceProcessor:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"tokenizer model not found: {path}")
  return spm.SentencePieceProcessor(model_file=path)


def train_or_load_tokenizer(workdir: str, corpora: Sequence[corpus.CorpusSpec], *,
                            vocab_size: int, split: corpus.SplitSpec = corpus.SplitSpec(),
                            max_sentences_per_language: int = 300_000,
                            character_coverage: float = 0.9995,
                            num_threads: int | None = None) -> spm.SentencePieceProcessor:
  """One BPE tokenizer for the train splits of `corpora` (one corpus per language).

  Loads workdir/tokenizer/spm_<key>.model if it exists; otherwise trains and writes it.
  The key covers every setting but num_threads, the specs, and the input files' paths and sizes.
  """
  settings = dict(version=_TOKENIZER_VERSION, vocab_size=vocab_size,
                  split=dataclasses.asdict(split),
                  corpora=[dataclasses.asdict(c) for c in corpora],
                  inputs=corpus.input_files(corpora),
                  max_sentences_per_language=max_sentences_per_language,
                  character_coverage=character_coverage)
  path = os.path.join(workdir, "tokenizer", f"spm_{corpus.cache_key(settings)}.model")
  if os.path.isfile(path):
    return load_tokenizer(path)

  sentences = tokenizer_sentences(
      [corpus.iter_split(corpus.iter_documents(c), "train", split) for c in corpora],
      max_sentences_per_language)
  if not sentences:
    raise ValueError(f"no training text in the train splits of {[c.path for c in corpora]}")
  log.info("training a %d-piece tokenizer on %d lines -> %s", vocab_size, len(sentences), path)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, character_coverage=character_coverage, byte_fallback=True,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        user_defined_symbols=["\n"],  # the lines hold no "\n"; make a paragraph break 1 token
        normalization_rule_name="identity", remove_extra_whitespaces=False,  # exact round trip
        # Already capped and balanced above; this only guards against a larger input.
        input_sentence_size=max_sentences_per_language * len(corpora),
        shuffle_input_sentence=True, max_sentence_length=16384,
        num_threads=num_threads or os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    reason = str(e).rstrip(".")
    hint = ("use a smaller vocab_size: this text has too few distinct pieces"
            if "too high" in reason else
            "use a larger vocab_size (>= 261 specials and bytes + the characters covered) or a "
            "lower character_coverage" if "smaller than required" in reason else "")
    raise ValueError(f"sentencepiece could not train a vocab_size={vocab_size} tokenizer on "
                     f"{len(sentences)} lines of {[c.path for c in corpora]}: {hint}. "
                     f"sentencepiece says: {reason}") from None
  fileio.write_bytes(path, model.getvalue())
  fileio.write_text(path[: -len(".model")] + ".json", json.dumps(settings, indent=1))
  return load_tokenizer(path)


def encode(sp: spm.SentencePieceProcessor, text: str) -> list[int]:
  """Text ids, no bos/eos (packing adds them)."""
  return sp.encode(text)


def encode_documents(sp: spm.SentencePieceProcessor, documents: Iterable[str],
                     batch_size: int = 1024) -> Iterator[list[int]]:
  """Streams the ids of each document, encoding batches on all cores."""
  documents = iter(documents)
  while batch := list(itertools.islice(documents, batch_size)):
    yield from sp.encode(batch, num_threads=os.cpu_count() or 1)


def decode(sp: spm.SentencePieceProcessor, ids: Iterable[int]) -> str:
  """Text of ids; pad/bos/eos decode to nothing."""
  return sp.decode([int(i) for i in ids])

