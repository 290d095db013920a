"""Addition problems written in four "languages" over a shared problem distribution.

Every sample is `<a> <op> <b> = <a+b reversed>`, one token per symbol; the answer is
written least-significant symbol first (the order in which addition produces it),
and the loss is taken on the answer only (see `common.encode_examples`).

  standard  `3 2 + 1 0 = 2 4`          decimal digits 0-9
  letter    `! D C , B A = C E`        decimal, digits 0->A ... 9->J, `!` prefix, `,`
  hex       `1 a + b = 5 2`            base 16, digits 0-9 and *lowercase* a-f
  roman     `Ⅹ Ⅹ Ⅰ + Ⅰ Ⅴ = Ⅴ Ⅹ Ⅹ`    Roman numerals (21 + 4 = 25), see below

Token sharing between languages is deliberate and limited to: `=` (all four), `+`
(standard, hex, roman) and the digits `0-9` (standard and hex: the same symbols
under a different algorithm). Every other token belongs to one language only, so a
`WordTokenizer` over the union of all `symbols(...)` never conflates two meanings:
  * hex uses lowercase `a-f` because the letter language owns uppercase `A-J`;
  * Roman numerals use the Unicode Roman-numeral glyphs `Ⅰ Ⅴ Ⅹ Ⅼ Ⅽ Ⅾ Ⅿ`
    (U+2160, U+2164, U+2169, U+216C-U+216F), not ASCII letters, because ASCII
    `C D I` are letter-language digits and lowercase `c d` are hex digits. The
    glyphs look like I V X L C D M; `ROMAN_TOKENS` is the single place to change it.

Roman notation for values >= 4000 (standard Roman stops at 3999). Values are >= 1.
  * v < 4000: standard subtractive Roman, e.g. 3999 = MMMCMXCIX.
  * v >= 4000: v = q*1000 + r (0 <= r < 1000) is written as q (recursively, same
    rules) followed by the thousands marker `|` and then r in standard Roman
    (empty when r == 0). So 4000 = `IV|`, 21034 = `XXI|XXXIV`,
    123456789 = `CXXIII|CDLVI|DCCLXXXIX`: groups read like digit groups, each `|`
    multiplies what precedes it by 1000.
  * Every value has exactly one spelling (the one above); `decode_number` accepts a
    numeral iff it is that spelling, so `IIII`, `VX`, `IC`, `MMMM`, `II|` (2000 is
    `MM`) and `IV|M` are all rejected.

Token length of an *example* (prompt + answer, EOS excluded; add 1 for EOS) when both
operands have at most `max_digits` digits (hex: hex digits). Positional languages need
3*d + 3 tokens (letter: 3*d + 4). A Roman numeral costs up to 4 tokens per decimal
digit (8 = VIII) plus one per `|`; the exact Roman maxima (digit DP over carries,
checked by brute force up to 4 digits) are reached by 88...8 + 88...8:

  max_digits   3   4   5   6   7   8   9
  standard    12  15  18  21  24  27  30
  letter      13  16  19  22  25  28  31
  hex         12  15  18  21  24  27  30
  roman       35  49  60  71  85  96 107

`max_example_length` returns these + 1 (EOS included, like `common.max_length`).
With the reference block size of 64 (EOS included) the positional languages fit for
every max_digits <= 9, but Roman only with max_digits <= 5 (60 + EOS = 61). Roman
with 9-digit operands needs a block of at least 108 (use 128).

Sampling: the same seed gives the same (a, b) problems in standard, letter and roman
(all base 10), so the languages are parallel corpora of one problem distribution;
use different seeds to get different problems per language.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from xlt.data.common import Example

LANGUAGES = ("standard", "letter", "roman", "hex")
DELIM = "="

# Roman symbol -> token. Internally Roman numerals are ASCII strings ("XXI|IV").
ROMAN_TOKENS = {"I": "Ⅰ", "V": "Ⅴ", "X": "Ⅹ", "L": "Ⅼ", "C": "Ⅽ", "D": "Ⅾ", "M": "Ⅿ", "|": "|"}
_ROMAN_FROM_TOKEN = {t: s for s, t in ROMAN_TOKENS.items()}
_ROMAN_VALUE = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
# Standard Roman, one table per decimal digit position (units, tens, hundreds, thousands).
_ROMAN_PLACES = (
    ("", "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX"),
    ("", "X", "XX", "XXX", "XL", "L", "LX", "LXX", "LXXX", "XC"),
    ("", "C", "CC", "CCC", "CD", "D", "DC", "DCC", "DCCC", "CM"),
    ("", "M", "MM", "MMM"),
)

# Positional languages: digit tokens, index = digit value.
_DIGITS = {
    "standard": tuple("0123456789"),
    "letter": tuple("ABCDEFGHIJ"),
    "hex": tuple("0123456789abcdef"),
}
_DIGIT_VALUE = {lang: {t: i for i, t in enumerate(ds)} for lang, ds in _DIGITS.items()}
# (tokens before the first operand, operator between the operands)
_SYNTAX = {"standard": ((), "+"), "letter": (("!",), ","), "hex": ((), "+"), "roman": ((), "+")}
_BASE = {"standard": 10, "letter": 10, "hex": 16, "roman": 10}

# Exact max Roman example tokens (EOS excluded) by max_digits; see the module docstring.
_ROMAN_MAX_TOKENS = {1: 13, 2: 24, 3: 35, 4: 49, 5: 60, 6: 71, 7: 85, 8: 96, 9: 107}

_CHUNK = 4096  # pairs drawn per RNG call; fixed so n=k draws are a prefix of n=k+1 draws


def _check_language(language: str) -> None:
  if language not in LANGUAGES:
    raise ValueError(f"unknown language {language!r}; expected one of {LANGUAGES}")


def base_of(language: str) -> int:
  """The base in which operand lengths are counted (16 for hex, else 10)."""
  _check_language(language)
  return _BASE[language]


def symbols(language: str) -> list[str]:
  """Full token inventory of a language (independent of which samples are drawn)."""
  _check_language(language)
  prefix, op = _SYNTAX[language]
  digits = list(ROMAN_TOKENS.values()) if language == "roman" else list(_DIGITS[language])
  return digits + list(prefix) + [op, DELIM]


def max_example_length(language: str, max_digits: int) -> int:
  """Tokens (EOS included) of the longest possible example whose operands have at
  most `max_digits` digits: the block size a config needs."""
  _check_language(language)
  if language == "roman":
    if max_digits not in _ROMAN_MAX_TOKENS:
      raise ValueError(f"Roman lengths are tabulated for 1-9 digits, not {max_digits}")
    return _ROMAN_MAX_TOKENS[max_digits] + 1
  return 3 * max_digits + 3 + len(_SYNTAX[language][0]) + 1


# ----------------------------------------------------------------------------- numbers


def _roman(value: int) -> str:
  if value < 4000:
    s, place = "", 0
    while value:
      value, d = divmod(value, 10)
      s = _ROMAN_PLACES[place][d] + s
      place += 1
    return s
  q, r = divmod(value, 1000)
  return _roman(q) + "|" + _roman(r)


def _roman_group_value(group: str) -> int:
  # Lenient subtractive reading; strictness comes from the canonical re-encoding check.
  total = 0
  for i, c in enumerate(group):
    v = _ROMAN_VALUE[c]
    total += -v if i + 1 < len(group) and v < _ROMAN_VALUE[group[i + 1]] else v
  return total


def encode_number(value: int, language: str) -> tuple[str, ...]:
  """Tokens of `value`, most significant first."""
  _check_language(language)
  value = int(value)
  if language == "roman":
    if value < 1:
      raise ValueError(f"Roman numerals encode positive integers only, got {value}")
    return tuple(ROMAN_TOKENS[c] for c in _roman(value))
  if value < 0:
    raise ValueError(f"negative values are not encodable, got {value}")
  digits, base = _DIGITS[language], _BASE[language]
  if base == 10:
    return tuple(digits[ord(c) - 48] for c in str(value))  # str() is the fast path
  out = []
  while True:
    value, d = divmod(value, base)
    out.append(digits[d])
    if not value:
      return tuple(reversed(out))


def decode_number(tokens: Sequence[str], language: str) -> int:
  """Strict inverse of `encode_number`: raises ValueError unless `tokens` is exactly
  the encoding of some value (no unknown tokens, leading zeros or non-canonical
  Roman numerals)."""
  _check_language(language)
  tokens = tuple(tokens)
  if not tokens:
    raise ValueError("empty number")
  if language == "roman":
    try:
      s = "".join(_ROMAN_FROM_TOKEN[t] for t in tokens)
    except KeyError as e:
      raise ValueError(f"unknown Roman token {e.args[0]!r} in {tokens}") from None
    value = 0
    for group in s.split("|"):
      value = value * 1000 + _roman_group_value(group)
    # Accept only the unique canonical spelling of the value read.
    if value < 1 or _roman(value) != s:
      raise ValueError(f"malformed Roman numeral {' '.join(tokens)!r}")
    return value
  table = _DIGIT_VALUE[language]
  value = 0
  for t in tokens:
    if t not in table:
      raise ValueError(f"unknown {language} digit {t!r} in {tokens}")
    value = value * _BASE[language] + table[t]
  if len(tokens) > 1 and table[tokens[0]] == 0:
    raise ValueError(f"leading zero in {tokens}")
  return value


# ----------------------------------------------------------------------------- examples


def make_example(a: int, b: int, language: str) -> Example:
  """`a + b` in `language`; the answer is the sum written least significant first."""
  _check_language(language)
  prefix, op = _SYNTAX[language]
  prompt = prefix + encode_number(a, language) + (op,) + encode_number(b, language) + (DELIM,)
  return Example(prompt, encode_number(a + b, language)[::-1])


def _as_tokens(x) -> tuple[str, ...]:
  if isinstance(x, Example):
    return x.prompt + x.answer
  if isinstance(x, str):
    return tuple(x.split())
  return tuple(x)


def _parse_prompt(tokens: tuple[str, ...], language: str) -> tuple[int, int, int]:
  """Returns (a, b, index just past the delimiter)."""
  _check_language(language)
  prefix, op = _SYNTAX[language]
  if tokens[: len(prefix)] != prefix:
    raise ValueError(f"{language} prompt must start with {prefix}: {tokens}")
  if op not in tokens or DELIM not in tokens:
    raise ValueError(f"{language} prompt needs {op!r} and {DELIM!r}: {tokens}")
  i, j = tokens.index(op), tokens.index(DELIM)
  # Stray operators inside an operand are unknown digit tokens, so decode rejects them.
  a = decode_number(tokens[len(prefix) : i], language)
  b = decode_number(tokens[i + 1 : j], language)
  return a, b, j + 1


def parse_example(example_or_tokens, language: str) -> tuple[int, int, int]:
  """(a, b, value written in the answer) of a full sample: an `Example`, a token
  sequence (prompt + answer) or its space-joined text. Does not check the sum."""
  tokens = _as_tokens(example_or_tokens)
  a, b, end = _parse_prompt(tokens, language)
  return a, b, decode_number(tokens[end:][::-1], language)


def is_correct(prompt_tokens, generated_answer_tokens, language: str) -> bool:
  """Exact match of a generated answer (EOS excluded) against the true sum."""
  prompt = _as_tokens(prompt_tokens)
  a, b, end = _parse_prompt(prompt, language)
  if end != len(prompt):
    raise ValueError(f"prompt must end with the delimiter {DELIM!r}: {prompt}")
  return _as_tokens(generated_answer_tokens) == encode_number(a + b, language)[::-1]


# ----------------------------------------------------------------------------- sampling


def sample_problems(
    n: int,
    *,
    seed,
    min_digits: int = 3,
    max_digits: int = 9,
    base: int = 10,
    exclude: Iterable[tuple[int, int]] = frozenset(),
) -> list[tuple[int, int]]:
  """n distinct ordered pairs (a, b), none in `exclude`, deterministic from `seed`
  (anything `np.random.default_rng` accepts). Each operand's length in base-`base`
  digits is uniform in [min_digits, max_digits], then its value uniform among the
  numbers of that length (no leading zeros, so operands are >= 1).

  Sampling is sequential: the first k pairs for a seed do not depend on n >= k.
  """
  if not 1 <= min_digits <= max_digits:
    raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
  if base < 2 or base**max_digits > 2**62:
    raise ValueError(f"base {base} with {max_digits} digits does not fit int64 sampling")
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  exclude = exclude if isinstance(exclude, (set, frozenset)) else frozenset(exclude)
  lo, hi = base ** (min_digits - 1), base**max_digits - 1
  available = (hi - lo + 1) ** 2 - sum(lo <= a <= hi and lo <= b <= hi for a, b in exclude)
  if n > available:
    raise ValueError(
        f"requested {n} distinct problems but only {available} exist with "
        f"{min_digits}-{max_digits} digit operands in base {base} (after exclusions)")

  rng = np.random.default_rng(seed)
  out: list[tuple[int, int]] = []
  seen: set[tuple[int, int]] = set()
  while len(out) < n:
    lengths = rng.integers(min_digits, max_digits + 1, size=(_CHUNK, 2))
    values = rng.integers(base ** (lengths - 1), base**lengths)  # high is exclusive
    for pair in map(tuple, values.tolist()):
      if pair not in seen and pair not in exclude:
        seen.add(pair)
        out.append(pair)
        if len(out) == n:
          break
  return out


def make_split(
    language: str,
    *,
    n_train: int,
    n_test: int,
    seed: int,
    min_digits: int = 3,
    max_digits: int = 9,
) -> tuple[list[Example], list[Example]]:
  """(train, test) examples, deterministic from `seed`.

  The test problems come from their own RNG stream drawn first, so they are the same
  whatever n_train is (sample-size sweeps share one test set). Train and test are
  disjoint as *unordered* pairs: if (a, b) is a test problem, neither (a, b) nor
  (b, a) is trained on, so commutativity cannot leak test answers.
  """
  base = base_of(language)
  test_seq, train_seq = np.random.SeedSequence(seed).spawn(2)
  kw = dict(min_digits=min_digits, max_digits=max_digits, base=base)
  test = sample_problems(n_test, seed=test_seq, **kw)
  held_out = frozenset(test) | frozenset((b, a) for a, b in test)
  train = sample_problems(n_train, seed=train_seq, exclude=held_out, **kw)
  return ([make_example(a, b, language) for a, b in train],
          [make_example(a, b, language) for a, b in test])


def eval_set(examples: Sequence[Example], language: str):
  from xlt.data.common import EvalSet

  prompts = tuple(ex.prompt for ex in examples)
  max_new = max(len(ex.answer) for ex in examples) + 1
  return EvalSet(language, prompts, lambda i, answer: {"exact_match": float(is_correct(prompts[i], answer, language))},
                 "exact_match", max_new)


def build(c, counts: dict[str, int]):
  """The addition task: `counts[language]` training problems per language (config: see
  configs/addition.py). Test and validation problems of *every* language are excluded
  from the training problems of every language (as unordered pairs), so a mixed model
  never trains on another language's spelling of a test problem."""
  from xlt.data.common import Task, WordTokenizer

  ac = c.addition
  for lang in counts:
    _check_language(lang)
  kw = dict(min_digits=ac.min_digits, max_digits=ac.max_digits)
  langs = sorted(counts, key=LANGUAGES.index)
  held = {}
  for lang in langs:  # one held-out draw per base, shared by the languages of that base
    base = base_of(lang)
    if base not in held:
      seq = np.random.SeedSequence([ac.seed, base, 1])
      held[base] = sample_problems(ac.num_test + ac.num_val, seed=seq, base=base, **kw)
  excluded = frozenset(p for ps in held.values() for a, b in ps for p in ((a, b), (b, a)))
  train, val, test = {}, {}, {}
  for lang in langs:
    seq = np.random.SeedSequence([ac.seed, LANGUAGES.index(lang), 0])
    probs = sample_problems(counts[lang], seed=seq, base=base_of(lang), exclude=excluded, **kw)
    train[lang] = [make_example(a, b, lang) for a, b in probs]
    ho = held[base_of(lang)]
    test[lang] = eval_set([make_example(a, b, lang) for a, b in ho[:ac.num_test]], lang)
    val[lang] = eval_set([make_example(a, b, lang) for a, b in ho[ac.num_test:]], lang)
  seq_len = max(max_example_length(lang, ac.max_digits) for lang in langs)
  tok = WordTokenizer(s for lang in langs for s in symbols(lang))
  return Task(tokenizer=tok, seq_len=seq_len, train=train, val=val, test=test,
              info={"languages": langs, "digits": [ac.min_digits, ac.max_digits],
                    "test_problems": ac.num_test, "val_problems": ac.num_val})
