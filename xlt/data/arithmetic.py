"""Arithmetic operations in two "languages": the problem sets of the merge testbed
(configs/merge.py).

Numerals in prompts are shared by both languages (as Arabic numerals are by many natural
languages) and so are operator words; a language has its own *delimiter* (its word for "is")
and writes its *answers* in its own script (its number words), the digit scripts of
xlt.data.addition:

  standard   `3 2 7 + 1 0 4 =`  -> 1 3 4     answers in 0-9
  letter     `3 2 7 + 1 0 4 →`  -> B D E     answers in A-J (0 -> A ... 9 -> J)

Operations: `add` (the testbed's task), `max`, `min`, `double`, `succ` and `copy` (in the
letter language `copy` translates a numeral into letters). As in the addition task, answers
are written least significant digit first and the loss is taken on the answer only. A data
*mixture* is a list of (operation, language, count) parts.

Held-out problems: for each operation one set of test and one of validation problems is drawn
(shared by the languages: the letter test set asks the standard test set's questions), and no
training part of any language ever contains a held-out problem of its operation, as an
unordered pair. Training problems of a part are drawn from a stream seeded by (seed, operation,
language), so a part with n problems is a prefix of the same part with more.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from xlt.data import addition
from xlt.data.common import EvalSet, Example

LANGUAGES = ("standard", "letter")
BINARY = {"add": "+", "add_digit": "+", "add_one": "+", "max": "max", "min": "min"}
UNARY = {"succ": "succ", "double": "double", "copy": "copy"}
OPERATIONS = tuple(BINARY) + tuple(UNARY)
TAGS = {"standard": "[std]", "letter": "[let]"}
DELIM = addition.DELIM


def _check(op: str, language: str):
  if op not in OPERATIONS:
    raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPERATIONS)}")
  if language not in LANGUAGES:
    raise ValueError(f"unknown arithmetic language {language!r}; known: {', '.join(LANGUAGES)}")


def value(op: str, a: int, b: int | None) -> int:
  return {"add": lambda: a + b, "add_digit": lambda: a + b, "add_one": lambda: a + b, "max": lambda: max(a, b), "min": lambda: min(a, b),
          "succ": lambda: a + 1, "double": lambda: 2 * a, "copy": lambda: a}[op]()


def make_example(op: str, a: int, b: int | None, language: str) -> Example:
  _check(op, language)
  num = lambda v: addition.encode_number(v, "standard")
  if op in BINARY:
    prompt = (TAGS[language],) + num(a) + (BINARY[op],) + num(b) + (DELIM,)
  else:
    prompt = (TAGS[language],) + num(a) + (UNARY[op], DELIM)
  return Example(prompt, addition.encode_number(value(op, a, b), language)[::-1])


def symbols() -> list[str]:
  """Every token of both languages and all operations (fixed: ids never depend on samples)."""
  digits = [str(d) for d in range(10)] + [addition.encode_number(d, "letter")[0] for d in range(10)]
  return list(dict.fromkeys(digits + list(BINARY.values()) + list(UNARY.values()) + [DELIM]
                            + list(TAGS.values())))


def max_length(max_digits: int) -> int:
  """Tokens (EOS included) of the longest example: a binary prompt and a sum one digit longer."""
  return 1 + 2 * max_digits + 2 + (max_digits + 1) + 1


def score(op: str, a: int, b: int | None, answer: Sequence[str], language: str) -> dict:
  """`exact_match`: the right value in the language's script. `any_script`: the right value in
  either script: an answer in the wrong script shows that the operation transferred while the
  language did not."""
  want = value(op, a, b)
  exact = tuple(answer) == addition.encode_number(want, language)[::-1]
  other = False
  for lang in LANGUAGES:
    try:
      other = other or addition.decode_number(tuple(answer)[::-1], lang) == want
    except ValueError:
      pass
  return {"exact_match": float(exact), "any_script": float(exact or other)}


def score_text(set_name: str, prompt: str, continuation: str) -> dict:
  """`score` of a test prompt written as text (xlt.experiments.pretrain_hf's prompt files: set
  "op/language", prompt "[std] 327 + 4 =", the operands' digits run together) and a model's
  continuation (the answer's symbols, run together or spaced)."""
  op, _, language = str(set_name).partition("/")
  _check(op, language)
  operands = [int(w) for w in prompt.split() if w.isdigit()]
  if len(operands) != (2 if op in BINARY else 1):
    raise ValueError(f"prompt {prompt!r} is not a {op} problem of set {set_name!r}")
  return score(op, operands[0], operands[1] if op in BINARY else None, tuple("".join(continuation.split())), language)


def _problems(op: str, n: int, seed, ac, exclude=frozenset()) -> list[tuple[int, int | None]]:
  if op == "add_digit":
    # a + d for one digit d >= 2 (d = 1 is succ) whose units carry: an answer no other
    # operation's output can match by chance (without a carry, "a with its last digit
    # replaced by d" would be right whenever a ends in 0)
    lo, hi = 10 ** (ac.min_digits - 1), 10 ** ac.max_digits - 1
    pool = [(a, d) for a in range(lo, hi + 1) for d in range(2, 10)
            if a % 10 + d >= 10 and (a, d) not in exclude]
    if n > len(pool):
      raise ValueError(f"{op}: asked for {n} problems but only {len(pool)} exist (after held-out ones)")
    return [pool[i] for i in np.random.default_rng(seed).permutation(len(pool))[:n]]
  if op in BINARY and op != "add_one":
    return addition.sample_problems(n, seed=seed, min_digits=ac.min_digits, max_digits=ac.max_digits,
                                    exclude=exclude)
  # one operand (add_one's second operand is always 1): one problem per number
  lo, hi = 10 ** (ac.min_digits - 1), 10 ** ac.max_digits - 1
  pool = np.setdiff1d(np.arange(lo, hi + 1), [a for pair in exclude for a in pair if a is not None])
  if n > len(pool):
    raise ValueError(f"{op}: asked for {n} problems but only {len(pool)} operands exist with "
                     f"{ac.min_digits}-{ac.max_digits} digits (after held-out ones)")
  second = 1 if op == "add_one" else None
  return [(int(a), second) for a in np.random.default_rng(seed).permutation(pool)[:n]]


def num_test(op: str, ac) -> int:
  """Test problems of `op`: `ac.num_test_by_op[op]` where given, else `ac.num_test` (an
  operation whose pool is large, like the testbed's task, can afford a larger test set than a
  one-operand operation over 900 numbers)."""
  by_op = ac.get("num_test_by_op") or {}
  if unknown := set(by_op) - set(OPERATIONS):
    raise ValueError(f"arithmetic.num_test_by_op names unknown operations {sorted(unknown)}")
  return int(by_op.get(op, ac.num_test))


def held_out(op: str, ac) -> tuple[list, list]:
  """(test, validation) problems of an operation, shared by every language."""
  n = num_test(op, ac)
  probs = _problems(op, n + ac.num_val, np.random.SeedSequence([ac.seed, OPERATIONS.index(op), 1]), ac)
  return probs[:n], probs[n:]


def train_problems(op: str, language: str, n: int, ac) -> list[tuple[int, int | None]]:
  _check(op, language)
  test, val = held_out(op, ac)
  exclude = frozenset(p for a, b in test + val for p in ((a, b), (b, a)))
  seq = np.random.SeedSequence([ac.seed, OPERATIONS.index(op), LANGUAGES.index(language) + 2])
  return _problems(op, n, seq, ac, exclude)


def mixture(parts: Sequence[Sequence], ac) -> list[Example]:
  """Training examples of a mixture [(operation, language, count), ...], parts in order."""
  out = []
  for op, language, n in parts:
    if int(n) < 0:
      raise ValueError(f"mixture part ({op}, {language}) has a negative count {n}")
    out += [make_example(op, a, b, language) for a, b in train_problems(op, language, int(n), ac)]
  if not out:
    raise ValueError(f"the mixture {list(parts)} has no examples")
  return out


def eval_set(op: str, language: str, problems, *, max_digits: int) -> EvalSet:
  examples = [make_example(op, a, b, language) for a, b in problems]
  return EvalSet(f"{op}/{language}", tuple(ex.prompt for ex in examples),
                 lambda i, answer: score(op, *problems[i], answer, language), "exact_match",
                 max_digits + 2)


def eval_sets(sets: Sequence[str], ac) -> tuple[dict[str, EvalSet], dict[str, EvalSet]]:
  """(validation, test) sets by name "operation/language" (e.g. "add/letter")."""
  val, test = {}, {}
  for name in sets:
    op, _, language = name.partition("/")
    _check(op, language)
    t, v = held_out(op, ac)
    test[name] = eval_set(op, language, t, max_digits=ac.max_digits)
    val[name] = eval_set(op, language, v, max_digits=ac.max_digits)
  return val, test
