"""The merge tool as a mergekit user meets it: any architecture's names for the methods that
read no blocks, naming rules for those that do, one-line errors naming the file and tensor,
vocabularies that differ, and mergekit YAML configs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from xlt import merge
from xlt.io import tensor_files as files
from xlt.merge import from_mergekit, registry, tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}


def neox(seed: int, layers: int = 4, d: int = 8, v: int = 16) -> dict:
  """A tiny GPT-NeoX-named checkpoint: no rule of xlt.param_paths knows these names."""
  rng = np.random.default_rng(seed)
  shapes = {"gpt_neox.embed_in.weight": (v, d), "gpt_neox.final_layer_norm.weight": (d,),
            "embed_out.weight": (v, d)}
  for i in range(layers):
    p = f"gpt_neox.layers.{i}."
    shapes |= {p + "attention.query_key_value.weight": (3 * d, d), p + "attention.dense.weight": (d, d),
               p + "mlp.dense_h_to_4h.weight": (2 * d, d), p + "mlp.dense_4h_to_h.bias": (d,),
               p + "input_layernorm.weight": (d,)}
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def llama(seed: int, v: int = 16, d: int = 8, layers: int = 2) -> dict:
  rng = np.random.default_rng(seed)
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
  for i in range(layers):
    shapes |= {f"model.layers.{i}.self_attn.q_proj.weight": (d, d), f"model.layers.{i}.mlp.up_proj.weight": (d, d)}
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def save(tmp_path, name: str, tensors: dict, config: dict | None = None) -> str:
  """A checkpoint: a model directory with config.json when `config` is given, else a file."""
  if config is None:
    files.save(tensors, str(tmp_path / f"{name}.safetensors"))
    return str(tmp_path / f"{name}.safetensors")
  os.makedirs(tmp_path / name, exist_ok=True)
  files.save(tensors, str(tmp_path / name / "model.safetensors"), metadata={"format": "pt"})
  with open(tmp_path / name / "config.json", "w") as f:
    json.dump(config, f)
  return str(tmp_path / name)


def cli(*args, cwd=REPO):
  return subprocess.run([sys.executable, "-m", "xlt.merge", *args], cwd=cwd, env=ENV, capture_output=True,
                        text=True)


# ---- 1. names only where needed


def test_registry_marks_layer_aware_methods():
  get = registry.get
  assert get("layer_swap").uses_layers() and get("maet").uses_layers() and get("sparsify_rows").uses_layers()
  assert get("della").uses_layers() and get("arcee_fusion").uses_layers()
  for name in ("soup", "task_arithmetic", "ties", "dare", "dare_ties", "breadcrumbs", "sce", "karcher", "ram"):
    assert not get(name).uses_layers(), name
  assert not get("slerp").uses_layers({"t": 0.5}) and get("slerp").uses_layers({"t": [0, 1]})
  assert get("model_stock").uses_layers({"filter_wise": True}) and not get("model_stock").uses_layers()
  assert get("nuslerp").uses_layers({"flatten": False}) and not get("nuslerp").uses_layers({})
  assert get("task_arithmetic").uses_layers({"masks": {"w": True}})  # a neuron mask reads rows
  assert "needs a naming rule" in registry.describe("layer_swap")


def test_a_block_pattern_that_matches_no_tensor_is_an_error():
  with pytest.raises(ValueError, match="matches no tensor name"):
    registry.naming_for_method(registry.get("layer_swap"), {}, ["a.b"], "h.{i}.")


def test_any_names_merge_without_a_rule(tmp_path):
  """task_arithmetic on GPT-NeoX names and a soup of Llama names with GPT-J's lm_head.bias."""
  base, a, b = neox(0), neox(1), neox(2)
  p = [save(tmp_path, n, t) for n, t in (("base", base), ("a", a), ("b", b))]
  summary = tool.merge_files({"base": p[0], "experts": p[1:]}, "task_arithmetic", str(tmp_path / "out"),
                             {"lambdas": 0.5})
  assert summary["naming"] == "unnamed" and summary["heatmaps"] == [] and "heatmaps_skipped" in summary
  got = load_file(str(tmp_path / "out" / "model.safetensors"))
  for k in base:
    np.testing.assert_allclose(got[k], base[k] + 0.5 * (a[k] - base[k]) + 0.5 * (b[k] - base[k]), rtol=1e-6)
  gptj = [llama(i) | {"lm_head.bias": np.full(16, i, np.float32)} for i in range(2)]
  q = [save(tmp_path, f"j{i}", t) for i, t in enumerate(gptj)]
  tool.merge_files({"experts": q}, "soup", str(tmp_path / "soup"))
  np.testing.assert_allclose(load_file(str(tmp_path / "soup" / "model.safetensors"))["lm_head.bias"], 0.5)


def test_layer_aware_method_needs_and_takes_a_rule(tmp_path):
  task, lang = neox(1), neox(2)
  p = {"task_expert": save(tmp_path, "t", task), "language_expert": save(tmp_path, "l", lang)}
  with pytest.raises(ValueError, match="layer_swap reads blocks or rows.*naming='gpt_neox.layers.{i}.'"):
    tool.merge_files(p, "layer_swap", str(tmp_path / "o"), {"bottom": 1, "top": 1})
  summary = tool.merge_files(p, "layer_swap", str(tmp_path / "o"), {"bottom": 1, "top": 1, "non_block": "task"},
                             naming="gpt_neox.layers.{i}.")
  assert summary["naming"] == "gpt_neox.layers.{i}."
  got = load_file(str(tmp_path / "o" / "model.safetensors"))
  for i, src in ((0, lang), (1, task), (2, task), (3, lang)):
    k = f"gpt_neox.layers.{i}.attention.dense.weight"
    np.testing.assert_array_equal(got[k], src[k])
  np.testing.assert_array_equal(got["embed_out.weight"], task["embed_out.weight"])


# ---- 2. one-line errors naming the file and the tensor


def test_input_mismatches_name_both_files_and_the_tensor(tmp_path):
  a = save(tmp_path, "a", llama(0))
  short = llama(1)
  short.pop("model.norm.weight")
  wide = llama(1) | {"model.layers.0.mlp.up_proj.weight": np.zeros((8, 9), np.float32)}
  half = {k: x.astype(np.float16) for k, x in llama(1).items()}
  for name, tree, message in (
      ("short", short, "tensor model.norm.weight is in .*a.safetensors but missing from .*short.safetensors"),
      ("wide", wide, r"tensor model.layers.0.mlp.up_proj.weight: shape \(8, 8\) in .*a.safetensors vs \(8, 9\) "
                     r"in .*wide.safetensors"),
      ("half", half, "tensor .*: dtype float32 in .*a.safetensors vs float16 in .*half.safetensors")):
    with pytest.raises(ValueError, match=message):
      tool.merge_files({"experts": [a, save(tmp_path, name, tree)]}, "soup", str(tmp_path / "o"))


def test_command_errors_are_one_line_and_leave_the_output(tmp_path):
  a, b = save(tmp_path, "a", llama(0)), save(tmp_path, "b", llama(1))
  with open(b, "r+b") as f:  # truncate: the header promises more bytes than the file has
    f.truncate(os.path.getsize(b) - 10)
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  args = ["--config=configs/merge_files.py", "--config.method=soup", f"--config.inputs.experts={a},{b}",
          f"--config.output={out}"]
  r = cli(*args)
  assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
  assert r.stderr.startswith("xlt.merge: error: ") and "b.safetensors is truncated" in r.stderr
  assert (out / "keep.txt").read_text() == "mine" and sorted(os.listdir(out)) == ["keep.txt"]
  r = cli(*args, "--traceback")
  assert r.returncode != 0 and "Traceback" in r.stderr and "is truncated" in r.stderr


def test_unreadable_tensor_names_file_and_tensor(tmp_path):
  x = files.LazyTensor(str(tmp_path / "gone.safetensors"), "w", (2,), np.float32)
  with pytest.raises(ValueError, match="gone.safetensors: tensor w could not be read"):
    np.asarray(x)


# ---- 3. vocabularies that differ


def test_vocab_base_and_union(tmp_path):
  cfg = lambda v: {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": v}
  base, expert = llama(0, v=16), llama(1, v=16)
  ext = llama(2, v=20)  # a language expert with 4 more tokens
  ext = {k: (expert[k] if x.shape == expert[k].shape else x) for k, x in ext.items()}
  ext["model.embed_tokens.weight"][:16] = expert["model.embed_tokens.weight"]
  p = {"base": save(tmp_path, "base", base, cfg(16)),
       "experts": [save(tmp_path, "e", expert, cfg(16)), save(tmp_path, "x", ext, cfg(20))]}
  mismatch = r"tensor (lm_head|model.embed_tokens).weight: shape \(16, 8\).*\(20, 8\).*vocab='base'"
  with pytest.raises(ValueError, match=mismatch):
    tool.merge_files(p, "task_arithmetic", str(tmp_path / "o"))
  tool.merge_files(p, "task_arithmetic", str(tmp_path / "b"), {"lambdas": 0.5}, vocab="base", heatmaps=False)
  got = load_file(str(tmp_path / "b" / "model.safetensors"))
  assert got["lm_head.weight"].shape == (16, 8)
  assert json.load(open(tmp_path / "b" / "config.json"))["vocab_size"] == 16
  summary = tool.merge_files(p, "task_arithmetic", str(tmp_path / "u"), {"lambdas": 0.5}, vocab="union",
                             heatmaps=False)
  got = load_file(str(tmp_path / "u" / "model.safetensors"))
  emb = "model.embed_tokens.weight"
  assert got[emb].shape == (20, 8) and summary["config_from"].endswith("x")
  assert summary["vocab_alignment"] == "rows"  # no tokenizer.json to align by: row numbers, as asked
  assert json.load(open(tmp_path / "u" / "config.json"))["vocab_size"] == 20
  # the new rows: only the extended expert has them, so the base and the other expert take its
  # rows, their deltas there are 0 and the merge keeps the extended expert's row
  np.testing.assert_allclose(got[emb][16:], ext[emb][16:], rtol=1e-6)
  want = base[emb] + 0.5 * (expert[emb] - base[emb]) + 0.5 * (ext[emb][:16] - base[emb])
  np.testing.assert_allclose(got[emb][:16], want, rtol=1e-5)
  with pytest.raises(ValueError, match="vocab must be one of base, union"):
    tool.merge_files(p, "task_arithmetic", str(tmp_path / "o"), vocab="largest")


# ---- 4. mergekit YAML


def test_mergekit_examples_map():
  ties = {"models": [{"model": "base"}, {"model": "a", "parameters": {"density": 0.5, "weight": 0.7}},
                     {"model": "b", "parameters": {"density": 0.5, "weight": 0.3}}],
          "merge_method": "ties", "base_model": "base", "parameters": {"normalize": True, "int8_mask": True},
          "dtype": "float16"}
  assert from_mergekit.from_mergekit(ties) == {
      "method": "ties", "inputs": {"base": "base", "experts": ["a", "b"]}, "dtype": "float16",
      "options": {"lambdas": [0.7, 0.3], "convention": "mergekit", "density": 0.5}}
  linear = {"models": [{"model": m, "parameters": {"weight": w}} for m, w in (("a", 1.0), ("b", 0.3))],
            "merge_method": "linear", "dtype": "float16"}
  assert from_mergekit.from_mergekit(linear)["options"] == {"weights": [1.0, 0.3]}
  swap = {"slices": [{"sources": [{"model": m, "layer_range": r}]} for m, r in
                     (("lang", [0, 2]), ("math", [2, 7]), ("lang", [7, 8]))], "merge_method": "passthrough"}
  got = from_mergekit.from_mergekit(swap)
  assert got["method"] == "layer_swap" and got["inputs"] == {"task_expert": "math", "language_expert": "lang"}
  assert got["options"] == {"bottom": 2, "top": 1, "non_block": "language", "num_blocks": 8}
  dare = {"models": [{"model": "a", "parameters": {"density": 0.53, "weight": 0.4}}, {"model": "b"}],
          "merge_method": "dare_ties", "base_model": "base", "parameters": {"lambda": 0.9}}
  assert from_mergekit.from_mergekit(dare)["options"] == {"weights": [0.4, 1.0], "density": [0.53, 1.0],
                                                          "scale": 0.9}


# mergekit's own examples (examples/*.yml), verbatim
LINEAR_YML = """models:
  - model: psmathur/orca_mini_v3_13b
    parameters:
      weight: 1.0
  - model: WizardLM/WizardLM-13B-V1.2
    parameters:
      weight: 0.3
  - model: garage-bAInd/Platypus2-13B
    parameters:
      weight: 0.5
merge_method: linear
dtype: float16
"""
TIES_YML = """models:
  - model: psmathur/orca_mini_v3_13b
    parameters:
      density: [1, 0.7, 0.1] # density gradient
      weight: 1.0
  - model: garage-bAInd/Platypus2-13B
    parameters:
      density: 0.5
      weight: [0, 0.3, 0.7, 1] # weight gradient
merge_method: ties
base_model: TheBloke/Llama-2-13B-fp16
parameters:
  normalize: true
  int8_mask: true
dtype: float16
"""
GRADIENT_SLERP_YML = """slices:
  - sources:
      - model: psmathur/orca_mini_v3_13b
        layer_range: [0, 40]
      - model: garage-bAInd/Platypus2-13B
        layer_range: [0, 40]
merge_method: slerp
base_model: psmathur/orca_mini_v3_13b
parameters:
  t:
    - pattern: self_attn
      value: [0, 0.5, 0.3, 0.7, 1]
    - pattern: mlp
      value: [1, 0.5, 0.7, 0.3, 0]
    - value: 0.5
dtype: float16
"""
STACK_YML = """slices:
  - sources:
    - model: psmathur/orca_mini_v3_13b
      layer_range: [0, 24]
  - sources:
    - model: garage-bAInd/Platypus2-13B
      layer_range: [20, 40]
merge_method: passthrough
dtype: float16
"""


def test_mergekit_example_files(tmp_path):
  for name, text in (("linear", LINEAR_YML), ("ties", TIES_YML), ("slerp", GRADIENT_SLERP_YML),
                     ("stack", STACK_YML)):
    (tmp_path / f"{name}.yml").write_text(text)
  got = from_mergekit.load_yaml(str(tmp_path / "linear.yml"))
  assert got == {"method": "soup", "dtype": "float16", "options": {"weights": [1.0, 0.3, 0.5]},
                 "inputs": {"experts": ["psmathur/orca_mini_v3_13b", "WizardLM/WizardLM-13B-V1.2",
                                        "garage-bAInd/Platypus2-13B"]}}
  # a frankenmerge of 44 layers (four repeated): xlt.merge.stack, tests/test_merge_stack.py
  got = from_mergekit.load_yaml(str(tmp_path / "stack.yml"))
  assert got == {"method": "layer_stack", "dtype": "float16",
                 "inputs": {"models": ["psmathur/orca_mini_v3_13b", "garage-bAInd/Platypus2-13B"]},
                 "options": {"slices": [["psmathur/orca_mini_v3_13b", 0, 24], ["garage-bAInd/Platypus2-13B", 20, 40]]}}
  # per-model gradients: lists over the layers (xlt.merge.layerwise), tests/test_merge_gradients.py
  got = from_mergekit.load_yaml(str(tmp_path / "ties.yml"))
  assert got["method"] == "ties" and got["options"] == {
      "lambdas": [1.0, [0.0, 0.3, 0.7, 1.0]], "convention": "mergekit", "density": [1.0, 0.7, 0.1],
      "densities": [[1.0, 0.7, 0.1], 0.5]}
  # the example's old `pattern:` key (mergekit now reads `filter:`) is named; with filter it maps
  # to a merge over slices (its sources' depth is unknown here: no config.json), t by tensor name
  with pytest.raises(ValueError, match=r"mergekit config .*slerp.yml: parameters.t\[0\]: a filtered value is"):
    from_mergekit.load_yaml(str(tmp_path / "slerp.yml"))
  (tmp_path / "slerp.yml").write_text(GRADIENT_SLERP_YML.replace("pattern:", "filter:"))
  got = from_mergekit.load_yaml(str(tmp_path / "slerp.yml"))
  assert got["method"] == "layer_slices" and got["options"]["merge_method"] == "slerp"
  assert got["options"]["per_slice"][0]["t"][0] == {"filter": "self_attn", "value": [0.0, 0.5, 0.3, 0.7, 1.0]}


@pytest.mark.parametrize("cfg, key", [
    ({"merge_method": "ties", "models": [{"model": "a"}], "base_model": "b", "tokenizer": {"source": ["x"]}},
     r"tokenizer.source: base, union or a model directory, got \['x'\]"),
    ({"merge_method": "ties", "models": [{"model": "a"}], "base_model": "b",
      "tokenizer": {"source": "union", "pad": 8}}, "tokenizer.pad: not supported"),
    ({"merge_method": "sce", "base_model": "a", "models": [{"model": "b"}],
      "parameters": {"select_topk": [{"filter": "self_attn", "value": 0.1}, {"value": 0.5}]}},
     "parameters.select_topk: filtered or conditional values .* are supported for t, weight"),
    ({"merge_method": "ties", "base_model": "a", "models": [{"model": "b", "parameters": {"lambda": [1, 0]}}]},
     r"models\[0\].parameters.lambda: a gradient"),
    ({"merge_method": "passthrough", "slices": [{"sources": [{"model": "a", "layer_range": [0, 24]}]},
                                                {"sources": [{"model": "b", "layer_range": [20, 20]}]}]},
     r"slices\[1\]: layer_range \[20, 20\] must be 0 <= lo < hi"),
    ({"merge_method": "model_breadcrumbs", "models": [{"model": "a"}]}, "merge_method: 'model_breadcrumbs'"),
    ({"merge_method": "linear", "models": [{"model": "a+lora"}]}, "LoRA adapter"),
])
def test_mergekit_refusals_name_the_key(cfg, key):
  with pytest.raises(ValueError, match=key):
    from_mergekit.from_mergekit(cfg)


def test_mergekit_yaml_command_runs_the_merge(tmp_path):
  p = [save(tmp_path, n, llama(i)) for i, n in enumerate(("base", "a", "b"))]
  yml = tmp_path / "merge.yml"
  yml.write_text(f"models:\n  - model: {p[0]}\n  - model: {p[1]}\n    parameters:\n      weight: 0.6\n"
                 f"  - model: {p[2]}\n    parameters:\n      weight: 0.4\n"
                 f"merge_method: task_arithmetic\nbase_model: {p[0]}\ndtype: float16\n")
  r = cli(f"--config={yml}", f"--config.output={tmp_path / 'out'}", "--config.heatmaps=false")
  assert r.returncode == 0, r.stderr
  got = load_file(str(tmp_path / "out" / "model.safetensors"))
  trees = [llama(i) for i in range(3)]
  want = merge.task_arithmetic(trees[0], trees[1:], lambdas=[0.6, 0.4])
  for k in want:
    assert got[k].dtype == np.float16
    np.testing.assert_allclose(got[k], want[k], rtol=2e-3, atol=2e-3)
  yml.write_text(yml.read_text().replace("task_arithmetic", "della_lineer"))
  r = cli(f"--mergekit_yaml={yml}", f"--config.output={tmp_path / 'out2'}")
  assert r.returncode == 2 and "merge_method: 'della_lineer'" in r.stderr and r.stderr.count("\n") == 1
