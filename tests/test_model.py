import re

import jax
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from xlt import ensemble_decode, matmul, model, param_paths

apply = compiled(model.apply)  # conftest: why, and what a patching test does instead


def _param_count(v, t, l, d, tied=False):
  block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
  return v * d + t * d + l * block + 2 * d + (0 if tied else d * v)


def test_reference_graph_config_parameter_count():
  cfg = model.Config(vocab_size=104, block_size=128, num_layers=6, num_heads=4, d_model=64)
  n = model.count_params(jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0))))  # shapes suffice
  assert n == _param_count(104, 128, 6, 64) == 321536
  assert 2.9e5 < n < 3.5e5  # the reference reports ~3.1e5


def test_reference_addition_config_parameter_count():
  cfg = model.Config(vocab_size=40, block_size=64, num_layers=12, num_heads=8, d_model=128)
  n = model.count_params(jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0))))  # shapes suffice
  assert n == _param_count(40, 64, 12, 128)
  assert 2.3e6 < n < 2.6e6  # the reference reports ~2.5e6


def test_count_params_of_a_stacked_ensemble_is_one_members():
  stacked = {"a": jax.ShapeDtypeStruct((3, 4, 5), jnp.float32), "b": {"c": jnp.zeros((3, 2))}}
  assert model.count_params(stacked) == 66 and model.count_params(stacked, stacked=True) == 22


def test_param_paths_name_block_and_kind():
  cfg = model.Config(vocab_size=10, num_layers=2, num_heads=2, d_model=8)
  params = model.init_params(cfg, jax.random.key(0))
  info = {jax.tree_util.keystr(p): model.path_info(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert info["['block_1']['mlp']['fc']['kernel']"] == (1, "mlp")
  assert info["['block_0']['attn']['qkv']['kernel']"] == (0, "attn")
  assert info["['block_0']['ln_2']['scale']"] == (0, "norm")
  assert info["['wte']['embedding']"] == (None, "embedding")
  assert info["['lm_head']['kernel']"] == (None, "head")
  # every parameter has logical axes of its rank
  axes = model.logical_axes(cfg)
  for x, spec in zip(jax.tree.leaves(params), jax.tree.leaves(axes, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))):
    assert len(spec) == x.ndim


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
def test_causality(pos_embedding):
  cfg = model.Config(vocab_size=20, block_size=16, num_layers=2, num_heads=2, d_model=16,
                     pos_embedding=pos_embedding)
  params = model.init_params(cfg, jax.random.key(1))
  x = jax.random.randint(jax.random.key(2), (2, 10), 0, 20)
  y = x.at[:, 6:].set((x[:, 6:] + 1) % 20)
  lx, _ = apply(cfg, params, x)
  ly, _ = apply(cfg, params, y)
  np.testing.assert_allclose(lx[:, :6], ly[:, :6], atol=1e-6)
  assert not np.allclose(lx[:, 6:], ly[:, 6:])


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
def test_greedy_decode_with_cache_equals_full_forward_argmax(pos_embedding):
  cfg = model.Config(vocab_size=20, block_size=24, num_layers=2, num_heads=2, d_model=16,
                     pos_embedding=pos_embedding)
  params = model.init_params(cfg, jax.random.key(3))
  prompts = np.array([[5, 6, 7, 0], [1, 2, 3, 4]], np.int32)  # lengths 3 and 4
  lens = np.array([3, 4], np.int32)
  out = np.asarray(ensemble_decode.greedy_decode(cfg, params, prompts, lens, max_new=8, min_prompt=3))
  # reference: no cache, the whole sequence recomputed per new token. Padded to one length so it
  # compiles once; causal attention (test_causality) makes the padding after `len(seq)` irrelevant.
  full_logits = jax.jit(lambda toks: model.apply(cfg, params, toks)[0])
  for row, plen in zip(out, lens):
    seq = list(row[:plen])
    for _ in range(out.shape[1] - plen):
      logits = full_logits(jnp.asarray([seq + [0] * (out.shape[1] - len(seq))]))
      seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    np.testing.assert_array_equal(row, seq)



def test_greedy_decode_stops_when_every_row_wrote_eos():
  cfg = model.Config(vocab_size=20, block_size=40, num_layers=2, num_heads=2, d_model=16)
  params = model.init_params(cfg, jax.random.key(5))
  prompts = np.array([[5, 6, 7, 0], [1, 2, 3, 4], [9, 9, 8, 0]], np.int32)
  lens = np.array([3, 4, 3], np.int32)
  full = np.asarray(ensemble_decode.greedy_decode(cfg, params, prompts, lens, max_new=30, min_prompt=3))
  # EOS by rule: the token every row generates soonest, so that every row writes one
  gens = [list(r[l:]) for r, l in zip(full, lens)]
  eos = min(set(gens[0]) & set(gens[1]) & set(gens[2]), key=lambda t: max(g.index(t) for g in gens))
  out = np.asarray(ensemble_decode.greedy_decode(cfg, params, prompts, lens, max_new=30, min_prompt=3, eos_id=eos))
  ends = []
  for row, row_full, plen in zip(out, full, lens):
    end = plen + list(row_full[plen:]).index(eos)
    np.testing.assert_array_equal(row[:end + 1], row_full[:end + 1])  # the same answer, EOS included
    ends.append(end)
  assert max(ends) < out.shape[1] - 1, "the test needs a batch that ends early"
  np.testing.assert_array_equal(out[:, max(ends) + 1:], 0)  # nothing decoded after the last EOS

def test_rope_attention_depends_only_on_offsets():
  # q.k after rotation is a function of the position offset: shifting both by 7 keeps it
  q, k = jax.random.normal(jax.random.key(0), (2, 1, 5, 3, 8))
  pos = jnp.arange(5)
  dots = jnp.einsum("bthk,bshk->bhts", model.rope(q, pos, 1e4), model.rope(k, pos, 1e4))
  shifted = jnp.einsum("bthk,bshk->bhts", model.rope(q, pos + 7, 1e4), model.rope(k, pos + 7, 1e4))
  np.testing.assert_allclose(dots, shifted, atol=1e-4)
  # position 0 is the identity, and rotation keeps the norm
  np.testing.assert_allclose(model.rope(q, jnp.zeros(5, int), 1e4), q, atol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(model.rope(q, pos, 1e4), axis=-1),
                             jnp.linalg.norm(q, axis=-1), rtol=1e-5)
  # and a rope model has no position table
  cfg = model.Config(vocab_size=10, num_layers=1, num_heads=2, d_model=8, pos_embedding="rope")
  assert "wpe" not in model.init_params(cfg, jax.random.key(0))


def test_bad_model_config():
  with pytest.raises(ValueError, match="not divisible by num_heads"):
    model.Config(vocab_size=10, d_model=30, num_heads=4)
  with pytest.raises(ValueError, match="must be positive"):
    model.Config(vocab_size=0)
  with pytest.raises(ValueError, match="pos_embedding"):
    model.Config(vocab_size=10, pos_embedding="alibi")
  for bad in (-0.1, 1.0, 1e-6):
    with pytest.raises(ValueError, match="dropout"):
      model.Config(vocab_size=10, dropout=bad)


def test_dropout_rate_scale_and_key():
  x = jnp.arange(1, 200_001, dtype=jnp.float32).reshape(400, 500)
  y = np.asarray(model.dropout(jax.random.key(0), x, 0.05))
  kept = y != 0
  keep = 1 - 3277 / 65536  # 0.05 rounded to a multiple of 2^-16
  np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / keep, rtol=1e-6)
  assert abs((~kept).mean() - 0.05) < 0.002  # 200k draws: std ~0.0005
  # the same key draws the same mask (also under jit); another key another mask
  np.testing.assert_array_equal(np.asarray(jax.jit(model.dropout, static_argnums=2)(jax.random.key(0), x, 0.05)), y)
  other = np.asarray(model.dropout(jax.random.key(1), x, 0.05)) != 0
  assert (other != kept).mean() > 0.05
  # rows are not copies of each other (the mask is drawn per entry, not per row)
  assert len({row.tobytes() for row in kept}) == kept.shape[0]
  assert model.dropout(jax.random.key(0), x.astype(jnp.bfloat16), 0.5).dtype == jnp.bfloat16


def test_dropout_only_when_training_with_an_rng():
  cfg = model.Config(vocab_size=40, block_size=16, num_layers=2, num_heads=2, d_model=16, dropout=0.5)
  params = model.init_params(cfg, jax.random.key(0))
  tokens = (jnp.arange(24).reshape(2, 12) * 7) % 40
  plain, _ = apply(model.Config(**{**cfg.__dict__, "dropout": 0.0}), params, tokens)
  evaluated, _ = apply(cfg, params, tokens)  # no rng: no dropout, exactly
  np.testing.assert_array_equal(np.asarray(evaluated), np.asarray(plain))
  a, b, other = (apply(cfg, params, tokens, dropout_rng=jax.random.key(k))[0] for k in (1, 1, 2))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the rng decides the masks
  assert not np.allclose(a, plain) and not np.allclose(a, other)
  # and decoding (evaluation) is the dropout-free model's
  prompts, lens = np.asarray(tokens[:, :4], np.int32), np.full((2,), 4, np.int32)
  got = ensemble_decode.greedy_decode(cfg, params, prompts, lens, max_new=6, min_prompt=4)
  want = ensemble_decode.greedy_decode(model.Config(**{**cfg.__dict__, "dropout": 0.0}), params, prompts, lens,
                                max_new=6, min_prompt=4)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_causal_attention_and_its_gradient_equal_the_plain_softmax():
  """The normalise-after-values order (and the stop_gradient on the row max) changes
  neither the attention nor its gradient."""
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 3, 7, 4)) * 3 for i in range(3))
  mask = jnp.tril(jnp.ones((7, 7), bool))

  def plain(q, k, v):
    s = jnp.where(mask, jnp.einsum("bhtk,bhsk->bhts", q, k), -jnp.inf)
    return jnp.einsum("bhts,bhsk->bthk", jax.nn.softmax(s, -1), v)

  def loss(f):
    return lambda *a: (f(*a) * jnp.arange(4.0)).sum()

  np.testing.assert_allclose(model.causal_attention(q, k, v, mask), plain(q, k, v), rtol=1e-5, atol=1e-6)
  for g, g_plain in zip(jax.jit(jax.grad(loss(model.causal_attention), (0, 1, 2)))(q, k, v, mask),
                        jax.jit(jax.grad(loss(plain), (0, 1, 2)))(q, k, v)):
    # gradients are O(1); scores reach ~30, whose float32 rounding moves exp() by ~1e-5
    # (an AMD EPYC's matmul kernels differed from the plain order by 1.5e-5 in places)
    np.testing.assert_allclose(g, g_plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_one_query_against_grouped_heads_equals_the_heads_repeated(softcap):
  """A decoding step's attention with fewer key/value heads than query heads (computed in the
  grouped layout on a CPU) equals the attention with each key/value head repeated for its
  queries, as transformers' repeat_kv does; dropout still sees the weights [B, H, 1, S]."""
  q = jax.random.normal(jax.random.key(0), (3, 6, 1, 4)) * 3
  k, v = (jax.random.normal(jax.random.key(i), (3, 2, 9, 4)) * 3 for i in (1, 2))
  mask = jnp.arange(9)[None, None, None, :] < jnp.asarray([9, 4, 1])[:, None, None, None]  # each row's cache
  repeat = lambda x: jnp.repeat(x, 3, axis=1)  # noqa: E731  (query head h reads key/value head h // 3)
  shapes = []
  drop = lambda p: (shapes.append(p.shape), p * 0.5)[1]  # noqa: E731  (halved weights, normalised as before)
  attend = jax.jit(lambda q, k, v: model.causal_attention(q, k, v, mask, drop, softcap=softcap))
  got, want = attend(q, k, v), attend(q, repeat(k), repeat(v))
  assert got.shape == (3, 1, 6, 4) and shapes == [(3, 6, 1, 9)] * 2
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunks", [2, 3, 7, 9])
def test_causal_attention_in_query_chunks_equals_one_chunk(chunks):
  """Chunks of queries that attend only to the keys up to their last position compute the
  same attention and gradients as one chunk over all keys (uneven chunks, and more chunks
  than positions, included)."""
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 3, 7, 4)) * 3 for i in range(3))
  mask = jnp.tril(jnp.ones((7, 7), bool))
  loss = lambda n: lambda *a: (model.causal_attention(*a, mask, query_chunks=n) * jnp.arange(4.0)).sum()
  np.testing.assert_allclose(model.causal_attention(q, k, v, mask, query_chunks=chunks),
                             model.causal_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)
  grad = lambda n: jax.jit(jax.grad(loss(n), (0, 1, 2)))(q, k, v)
  for g, g_one in zip(grad(chunks), grad(1)):
    np.testing.assert_allclose(g, g_one, rtol=1e-4, atol=1e-4)


def test_causal_attention_in_chunks_refuses_a_cache_longer_than_the_queries():
  """Chunks assume the keys are the queries' own positions; a decoding step's cache is not."""
  q, k = jnp.ones((1, 2, 4, 8)), jnp.ones((1, 2, 6, 8))
  with pytest.raises(ValueError, match="query_chunks=2 needs self-attention"):
    model.causal_attention(q, k, k, jnp.ones((4, 6), bool), query_chunks=2)


def test_query_chunks_per_length_on_cpu():
  """floor(sqrt(T / 32)) chunks on CPU: one below 128 tokens, 2 at 128, 4 at 512 (xlt.matmul)."""
  if jax.default_backend() != "cpu":
    pytest.skip("the count is the CPU's; elsewhere it is 1")
  assert [matmul.causal_query_chunks(t) for t in (1, 13, 29, 63, 64, 128, 288, 512)] == [1, 1, 1, 1, 1, 2, 3, 4]


def test_model_with_chunked_attention_equals_one_chunk(monkeypatch):
  """A whole model over 128 tokens (2 chunks on CPU) gives the logits it gives with one."""
  cfg = model.Config(vocab_size=11, block_size=128, num_layers=2, num_heads=2, d_model=8)
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 128), 0, 11)
  chunked = jax.jit(lambda t: model.apply(cfg, params, t)[0])(tokens)
  monkeypatch.setattr(matmul, "causal_query_chunks", lambda t: 1)
  one = jax.jit(lambda t: model.apply(cfg, params, t)[0])(tokens)  # a fresh function: traced with the patch
  np.testing.assert_allclose(chunked, one, rtol=1e-5, atol=1e-5)


def test_attention_benchmark_variants_compute_xlts_attention():
  """benchmarks/attention.py times its variants as alternatives to xlt's: they must agree."""
  from benchmarks import attention

  q, k, v = (jax.random.normal(jax.random.key(i), (2, 3, 7, 4)) for i in range(3))
  mask = jnp.tril(jnp.ones((7, 7), bool))
  want = model.causal_attention(q, k, v, mask)
  for name, fn in attention.VARIANTS.items():
    np.testing.assert_allclose(fn(q, k, v, mask), want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_gelu_and_its_derivative_equal_flax():
  x = jnp.linspace(-8.0, 8.0, 2001)
  np.testing.assert_array_equal(model.gelu(x), nn.gelu(x))
  np.testing.assert_allclose(jax.vmap(jax.grad(model.gelu))(x), jax.vmap(jax.grad(nn.gelu))(x), atol=2e-6)


def test_benchmark_flax_masks_are_nn_dropout():
  # benchmarks/dropout.py times flax's masks through its own function: it must be nn.Dropout's
  from benchmarks import dropout as bench

  x = jnp.arange(1.0, 1001.0).reshape(10, 100)
  want = nn.Dropout(0.3, deterministic=False).apply({}, x, rng=jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(bench.flax_masks(jax.random.key(3), x, 0.3)), np.asarray(want))


# ---- the options for Hugging Face decoders (xlt.pretrained checks each against transformers)

# every option on at once: GQA, explicit head width, gated MLP, Gemma's norms and scales, a
# sliding window on layer 0 only, soft-capping
_HF_STYLE = dict(vocab_size=24, block_size=24, num_layers=2, num_heads=4, d_model=16, pos_embedding="rope",
                 num_kv_heads=2, head_dim=6, norm="rmsnorm_plus_one", mlp="geglu", mlp_dim=20, bias=False,
                 qkv_bias=True, qk_norm=True, post_norms=True, embed_scale=True, attn_logit_softcap=3.0,
                 final_logit_softcap=8.0, sliding_window=3, sliding_layers=(0,), query_pre_attn_scalar=5.0,
                 rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8})


def test_hf_style_params_paths_axes_and_cache():
  cfg = model.Config(**_HF_STYLE)
  params = model.init_params(cfg, jax.random.key(0))
  attn, blk = params["block_0"]["attn"], params["block_0"]
  assert attn["q"]["kernel"].shape == (16, 4, 6) and attn["k"]["kernel"].shape == (16, 2, 6)
  assert attn["q"]["bias"].shape == (4, 6) and "bias" not in attn["proj"] and attn["q_norm"]["scale"].shape == (6,)
  assert set(blk["mlp"]) == {"gate", "up", "proj"} and "bias" not in blk["mlp"]["up"]
  assert {"ln_1", "ln_1_post", "ln_2", "ln_2_post"} <= set(blk) and "bias" not in blk["ln_1"]
  assert np.all(np.asarray(blk["ln_1"]["scale"]) == 0)  # (1 + w) norms start at w = 0
  assert model.path_info(("block_0", "ln_2_post", "scale")) == (0, "norm")
  assert model.path_info(("block_1", "attn", "k_norm", "scale")) == (1, "attn")
  assert param_paths.XLT.num_rows(("block_0", "attn", "k", "kernel"), (16, 2, 6)) == 12
  assert model.logical_axes(cfg)["block_0"]["attn"]["k"]["kernel"] == jax.sharding.PartitionSpec(
      "embed", "kv_heads", "kv")
  assert model.init_cache(cfg, 3, 10)[0][0].shape == (3, 2, 10, 6)  # key/value heads are cached
  fused = model.init_params(model.Config(**(_HF_STYLE | {"num_kv_heads": 4})), jax.random.key(0))
  assert fused["block_0"]["attn"]["qkv"]["kernel"].shape == (16, 3, 4, 6)
  bf16 = model.init_params(model.Config(**(_HF_STYLE | {"param_dtype": "bfloat16"})), jax.random.key(0))
  assert {x.dtype for x in jax.tree.leaves(bf16)} == {jnp.dtype("bfloat16")}


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_hf_style_decode_with_cache_equals_full_forward(kv_heads):
  cfg = model.Config(**(_HF_STYLE | {"num_kv_heads": kv_heads}))
  params = jax.tree.map(lambda x: x + 0.1, model.init_params(cfg, jax.random.key(1)))  # norms away from 0
  toks = jax.random.randint(jax.random.key(2), (2, 12), 0, 24)
  full, _ = apply(cfg, params, toks)
  cache = model.init_cache(cfg, 2, 12)
  first, cache = apply(cfg, params, toks[:, :5], cache, 0)
  steps = [first]
  for i in range(5, 12):
    step, cache = apply(cfg, params, toks[:, i:i + 1], cache, i)
    steps.append(step)
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
  assert np.abs(full).max() <= 8.0  # the final soft-cap


def test_sliding_window_hides_tokens_beyond_it():
  cfg = model.Config(**(_HF_STYLE | {"num_layers": 1, "sliding_layers": None}))
  params = model.init_params(cfg, jax.random.key(1))
  x = jax.random.randint(jax.random.key(2), (1, 10), 0, 24)
  lx, _ = apply(cfg, params, x)
  ly, _ = apply(cfg, params, x.at[:, 4].set((x[:, 4] + 1) % 24))
  np.testing.assert_allclose(lx[:, 7:], ly[:, 7:], atol=1e-6)  # position 4 is out of 7's window of 3
  assert not np.allclose(lx[:, 4:7], ly[:, 4:7])


def test_bad_hf_style_options():
  for change, text in [({"norm": "batchnorm"}, "model.norm"), ({"mlp": "relu"}, "model.mlp"),
                       ({"num_kv_heads": 3}, "num_kv_heads"), ({"sliding_layers": (5,)}, "sliding_layers"),
                       ({"rope_scaling": {"rope_type": "yarn"}}, "llama3")]:
    with pytest.raises(ValueError, match=text):
      model.Config(**(_HF_STYLE | change))


# ---- left-padded batches (apply's valid_BxT; transformers' left padding: tests/test_pretrained.py)

def _left_pad(rows, length, pad_id=0):
  ids, valid = np.full((len(rows), length), pad_id, np.int32), np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    ids[i, length - len(row):], valid[i, length - len(row):] = row, 1
  return ids, valid


@pytest.mark.parametrize("options", [{}, _HF_STYLE])
def test_left_padded_rows_equal_each_row_alone(options):
  """Learned positions (GPT-2) and every HF option (rope, GQA, a sliding window of 3 that the
  padding must not shift); no cache, a padded prefill, and decoding steps after it."""
  cfg = model.Config(**({"vocab_size": 24, "block_size": 24, "num_layers": 2, "num_heads": 2, "d_model": 16}
                        | options))
  params = model.init_params(cfg, jax.random.key(1))
  if options:  # Gemma's (1 + w) norms away from w = 0 (shifting GPT-2's LayerNorms ill-conditions them)
    params = jax.tree.map(lambda x: x + 0.1, params)
  toks = np.asarray(jax.random.randint(jax.random.key(2), (3, 12), 1, 24))
  lens = np.array([9, 4, 7])
  rows = [toks[r, :n] for r, n in enumerate(lens)]
  ids, valid = _left_pad(rows, 9)
  padded, _ = apply(cfg, params, ids, valid_BxT=valid)
  cache = model.init_cache(cfg, 3, 12, padded=True)
  prefill, cache = apply(cfg, params, ids, cache, 0, valid_BxT=valid)
  steps = []
  for i in range(3):  # the rows' next tokens, in the same slots 9, 10, 11
    step, cache = apply(cfg, params, toks[np.arange(3), lens + i][:, None], cache, 9 + i)
    steps.append(step)
  for r, row in enumerate(rows):
    n = len(row)
    alone, _ = apply(cfg, params, toks[r:r + 1, :n + 3])
    np.testing.assert_allclose(padded[r, 9 - n:], alone[0, :n], atol=1e-5)
    np.testing.assert_allclose(prefill[r, 9 - n:], alone[0, :n], atol=1e-5)
    np.testing.assert_allclose(np.concatenate(steps, 1)[r], alone[0, n:], atol=1e-5)
  assert not np.isnan(np.asarray(padded)).any()  # the padding's own (unused) logits too


def test_all_valid_equals_no_padding_and_query_chunks():
  """valid_BxT of ones is the unpadded forward; a long left-padded prefill (cut into query
  chunks on CPU) equals the row alone."""
  cfg = model.Config(vocab_size=24, block_size=160, num_layers=1, num_heads=2, d_model=16, pos_embedding="rope")
  params = model.init_params(cfg, jax.random.key(1))
  toks = np.asarray(jax.random.randint(jax.random.key(2), (2, 150), 1, 24))
  plain, _ = apply(cfg, params, toks)
  ones, _ = apply(cfg, params, toks, valid_BxT=np.ones_like(toks))
  np.testing.assert_allclose(ones, plain, atol=1e-6)
  ids, valid = _left_pad([toks[0], toks[1, :100]], 150)
  cache = model.init_cache(cfg, 2, 150, padded=True)
  padded, cache = apply(cfg, params, ids, cache, 0, valid_BxT=valid)
  np.testing.assert_allclose(padded[1, 50:], plain[1, :100], atol=1e-5)
  np.testing.assert_array_equal(cache.valid_BxS, valid.astype(bool))


def test_valid_with_plain_cache_is_an_error():
  cfg = model.Config(vocab_size=24, num_layers=1, num_heads=2, d_model=16)
  params = model.init_params(cfg, jax.random.key(1))
  with pytest.raises(ValueError, match="padded=True"):
    model.apply(cfg, params, np.ones((1, 4), np.int32), model.init_cache(cfg, 1, 8), 0,
                valid_BxT=np.ones((1, 4), np.int32))


@pytest.mark.parametrize("tie", [True, False])
def test_head_runs_in_the_compute_dtype_over_float32_parameters(tie):
  # the tied head as flax's attend: promoted to float32 parameters it ran as float32 products
  cfg = model.Config(vocab_size=97, block_size=8, num_layers=1, num_heads=2, d_model=16, dtype="bfloat16",
                     param_dtype="float32", tie_embeddings=tie)
  params = model.init_params(cfg, jax.random.key(0))
  text = jax.jit(lambda p: model.apply(cfg, p, jnp.zeros((1, 8), jnp.int32))[0]).lower(params).as_text()
  heads = [line for line in text.splitlines() if "dot_general" in line and re.search(r"-> tensor<[0-9x]*x97x", line)]
  assert heads and all("f32" not in line for line in heads), heads
