"""xlt.data.sft on hand-made examples with the llama fixture's word-level tokenizer: "wN" is id
N + 4, </s> (EOS) is 2, <pad> is 0, and encode adds no BOS."""

import collections
import json
import pathlib
import shutil

import numpy as np
import pytest

from xlt import hf_tokenizer
from xlt.data import sft

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "hf" / "llama"
EOS, PAD = 2, 0
# roles marked by words, an assistant turn ended by </s>, a generation prompt "w2"
ROLE_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}w1 {{ m['content'] }} "
                 "{% elif m['role'] == 'system' %}w3 {{ m['content'] }} "
                 "{% else %}w2 {{ m['content'] }} </s> {% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}w2 {% endif %}")


def w(*ns):
  return [n + 4 for n in ns]


@pytest.fixture(scope="module")
def tok():
  """The fixture's own template: the contents joined by spaces (no roles, no EOS)."""
  return hf_tokenizer.load(str(FIXTURE))


@pytest.fixture(scope="module")
def role_tok(tmp_path_factory):
  d = tmp_path_factory.mktemp("hf") / "llama"
  shutil.copytree(FIXTURE, d)
  (d / "chat_template.jinja").write_text(ROLE_TEMPLATE)
  return hf_tokenizer.load(str(d))


def write(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


def test_prompt_completion_exact(tok, tmp_path):
  path = write(tmp_path / "a.jsonl", [{"prompt": "w1 w2", "completion": "w3"}])
  data = sft.load(path, tok, block_size=7, packing=False)
  np.testing.assert_array_equal(data.train["tokens"], [w(1, 2, 3) + [EOS, PAD, PAD, PAD, PAD]])
  # targets: w3 (predicted from w2) and EOS; never the prompt or the padding
  np.testing.assert_array_equal(data.train["loss_mask"], [[0, 1, 1, 0, 0, 0, 0]])
  assert data.train["tokens"].dtype == np.int32 and data.train["loss_mask"].dtype == np.float32
  assert data.val is None
  assert data.counts["train"] == {"examples": 1, "truncated": 0, "dropped": 0, "rows": 1, "tokens": 4,
                                  "response_tokens": 2}


def test_packed_rows_exact(tok, tmp_path):
  path = write(tmp_path / "a.jsonl", [{"prompt": "w1", "completion": "w2 w3"}, {"prompt": "w4 w5", "completion": "w6"},
                                      {"prompt": "w7", "completion": "w8"}])
  data = sft.load(path, tok, block_size=8)
  # best fit in order: examples of 4, 4, 3 tokens into rows of 9: [ex0 ex1] [ex2]
  np.testing.assert_array_equal(data.train["tokens"], [w(1, 2, 3) + [EOS] + w(4, 5, 6) + [EOS, PAD],
                                                       w(7, 8) + [EOS] + [PAD] * 6])
  # the boundary (EOS of ex0 -> w4) and ex1's prompt are never targets
  np.testing.assert_array_equal(data.train["loss_mask"], [[1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0]])


def test_chat_masks_cover_assistant_content(role_tok, tmp_path):
  msgs = [{"role": "system", "content": "w10"}, {"role": "user", "content": "w11 w12"},
          {"role": "assistant", "content": "w13 w14"}, {"role": "user", "content": "w15"},
          {"role": "assistant", "content": "w16"}]
  ids, targets = sft.encode(role_tok, {"messages": msgs})
  assert list(ids) == role_tok.encode_chat(msgs, add_generation_prompt=False)
  expected = w(3, 10, 1, 11, 12, 2) + w(13, 14) + [EOS] + w(1, 15, 2) + w(16) + [EOS]
  assert list(ids) == expected
  # exactly the assistant contents and their end-of-turn </s>; the template already ends each
  # turn with a stop id, so no EOS is added
  trained = [i for i, t in zip(ids, targets) if t]
  assert trained == w(13, 14) + [EOS] + w(16) + [EOS]
  assert list(targets) == [False] * 6 + [True] * 3 + [False] * 3 + [True] * 2


def test_chat_without_end_token_gets_eos(tok):
  msgs = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2 w3"},
          {"role": "user", "content": "w4"}, {"role": "assistant", "content": "w5"}]
  ids, targets = sft.encode(tok, {"messages": msgs})
  assert list(ids) == w(1, 2, 3) + [EOS] + w(4, 5) + [EOS]
  assert [bool(t) for t in targets] == [False, True, True, True, False, True, True]
  ids, targets = sft.encode(tok, {"messages": msgs}, add_eos=False)
  assert list(ids) == w(1, 2, 3, 4, 5) and [i for i, t in zip(ids, targets) if t] == w(2, 3, 5)


def test_chat_template_not_prefix_stable(tmp_path):
  d = tmp_path / "llama"
  shutil.copytree(FIXTURE, d)
  # writes the turn count first: a later turn changes the text before earlier ones
  (d / "chat_template.jinja").write_text("w{{ messages | length }} {% for m in messages %}{{ m['content'] }} {% endfor %}")
  msgs = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]
  with pytest.raises(sft.SFTError, match="prefix by prefix at message 1"):
    sft.encode(hf_tokenizer.load(str(d)), {"messages": msgs}, where="f.jsonl:3")


def test_packing_keeps_every_response_token_once(role_tok, tmp_path):
  rng = np.random.default_rng(0)
  rows, responses = [], collections.Counter()
  for i in range(60):
    prompt = " ".join(f"w{n}" for n in [0, *rng.integers(1, 50, rng.integers(1, 6))])
    answer = " ".join(f"w{n}" for n in rng.integers(1, 50, rng.integers(1, 5)))
    if i % 2:
      rows.append({"prompt": prompt, "completion": answer})
    else:
      rows.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]})
    responses.update(role_tok.encode(answer) + [EOS])
  path = write(tmp_path / "a.jsonl", rows)
  packed = sft.load(path, role_tok, block_size=16)
  single = sft.load(path, role_tok, block_size=16, packing=False)
  for data in (packed, single):
    tokens, mask = data.train["tokens"], data.train["loss_mask"]
    assert collections.Counter(tokens[:, 1:][mask > 0].tolist()) == responses
    # a prompt's first word (w0) or padding is never a target
    assert not mask[(tokens[:, 1:] == w(0)[0]) | (tokens[:, 1:] == PAD)].any()
  assert packed.counts["train"]["rows"] < single.counts["train"]["rows"] == 60
  assert packed.counts["train"]["tokens"] == single.counts["train"]["tokens"]


def test_too_long_truncated_or_dropped(tok, tmp_path):
  path = write(tmp_path / "a.jsonl", [{"prompt": "w1 w2", "completion": "w3 w4 w5"},
                                      {"prompt": "w1 w2 w3 w4 w5", "completion": "w6"},
                                      {"prompt": "w1", "completion": "w2"}])
  data = sft.load(path, tok, block_size=4, packing=False)
  # ex0 (6 tokens) cut to 5; ex1's response lies past the cut, so it is dropped
  np.testing.assert_array_equal(data.train["tokens"], [w(1, 2, 3, 4, 5), w(1, 2) + [EOS, PAD, PAD]])
  np.testing.assert_array_equal(data.train["loss_mask"], [[0, 1, 1, 1], [1, 1, 0, 0]])
  assert data.counts["train"]["truncated"] == 1 and data.counts["train"]["dropped"] == 1
  data = sft.load(path, tok, block_size=4, too_long="drop")
  assert data.counts["train"]["truncated"] == 0 and data.counts["train"]["dropped"] == 2
  np.testing.assert_array_equal(data.train["tokens"], [w(1, 2) + [EOS, PAD, PAD]])


def test_split_deterministic_and_disjoint(tok, tmp_path):
  rows = [{"prompt": f"w{i % 40}", "completion": f"w{i % 7}"} for i in range(200)]  # with duplicates
  train, val = sft.split(rows, 0.2, seed=3)
  assert (train, val) == sft.split(rows, 0.2, seed=3)
  assert len(train) + len(val) == 200 and abs(len(val) - 40) <= 5  # ties extend the cut
  key = lambda r: (r["prompt"], r["completion"])
  assert not {key(r) for r in train} & {key(r) for r in val}
  assert sft.split(rows, 0.2, seed=4)[1] != val
  # the rule reads the content, not the line order
  assert sorted(map(key, sft.split(rows[::-1], 0.2, seed=3)[1])) == sorted(map(key, val))
  path = write(tmp_path / "a.jsonl", rows)
  data = sft.load(path, tok, block_size=8, val_fraction=0.2, seed=3)
  assert data.counts["val"]["examples"] == len(val) and data.counts["train"]["examples"] == len(train)
  assert data.val["tokens"].shape[1] == 9


@pytest.mark.parametrize("lines, match", [
    (['{"prompt": "w1", "completion": "w2"}', "{not json"], r"a.jsonl:2: not valid JSON"),
    (['{"prompt": "w1"}'], r"a.jsonl:1: needs 'prompt' and 'completion', or 'messages'; has keys \['prompt'\]"),
    (['{"prompt": 1, "completion": "w2"}'], "must be strings"),
    (["", '[1, 2]'], r"a.jsonl:2: expected a JSON object"),
    (['{"messages": [{"role": "user", "content": "w1"}]}'], r"a.jsonl:1: no assistant message \(its roles: user\)"),
    (['{"prompt": "w1", "completion": "w2"}', '{"messages": [{"role": "user", "content": "w1"}, {"role": "wizard", '
      '"content": "w2"}, {"role": "assistant", "content": "w3"}]}'], r"a.jsonl:2: message 1 has the role 'wizard'"),
    (['{"prompt": "w1", "completion": ""}', '{"messages": [{"role": "user", "content": "w1"}, '
      '{"role": "assistant", "content": " "}]}'], r"a.jsonl: all 2 completions are empty \(the first on line 1\)"),
    (['{"prompt": "w1", "completion": "w2",}'], r"a.jsonl:1: not valid JSON \(a trailing comma .* at column 36\)"),
    (['{"messages": [{"role": "user"}]}'], "message 0 needs a string 'role' and a string 'content'"),
    (["", "  "], "has no examples"),
])
def test_errors_name_the_line(tok, tmp_path, lines, match):
  path = write(tmp_path / "a.jsonl", lines)
  with pytest.raises(sft.SFTError, match=match) as e:
    sft.load(path, tok, block_size=8)
  assert "\n" not in str(e.value)


def test_file_checks(tok, tmp_path):
  with pytest.raises(sft.SFTError, match="no such file"):
    sft.load(str(tmp_path / "missing.jsonl"), tok, block_size=8)
  path = write(tmp_path / "a.jsonl", [{"prompt": "w1", "completion": "w2"}])
  with pytest.raises(sft.SFTError, match="over the 10-byte limit"):
    sft.load(path, tok, block_size=8, max_bytes=10)
  with pytest.raises(sft.SFTError, match="too_long must be one of"):
    sft.load(path, tok, block_size=8, too_long="wrap")
  with pytest.raises(sft.SFTError, match="val_fraction"):
    sft.load(path, tok, block_size=8, val_fraction=1.0)
