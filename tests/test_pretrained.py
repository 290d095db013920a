"""xlt.pretrained against transformers' own numbers: tests/fixtures/hf/<family> holds tiny random
Hugging Face checkpoints with the logits (and for the newer families a 20-token greedy decode)
transformers computed for them (tests/fixtures/make_hf_fixtures.py)."""

import json
import os

import jax
import numpy as np
import pytest

from conftest import compiled
from xlt import decode, ensemble_decode, model, pretrained, sharding
from xlt.io import hf_dir, tensor_files

apply = compiled(model.apply)

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
FAMILIES = sorted(os.listdir(HF))  # every fixture: each record of xlt.families has one (tests/test_families.py)
DECODED = [f for f in FAMILIES if os.path.exists(os.path.join(HF, f, "greedy_ids.npy"))]


def _fixture(family):
  d = os.path.join(HF, family)
  return d, np.load(os.path.join(d, "input_ids.npy")).astype(np.int32), np.load(os.path.join(d, "logits.npy"))


def _tensors(path):
  return {k: np.asarray(v) for k, v in hf_dir.read_model_dir(path)[1].items()}


def _equal_trees(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(family):
  path, ids, ref = _fixture(family)
  cfg, params = pretrained.load(path)
  logits, _ = apply(cfg, params, ids)
  assert np.abs(np.asarray(logits) - ref).max() <= 1e-4


def test_configs_map_each_family_feature():
  cfgs = {f: pretrained.load(os.path.join(HF, f))[0] for f in ("llama_kv1", "mistral", "qwen2", "qwen3", "gemma2")}
  assert cfgs["llama_kv1"].kv_heads == 1 and cfgs["llama_kv1"].tie_embeddings and cfgs["llama_kv1"].rope_base == 500
  assert dict(cfgs["llama_kv1"].rope_scaling)["original_max_position_embeddings"] == 16
  assert cfgs["mistral"].sliding_window == 4 and cfgs["mistral"].sliding_layers is None
  assert cfgs["qwen2"].qkv_bias and not cfgs["qwen2"].bias
  assert cfgs["qwen3"].qk_norm and cfgs["qwen3"].head_width == 16
  g = cfgs["gemma2"]
  assert (g.sliding_layers, g.post_norms, g.query_pre_attn_scalar, g.embed_scale) == ((0, 2), True, 24, True)


@pytest.mark.parametrize("family", DECODED)
def test_greedy_decode_with_kv_cache_equals_transformers(family):
  path, ids, _ = _fixture(family)
  want = np.load(os.path.join(path, "greedy_ids.npy"))
  cfg, params = pretrained.load(path)
  assert np.array_equal(decode.sample(cfg, params, ids, max_new=20, temperature=0), want)
  p = ids.shape[1]
  out = jax.jit(ensemble_decode.greedy_decode, static_argnums=0, static_argnames=("max_new", "min_prompt"))(
      cfg, params, ids, np.array([p], np.int32), max_new=20, min_prompt=p)
  assert np.array_equal(out, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip_is_bit_exact(family, tmp_path):
  path, ids, _ = _fixture(family)
  cfg, params = pretrained.load(path)
  pretrained.save(cfg, params, str(tmp_path / "out"), source_dir=path)
  cfg2, params2 = pretrained.load(str(tmp_path / "out"))
  assert cfg2 == cfg
  _equal_trees(params, params2)
  saved, source = _tensors(str(tmp_path / "out")), _tensors(path)
  assert saved.keys() == source.keys()
  assert all(np.array_equal(saved[k], source[k]) for k in source)
  config = json.load(open(tmp_path / "out" / "config.json"))
  if cfg.pos_embedding == "rope":  # transformers 5 reads rope_parameters, 4 rope_theta + rope_scaling
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"] == cfg.rope_base
    assert config["rope_scaling"] == (dict(cfg.rope_scaling) or None)
    assert all(config["rope_parameters"][k] == v for k, v in cfg.rope_scaling)


def test_save_without_source_guesses_family_and_shards(tmp_path):
  for family in ("gemma2", "qwen3", "gpt2", "llama_kv1"):
    cfg, params = pretrained.load(os.path.join(HF, family))
    out = str(tmp_path / family)
    summary = pretrained.save(cfg, params, out, max_shard_bytes=20_000, dtype="bfloat16")
    assert "model.safetensors.index.json" in summary["files"]
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["model_type"] == family.split("_")[0] and config["dtype"] == "bfloat16"
    cfg2, params2 = pretrained.load(out, dtype="float32")
    assert cfg2 == cfg
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):  # bfloat16 rounding only
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=2**-8, atol=0)


def test_bfloat16_load_computes_in_bfloat16():
  path, ids, ref = _fixture("gemma")
  cfg, params = pretrained.load(path, dtype="bfloat16")
  assert cfg.dtype == cfg.param_dtype == "bfloat16"
  assert all(x.dtype == np.dtype("bfloat16") for x in jax.tree.leaves(params))
  logits, _ = apply(cfg, params, ids)
  assert np.abs(np.asarray(logits) - ref).max() < 0.5


def test_sharded_load_equals_single_device_load():
  mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
  for family in ("llama_kv1", "gpt2", "gemma2"):
    path, ids, ref = _fixture(family)
    cfg, single = pretrained.load(path)
    cfg8, sharded = pretrained.load(path, mesh=mesh)
    assert cfg8 == cfg
    _equal_trees(single, sharded)
    assert len(sharded["wte"]["embedding"].sharding.device_set) == 8
    logits, _ = jax.jit(model.apply, static_argnums=0)(cfg, sharded, ids)
    assert np.abs(np.asarray(logits) - ref).max() <= 1e-4


def _copy(src, dst, change=None):
  os.makedirs(dst)
  for name in os.listdir(src):
    with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
      g.write(f.read())
  if change:
    config = json.load(open(os.path.join(dst, "config.json")))
    json.dump(change(config), open(os.path.join(dst, "config.json"), "w"))
  return dst


def test_errors_are_one_line(tmp_path):
  llama = os.path.join(HF, "llama")
  cases = [
      (lambda c: c | {"model_type": "falcon", "architectures": ["FalconForCausalLM"]}, ValueError,
       "unknown model_type 'falcon'"),
      (lambda c: c | {"hidden_size": 48}, ValueError, "expected shape"),
      (lambda c: c | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, ValueError, "rope_type 'yarn'"),
  ]
  for i, (change, error, text) in enumerate(cases):
    with pytest.raises(error, match=text) as e:
      pretrained.load(_copy(llama, str(tmp_path / str(i)), change))
    assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="dtype 'int8'") as e:
    pretrained.load(llama, dtype="int8")
  f64 = _copy(llama, str(tmp_path / "f64"))
  tensors = _tensors(llama)
  tensor_files.save(tensors | {"model.norm.weight": tensors["model.norm.weight"].astype(np.float64)},
             os.path.join(f64, "model.safetensors"), {"format": "pt"})
  with pytest.raises(ValueError, match="tensor model.norm.weight has dtype float64"):
    pretrained.load(f64)
  cfg, params = pretrained.load(llama)
  pretrained.save(cfg, params, str(tmp_path / "sharded"), max_shard_bytes=20_000)
  os.remove(str(tmp_path / "sharded" / "model-00002-of-00005.safetensors"))
  with pytest.raises(FileNotFoundError, match="model-00002-of-00005.safetensors") as e:
    pretrained.load(str(tmp_path / "sharded"))
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="not a gemma model"):
    pretrained.save(cfg, params, str(tmp_path / "x"), hf_config=json.load(open(os.path.join(HF, "gemma", "config.json"))))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("llama", "llama_b")])
def test_transformers_reads_what_xlt_saves(family, tmp_path):
  """Live: transformers loads xlt's directory (config.json written from xlt's Config, no
  source_dir) and computes xlt's logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  path, ids, _ = _fixture(family)
  cfg, params = pretrained.load(path)
  # perturbed weights: transformers must read these files, not agree with the fixture by chance
  params = jax.tree.map(lambda x: x * 1.01, params)
  pretrained.save(cfg, params, str(tmp_path / "out"), hf_config={"bos_token_id": 1, "eos_token_id": 2})
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
  with torch.no_grad():
    want = hf_model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
  logits, _ = model.apply(cfg, params, ids)
  assert np.abs(np.asarray(logits) - want).max() <= 1e-4


def _padded(family):
  d = os.path.join(HF, family)
  return tuple(np.load(os.path.join(d, f"padded_{k}.npy")) for k in ("ids", "mask", "logits"))


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_logits_equal_transformers(family):
  """A batch of 3 prompts of different lengths, left-padded (padded_mask.npy): on the real
  positions, xlt's logits are transformers' (without a cache, and from a padded prefill)."""
  ids, mask, ref = _padded(family)
  cfg, params = pretrained.load(os.path.join(HF, family))
  ids = ids.astype(np.int32)
  logits, _ = apply(cfg, params, ids, valid_BxT=mask)
  prefill, _ = apply(cfg, params, ids, model.init_cache(cfg, 3, ids.shape[1] + 2, padded=True), 0,
                           valid_BxT=mask)
  real = mask.astype(bool)
  assert np.abs(np.asarray(logits)[real] - ref[real]).max() <= 1e-4
  assert np.abs(np.asarray(prefill)[real] - ref[real]).max() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_greedy_decode_equals_each_row_alone(family):
  ids, mask, _ = _padded(family)
  cfg, params = pretrained.load(os.path.join(HF, family))
  (b, p), new = ids.shape, 10
  step = jax.jit(model.apply, static_argnums=0)
  cache = model.init_cache(cfg, b, p + new, padded=True)
  logits, cache = step(cfg, params, ids.astype(np.int32), cache, 0, valid_BxT=mask)
  out = []
  for i in range(new):  # decoding steps need no mask: the cache remembers the padding
    out.append(np.asarray(logits[:, -1].argmax(-1), np.int32))
    if i + 1 < new:
      logits, cache = step(cfg, params, out[-1][:, None], cache, p + i)
  for r in range(b):
    alone = ids[r][mask[r] == 1].astype(np.int32)
    want = decode.sample(cfg, params, alone, max_new=new, temperature=0)[len(alone):]
    assert np.array_equal(np.stack(out, 1)[r], want)
