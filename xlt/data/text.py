"""Real text for the Table 4 language-modelling rows: load, split, tokenize, pack, batch.

Table 4 of the language-mixing paper trains GPT models on TinyStories English (high-resource)
and its Czech translation (low-resource) and reports perplexity. Its rows: English only; Czech
only, limited (10% of the Czech corpus); Czech only, full; mixed (limited Czech + English).
This module is the data layer for those rows. Every step streams, because the full corpora are
~2 GB each:

  CorpusSpec --iter_documents--> documents (str), in file order
    --iter_split(docs, "train" | "limited" | "held_out", SplitSpec)--> one split's documents
    --encode_documents(sp, docs)--> token ids per document
    --pack_documents--> rows {"tokens", "segment_ids", "loss_mask"} of block_size + 1 tokens
    --packed_arrays (N rows in memory) | pack_split_to_npy (all rows, once, on disk)
    --grain_dataset--> shuffled, repeated (reshuffled per epoch), batched grain.MapDataset

For the full corpora: `train_or_load_tokenizer` once, then `pack_split_to_npy` per (corpus,
split) — one streaming tokenize+pack pass that writes an int32 [N, block_size + 1] .npy — then
`grain_dataset(open_packed_tokens(path), ...)` reads batches by random access from the memmap.
The arrays also fit `xlt.data.pipeline.member_batches` (tokens [N, T], loss_mask [N, T-1]).

Loading. `CorpusSpec(path, format, ...)` is plain fields, so an ml_collections config can hold
it (`CorpusSpec(**config.corpus)`). Formats: "text" (documents end at an end-of-text marker,
`separator="eot"`, the default because the TinyStories .txt releases use `<|endoftext|>`; or
at blank lines, `separator="blank_line"`), "jsonl" (one object per line, the document in
`field`, default "text"). A parallel jsonl ({"en": ..., "de": ...}) is read as "jsonl" with
`field` set to the language. `path` may be a glob (shards, read in sorted order) and may end in
.gz. Malformed lines (not UTF-8, not JSON, not an object, field missing or not a string) raise
`ValueError("{file}:{line}: ...")`; with `on_error="skip"` they are skipped and one warning
with the count and the first error is logged when the stream ends, and `count_documents(spec)`
returns the count as data. Empty documents are dropped silently (not errors).

Splits. Document i (its position in the stream) is held out iff
hash(seed, "held_out", i) < held_out_fraction, and is in the limited subset iff it is not held
out and hash(seed, "limited", i) < limited_fraction (blake2b, stable across runs and machines).
So held-out text is in no train subset, limited ⊂ train, the held-out set does not change with
limited_fraction, and a larger limited_fraction gives a superset. The split depends on the
index only, not the text or the language: for a translated pair in the same order (the
reference's English and Czech), a story and its translation fall in the same split, so the
mixed row never trains on the English of a held-out Czech story. The tokenizer is trained on
the train splits only. With the default SplitSpec the proxies below split 5,212 train (508 of
them limited) / 266 held out.

Tokenizer. One sentencepiece BPE model over both languages' train text, ids
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

Per-byte/per-character perplexity. `text_stats(docs, sp)` gives documents, UTF-8 bytes,
characters and text tokens; a packed split scores tokens + documents targets, and perplexity
per byte = exp(sum of target NLLs / bytes) (the eos targets' NLL is included, their "bytes"
are not), comparable across tokenizers; per character likewise. Use characters to compare
languages: Cyrillic takes 2 UTF-8 bytes a character, Czech ~1.1, English 1.

Proxy corpora on this machine (`proxy_corpora(shared_dir)`; neither reference corpus is here,
see ../shared/data/PROVENANCE.md):
  high-resource: en_tinystories/train_head_lowercased.jsonl — the first 5,478 documents of the
    real TinyStories train split (lowercased), 4,186,549 bytes, 4,175,959 characters. Chosen
    over the cased file (1,092 documents) for size; the lowercasing makes English somewhat
    easier than the cased low-resource side, and like the original data it contains mojibake
    (â€œ for opening quotes). Dataset licence CDLA-Sharing-1.0, file from an MIT
    repository.
  low-resource: ru_tinystories_nonparallel/tinystories_ru.jsonl — Russian TinyStories-style
    stories (14,753 documents, 19,854,253 bytes, 11,141,393 characters), by default only the
    first 5,478 (`match_sizes=True`: 7,363,427 bytes, 4,131,899 characters: the English side's
    documents and characters, as a translation would have). Why Russian: it is the
    same story domain and style with real story boundaries; it is a Slavic language like
    Czech (rich inflection, free word order: the same typological distance from English as the
    reference pair); it is large enough that 10% of its train split (508 stories at the matched
    size) is a meaningful limited set; and it is Apache-2.0. Not German: the story-aligned en/de file has only 1,000 stories
    (limited = ~90), the 10k German file is sentences with no story boundaries and includes those
    1,000 stories (it starts with the first one: held-out leakage), German is close to English, and the licence is
    non-commercial research only. Caveats: Russian is written natively, not translated (the
    reference Czech is translationese), and Cyrillic shares no letters with English, unlike
    Czech's Latin script, so the shared tokenizer shares fewer subwords across the two
    languages and transfer through shared tokens is likely understated.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import gzip
import hashlib
import io
import itertools
import json
import logging
import os
import struct
import tempfile
from typing import Iterable, Iterator, Mapping, Sequence

import grain
import numpy as np
import sentencepiece as spm

log = logging.getLogger(__name__)

FORMATS = ("text", "jsonl")
SEPARATORS = ("eot", "blank_line")
ON_ERROR = ("raise", "skip")
SPLITS = ("train", "limited", "held_out")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# A document this long means the separator is wrong for the file; fail before memory runs out.
MAX_DOCUMENT_CHARS = 10_000_000

# ------------------------------------------------------------------------------ loading


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Where a corpus is and how to read it; plain fields so a config can hold it."""

  path: str  # a file or a glob of shards (sorted); ".gz" files are decompressed
  format: str  # "text" | "jsonl" (parallel jsonl: "jsonl" with field=<language>)
  field: str = "text"  # jsonl: the field that holds the document
  separator: str = "eot"  # text: "eot" (documents end at eot_marker) | "blank_line"
  eot_marker: str = "<|endoftext|>"
  on_error: str = "raise"  # malformed lines: "raise" | "skip" (count logged, count_documents)
  max_documents: int = 0  # keep only the first N documents; 0 keeps all
  language: str = ""  # a tag for names and reports ("en", "cs")

  def __post_init__(self):
    for name, value, allowed in [("format", self.format, FORMATS),
                                 ("separator", self.separator, SEPARATORS),
                                 ("on_error", self.on_error, ON_ERROR)]:
      if value not in allowed:
        raise ValueError(f"CorpusSpec.{name}={value!r}; expected one of {allowed}")
    if self.format == "text" and self.separator == "eot" and not self.eot_marker:
      raise ValueError("CorpusSpec.eot_marker must be non-empty with separator='eot'")
    if self.max_documents < 0:
      raise ValueError(f"CorpusSpec.max_documents={self.max_documents} must be >= 0")


@dataclasses.dataclass(frozen=True)
class CorpusCount:
  documents: int
  skipped_lines: int  # malformed lines skipped (on_error="skip"; always 0 with "raise")


def corpus_files(spec: CorpusSpec) -> list[str]:
  """The files of a corpus; FileNotFoundError naming the path if there are none."""
  if any(c in spec.path for c in "*?["):
    paths = sorted(glob.glob(spec.path))
    if not paths:
      raise FileNotFoundError(f"no corpus files match {spec.path!r}")
    return paths
  if not os.path.isfile(spec.path):
    raise FileNotFoundError(f"corpus file not found: {spec.path}")
  return [spec.path]


def _decoded_lines(path: str) -> Iterator[tuple[int, str | None, str | None]]:
  """(line number from 1, line with its "\\n", None) or (line number, None, error)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    for lineno, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        yield lineno, None, f"invalid UTF-8 ({e.reason} at byte {e.start})"
        continue
      if line.endswith("\r\n"):
        line = line[:-2] + "\n"
      yield lineno, line, None


def _text_records(path: str, spec: CorpusSpec) -> Iterator[tuple[int, str | None, str | None]]:
  """(first line, document, None) per document of a text file, or (line, None, error)."""
  parts: list[str] = []
  n_chars, start = 0, 1
  for lineno, line, error in _decoded_lines(path):
    if error is not None:
      yield lineno, None, error
      continue
    # A document ends between consecutive pieces: a blank line is one boundary, and each
    # marker on a line is one.
    if spec.separator == "blank_line":
      pieces = ["", ""] if not line.strip() else [line]
    else:
      pieces = line.split(spec.eot_marker)
    for k, piece in enumerate(pieces):
      if k > 0:
        yield from _finished_document(start, parts)
        parts, n_chars = [], 0
      if piece.strip() or parts:  # whitespace between documents starts none
        start = lineno if not parts else start
        parts.append(piece)
        n_chars += len(piece)
    if n_chars > MAX_DOCUMENT_CHARS:
      raise ValueError(f"{path}:{start}: document longer than {MAX_DOCUMENT_CHARS:,} characters;"
                       f" is separator={spec.separator!r} right for this file?")
  yield from _finished_document(start, parts)


def _finished_document(start: int, parts: list[str]) -> list[tuple[int, str, None]]:
  doc = "".join(parts).strip()
  return [(start, doc, None)] if doc else []


def _jsonl_records(path: str, field: str) -> Iterator[tuple[int, str | None, str | None]]:
  """(line, document, None) per non-empty line of a jsonl file, or (line, None, error)."""
  for lineno, line, error in _decoded_lines(path):
    if error is None and not line.strip():
      continue  # blank lines (e.g. a trailing newline) are not records
    if error is None:
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        error = f"invalid JSON ({e.msg} at column {e.colno})"
      else:
        if not isinstance(record, dict):
          error = f"expected a JSON object, got {type(record).__name__}"
        elif field not in record:
          error = f"missing field {field!r} (fields: {sorted(record)[:10]})"
        elif not isinstance(record[field], str):
          error = f"field {field!r} is {type(record[field]).__name__}, not a string"
    if error is not None:
      yield lineno, None, error
    elif record[field]:
      yield lineno, record[field], None


def _records(spec: CorpusSpec, paths: Sequence[str]) -> Iterator[tuple[str | None, str | None]]:
  """(document, None) or, with on_error="skip", (None, "file:line: error"); stops at max."""
  n_documents = 0
  for path in paths:
    file_records = (_jsonl_records(path, spec.field) if spec.format == "jsonl"
                    else _text_records(path, spec))
    for lineno, doc, error in file_records:
      if error is not None:
        if spec.on_error == "raise":
          raise ValueError(f"{path}:{lineno}: {error}")
        yield None, f"{path}:{lineno}: {error}"
        continue
      yield doc, None
      n_documents += 1
      if n_documents == spec.max_documents:
        return


def iter_documents(spec: CorpusSpec) -> Iterator[str]:
  """Streams the documents of a corpus in file order. Missing files raise here, not later."""
  return _documents(spec, corpus_files(spec))


def _documents(spec: CorpusSpec, paths: Sequence[str]) -> Iterator[str]:
  skipped, first_error = 0, None
  try:
    for doc, error in _records(spec, paths):
      if error is None:
        yield doc
      else:
        skipped += 1
        first_error = first_error or error
  finally:  # also when the consumer stops early
    if skipped:
      log.warning("%s: skipped %d malformed lines (first: %s)", spec.path, skipped, first_error)


def count_documents(spec: CorpusSpec) -> CorpusCount:
  """Documents (after max_documents) and skipped malformed lines of a corpus; one pass."""
  documents = skipped = 0
  for doc, _ in _records(spec, corpus_files(spec)):
    documents += doc is not None
    skipped += doc is None
  return CorpusCount(documents, skipped)


def take_documents(documents: Iterable[str], n: int) -> list[str]:
  """The first n documents of a stream (fewer if it is shorter)."""
  return list(itertools.islice(documents, n))


# ------------------------------------------------------------------------------- splits


@dataclasses.dataclass(frozen=True)
class SplitSpec:
  """Which documents are held out and which train documents form the limited subset."""

  seed: int = 0
  held_out_fraction: float = 0.05
  limited_fraction: float = 0.1  # of the train documents (Table 4: 10%)

  def __post_init__(self):
    for name in ("held_out_fraction", "limited_fraction"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"SplitSpec.{name}={getattr(self, name)} must be in [0, 1]")


def _unit_hash(seed: int, salt: str, index: int) -> float:
  # blake2b, not hash(): Python salts str hashes per process.
  digest = hashlib.blake2b(f"{salt}:{seed}:{index}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


def is_held_out(index: int, split: SplitSpec) -> bool:
  return _unit_hash(split.seed, "held_out", index) < split.held_out_fraction


def in_split(index: int, name: str, split: SplitSpec) -> bool:
  """Whether document `index` of a corpus is in split `name` ("train" | "limited" | "held_out")."""
  if name == "held_out":
    return is_held_out(index, split)
  if name == "train":
    return not is_held_out(index, split)
  if name == "limited":
    return (not is_held_out(index, split)
            and _unit_hash(split.seed, "limited", index) < split.limited_fraction)
  raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")


def iter_split(documents: Iterable[str], name: str, split: SplitSpec) -> Iterator[str]:
  """The documents of one split, in stream order (index = position in `documents`)."""
  if name not in SPLITS:
    raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
  return (doc for i, doc in enumerate(documents) if in_split(i, name, split))


# ---------------------------------------------------------------------------- tokenizer

_TOKENIZER_VERSION = 1  # bump when the training recipe changes, to invalidate caches


def _hash_json(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _input_files(corpora: Sequence[CorpusSpec]) -> list[tuple[str, int]]:
  return [(os.path.abspath(p), os.path.getsize(p)) for c in corpora for p in corpus_files(c)]


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


def _write_atomic(path: str, data: bytes) -> None:
  """Writes to a temporary file in the same directory, then renames: never a partial file."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def load_tokenizer(path: str) -> spm.SentencePieceProcessor:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"tokenizer model not found: {path}")
  return spm.SentencePieceProcessor(model_file=path)


def train_or_load_tokenizer(workdir: str, corpora: Sequence[CorpusSpec], *, vocab_size: int,
                            split: SplitSpec = SplitSpec(),
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
                  inputs=_input_files(corpora),
                  max_sentences_per_language=max_sentences_per_language,
                  character_coverage=character_coverage)
  path = os.path.join(workdir, "tokenizer", f"spm_{_hash_json(settings)}.model")
  if os.path.isfile(path):
    return load_tokenizer(path)

  sentences = tokenizer_sentences(
      [iter_split(iter_documents(c), "train", split) for c in corpora],
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
  _write_atomic(path, model.getvalue())
  _write_atomic(path[: -len(".model")] + ".json", json.dumps(settings, indent=1).encode())
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


# ------------------------------------------------------------------------------ packing


def row_features(tokens: np.ndarray, bos_id: int = BOS_ID,
                 pad_id: int = PAD_ID) -> dict[str, np.ndarray]:
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
                   bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_id: int = PAD_ID,
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
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".npy.tmp")
  try:
    with os.fdopen(fd, "wb") as f:
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
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
  return n_rows


def open_packed_tokens(path: str) -> np.ndarray:
  """The int32 [N, block+1] token rows of a packed .npy, memory-mapped (read lazily)."""
  return np.load(path, mmap_mode="r")


def pack_split_to_npy(workdir: str, spec: CorpusSpec, split_name: str, split: SplitSpec,
                      sp: spm.SentencePieceProcessor, *, block_size: int) -> str:
  """Tokenizes and packs one split of a corpus once (streaming) into workdir/packed/; the path.

  Reused when the spec, split, input files' sizes, tokenizer and block size are unchanged.
  """
  key = _hash_json(dict(spec=dataclasses.asdict(spec), inputs=_input_files([spec]),
                        split_name=split_name, split=dataclasses.asdict(split),
                        block_size=block_size,
                        tokenizer=hashlib.sha256(sp.serialized_model_proto()).hexdigest()))
  name = spec.language or os.path.splitext(os.path.basename(spec.path))[0]
  path = os.path.join(workdir, "packed", f"{name}_{split_name}_{key}.npy")
  if not os.path.isfile(path):
    documents = iter_split(iter_documents(spec), split_name, split)
    rows = pack_documents(encode_documents(sp, documents), block_size=block_size,
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
                  drop_remainder: bool = True, bos_id: int = BOS_ID,
                  pad_id: int = PAD_ID) -> grain.MapDataset:
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


# -------------------------------------------------------------------------------- stats


@dataclasses.dataclass(frozen=True)
class TextStats:
  """Sizes of a set of documents, for perplexity per token / byte / character.

  tokens counts text tokens only; a packed stream scores tokens + documents targets (one eos
  per document). Perplexity per byte = exp(sum of target NLLs / bytes); per character likewise.
  """

  documents: int
  bytes: int  # UTF-8
  chars: int  # Unicode code points
  tokens: int | None  # None without a tokenizer


def text_stats(documents: Iterable[str], sp: spm.SentencePieceProcessor | None = None) -> TextStats:
  """Streams over documents once, counting documents, UTF-8 bytes, characters and tokens."""
  n_docs = n_bytes = n_chars = n_tokens = 0
  documents = iter(documents)
  while batch := list(itertools.islice(documents, 1024)):
    n_docs += len(batch)
    n_bytes += sum(len(d.encode("utf-8")) for d in batch)
    n_chars += sum(len(d) for d in batch)
    if sp is not None:
      n_tokens += sum(len(ids) for ids in sp.encode(batch, num_threads=os.cpu_count() or 1))
  return TextStats(n_docs, n_bytes, n_chars, n_tokens if sp is not None else None)


# -------------------------------------------------------------------------------- proxy

_PROXY_FILES = {
    "high_resource": ("en", "en_tinystories/train_head_lowercased.jsonl"),
    "low_resource": ("ru", "ru_tinystories_nonparallel/tinystories_ru.jsonl"),
}
_PROXY_HIGH_RESOURCE_DOCUMENTS = 5478  # documents in the English file


def proxy_corpora(shared_dir: str = "../shared", *,
                  match_sizes: bool = True) -> dict[str, CorpusSpec]:
  """{"high_resource": English, "low_resource": Russian} specs for ../shared/data (module doc).

  match_sizes: keep only as many Russian stories as there are English ones (about the same
  characters), as the reference's translated corpus matches English.
  """
  data_dir = os.path.join(shared_dir, "data")
  if not os.path.isdir(data_dir):
    data_dir = shared_dir  # shared_dir may already be shared/data
  specs = {}
  for role, (language, relpath) in _PROXY_FILES.items():
    path = os.path.join(data_dir, relpath)
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f"proxy corpus {path} not found: the proxies live in ../shared/data (see its "
          f"PROVENANCE.md); elsewhere, pass CorpusSpecs of your own corpora")
    cap = _PROXY_HIGH_RESOURCE_DOCUMENTS if match_sizes and role == "low_resource" else 0
    specs[role] = CorpusSpec(path=path, format="jsonl", field="text", max_documents=cap,
                             language=language)
  return specs
