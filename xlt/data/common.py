"""What every synthetic problem set produces: word-level examples and a vocabulary.

An `Example` is a prompt (ending with the task's delimiter, e.g. `=` or `:`) and an
answer, both as tuples of string tokens (one token per whitespace-separated unit).
The loss is taken on the answer and the end-of-sequence token only.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

import numpy as np

PAD, EOS = "<pad>", "<eos>"
SPECIALS = (PAD, EOS)  # PAD must be id 0: padded positions are all-zero rows.


@dataclasses.dataclass(frozen=True)
class Example:
  prompt: tuple[str, ...]  # ends with the delimiter
  answer: tuple[str, ...]

  @property
  def text(self) -> str:
    return " ".join(self.prompt + self.answer)


class WordTokenizer:
  """Word-level tokenizer: every whitespace-separated unit is one token.

  The vocabulary is fixed at construction (specials first, then `symbols` in the
  given order), so ids never depend on which samples were drawn.
  """

  def __init__(self, symbols: Iterable[str]):
    seen = dict.fromkeys(SPECIALS)
    for s in symbols:
      if not s or any(c.isspace() for c in s):
        raise ValueError(f"invalid token {s!r}: tokens are non-empty and contain no spaces")
      seen.setdefault(s)
    self.itos: list[str] = list(seen)
    self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}

  @property
  def vocab_size(self) -> int:
    return len(self.itos)

  @property
  def pad_id(self) -> int:
    return self.stoi[PAD]

  @property
  def eos_id(self) -> int:
    return self.stoi[EOS]

  def encode(self, tokens: Sequence[str] | str) -> list[int]:
    if isinstance(tokens, str):
      tokens = tokens.split()
    try:
      return [self.stoi[t] for t in tokens]
    except KeyError as e:
      raise ValueError(f"token {e.args[0]!r} is not in the vocabulary") from None

  def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> list[str]:
    """Ids back to tokens; stops at the first EOS and drops padding."""
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id and stop_at_eos:
        break
      if i == self.pad_id:
        continue
      out.append(self.itos[i] if 0 <= i < len(self.itos) else f"<unk:{i}>")
    return out


@dataclasses.dataclass(frozen=True)
class Encoded:
  """A batch-ready encoding of examples.

  tokens: [N, T] int32; row = prompt + answer + EOS, right-padded with PAD (0).
  loss_mask: [N, T-1] float32; 1 where the *target* tokens[:, 1:] is part of the
    answer or the EOS, i.e. the loss is only taken after the delimiter.
  prompt_len: [N] int32, number of prompt tokens (delimiter included).
  """

  tokens: np.ndarray
  loss_mask: np.ndarray
  prompt_len: np.ndarray


def encode_examples(examples: Sequence[Example], tok: WordTokenizer, length: int) -> Encoded:
  """Encodes examples into fixed-length arrays; fails if one does not fit."""
  n = len(examples)
  tokens = np.zeros((n, length), np.int32)
  loss_mask = np.zeros((n, length - 1), np.float32)
  prompt_len = np.zeros((n,), np.int32)
  for i, ex in enumerate(examples):
    ids = tok.encode(ex.prompt) + tok.encode(ex.answer) + [tok.eos_id]
    if len(ids) > length:
      raise ValueError(
          f"example of {len(ids)} tokens does not fit the sequence length {length}: {ex.text!r}")
    p = len(ex.prompt)
    tokens[i, : len(ids)] = ids
    # target position j predicts tokens[j + 1]; answer tokens start at index p.
    loss_mask[i, p - 1 : len(ids) - 1] = 1.0
    prompt_len[i] = p
  return Encoded(tokens, loss_mask, prompt_len)


def max_length(examples: Iterable[Example]) -> int:
  """Tokens needed for the longest example, EOS included."""
  return max(len(e.prompt) + len(e.answer) + 1 for e in examples)


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """Held-out prompts of one language and how to score a generated answer.

  score(i, answer_tokens) -> {metric: value in [0, 1]}; `metric` names the headline one.
  """

  language: str
  prompts: tuple[tuple[str, ...], ...]
  score: Callable[[int, list[str]], dict[str, float]]
  metric: str
  max_new: int


@dataclasses.dataclass(frozen=True)
class Task:
  """What an experiment needs from a problem set, for a pair of languages.

  train: the training examples of each language (drawn once, so every condition and
    seed trains on the same samples); val/test: held-out sets per language.
  """

  tokenizer: WordTokenizer
  seq_len: int
  train: dict[str, list[Example]]
  val: dict[str, EvalSet]
  test: dict[str, EvalSet]
  info: dict
