import numpy as np
import pytest

from xlt.data import addition as ad
from xlt.data.common import EOS, Example, WordTokenizer, encode_examples, max_length

LANGS = ad.LANGUAGES
# Roman tokens are Unicode glyphs that look like ASCII; write expectations in ASCII.
_ROMAN_ASCII = str.maketrans({t: s for s, t in ad.ROMAN_TOKENS.items()})


def roman_text(ascii_text: str) -> str:
  return "".join(ad.ROMAN_TOKENS.get(c, c) for c in ascii_text)


def as_ascii(text: str) -> str:
  return text.translate(_ROMAN_ASCII)


# --------------------------------------------------------------------- exact surfaces


def test_exact_example_text():
  assert ad.make_example(32, 10, "standard").text == "3 2 + 1 0 = 2 4"
  assert ad.make_example(32, 10, "letter").text == "! D C , B A = C E"
  assert ad.make_example(0x1A, 0xB, "hex").text == "1 a + b = 5 2"
  assert ad.make_example(21, 4, "roman").text == "Ⅹ Ⅹ Ⅰ + Ⅰ Ⅴ = Ⅴ Ⅹ Ⅹ"  # Unicode glyphs
  assert as_ascii(ad.make_example(21, 4, "roman").text) == "X X I + I V = V X X"
  # The carry produces a longer answer, still reversed.
  assert ad.make_example(999, 1, "standard").text == "9 9 9 + 1 = 0 0 0 1"
  ex = ad.make_example(32, 10, "letter")
  assert ex.prompt == ("!", "D", "C", ",", "B", "A", "=") and ex.answer == ("C", "E")


@pytest.mark.parametrize(
    "value, ascii_roman",
    [
        (1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"), (400, "CD"),
        (999, "CMXCIX"), (1000, "M"), (3999, "MMMCMXCIX"), (4000, "IV|"), (4001, "IV|I"),
        (10000, "X|"), (21034, "XXI|XXXIV"), (1000000, "M|"), (2000000, "MM|"),
        (3999999, "MMMCMXCIX|CMXCIX"),
        (4000000, "IV||"), (4_000_000_000, "IV|||"), (123456789, "CXXIII|CDLVI|DCCLXXXIX"),
        (1999999998, "MCMXCIX|CMXCIX|CMXCVIII"),
    ],
)
def test_roman_spelling(value, ascii_roman):
  tokens = ad.encode_number(value, "roman")
  assert "".join(tokens) == roman_text(ascii_roman)
  assert ad.decode_number(tokens, "roman") == value


def test_positional_spelling():
  assert ad.encode_number(0x1FFE, "hex") == ("1", "f", "f", "e")
  assert ad.encode_number(1907, "letter") == ("B", "J", "A", "H")
  assert ad.encode_number(0, "standard") == ("0",)
  assert ad.decode_number(("a", "0"), "hex") == 160


# --------------------------------------------------------------------- round trips


def _edge_values():
  vals = {999, 1000, 1001, 3998, 3999, 4000, 4001, 9999, 3_999_999, 4_000_000, 4_000_001}
  for d in range(1, 11):
    vals |= {10 ** (d - 1), 10**d - 1, 10**d, 10**d + 1}
  vals.add(2 * (10**9 - 1))  # the largest possible sum of two 9-digit operands
  return sorted(vals)


@pytest.mark.parametrize("language", LANGS)
def test_encode_decode_round_trip(language):
  rng = np.random.default_rng(0)
  base = ad.base_of(language)
  values = _edge_values() + [base**9 - 1, 2 * (base**9 - 1), base**2, base**3 - 1]
  values += rng.integers(1, 2 * base**9, size=3000).tolist()
  values += rng.integers(1, 10_000, size=2000).tolist()
  for v in values:
    tokens = ad.encode_number(v, language)
    assert ad.decode_number(tokens, language) == v, (v, tokens)
    assert all(t in ad.symbols(language) for t in tokens)


def test_roman_round_trip_exhaustive_small():
  for v in range(1, 20_000):
    assert ad.decode_number(ad.encode_number(v, "roman"), "roman") == v


def test_positional_lengths_are_digit_counts():
  assert len(ad.encode_number(10**8, "standard")) == 9
  assert len(ad.encode_number(16**8, "hex")) == 9
  assert len(ad.encode_number(16**8 - 1, "hex")) == 8


# --------------------------------------------------------------------- strict decoding


@pytest.mark.parametrize(
    "bad",
    ["IIII", "VX", "IC", "IL", "XM", "VV", "LL", "DD", "MMMM", "IIV", "XCX", "CMM",
     "II|", "MMMM|", "III||", "IV|M", "IV|MI", "|", "|I", "I|I", "V|IIII", "V|XM", ""],
)
def test_roman_rejects_malformed(bad):
  with pytest.raises(ValueError):
    ad.decode_number(tuple(roman_text(bad)), "roman")


@pytest.mark.parametrize(
    "language, bad",
    [
        ("standard", ("0", "1")), ("standard", ("a",)), ("standard", ("+",)),
        ("standard", ("1", "A")), ("letter", ("A", "B")), ("letter", ("1",)),
        ("letter", ("K",)), ("hex", ("A",)), ("hex", ("0", "f")), ("hex", ("g",)),
        ("roman", ("I", "X", "Q")), ("roman", ("X",)),  # ASCII X is not a Roman token
        ("roman", ("i",)), ("standard", ()), ("hex", ()),
    ],
)
def test_decode_rejects_malformed(language, bad):
  with pytest.raises(ValueError):
    ad.decode_number(bad, language)


def test_encode_rejects_unencodable():
  with pytest.raises(ValueError):
    ad.encode_number(0, "roman")
  with pytest.raises(ValueError):
    ad.encode_number(-1, "standard")
  with pytest.raises(ValueError):
    ad.encode_number(5, "klingon")


@pytest.mark.parametrize(
    "language, text",
    [
        ("standard", "3 2 + 1 0 2 4"),  # no delimiter
        ("standard", "3 2 1 0 = 2 4"),  # no operator
        ("standard", "3 2 + + 1 0 = 2 4"),
        ("standard", "3 2 + 1 0 = 2 4 ="),
        ("standard", "3 2 + 1 0 ="),  # no answer
        ("standard", "+ 1 0 = 2 4"),
        ("letter", "D C , B A = C E"),  # missing `!`
        ("letter", "! D C + B A = C E"),  # wrong operator
        ("hex", "1 A + B = 5 2"),  # hex digits are lowercase
        ("roman", "X X I + I V = V X X"),  # ASCII letters, not Roman glyphs
    ],
)
def test_parse_example_rejects_malformed(language, text):
  with pytest.raises(ValueError):
    ad.parse_example(text, language)


# --------------------------------------------------------------------- generated samples


@pytest.mark.parametrize("language", LANGS)
def test_every_sample_parses_to_correct_sum(language):
  train, test = ad.make_split(language, n_train=2000, n_test=200, seed=3)
  base = ad.base_of(language)
  lengths = []
  for ex in train + test:
    a, b, s = ad.parse_example(ex, language)
    assert s == a + b
    assert ad.parse_example(ex.text, language) == (a, b, s)
    assert ex.prompt[-1] == ad.DELIM
    assert ad.is_correct(ex.prompt, ex.answer, language)
    for v in (a, b):
      n_digits = len(np.base_repr(v, base))
      assert 3 <= n_digits <= 9
      lengths.append(n_digits)
  # Lengths are uniform over 3..9: every length shows up about 1/7 of the time.
  counts = np.bincount(lengths, minlength=10)[3:]
  assert counts.min() > 0.8 * len(lengths) / 7, counts


def test_is_correct():
  ex = ad.make_example(32, 10, "standard")
  assert ad.is_correct(ex.prompt, ("2", "4"), "standard")
  assert ad.is_correct(" ".join(ex.prompt), ["2", "4"], "standard")
  assert not ad.is_correct(ex.prompt, ("4", "2"), "standard")  # not reversed
  assert not ad.is_correct(ex.prompt, ("2", "4", "0"), "standard")
  assert not ad.is_correct(ex.prompt, ("2",), "standard")
  assert not ad.is_correct(ex.prompt, (), "standard")
  assert not ad.is_correct(ex.prompt, ("2", "4", EOS), "standard")
  hx = ad.make_example(0x1A, 0xB, "hex")
  assert ad.is_correct(hx.prompt, ("5", "2"), "hex")
  assert not ad.is_correct(hx.prompt, ("3", "3"), "hex")  # 26 + 11 = 37 in decimal
  rm = ad.make_example(21, 4, "roman")
  assert ad.is_correct(rm.prompt, rm.answer, "roman")
  assert not ad.is_correct(rm.prompt, tuple(roman_text("XXV")), "roman")  # not reversed
  with pytest.raises(ValueError):
    ad.is_correct(ex.prompt + ex.answer, ex.answer, "standard")  # prompt runs past `=`


# --------------------------------------------------------------------- sampling and splits


def test_sample_problems_deterministic_distinct_and_prefix_stable():
  p1 = ad.sample_problems(5000, seed=7)
  assert p1 == ad.sample_problems(5000, seed=7)
  assert len(set(p1)) == 5000
  assert p1 != ad.sample_problems(5000, seed=8)
  assert ad.sample_problems(100, seed=7) == p1[:100]
  assert ad.sample_problems(0, seed=7) == []


def test_sample_problems_respects_exclude_and_base():
  first = ad.sample_problems(50, seed=1, min_digits=2, max_digits=2)
  rest = ad.sample_problems(200, seed=1, min_digits=2, max_digits=2, exclude=set(first))
  assert not set(first) & set(rest)
  hx = ad.sample_problems(2000, seed=1, min_digits=2, max_digits=3, base=16)
  assert all(16 <= v < 16**3 for pair in hx for v in pair)
  assert max(max(p) for p in hx) >= 1000  # really base 16, not base 10


def test_too_many_problems_raises():
  # One-digit operands: 9 * 9 = 81 distinct ordered pairs.
  assert len(ad.sample_problems(81, seed=0, min_digits=1, max_digits=1)) == 81
  with pytest.raises(ValueError, match="only 81"):
    ad.sample_problems(82, seed=0, min_digits=1, max_digits=1)
  with pytest.raises(ValueError, match="only 80"):
    ad.sample_problems(81, seed=0, min_digits=1, max_digits=1, exclude={(1, 1), (10, 10)})
  with pytest.raises(ValueError):
    ad.make_split("standard", n_train=60, n_test=30, seed=0, min_digits=1, max_digits=1)
  with pytest.raises(ValueError):
    ad.sample_problems(1, seed=0, min_digits=4, max_digits=3)


def _pairs(examples, language):
  return [ad.parse_example(e, language)[:2] for e in examples]


@pytest.mark.parametrize("language", LANGS)
def test_split_disjoint_deterministic_and_test_independent_of_n_train(language):
  train, test = ad.make_split(language, n_train=3000, n_test=500, seed=11)
  assert (train, test) == ad.make_split(language, n_train=3000, n_test=500, seed=11)
  tr, te = _pairs(train, language), _pairs(test, language)
  assert len(set(tr)) == 3000 and len(set(te)) == 500
  # Disjoint as unordered pairs: (b, a) of a test problem is not trained on either.
  unordered = lambda ps: {tuple(sorted(p)) for p in ps}
  assert not unordered(tr) & unordered(te)
  for n_train in (0, 10, 1000):
    tr2, te2 = ad.make_split(language, n_train=n_train, n_test=500, seed=11)
    assert te2 == test
    assert len(tr2) == n_train
  _, other = ad.make_split(language, n_train=10, n_test=500, seed=12)
  assert other != test


def test_split_disjoint_when_problem_space_is_small():
  # 2-digit operands: 8100 pairs; a large test set forces the exclusion to matter.
  train, test = ad.make_split("standard", n_train=3000, n_test=3000, seed=0,
                              min_digits=2, max_digits=2)
  tr, te = _pairs(train, "standard"), _pairs(test, "standard")
  assert not {tuple(sorted(p)) for p in tr} & {tuple(sorted(p)) for p in te}


def test_base_ten_languages_share_problems():
  pairs = [_pairs(ad.make_split(l, n_train=100, n_test=50, seed=5)[1], l)
           for l in ("standard", "letter", "roman")]
  assert pairs[0] == pairs[1] == pairs[2]


# --------------------------------------------------------------------- vocabulary


def test_symbols_and_sharing():
  inventories = {l: ad.symbols(l) for l in LANGS}
  for l, syms in inventories.items():
    assert len(syms) == len(set(syms)), l
  assert len(inventories["standard"]) == 12 and len(inventories["hex"]) == 18
  assert len(inventories["letter"]) == 13 and len(inventories["roman"]) == 10
  # Only the intended tokens are shared between languages.
  shared = {}
  for i, l1 in enumerate(LANGS):
    for l2 in LANGS[i + 1:]:
      shared[l1, l2] = set(inventories[l1]) & set(inventories[l2])
  digits = set("0123456789")
  assert shared["standard", "hex"] == digits | {"+", "="}
  assert shared["standard", "roman"] == shared["roman", "hex"] == {"+", "="}
  assert shared["standard", "letter"] == shared["letter", "roman"] == {"="}
  assert shared["letter", "hex"] == {"="}  # hex a-f never collide with letter A-J


def test_union_tokenizer_encodes_every_language_without_collision():
  tok = WordTokenizer([s for l in LANGS for s in ad.symbols(l)])
  assert tok.vocab_size == 2 + len({s for l in LANGS for s in ad.symbols(l)})
  letter_ids = set(tok.encode(list("ABCDEFGHIJ")))
  hex_letter_ids = set(tok.encode(list("abcdef")))
  roman_ids = set(tok.encode([ad.ROMAN_TOKENS[c] for c in "IVXLCDM|"]))
  assert len(letter_ids | hex_letter_ids | roman_ids) == 10 + 6 + 8
  for l in LANGS:
    _, test = ad.make_split(l, n_train=0, n_test=300, seed=0)
    for ex in test:
      assert tok.decode(tok.encode(ex.prompt + ex.answer)) == list(ex.prompt + ex.answer)


@pytest.mark.parametrize("language", LANGS)
def test_encode_examples_loss_mask_covers_answer_and_eos(language):
  tok = WordTokenizer(ad.symbols(language))
  _, examples = ad.make_split(language, n_train=0, n_test=200, seed=4)
  length = ad.max_example_length(language, 9)
  enc = encode_examples(examples, tok, length)
  for i, ex in enumerate(examples):
    p, n = len(ex.prompt), len(ex.answer)
    targets = enc.tokens[i, 1:]
    masked = targets[enc.loss_mask[i] == 1].tolist()
    assert masked == tok.encode(ex.answer) + [tok.eos_id]
    assert enc.loss_mask[i].sum() == n + 1
    assert enc.loss_mask[i, : p - 1].sum() == 0 and enc.prompt_len[i] == p


# --------------------------------------------------------------------- lengths and speed


@pytest.mark.parametrize("max_digits", range(1, 10))
def test_max_example_length_is_exact(max_digits):
  witness = int("8" * max_digits)  # 8 = VIII is the longest Roman digit
  for language in LANGS:
    base = ad.base_of(language)
    # Positional worst case: largest operands (the sum gets an extra digit).
    big = witness if language == "roman" else base**max_digits - 1
    ex = ad.make_example(big, big, language)
    assert max_length([ex]) == ad.max_example_length(language, max_digits), language
  # A random sample never exceeds the bound.
  for language in LANGS:
    n_test = 81 if max_digits == 1 else 300  # only 9 * 9 one-digit problems exist
    _, test = ad.make_split(language, n_train=0, n_test=n_test, seed=9, min_digits=1,
                            max_digits=max_digits)
    assert max_length(test) <= ad.max_example_length(language, max_digits)


def test_documented_block_sizes():
  assert ad.max_example_length("standard", 9) == 31
  assert ad.max_example_length("letter", 9) == 32
  assert ad.max_example_length("hex", 9) == 31
  assert ad.max_example_length("roman", 9) == 108
  assert ad.max_example_length("roman", 5) == 61 <= 64 < ad.max_example_length("roman", 6)


def test_reference_size_training_sets_are_distinct_problems():
  # the reference's 25,600 training problems per language (its speed is a benchmark's
  # business, not a unit test's: timing depends on the machine and its load)
  for language in LANGS:
    train, _ = ad.make_split(language, n_train=25_600, n_test=0, seed=0)
    assert len(train) == 25_600 and isinstance(train[0], Example)
    assert len({ad.parse_example(ex, language)[:2] for ex in train}) == 25_600
