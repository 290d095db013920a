"""xlt.generate: MGSM's final-number scoring, greedy decoding of ragged batches (= each prompt
alone), stopping, the command's files and errors, perplexity against a direct computation, and
the command end to end on tests/fixtures/hf/llama once xlt.pretrained exists."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlt import generate
from xlt import hf_tokenizer
from xlt import model as model_lib

LLAMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf", "llama")


@pytest.fixture(scope="module")
def tiny():
  """A tiny random xlt GPT over the llama fixture's 64-word vocabulary, and that tokenizer."""
  cfg = model_lib.Config(vocab_size=64, block_size=80, num_layers=2, num_heads=2, d_model=32, pos_embedding="rope")
  params = model_lib.init_params(cfg, jax.random.key(3))
  params = jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, params)  # sharper logits: fewer near-ties
  return cfg, params, hf_tokenizer.load(LLAMA)


@pytest.mark.parametrize("text, number", [
    ("The answer is 42.", "42"), ("1,234 apples and 5,678.50 pears", "5678.5"), ("no digits", None),
    ("first 3 then 18.00", "18"), ("-7 degrees", "-7"), ("x = 2.5, so 10", "10"), ("total: $1,000,000", "1000000"),
    ("ends with 3.", "3"), ("۳ is not ASCII but 4 is", "4"), (18, "18"), ("0.0", "0"),
])
def test_final_number(text, number):
  assert generate.final_number(text) == number


def test_score():
  records = [{"continuation": "so 1,200 in all"}, {"continuation": "it is 7"}, {"continuation": "none"}]
  summary = generate.score(records, [1200, "8", "3"], "number")
  assert summary == {"correct": 1, "total": 3, "accuracy": 1 / 3, "match": "number"}
  assert [r["correct"] for r in records] == [True, False, False] and records[0]["predicted"] == "1200"


def test_match_modes():
  """Letter answers ("GCJ") are right or wrong as strings; as final numbers nothing is found."""
  records = [{"continuation": " GCJ", "set": "add_digit/letter", "prompt": "[let] 327 + 4 ="},
             {"continuation": "BDD ", "set": "add_digit/letter", "prompt": "[let] 327 + 4 ="},
             {"continuation": "133", "set": "add_digit/letter", "prompt": "[let] 327 + 4 ="}]
  answers = ["GCJ", "GCJ", "GCJ"]  # hand-made answers: "GCJ" is right for the exact modes
  exact = generate.score([dict(r) for r in records], answers, "exact")
  assert (exact["correct"], exact["match"]) == (1, "exact")
  assert generate.score([dict(r) for r in records], answers, "number")["correct"] == 0
  # the task's own scorer: 327 + 4 = 331 is "BDD" in letters, least significant digit first;
  # "133" is the right value in the other script
  task = [dict(r) for r in records]
  summary = generate.score(task, answers, "task")
  assert [r["correct"] for r in task] == [False, True, False] and [r["any_script"] for r in task] == [False, True, True]
  assert summary["any_script"] == 2 / 3
  with pytest.raises(generate.UserError, match="--match=task needs"):
    generate.match("1", "1", "task", {"prompt": "w1"})


def test_ragged_batch_equals_one_by_one(tiny):
  cfg, params, _ = tiny
  rng = np.random.default_rng(0)
  # lengths a batch of 4 holds together ([4, 5, 6, 13]: a prefill of 4, the rest copied in
  # step by step) and one past the length bucket (33), in few shapes (each is a compile)
  prompts = [rng.integers(4, 64, n).tolist() for n in (4, 6, 13, 5, 33)]
  together = generate.greedy_ids(cfg, params, prompts, max_new=10, batch=4)
  alone = [generate.greedy_ids(cfg, params, [p], max_new=10, batch=1)[0] for p in prompts]
  assert together == alone
  assert all(len(c) == 10 for c in together)
  # direct: argmax of the full forward pass without a cache, one token at a time (the
  # sequence zero-padded to one length: causal, so the padding does not change the logits read)
  forward = jax.jit(lambda x: model_lib.apply(cfg, params, x)[0])
  seq = list(prompts[2])
  for _ in range(10):
    logits = forward(jnp.asarray([seq + [0] * (23 - len(seq))], jnp.int32))
    seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
  assert together[2] == seq[len(prompts[2]):]


def test_stop_ids_and_context(tiny):
  cfg, params, _ = tiny
  prompt = [5, 9, 11, 13]
  full = generate.greedy_ids(cfg, params, [prompt], max_new=12)[0]
  stop = full[4]
  cut = generate.greedy_ids(cfg, params, [prompt], max_new=12, stop_ids=[stop])[0]
  assert cut == full[:full.index(stop)]
  # any stop id ends the continuation (the first one alone also ends decoding early)
  absent = next(t for t in range(64) if t not in full)
  cut2 = generate.greedy_ids(cfg, params, [prompt], max_new=12, stop_ids=[absent, full[2]])[0]
  assert cut2 == full[:full.index(full[2])]
  # the context bounds the new tokens, and a prompt that fills it is refused
  assert len(generate.greedy_ids(cfg, params, [[4] * 75], max_new=12)[0]) == 5
  with pytest.raises(generate.UserError, match="prompt 1 has 80 tokens"):
    generate.greedy_ids(cfg, params, [[4], [4] * 80], max_new=1)


def test_decode_text_and_chat(tiny):
  cfg, params, tok = tiny
  out = generate.decode(cfg, params, tok, ["w1 w2 w3", [{"role": "user", "content": "w4 w5"}]], max_new=6)
  ids = generate.greedy_ids(cfg, params, [tok.encode("w1 w2 w3"), tok.encode("w4 w5 ", add_special_tokens=False)],
                            max_new=6, stop_ids=tok.stop_ids)
  assert [o["ids"] for o in out] == ids
  assert [o["continuation"] for o in out] == [tok.decode(i) for i in ids]
  chat = generate.decode(cfg, params, tok, ["w4 w5"], chat=True, max_new=6)
  assert chat[0]["ids"] == ids[1]


def test_perplexity_equals_direct_nll(tiny):
  cfg, params, tok = tiny
  words = " ".join(f"w{(7 * i) % 60}" for i in range(70))
  got = generate.perplexity(cfg, params, tok, words, block=16, batch=3)
  ids = tok.encode(words)
  forward = jax.jit(lambda x: model_lib.apply(cfg, params, x))  # eagerly: an op at a time
  nll, count = 0.0, 0
  for start in range(0, len(ids) - 1, 16):  # each chunk of 16 targets from its own start
    chunk = ids[start:start + 17]
    logits, _ = forward(jnp.asarray([chunk[:-1]], jnp.int32))
    logp = jax.nn.log_softmax(logits[0].astype(jnp.float64) if jax.config.jax_enable_x64 else logits[0])
    nll -= float(sum(logp[t, chunk[t + 1]] for t in range(len(chunk) - 1)))
    count += len(chunk) - 1
  assert got["tokens"] == count == len(ids) - 1
  np.testing.assert_allclose(got["ppl_token"], np.exp(nll / count), rtol=1e-5)
  with pytest.raises(generate.UserError, match="at least 2"):
    generate.perplexity(cfg, params, tok, "", block=16)


def test_packed_rows():
  tokens, mask = generate.packed_rows(list(range(1, 12)), 4)
  assert tokens.tolist() == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9], [9, 10, 11, 0, 0]]
  assert mask.sum() == 10 and mask[-1].tolist() == [1, 1, 0, 0]


def write_jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


@pytest.fixture
def fake_model(tiny, monkeypatch):
  """The command with the tiny model in place of xlt.pretrained's."""
  cfg, params, _ = tiny
  monkeypatch.setattr(generate, "load_model", lambda path, dtype, mesh=None, dense_layout=None: (cfg, params))
  return cfg, params


def test_command_files(tmp_path, fake_model, tiny, capsys):
  cfg, params, tok = tiny
  prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "w1 w2 w3", "id": "a"}, "",
                                              {"messages": [{"role": "user", "content": "w9"}]}, {"prompt": "w4"}])
  out = generate.greedy_ids(cfg, params, [tok.encode("w1 w2 w3"), tok.encode("w9 ", add_special_tokens=False),
                                          tok.encode("w4")], max_new=5, stop_ids=tok.stop_ids)
  texts = [tok.decode(o) for o in out]
  answers = write_jsonl(tmp_path / "a.jsonl", [{"answer": generate.final_number(texts[0]) or "1"}, {"answer": "x"},
                                               {"answer": 5}])
  output = str(tmp_path / "out.jsonl")
  assert generate.main(["--model", LLAMA, "--prompts", prompts, "--output", output, "--max_new=5", "--batch=2",
                        "--answers", answers, "--match=number"]) == 0
  lines = [json.loads(x) for x in open(output)]
  assert [x["continuation"] for x in lines] == texts and [x["ids"] for x in lines] == out
  assert lines[0]["id"] == "a" and "messages" in lines[1]
  summary = json.load(open(tmp_path / "out.accuracy.json"))
  expected = sum(generate.final_number(t) == generate.final_number(a)
                 for t, a in zip(texts, [lines[0]["answer"], "x", 5]))
  assert summary["correct"] == expected and summary["total"] == 3
  assert "accuracy" in capsys.readouterr().out
  # --perplexity writes a JSON summary
  text = tmp_path / "t.txt"
  text.write_text("w1 w2 w3 w4 w5 w6 w7")
  assert generate.main(["--model", LLAMA, "--perplexity", str(text), "--output", str(tmp_path / "ppl.json")]) == 0
  assert json.load(open(tmp_path / "ppl.json"))["tokens"] == 6


@pytest.mark.parametrize("rows, args, message", [
    (None, ["--prompts", "{tmp}/missing.jsonl"], "no prompts file"),
    ([{"prompt": "w1"}, "{bad json"], [], "p.jsonl line 2 is not JSON"),
    ([{"prompt": "w1"}, "", {"text": "w1"}], [], "line 3 has neither"),
    ([[1, 2]], [], "line 1 is not a JSON object"),
    ([], [], "holds no prompts"),
    ([{"prompt": "w1"}], ["--answers", "{tmp}/p.jsonl"], "line 1 has no \"answer\""),
    ([{"prompt": "w1"}], ["--max_new=0"], "must be positive"),
    ([{"prompt": "w1"}], ["--bogus"], "unrecognized arguments"),
    ([{"prompt": "w1", "answer": "1"}], ["--answers", "{tmp}/p.jsonl", "--match=task"], "--match=task needs"),
    ([{"prompt": "w1", "answer": "1"}], ["--answers", "{tmp}/p.jsonl", "--match=letters"], "invalid choice"),
    ([{"prompt": "w1"}], ["--model={tmp}/nowhere"], "no model directory"),
])
def test_command_errors(tmp_path, fake_model, capsys, rows, args, message):
  if rows is not None:
    write_jsonl(tmp_path / "p.jsonl", rows)
  argv = ["--model", LLAMA, "--prompts", str(tmp_path / "p.jsonl"), "--output", str(tmp_path / "o.jsonl")]
  assert generate.main(argv + [a.format(tmp=tmp_path) for a in args]) == 2
  err = capsys.readouterr().err
  assert err.startswith("xlt.generate: error: ") and message in err and err.count("\n") == 1, err
  assert not os.path.exists(tmp_path / "o.jsonl")


def test_command_exit_status(tmp_path):
  r = subprocess.run([sys.executable, "-m", "xlt.generate", "--model", LLAMA, "--prompts", str(tmp_path / "no.jsonl"),
                      "--output", str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no prompts file" in r.stderr, r.stderr


def test_llama_end_to_end(tmp_path):
  """The command on the llama fixture through xlt.pretrained; its greedy ids against
  transformers' where the fixture stores them (greedy_ids.npy: the prompt input_ids.npy and
  transformers' greedy continuation, or the continuation alone)."""
  pytest.importorskip("xlt.pretrained")
  tok = hf_tokenizer.load(LLAMA)
  cfg, params = generate.load_model(LLAMA, None)
  assert cfg.dense_layout == "kernel"  # decoding's layout (xlt.decode.DENSE_LAYOUT), not the family's
  prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "w1 w2 w3"}, {"prompt": "w7 w30 w5 w8 w9 w11"},
                                              {"messages": [{"role": "user", "content": "w12"}]}])
  output = str(tmp_path / "out.jsonl")
  assert generate.main(["--model", LLAMA, "--prompts", prompts, "--output", output, "--max_new=8"]) == 0
  lines = [json.loads(x) for x in open(output)]
  alone = [generate.greedy_ids(cfg, params, [ids], max_new=8, stop_ids=tok.stop_ids)[0]
           for ids in (tok.encode("w1 w2 w3"), tok.encode("w7 w30 w5 w8 w9 w11"), tok.encode_chat(
               [{"role": "user", "content": "w12"}]))]
  assert [x["ids"] for x in lines] == alone
  weights = str(tmp_path / "weights.jsonl")  # the family's layout decodes the same ids
  assert generate.main(["--model", LLAMA, "--prompts", prompts, "--output", weights, "--max_new=8",
                        "--dense_layout=weight"]) == 0
  assert [json.loads(x)["ids"] for x in open(weights)] == alone
  _check_transformers_generate(tok, [tok.encode("w1 w2 w3"), tok.encode("w7 w30 w5 w8 w9 w11")], alone[:2])
  greedy = os.path.join(LLAMA, "greedy_ids.npy")
  if not os.path.exists(greedy):
    return
  prompt = np.load(os.path.join(LLAMA, "input_ids.npy"))[0].tolist()
  theirs = np.load(greedy).reshape(-1).tolist()
  if theirs[:len(prompt)] == prompt:
    theirs = theirs[len(prompt):]
  ours = generate.greedy_ids(cfg, params, [prompt], max_new=len(theirs))[0]
  stops = [k for k, t in enumerate(theirs) if t in tok.stop_ids]  # transformers stops at EOS and may pad after
  n = stops[0] + 1 if stops else len(theirs)
  assert ours[:n] == theirs[:n]


def _check_transformers_generate(tok, prompts, ours):
  """transformers' own greedy `generate` (stopping at EOS) on the same prompts, where torch
  and transformers are installed (the venv of tests/fixtures/make_hf_fixtures.py)."""
  try:
    import torch
    import transformers
  except ImportError:
    return
  model = transformers.AutoModelForCausalLM.from_pretrained(LLAMA, dtype=torch.float32).eval()
  for ids, want in zip(prompts, ours):
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=tok.stop_ids,
                         pad_token_id=tok.pad_id)
    cont = out[0, len(ids):].tolist()
    assert tok.decode(cont) == tok.decode(want) and cont[:len(want)] == want, (cont, want)


FIXTURES_HF = os.path.dirname(LLAMA)
GREEDY = sorted(f for f in os.listdir(FIXTURES_HF) if os.path.exists(os.path.join(FIXTURES_HF, f, "greedy_ids.npy")))


@pytest.mark.parametrize("family", GREEDY)
def test_greedy_matches_transformers(family):
  """KV-cache greedy decoding of each fixture with transformers' greedy ids (a full forward pass
  per token, EOS not special), alone and in a ragged batch beside shorter prompts."""
  pytest.importorskip("xlt.pretrained")
  d = os.path.join(FIXTURES_HF, family)
  cfg, params = generate.load_model(d, None)
  prompt = np.load(os.path.join(d, "input_ids.npy"))[0].tolist()
  theirs = np.load(os.path.join(d, "greedy_ids.npy"))[0].tolist()
  assert theirs[:len(prompt)] == prompt
  new = len(theirs) - len(prompt)
  batch = generate.greedy_ids(cfg, params, [prompt[:3], prompt, prompt[:7]], max_new=new, batch=4)
  assert batch[1] == theirs[len(prompt):]


def test_a_prompts_file_over_the_limit_is_a_user_error(tmp_path, monkeypatch):
  from xlt.data import sft
  path = tmp_path / "p.jsonl"
  path.write_text('{"prompt": "w1"}\n')
  monkeypatch.setattr(sft, "MAX_FILE_BYTES", 4)
  with pytest.raises(generate.UserError, match="over the 4-byte limit"):
    generate.read_jsonl(str(path), "prompts")
