"""xlt.peft_io: xlt LoRA adapters written as PEFT adapters that peft loads onto the base with the
same logits (tests/fixtures/peft, made by tests/fixtures/make_peft_fixtures.py; live where peft is
installed), adapters peft made read back as xlt composites or merged, and exact round trips."""

import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import load_script
from xlt import lora, model, peft_io, pretrained

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF, PEFT = (os.path.join(REPO, "tests", "fixtures", d) for d in ("hf", "peft"))
SCRIPT = load_script("tests/fixtures/make_peft_fixtures.py")
ATOL = 1e-4


def _model(family):
  cfg, params = pretrained.load(os.path.join(HF, family))
  return cfg, params, np.load(os.path.join(HF, family, "input_ids.npy")).astype(np.int32)


def _logits(cfg, params):
  return lambda ids: np.asarray((lora.apply if lora.is_composite(params) else model.apply)(cfg, params, ids)[0])


@pytest.mark.parametrize("family", SCRIPT.FAMILIES)
def test_xlt_writes_the_fixture_adapter_and_peft_gives_its_logits(family, tmp_path):
  cfg, params, ids = _model(family)
  adapters = SCRIPT.xlt_adapters(params)
  config = peft_io.save(cfg, params, adapters, str(tmp_path / "a"), base_model=f"tests/fixtures/hf/{family}")
  fixture = os.path.join(PEFT, family, "xlt_adapter")
  with open(os.path.join(fixture, peft_io.CONFIG)) as f:
    assert json.load(f) == config
  assert config["use_rslora"] and config["lora_alpha"] == pytest.approx(4.0) and config["r"] == 2
  assert config["fan_in_fan_out"] == (family == "gpt2")
  want, got = load_file(os.path.join(fixture, peft_io.WEIGHTS)), load_file(str(tmp_path / "a" / peft_io.WEIGHTS))
  assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
  # peft's logits of the base with this adapter are xlt's adapter forward (merging: tests/test_lora.py)
  peft_logits = np.load(os.path.join(PEFT, family, "xlt_adapter_logits.npy"))
  np.testing.assert_allclose(_logits(cfg, {"base": params, "lora": adapters})(ids), peft_logits, atol=ATOL)
  assert np.abs(_logits(cfg, params)(ids) - peft_logits).max() > 0.5  # the adapter matters


@pytest.mark.parametrize("family", SCRIPT.FAMILIES)
def test_an_adapter_peft_made_reads_as_a_composite_or_merged(family):
  cfg, params, ids = _model(family)
  path = os.path.join(PEFT, family, "peft_adapter")
  want = np.load(os.path.join(PEFT, family, "peft_adapter_logits.npy"))
  composite = peft_io.load(path, cfg, params)
  assert lora.is_composite(composite) and float(composite["lora"]["scale"]) == pytest.approx(5 / 3)  # alpha / r
  np.testing.assert_allclose(_logits(cfg, composite)(ids), want, atol=ATOL)
  np.testing.assert_allclose(_logits(cfg, peft_io.load(path, cfg, params, merged=True))(ids), want, atol=ATOL)


@pytest.mark.parametrize("family", ("llama", "gpt2", "qwen2"))
def test_round_trip_is_exact(family, tmp_path):
  cfg, params, _ = _model(family)
  adapters = SCRIPT.xlt_adapters(params)
  peft_io.save(cfg, params, adapters, str(tmp_path / "a"))
  back = peft_io.read(str(tmp_path / "a"), cfg, params)
  assert jax.tree.structure(back) == jax.tree.structure(adapters)
  for x, y in zip(jax.tree.leaves(adapters), jax.tree.leaves(back)):
    np.testing.assert_array_equal(np.asarray(x), y)
  with pytest.raises(ValueError, match="exists and is not empty"):
    peft_io.save(cfg, params, adapters, str(tmp_path / "a"))


def test_modules_of_one_fused_kernel_with_their_own_lora_a_stack_their_ranks(tmp_path):
  # llama_kv4 has as many key/value heads as query heads: loaded as kernels, xlt fuses q, k, v
  # into attn/qkv
  cfg, params = pretrained.load(os.path.join(HF, "llama_kv4"), dense_layout="kernel")
  assert ("block_0", "attn", "qkv", "kernel") in {tuple(k.key for k in p) for p, _ in
                                                  jax.tree_util.tree_flatten_with_path(params)[0]}
  rng = np.random.default_rng(0)
  base_hf = {k: np.asarray(v) for k, v in pretrained.hf_tensors(cfg, params, "llama").items()}
  factors = {}
  for x in "qkv":
    w = base_hf[f"model.layers.0.self_attn.{x}_proj.weight"]
    factors[x] = (rng.normal(size=(2, w.shape[1])).astype(np.float32), rng.normal(size=(w.shape[0], 2)).astype(
        np.float32))
  save_file({f"{peft_io.PREFIX}model.layers.0.self_attn.{x}_proj.lora_{n}.weight": f[i]
             for x, f in factors.items() for i, n in enumerate("AB")}, str(tmp_path / peft_io.WEIGHTS))
  (tmp_path / peft_io.CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 3.0}))
  adapters = peft_io.read(str(tmp_path), cfg, params)
  assert adapters["block_0"]["attn"]["qkv"]["kernel"]["a"].shape[0] == 6  # three rank-2 factors side by side
  merged = {k: np.asarray(v) for k, v in pretrained.hf_tensors(cfg, peft_io.load(str(tmp_path), cfg, params,
                                                                                  merged=True), "llama").items()}
  for x, (a, b) in factors.items():
    name = f"model.layers.0.self_attn.{x}_proj.weight"
    np.testing.assert_allclose(merged[name] - base_hf[name], 1.5 * b @ a, atol=1e-5)  # scaling alpha / r
  assert np.array_equal(merged["model.layers.1.self_attn.q_proj.weight"],
                        base_hf["model.layers.1.self_attn.q_proj.weight"])


def test_what_is_not_a_lora_adapter_is_one_clear_line(tmp_path):
  cfg, params, _ = _model("llama")
  with pytest.raises(ValueError, match="is not a PEFT adapter: no adapter_config.json"):
    peft_io.read(str(tmp_path), cfg, params)
  (tmp_path / peft_io.CONFIG).write_text(json.dumps({"peft_type": "LORA", "use_dora": True}))
  with pytest.raises(ValueError, match="only plain LoRA adapters"):
    peft_io.read(str(tmp_path), cfg, params)
  (tmp_path / peft_io.CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": 1, "lora_alpha": 1}))
  save_file({f"{peft_io.PREFIX}lm_head.lora_A.weight": np.zeros((1, 16), np.float32)},
            str(tmp_path / peft_io.WEIGHTS))
  with pytest.raises(ValueError, match=r"module lm_head has \['A'\] of the factors A and B"):
    peft_io.read(str(tmp_path), cfg, params)
  save_file({f"{peft_io.PREFIX}lm_head.lora_{n}.weight": np.zeros((1, 1), np.float32) for n in "AB"},
            str(tmp_path / peft_io.WEIGHTS))
  with pytest.raises(ValueError, match="module lm_head is no projection of this model"):
    peft_io.read(str(tmp_path), cfg, params)


@pytest.mark.parametrize("family", SCRIPT.FAMILIES)
def test_live_peft_loads_the_xlt_adapter(family, tmp_path):
  torch = pytest.importorskip("torch")
  peft = pytest.importorskip("peft")
  transformers = pytest.importorskip("transformers")
  cfg, params, ids = _model(family)
  adapters = SCRIPT.xlt_adapters(params)
  peft_io.save(cfg, params, adapters, str(tmp_path / "a"))
  base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(HF, family))
  with torch.no_grad():
    got = peft.PeftModel.from_pretrained(base, str(tmp_path / "a"))(torch.from_numpy(ids.astype(np.int64))).logits
  np.testing.assert_allclose(_logits(cfg, {"base": params, "lora": adapters})(ids), got.numpy(), atol=ATOL)


def _cli_merge(reference, out):
  import subprocess
  import sys
  return subprocess.run([sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py", "--config.method=linear",
                         f"--config.inputs.experts={reference}", f"--config.output={out}"], cwd=REPO,
                        capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO})


def test_pattern_keys_are_read_as_peft_reads_them(tmp_path):
  # alpha_pattern {"q_proj|v_proj": 16}: peft matches (.*\.)?(q_proj|v_proj)$, so v_proj takes 16
  # too; read without the group, v_proj took lora_alpha (before: 9 off in the logits)
  cfg, params, ids = _model("llama")
  adapter = os.path.join(PEFT, "llama", "pattern_adapter")
  want = np.load(os.path.join(PEFT, "llama", "pattern_adapter_logits.npy"))
  r = _cli_merge(f"{os.path.join(HF, 'llama')}+{adapter}", tmp_path / "out")
  assert r.returncode == 0, r.stderr
  merged_cfg, merged = pretrained.load(str(tmp_path / "out"))
  np.testing.assert_allclose(_logits(merged_cfg, merged)(ids), want, atol=ATOL)
  np.testing.assert_allclose(_logits(cfg, peft_io.load(adapter, cfg, params))(ids), want, atol=ATOL)


def _adapter(tmp_path, config: dict, tensors: dict | None = None) -> str:
  """A copy of the pattern adapter with `config` laid over its config (and `tensors` for its factors)."""
  src = os.path.join(PEFT, "llama", "pattern_adapter")
  with open(os.path.join(src, peft_io.CONFIG)) as f:
    full = json.load(f) | config
  out = tmp_path / "adapter"
  out.mkdir(exist_ok=True)
  (out / peft_io.CONFIG).write_text(json.dumps(full))
  save_file(load_file(os.path.join(src, peft_io.WEIGHTS)) if tensors is None else tensors, str(out / peft_io.WEIGHTS))
  return str(out)


@pytest.mark.parametrize("field, value", [("alora_invocation_tokens", [5, 6]), ("layer_replication", [[0, 2], [1, 2]]),
                                          ("target_parameters", ["mlp.experts.gate_up_proj"]),
                                          ("trainable_token_indices", [3]), ("lora_bias", True), ("use_qalora", True),
                                          ("modules_to_save", ["lm_head"]), ("init_lora_weights", "pissa")])
def test_lora_variants_xlt_does_not_model_are_refused_in_one_line(field, value, tmp_path):
  cfg, params, _ = _model("llama")
  with pytest.raises(ValueError, match=rf"adapter_config.json: {field}=.* xlt does not model"):
    peft_io.read(_adapter(tmp_path, {field: value}), cfg, params)


def test_a_variant_on_the_command_line_is_one_line_and_exit_2(tmp_path):
  # before: applied as plain LoRA, 8 to 9 off in the logits, exit 0
  r = _cli_merge(f"{os.path.join(HF, 'llama')}+{_adapter(tmp_path, {'alora_invocation_tokens': [5]})}", tmp_path / "o")
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and "alora_invocation_tokens=[5]" in r.stderr, r.stderr


def test_config_and_factors_that_disagree_name_the_file_and_the_module(tmp_path):
  cfg, params, _ = _model("llama")
  factors = load_file(os.path.join(PEFT, "llama", "pattern_adapter", peft_io.WEIGHTS))
  module = "model.layers.1.self_attn.q_proj"
  with pytest.raises(ValueError, match=r"adapter_model.safetensors: module model.layers.0.self_attn.q_proj has "
                                       r"rank-2 factors, adapter_config.json's r says 4"):
    peft_io.read(_adapter(tmp_path, {"r": 4, "rank_pattern": {"up_proj": 3}}), cfg, params)
  with pytest.raises(ValueError, match=r"module model.layers.0.mlp.up_proj has rank-3 factors, .*'s r says 2"):
    peft_io.read(_adapter(tmp_path, {"rank_pattern": {"up": 3}}), cfg, params)  # peft matches whole names
  with pytest.raises(ValueError, match=r"module model.layers.1.\S+ has LoRA factors that adapter_config.json does "
                                       "not target .* peft would not load them"):
    peft_io.read(_adapter(tmp_path, {"layers_to_transform": [0]}), cfg, params)
  with pytest.raises(ValueError, match="module model.layers.0.mlp.up_proj has LoRA factors that"):
    peft_io.read(_adapter(tmp_path, {"target_modules": ["q_proj", "v_proj"]}), cfg, params)
  bad = dict(factors)
  key = f"{peft_io.PREFIX}{module}.lora_A.weight"
  bad[key] = np.zeros((2, 31), np.float32)
  with pytest.raises(ValueError, match=rf"adapter_model.safetensors: module {module}'s lora_A \[2, 31\] and lora_B "
                                       r"\[32, 2\] do not fit its weight \[32, 32\]"):
    peft_io.read(_adapter(tmp_path, {}, bad), cfg, params)
  bad[key] = np.zeros((3, 32), np.float32)
  with pytest.raises(ValueError, match=rf"module {module}'s lora_A \[3, 32\] and lora_B \[32, 2\] are not \[r, in\]"):
    peft_io.read(_adapter(tmp_path, {}, bad), cfg, params)
