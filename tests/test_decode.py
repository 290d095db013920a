"""xlt.decode: logits and token log-probabilities of left-padded batches against transformers'
(the fixtures' padded_logits.npy), greedy decoding that says why each row stopped, and every
one of them on a data x fsdp x tensor mesh of the 8 CPU devices equal to the one-device run."""

from __future__ import annotations

import os

import numpy as np
import pytest

from xlt import decode
from xlt import pretrained

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")


@pytest.fixture(scope="module")
def llama():
  """The MQA / llama3-rope fixture, with transformers' 20 greedy tokens after its prompt."""
  d = os.path.join(FIXTURES, "llama_kv1")
  cfg, params = pretrained.load(d)
  return cfg, params, np.load(os.path.join(d, "input_ids.npy"))[0].tolist(), np.load(
      os.path.join(d, "greedy_ids.npy"))[0].tolist(), d


def test_left_pad_and_positions():
  tokens, valid = decode.left_pad([[5, 6, 7], [8]], multiple=4)
  assert tokens.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0], [0, 0, 0]]
  assert valid.tolist() == [[True] * 3, [False, False, True], [False] * 3, [False] * 3]
  assert decode.positions(valid)[:2].tolist() == [[0, 1, 2], [0, 0, 0]]
  with pytest.raises(ValueError, match="more than the padded length"):
    decode.left_pad([[1, 2, 3]], 2)


def test_parse_mesh():
  assert decode.parse_mesh("data=4,tensor=2") == {"data": 4, "tensor": 2}
  assert decode.parse_mesh(None) is None and decode.make_mesh("") is None
  with pytest.raises(ValueError, match="AXIS=SIZE"):
    decode.parse_mesh("rows=4")


def test_padded_logits_and_logprobs_match_transformers(llama):
  cfg, params, _, _, d = llama
  ids, mask = np.load(os.path.join(d, "padded_ids.npy")), np.load(os.path.join(d, "padded_mask.npy"))
  theirs = np.load(os.path.join(d, "padded_logits.npy"))
  ours = decode.logits(cfg, params, ids, mask)
  assert np.abs(ours - theirs)[mask == 1].max() < 1e-4
  logp, greedy = decode.token_logprobs(cfg, params, ids, mask)
  want = theirs - np.log(np.exp(theirs).sum(-1, keepdims=True))
  want = np.take_along_axis(want[:, :-1], ids[:, 1:, None], axis=-1)[..., 0]
  real = (mask[:, :-1] == 1)
  assert np.abs(logp - want)[real].max() < 1e-4
  assert (greedy == (theirs[:, :-1].argmax(-1) == ids[:, 1:]))[real].all()


def _continuations(prompt, multiple=1):
  """Rows as (prefix, window) pairs: two windows after one prefix, an empty prefix, a
  window with padding; and the same rows whole, for token_logprobs."""
  pairs = [(prompt[:6], prompt[6:9]), (prompt[:6], [prompt[5], 11, 12, 13, 14]), ([], prompt[:4]),
           (prompt[2:4], prompt[4:6])]
  prefixes = [prompt[:6], [], prompt[2:4]]
  owner = [0, 0, 1, 2]
  prefix, prefix_valid = decode.left_pad(prefixes, 8, multiple=multiple)
  window, window_valid = np.zeros((len(pairs), 6), np.int32), np.zeros((len(pairs), 6), bool)
  for r, (_, w) in enumerate(pairs):
    window[r, :len(w)], window_valid[r, :len(w)] = w, True
  whole = decode.left_pad([list(a) + list(w) for a, w in pairs])
  return (prefix, prefix_valid, owner, window, window_valid), whole, [len(w) - 1 for _, w in pairs]


def test_continuation_logprobs_equal_token_logprobs(llama):
  """A prefix run once for two windows, an empty one, right-padded windows: the log-probs of
  each window's targets are those of the whole row."""
  cfg, params, prompt, _, _ = llama
  args, (tokens, valid), n = _continuations(prompt)
  logp, greedy = decode.continuation_logprobs(cfg, params, *args)
  want, want_greedy = decode.token_logprobs(cfg, params, tokens, valid)
  for r, k in enumerate(n):
    np.testing.assert_allclose(logp[r, :k], want[r, -k:], atol=1e-5)
    assert (greedy[r, :k] == want_greedy[r, -k:]).all()
  with pytest.raises(ValueError, match="owner names a prefix"):
    decode.continuation_logprobs(cfg, params, *args[:2], [0, 0, 1, 3], *args[3:])


def test_greedy_reports_stops(llama):
  cfg, params, prompt, theirs, _ = llama
  new = theirs[len(prompt):]
  out = decode.greedy(cfg, params, [prompt, prompt[4:]], max_new=20)
  assert out.ids[0] == new and out.stopped == [None, None]
  stop = new[6]
  out = decode.greedy(cfg, params, [prompt], max_new=20, stop_ids=[stop, 63 if stop != 63 else 62])
  assert out.ids[0] == new[:new.index(stop)] and out.stopped[0] == stop
  # a host stop (a stop string) ends a row after the chunk where it first says so
  out = decode.greedy(cfg, params, [prompt, prompt], max_new=20, stop=lambda r, ids: r == 1 and len(ids) >= 3,
                      chunk=4)
  assert out.ids[0] == new and out.stopped == [None, "stop"] and out.ids[1] == new[:4]
  with pytest.raises(ValueError, match="exceeds the model's context"):
    decode.greedy(cfg, params, [prompt], max_new=cfg.block_size)


def test_cpu_data_mesh_spans_the_cpu_devices(llama):
  """The 8 CPU devices (tests/conftest.py) as one data axis: rows split 8 ways, the parameters
  replicated, and a batch's greedy tokens those of one device."""
  import jax

  assert jax.device_count() == 8 and decode.cpu_data_mesh() == "data=8"
  cfg, params, prompt, _, _ = llama
  mesh = decode.make_mesh(decode.cpu_data_mesh())
  assert mesh.shape["data"] == 8 and decode.rows_multiple(mesh) == 8
  placed = decode.place(cfg, params, mesh)
  rows = [prompt, prompt[2:], [7, 9]]
  assert decode.greedy(cfg, placed, rows, max_new=6, mesh=mesh) == decode.greedy(cfg, params, rows, max_new=6)


def test_sharded_equals_one_device(llama):
  """data=2, fsdp=2, tensor=2: rows over data x fsdp, parameters over fsdp (embed) and tensor."""
  cfg, params, prompt, theirs, _ = llama
  mesh = decode.make_mesh("data=2,fsdp=2,tensor=2")
  placed = decode.place(cfg, params, mesh)
  assert not placed["wte"]["embedding"].sharding.is_fully_replicated
  rows = [prompt, prompt[3:], prompt[:5], [7, 9]]
  tokens, valid = decode.left_pad(rows, multiple=decode.rows_multiple(mesh))
  a = decode.token_logprobs(cfg, params, tokens, valid)
  b = decode.token_logprobs(cfg, placed, tokens, valid, mesh=mesh)
  assert np.abs(a[0] - b[0]).max() < 1e-5 and (a[1] == b[1]).all()
  np.testing.assert_allclose(decode.logits(cfg, placed, tokens, valid, mesh=mesh),
                             decode.logits(cfg, params, tokens, valid), atol=1e-5)
  one = decode.greedy(cfg, params, rows[:3], max_new=16, stop_ids=[theirs[len(prompt) + 5]])
  many = decode.greedy(cfg, placed, rows[:3], max_new=16, stop_ids=[theirs[len(prompt) + 5]], mesh=mesh)
  assert one == many and one.stopped[0] == theirs[len(prompt) + 5]
  with pytest.raises(ValueError, match="do not split over the mesh"):
    decode.logits(cfg, placed, tokens[:3], valid[:3], mesh=mesh)
  args, _, _ = _continuations(prompt, multiple=4)
  args = args[:2] + ([0, 0, 1, 2], *args[3:])
  one, many = (decode.continuation_logprobs(cfg, p, *args, mesh=m) for p, m in ((params, None), (placed, mesh)))
  assert np.abs(one[0] - many[0]).max() < 1e-5 and (one[1] == many[1]).all()


def test_generate_command_with_a_mesh(tmp_path):
  """xlt.generate --mesh: the same continuations as on one device; a bad mesh is one line, exit 2."""
  from xlt import generate

  d = os.path.join(FIXTURES, "llama")
  prompts = tmp_path / "p.jsonl"
  prompts.write_text('{"prompt": "w1 w2 w3"}\n{"prompt": "w7 w30 w5 w8 w9 w11"}\n{"prompt": "w12"}\n')
  outs = []
  for mesh in ([], ["--mesh=data=4,tensor=2"]):
    out = tmp_path / f"out{len(mesh)}.jsonl"
    assert generate.main(["--model", d, "--prompts", str(prompts), "--output", str(out), "--max_new=8"] + mesh) == 0
    outs.append(out.read_text())
  assert outs[0] == outs[1]
  assert generate.main(["--model", d, "--prompts", str(prompts), "--output", str(tmp_path / "x"),
                        "--mesh=data=3"]) == 2
