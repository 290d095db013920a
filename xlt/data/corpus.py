"""Corpora of real text for the Table 4 language-modelling rows: reading documents from
plain-text or jsonl files, the train / limited / held-out split of a corpus, the sizes of a set
of documents (for perplexity per byte or character), and the proxy corpora of this machine.

Table 4 of the language-mixing paper trains GPT models on TinyStories English (high-resource)
and its Czech translation (low-resource) and reports perplexity. Its rows: English only; Czech
only, limited (10% of the Czech corpus); Czech only, full; mixed (limited Czech + English).
The full corpora are ~2 GB each, so documents stream and are never all in memory. The way from
here to training batches (tokenizer `xlt.data.spm_tokenizer`, rows `xlt.data.packing`) is drawn in
`xlt.data.packing`'s docstring.

Loading. `CorpusSpec(path, format, ...)` is plain fields, so an ml_collections config can hold
it (`CorpusSpec(**config.corpus)`). Formats: "text" (documents end at an end-of-text marker,
`separator="eot"`, the default because the TinyStories .txt releases use `<|endoftext|>`; or
at blank lines, `separator="blank_line"`; or, for a file of one sentence a line with no story
boundaries, runs of `lines_per_document` lines after `skip_lines`, `separator="line"`), "jsonl"
(one object per line, the document in `field`, default "text"). A parallel jsonl
({"en": ..., "de": ...}) is read as "jsonl" with `field` set to the language. `path` may be a
glob (shards, read in sorted order) and may end in .gz. Malformed lines (not UTF-8, not JSON, not
an object, field missing or not a string) raise `ValueError("{file}:{line}: ...")`; with
`on_error="skip"` they are skipped and one warning with the count and the first error is logged
when the stream ends, and `count_documents(spec)` returns the count as data. Empty documents are
dropped silently (not errors).

Splits. Document i (its position in the stream) is held out iff
hash(seed, "held_out", i) < held_out_fraction, and is in the limited subset iff it is not held
out and hash(seed, "limited", i) < limited_fraction (blake2b, stable across runs and machines).
So held-out text is in no train subset, limited ⊂ train, the held-out set does not change with
limited_fraction, and a larger limited_fraction gives a superset. The split depends on the
index only, not the text or the language: for a translated pair in the same order (the
reference's English and Czech), a story and its translation fall in the same split, so the
mixed row never trains on the English of a held-out Czech story (two fields of one parallel
jsonl file are such a pair; `check_parallel` verifies that no line is dropped on one side
only, which would shift the indices). The tokenizer is trained on
the train splits only. With the default SplitSpec the proxies below split 5,212 train (508 of
them limited) / 266 held out.

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
    size) is a meaningful limited set; and it is Apache-2.0. Not German: the story-aligned
    en/de file has only 1,000 stories (limited = ~90), the 10k German file is sentences with no
    story boundaries and includes those 1,000 stories (it starts with the first one: held-out
    leakage), German is close to English, and the licence is non-commercial research only. Caveats: Russian is written natively, not translated (the
    reference Czech is translationese), and Cyrillic shares no letters with English, unlike
    Czech's Latin script, so the shared tokenizer shares fewer subwords across the two
    languages and transfer through shared tokens is likely understated.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import itertools
import json
import logging
import os
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

if TYPE_CHECKING:  # only for annotations: reading a corpus needs no tokenizer
  import sentencepiece as spm

log = logging.getLogger(__name__)

FORMATS = ("text", "jsonl")
SEPARATORS = ("eot", "blank_line", "line")
ON_ERROR = ("raise", "skip")
SPLITS = ("train", "limited", "held_out", "all")
# A document this long means the separator is wrong for the file; fail before memory runs out.
MAX_DOCUMENT_CHARS = 10_000_000

# ------------------------------------------------------------------------------ loading


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Where a corpus is and how to read it; plain fields so a config can hold it."""

  path: str  # a file or a glob of shards (sorted); ".gz" files are decompressed
  format: str  # "text" | "jsonl" (parallel jsonl: "jsonl" with field=<language>)
  field: str = "text"  # jsonl: the field that holds the document
  separator: str = "eot"  # text: "eot" (documents end at eot_marker) | "blank_line" | "line"
  eot_marker: str = "<|endoftext|>"
  on_error: str = "raise"  # malformed lines: "raise" | "skip" (count logged, count_documents)
  max_documents: int = 0  # keep only the first N documents; 0 keeps all
  language: str = ""  # a tag for names and reports ("en", "cs")
  # separator="line" (one sentence a line, no story boundaries): a document is each run of
  # lines_per_document non-empty lines, joined by a space, after the first skip_lines of them
  lines_per_document: int = 1
  skip_lines: int = 0

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
    if self.lines_per_document < 1 or self.skip_lines < 0:
      raise ValueError(f"CorpusSpec.lines_per_document={self.lines_per_document} must be >= 1 and "
                       f"skip_lines={self.skip_lines} >= 0")
    if (self.lines_per_document != 1 or self.skip_lines) and self.separator != "line":
      raise ValueError("CorpusSpec.lines_per_document and skip_lines need separator='line'")


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


def _line_group_records(path: str, spec: CorpusSpec) -> Iterator[tuple[int, str | None, str | None]]:
  """(first line, document, None) per run of spec.lines_per_document non-empty lines (the last
  run may be shorter), after the first spec.skip_lines non-empty lines; or (line, None, error)."""
  group, start, seen = [], 1, 0
  for lineno, line, error in _decoded_lines(path):
    if error is not None:
      yield lineno, None, error
      continue
    if not line.strip():
      continue
    seen += 1
    if seen <= spec.skip_lines:
      continue
    start = lineno if not group else start
    group.append(line.strip())
    if len(group) == spec.lines_per_document:
      yield start, " ".join(group), None
      group = []
  if group:
    yield start, " ".join(group), None


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


def _records(spec: CorpusSpec, paths: Sequence[str]
             ) -> Iterator[tuple[str, int, str | None, str | None]]:
  """(file, line, document, None) or, with on_error="skip", (file, line, None, "file:line:
  error"); stops at max_documents."""
  n_documents = 0
  for path in paths:
    file_records = (_jsonl_records(path, spec.field) if spec.format == "jsonl"
                    else _line_group_records(path, spec) if spec.separator == "line"
                    else _text_records(path, spec))
    for lineno, doc, error in file_records:
      if error is not None:
        if spec.on_error == "raise":
          raise ValueError(f"{path}:{lineno}: {error}")
        yield path, lineno, None, f"{path}:{lineno}: {error}"
        continue
      yield path, lineno, doc, None
      n_documents += 1
      if n_documents == spec.max_documents:
        return


def iter_documents(spec: CorpusSpec) -> Iterator[str]:
  """Streams the documents of a corpus in file order. Missing files raise here, not later."""
  return _documents(spec, corpus_files(spec))


def _documents(spec: CorpusSpec, paths: Sequence[str]) -> Iterator[str]:
  skipped, first_error = 0, None
  try:
    for _, _, doc, error in _records(spec, paths):
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
  for _, _, doc, _ in _records(spec, corpus_files(spec)):
    documents += doc is not None
    skipped += doc is None
  return CorpusCount(documents, skipped)


def take_documents(documents: Iterable[str], n: int) -> list[str]:
  """The first n documents of a stream (fewer if it is shorter)."""
  return list(itertools.islice(documents, n))


def document_lines(spec: CorpusSpec) -> Iterator[tuple[str, int]]:
  """(file, line) where each document of a corpus starts, in stream order (document i's split
  index is i)."""
  return ((path, lineno) for path, lineno, doc, _ in _records(spec, corpus_files(spec))
          if doc is not None)


def check_parallel(a: CorpusSpec, b: CorpusSpec) -> None:
  """ValueError unless document i of `a` and of `b` start on the same line, for every i both
  have (a shorter max_documents compares a prefix).

  For two fields of one parallel jsonl file (one story per line) the split then puts a story
  and its translation in the same split. Without this a line whose field is empty on one side
  only (dropped silently) or malformed on one side (on_error="skip") would shift every later
  index of that side by one: the held-out stories of one language would sit, in translation,
  in the other's training set, and nothing else would notice.
  """
  for i, (where_a, where_b) in enumerate(zip(document_lines(a), document_lines(b))):
    if where_a != where_b:
      raise ValueError(
          f"parallel corpora misaligned at document {i}: field {a.field!r} starts at "
          f"{where_a[0]}:{where_a[1]}, field {b.field!r} at {where_b[0]}:{where_b[1]} (a record "
          f"empty or malformed on one side only); the split is by document index, so each line "
          f"must hold a non-empty document in both fields")


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
  """Whether document `index` of a corpus is in split `name` ("train" | "limited" | "held_out",
  or "all": a corpus that only adds training text, such as more high-resource stories)."""
  if name == "all":
    return True
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



# -------------------------------------------------------------------------- cache keys
# Files derived from corpora (a tokenizer, packed rows) are cached under a key of the settings
# and the input files, so a changed corpus or setting is never served a stale file.


def cache_key(value) -> str:
  """A short, stable hash of a JSON-able value (dict keys sorted)."""
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def input_files(corpora: Sequence[CorpusSpec]) -> list[tuple[str, int]]:
  """(absolute path, size in bytes) of every file of the corpora."""
  return [(os.path.abspath(p), os.path.getsize(p)) for c in corpora for p in corpus_files(c)]


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
