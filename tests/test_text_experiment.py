import importlib.util
import json
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlt import evaluate as eval_lib
from xlt import lm
from xlt import model as model_lib
from xlt import runner, sharding
from xlt.experiments import text as tt
from xlt.data import spm_tokenizer

ROOT = os.path.join(os.path.dirname(__file__), "..")


def load_config(name):
  path = os.path.join(ROOT, "configs", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


_apply = jax.jit(model_lib.apply, static_argnums=0)
CFG = model_lib.Config(vocab_size=50, block_size=24, num_layers=2, num_heads=2, d_model=16)


@pytest.fixture(scope="module")
def params():
  return jax.jit(model_lib.init_params, static_argnums=0)(CFG, jax.random.key(0))


def rows(n=5, t=13, seed=0):
  tokens = np.random.default_rng(seed).integers(4, CFG.vocab_size, (n, t)).astype(np.int32)
  tokens[:, 0] = spm_tokenizer.BOS_ID
  return tokens


# ------------------------------------------------------------------------------- perplexity


def test_uniform_model_perplexity_is_vocab_size(params):
  uniform = {**params, "lm_head": jax.tree.map(jnp.zeros_like, params["lm_head"])}
  tokens = rows()
  mask = np.ones((5, 12), np.float32)
  r = lm.perplexity(CFG, uniform, tokens, mask, batch=2)  # 3 batches, the last one padded
  assert r["tokens"] == 60 and r["ppl_token"] == pytest.approx(CFG.vocab_size, rel=1e-5)
  assert r["nll_sum"] == pytest.approx(60 * np.log(CFG.vocab_size), rel=1e-5)
  stacked = jax.tree.map(lambda *x: jnp.stack(x), uniform, params)  # an ensemble of two
  e = lm.perplexity(CFG, stacked, tokens, mask, batch=2)
  assert e["ppl_token"].shape == (2,)
  assert e["ppl_token"][0] == pytest.approx(CFG.vocab_size, rel=1e-5)
  single = lm.perplexity(CFG, params, tokens, mask, 2)
  assert e["ppl_token"][1] == pytest.approx(single["ppl_token"], rel=1e-5)
  one = lm.perplexity(CFG, stacked, tokens, mask, batch=2, members=[1])  # a sub-ensemble
  assert one["ppl_token"].shape == (1,) and one["ppl_token"][0] == pytest.approx(e["ppl_token"][1])


def test_perplexity_respects_loss_mask(params):
  tokens = rows(seed=1)
  mask = (np.random.default_rng(2).random((5, 12)) < 0.5).astype(np.float32)
  logits, _ = _apply(CFG, params, jnp.asarray(tokens[:, :-1]))
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  nll = -np.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  want = (nll * mask).sum()
  for batch in (2, 5, 64):  # padding of the last batch changes nothing
    r = lm.perplexity(CFG, params, tokens, mask, batch)
    assert r["tokens"] == mask.sum() and r["nll_sum"] == pytest.approx(want, rel=1e-5)
  assert r["ppl_token"] == pytest.approx(np.exp(want / mask.sum()), rel=1e-5)
  with pytest.raises(ValueError, match="loss_mask"):
    lm.perplexity(CFG, params, tokens, mask[:, 1:], 2)


# --------------------------------------------------------------------------------- sampling


def test_sample_greedy_matches_greedy_decode(params):
  prompts = rows(n=3, t=5, seed=3)
  got = lm.sample(CFG, params, prompts, max_new=7, temperature=0.0)
  want = eval_lib.ensemble_decode(CFG, jax.tree.map(lambda x: x[None], params), prompts[None],
                                  np.full((1, 3), 5), max_new=7, min_prompt=5)[0]
  np.testing.assert_array_equal(got, np.asarray(want))
  # Repeated full forward passes (no cache), argmax at the last real position; the buffer is
  # padded to a fixed length, which causal attention ignores.
  buf = np.zeros((3, 12), np.int32)
  buf[:, :5] = prompts
  for t in range(5, 12):
    logits, _ = _apply(CFG, params, jnp.asarray(buf))
    buf[:, t] = np.argmax(np.asarray(logits[:, t - 1]), axis=-1)
  np.testing.assert_array_equal(got, buf)
  np.testing.assert_array_equal(lm.sample(CFG, params, prompts, max_new=7, temperature=1.0,
                                          top_k=1, rng=5), buf)  # top-1 is greedy too


def test_sample_top_k_and_rng(params):
  prompt = rows(n=3, t=5, seed=4)  # the shapes of the test above: no new compile
  a = lm.sample(CFG, params, prompt, max_new=7, temperature=5.0, top_k=3, rng=jax.random.key(1))
  b = lm.sample(CFG, params, prompt, max_new=7, temperature=5.0, top_k=3, rng=jax.random.key(1))
  c = lm.sample(CFG, params, prompt, max_new=7, temperature=5.0, top_k=3, rng=jax.random.key(2))
  np.testing.assert_array_equal(a, b)
  assert a.shape == (3, 12) and (a[:, :5] == prompt).all() and not (a == c).all()
  # Every new token is among the 3 most likely ones given what precedes it.
  logits, _ = _apply(CFG, params, jnp.asarray(a))
  top3 = np.argsort(np.asarray(logits), axis=-1)[:, 4:-1, -3:]
  assert (top3 == a[:, 5:, None]).any(-1).all()
  with pytest.raises(ValueError, match="block_size"):
    lm.sample(CFG, params, prompt, max_new=CFG.block_size)


# ---------------------------------------------------------------------------- experiment

EN = ("the cat", "a dog", "the girl", "a boy", "the bird", "mom")
EN_V = ("saw", "liked", "found", "had", "wanted")
EN_O = ("a ball", "the tree", "a cake", "the sun", "a box")


def corpus_text(seed, n, transform=lambda w: w):
  rng = random.Random(seed)
  sent = lambda: " ".join(transform(rng.choice(x)) for x in (EN, EN_V, EN_O)) + "."
  return [" ".join(sent() for _ in range(rng.randint(3, 6))) for _ in range(n)]


def reverse_words(phrase):  # a second "language": same grammar, other word forms
  return " ".join(w[::-1] + "o" for w in phrase.split())


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  root = tmp_path_factory.mktemp("text_corpora")
  high = root / "high.jsonl"
  high.write_text("".join(json.dumps({"text": d}) + "\n" for d in corpus_text(0, 240)))
  low = root / "low.txt"
  low.write_text("\n<|endoftext|>\n".join(corpus_text(1, 240, reverse_words)))
  return str(high), str(low)


def tiny_config(high, low):
  c = load_config("tinystories")
  c.data.shared_dir = ""
  c.data.high.path, c.data.low.path = high, low
  c.data.low.format = "text"
  c.data.low.max_documents = 0
  c.data.split.held_out_fraction = 0.1
  c.data.num_val_documents = 4
  c.tokenizer.vocab_size = 300
  c.model.update(num_layers=1, num_heads=2, d_model=32, block_size=32)
  c.train.update(batch_size=8, steps=20, eval_every=10, log_every=5, checkpoint_every=100)
  c.opt.update(warmup_steps=2, peak_lr=1e-2)
  c.eval.batch_size = 16
  c.samples.update(max_new=6, num_prompts=1, prompt_words=2)
  c.mesh.data = 1
  return c


def test_text_experiment_end_to_end(corpora, tmp_path, monkeypatch):
  c = tiny_config(*corpora)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  workdir = str(tmp_path / "run")
  rows = runner.run(c, workdir, progress=False, mesh=mesh)
  saved = json.load(open(os.path.join(workdir, "results.json")))
  assert saved == json.loads(json.dumps(rows))
  # Run again on the finished workdir: its results, with nothing built, trained or tested.
  monkeypatch.setattr(tt, "prepare", lambda *a: pytest.fail("a finished workdir prepared data again"))
  assert runner.run(c, workdir, progress=False, mesh=mesh) == saved
  assert {r["condition"] for r in rows} == set(tt.CONDITIONS)
  assert {(r["language"], r["role"]) for r in rows} == {("en", "source"), ("ru", "target")}
  assert {r["metric"] for r in rows} == set(tt.METRICS)
  for r in rows:
    assert all(np.isfinite(v) and v > 1 for v in r["values"]), r
  docs = {(r["condition"], r["language"]): r["samples"] for r in rows}
  assert docs["high_only", "ru"] == 0 and docs["low_limited", "en"] == 0
  assert 0 < docs["low_limited", "ru"] < docs["low_full", "ru"]
  assert docs["mixed", "ru"] == docs["low_limited", "ru"]
  assert docs["mixed", "en"] == docs["high_only", "en"] > 0
  table = open(os.path.join(workdir, "table.md")).read()
  assert "| mixed |" in table and "transfer improvement" in table
  for name in ("curves.png", "train_loss.png", "samples.txt", "summary.json", "results.csv"):
    assert os.path.isfile(os.path.join(workdir, name)), name
  assert "mixed/seed_0 | ru" in open(os.path.join(workdir, "samples.txt")).read()
  assert json.load(open(os.path.join(workdir, "summary.json")))["steps"] == 20


def test_missing_corpus_is_a_clear_error(corpora, tmp_path):
  c = tiny_config(*corpora)
  c.data.low.path = str(tmp_path / "nope.txt")
  with pytest.raises(FileNotFoundError, match=r"config\.data\.low\.path.*nope\.txt"):
    runner.run(c, str(tmp_path / "w"), progress=False)
  c.data.low.path = None
  with pytest.raises(ValueError, match=r"--config\.data\.high\.path="):
    tt.corpus_specs(c)
  c.data.shared_dir = str(tmp_path / "no_shared")
  with pytest.raises(FileNotFoundError, match=r"shared_dir.*--config\.data\.high\.path"):
    tt.corpus_specs(c)


def test_configs_load():
  ref = load_config("tinystories_reference")
  assert (ref.model.d_model, ref.model.num_layers, ref.tokenizer.vocab_size) == (768, 4, 30_000)
  assert ref.train.batch_size // ref.train.grad_accum == 80
  with pytest.raises(ValueError, match=r"config\.data\.high\.path is not set"):
    tt.corpus_specs(ref)
  proxy = load_config("tinystories")
  if not os.path.isdir(os.path.join(ROOT, "..", "shared", "data")):
    pytest.skip("../shared/data is not present")
  specs = tt.corpus_specs(proxy)
  assert (specs["high"].language, specs["low"].language) == ("en", "ru")
  assert all(os.path.isfile(s.path) for s in specs.values())
