"""Arithmetic operations in several "languages": the problem sets of the merge testbed
(configs/merge.py) and of its structure designs (configs/structure_pilots.py).

In the testbed's first two languages numerals in prompts are shared (as Arabic numerals are by
many natural languages) and so are operator words; a language has its own tag and writes its
*answers* in its own script (its number words), the digit scripts of xlt.data.addition:

  standard   `[std] 3 2 7 + 1 0 4 =`  -> 1 3 4     answers in 0-9
  letter     `[let] 3 2 7 + 1 0 4 =`  -> B D E     answers in A-J (0 -> A ... 9 -> J)

The other languages (`LANGUAGE_SPECS`) write their operands *and* answers in their own glyphs,
so that their inputs differ too, as a multilingual model's languages do:

  deva, arab, thai  Devanagari, Arabic-Indic and Thai digits in and out; operators, `=` and the
                    positions shared with every language (the anchors a shared middle can use)
  clone             every token its own copy (digits, operators, `=`: `0ʹ`, `+ʹ`, `=ʹ`)
  clone_rev         clone's tokens, operands written least significant digit first: a word
                    order that must be undone early, before any shared computation

Operations: `add` and `add_digit` (the testbed's tasks), `max`, `min`, `double`, `succ`,
`add_one` and `copy` (in the letter language `copy` translates a numeral into letters), and the
translations `to_<language>`: `[std] 3 2 7 to [tha] =` -> the same number in thai's script (the
parallel data that ties a base's languages together). As in the addition task, answers are
written least significant digit first and the loss is taken on the answer only. A data
*mixture* is a list of (operation, language, count) parts.

Held-out problems: for each operation one set of test and one of validation problems is drawn
(shared by the languages: the letter test set asks the standard test set's questions), and no
training part of any language ever contains a held-out problem of its operation, as an
unordered pair. Training problems of a part are drawn from a stream seeded by (seed, operation,
language), so a part with n problems is a prefix of the same part with more.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from xlt.data import addition
from xlt.data.common import EvalSet, Example


@dataclasses.dataclass(frozen=True)
class Language:
  """How a language writes a problem: its tag, the digits of its operands and of its answers
  (None: the shared digits 0-9), a suffix on its operator and delimiter tokens ("": shared with
  every language), and whether its operands are written least significant digit first."""

  tag: str
  operand_digits: tuple[str, ...] | None = None
  answer_digits: tuple[str, ...] | None = None
  suffix: str = ""
  operands_lsd_first: bool = False


_SHARED = tuple("0123456789")
_CLONE = tuple(f"{d}ʹ" for d in range(10))
# the order fixes every token's id and every stream's seed: new languages go at the end
LANGUAGE_SPECS = {
    "standard": Language("[std]"),
    "letter": Language("[let]", answer_digits=tuple("ABCDEFGHIJ")),
    "deva": Language("[dev]", tuple("०१२३४५६७८९"), tuple("०१२३४५६७८९")),
    "arab": Language("[ara]", tuple("٠١٢٣٤٥٦٧٨٩"), tuple("٠١٢٣٤٥٦٧٨٩")),
    "thai": Language("[tha]", tuple("๐๑๒๓๔๕๖๗๘๙"), tuple("๐๑๒๓๔๕๖๗๘๙")),
    "clone": Language("[clo]", _CLONE, _CLONE, suffix="ʹ"),
    "clone_rev": Language("[clr]", _CLONE, _CLONE, suffix="ʹ", operands_lsd_first=True),
}
LANGUAGES = tuple(LANGUAGE_SPECS)
BINARY = {"add": "+", "add_digit": "+", "add_one": "+", "max": "max", "min": "min"}
UNARY = {"succ": "succ", "double": "double", "copy": "copy"}
TRANSLATE = {f"to_{l}": l for l in LANGUAGES}  # operation -> the language of its answer
OPERATIONS = tuple(BINARY) + tuple(UNARY) + tuple(TRANSLATE)
TAGS = {name: spec.tag for name, spec in LANGUAGE_SPECS.items()}
DELIM = addition.DELIM
TO = "to"


def _check(op: str, language: str):
  if op not in OPERATIONS:
    raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPERATIONS)}")
  if language not in LANGUAGES:
    raise ValueError(f"unknown arithmetic language {language!r}; known: {', '.join(LANGUAGES)}")


def value(op: str, a: int, b: int | None) -> int:
  if op in TRANSLATE:
    return a
  return {"add": lambda: a + b, "add_digit": lambda: a + b, "add_one": lambda: a + b, "max": lambda: max(a, b), "min": lambda: min(a, b),
          "succ": lambda: a + 1, "double": lambda: 2 * a, "copy": lambda: a}[op]()


def answer_language(op: str, language: str) -> str:
  """The language whose script an answer is written in: a translation's target, else the prompt's."""
  return TRANSLATE.get(op, language)


def _digits(v: int, digits: tuple[str, ...] | None) -> tuple[str, ...]:
  return tuple((digits or _SHARED)[ord(ch) - 48] for ch in str(int(v)))


def operand(v: int, language: str) -> tuple[str, ...]:
  spec = LANGUAGE_SPECS[language]
  out = _digits(v, spec.operand_digits)
  return out[::-1] if spec.operands_lsd_first else out


def answer_tokens(v: int, language: str) -> tuple[str, ...]:
  """An answer's tokens in `language`'s script, least significant digit first."""
  return _digits(v, LANGUAGE_SPECS[language].answer_digits)[::-1]


def answer_script(language: str) -> tuple[str, ...]:
  """The ten digit tokens `language` writes its answers in (0 first)."""
  return LANGUAGE_SPECS[language].answer_digits or _SHARED


def decode_answer(tokens: Sequence[str], language: str) -> int:
  """The value an answer (least significant digit first) writes in `language`'s script; a
  ValueError unless it is exactly that script's spelling of a number (no leading zeros)."""
  digits = answer_script(language)
  msd = list(tokens)[::-1]
  if not msd or any(t not in digits for t in msd) or (len(msd) > 1 and msd[0] == digits[0]):
    raise ValueError(f"{tokens!r} is not a number in {language}'s script")
  return int("".join(str(digits.index(t)) for t in msd))


def make_example(op: str, a: int, b: int | None, language: str) -> Example:
  _check(op, language)
  spec = LANGUAGE_SPECS[language]
  word = lambda t: t + spec.suffix
  if op in TRANSLATE:
    prompt = (spec.tag,) + operand(a, language) + (word(TO), TAGS[TRANSLATE[op]], word(DELIM))
  elif op in BINARY:
    prompt = (spec.tag,) + operand(a, language) + (word(BINARY[op]),) + operand(b, language) + (word(DELIM),)
  else:
    prompt = (spec.tag,) + operand(a, language) + (word(UNARY[op]), word(DELIM))
  return Example(prompt, answer_tokens(value(op, a, b), answer_language(op, language)))


def symbols(languages: Sequence[str] = (), ops: Sequence[str] = ()) -> list[str]:
  """Every token of the testbed's first two languages and all their operations, then those of
  `languages` and `ops` beyond them, in LANGUAGES order (fixed: ids never depend on samples,
  and a config of the first two languages has the vocabulary it always had)."""
  digits = list(_SHARED) + list(LANGUAGE_SPECS["letter"].answer_digits)
  words = list(BINARY.values()) + list(UNARY.values())
  out = digits + words + [DELIM] + [TAGS["standard"], TAGS["letter"]]
  extra = [l for l in LANGUAGES[2:] if l in set(languages) | {TRANSLATE[o] for o in ops if o in TRANSLATE}]
  for l in extra:
    spec = LANGUAGE_SPECS[l]
    out += [spec.tag, *(spec.operand_digits or ()), *(spec.answer_digits or ())]
    out += [w + spec.suffix for w in words + [DELIM, TO]] if spec.suffix else []
  if extra or any(o in TRANSLATE for o in ops):
    out.append(TO)
  return list(dict.fromkeys(out))


def max_length(max_digits: int) -> int:
  """Tokens (EOS included) of the longest example: a binary prompt and a sum one digit longer."""
  return 1 + 2 * max_digits + 2 + (max_digits + 1) + 1


def score(op: str, a: int, b: int | None, answer: Sequence[str], language: str) -> dict:
  """`exact_match`: the right value in the language's script (a translation's: its target's).
  `any_script`: the right value in any language's script: an answer in the wrong script shows
  that the operation transferred while the language did not."""
  want = value(op, a, b)
  exact = tuple(answer) == answer_tokens(want, answer_language(op, language))
  other = False
  for lang in LANGUAGES:
    try:
      other = other or decode_answer(tuple(answer), lang) == want
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
