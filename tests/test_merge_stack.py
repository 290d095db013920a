"""Layer stacks ("frankenmerges", xlt.merge.stack): mergekit's passthrough over slices that repeat,
reorder or drop layers, run from a mergekit YAML, compared with mergekit's own outputs
(tests/fixtures/mergekit/stack/, written by tests/fixtures/make_mergekit_fixtures_stack.py; live
where mergekit is installed), and loaded by transformers where it is installed."""

import json
import os

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from conftest import load_script, run_mergekit_yaml
from xlt.merge import from_mergekit, stack
from xlt.param_paths import naming_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")


def fixture_script():
  return load_script("tests/fixtures/make_mergekit_fixtures_stack.py")


def tiny(tag: float, layers: int = 3) -> dict:
  """A flat HF-named tree whose every entry says which model and block it came from."""
  out = {"model.embed_tokens.weight": np.full((4, 2), tag), "model.norm.weight": np.full((2,), tag + 0.5),
         "lm_head.weight": np.full((4, 2), tag + 0.25)}
  for b in range(layers):
    out[f"model.layers.{b}.mlp.up_proj.weight"] = np.full((2, 2), tag + b / 10)
    out[f"model.layers.{b}.input_layernorm.weight"] = np.full((2,), tag + b / 10)
  return out


def test_stack_trees_renumbers_blocks_and_takes_embedding_first_head_last():
  trees = {"a": tiny(1.0), "b": tiny(2.0)}
  nm = naming_for(list(trees["a"]))
  got = stack.stack_trees(trees, [("a", 0, 2), ("a", 1, 3), ("b", 2, 3)], nm)
  assert len(got) == 3 + 2 * 5
  want_blocks = [1.0, 1.1, 1.1, 1.2, 2.2]
  for k, v in enumerate(want_blocks):
    assert got[f"model.layers.{k}.mlp.up_proj.weight"][0, 0] == v
    assert got[f"model.layers.{k}.input_layernorm.weight"][0] == v
  assert got["model.embed_tokens.weight"][0, 0] == 1.0  # the first slice's model
  assert got["model.norm.weight"][0] == 2.5 and got["lm_head.weight"][0, 0] == 2.25  # the last slice's
  with pytest.raises(ValueError, match=r"slices\[1\]: layer_range \[2, 4\] runs past b's 3 layers"):
    stack.stack_trees(trees, [("a", 0, 1), ("b", 2, 4)], nm)


def test_renamed_moves_the_block_index_only():
  assert stack.renamed("model.layers.3.mlp.experts.3.w1", 3, 7) == "model.layers.7.mlp.experts.3.w1"
  assert stack.renamed("transformer.h.10.attn.c_attn.weight", 10, 0) == "transformer.h.0.attn.c_attn.weight"
  with pytest.raises(ValueError, match="block index 2 is not the first number"):
    stack.renamed("model.layers.3.mlp.weight", 2, 0)


def test_stacked_config_sets_depth_and_per_layer_types(tmp_path):
  for name, types in (("a", ["sliding", "full"]), ("b", ["x", "y"])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "m", "num_hidden_layers": 2,
                                                             "layer_types": types}))
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  cfg = stack.stacked_config(a, [(a, 0, 2), (b, 1, 2), (a, 1, 2)])
  assert cfg["num_hidden_layers"] == 4 and cfg["layer_types"] == ["sliding", "full", "y", "full"]


def test_mergekit_passthrough_slices_of_another_depth_map_to_a_stack():
  llama, llama_b = (os.path.join(FIXTURES, "hf", n) for n in ("llama", "llama_b"))
  slices = lambda *p: [{"sources": [{"model": m, "layer_range": [lo, hi]}]} for m, lo, hi in p]
  got = from_mergekit.from_mergekit({"merge_method": "passthrough",
                                     "slices": slices((llama, 0, 2), (llama_b, 1, 2), (llama, 0, 1))})
  assert got["method"] == "layer_stack" and got["inputs"] == {"models": [llama, llama_b]}
  assert got["options"] == {"slices": [[llama, 0, 2], [llama_b, 1, 2], [llama, 0, 1]]}
  with pytest.raises(ValueError, match=r"slices\[0\]: layer_range \[0, 3\] runs past .*llama's 2 layers"):
    from_mergekit.from_mergekit({"merge_method": "passthrough", "slices": slices((llama, 0, 3))})
  with pytest.raises(ValueError, match=r"slices\[0\]: a passthrough slice takes one source"):
    from_mergekit.from_mergekit({"merge_method": "passthrough", "slices": [
        {"sources": [{"model": llama, "layer_range": [0, 1]}, {"model": llama_b, "layer_range": [0, 1]}]}]})


def test_passthrough_scale_per_slice_and_global():
  trees = {"a": tiny(1.0), "b": tiny(2.0)}
  nm = naming_for(list(trees["a"]))
  zero_up = [{"filter": "up_proj", "value": 0.0}]
  got = stack.stack_trees(trees, [("a", 0, 1), ("a", 0, 1, zero_up), ("b", 0, 3, [1.0, 3.0])], nm,
                          scale=[{"filter": "lm_head", "value": 2.0}, {"filter": "layers.1.", "value": 5.0}])
  value = lambda k: float(np.asarray(got[k]).ravel()[0])
  assert value("model.layers.0.mlp.up_proj.weight") == 1.0  # no slice scale, the global one matches nothing
  assert value("model.layers.1.mlp.up_proj.weight") == 0.0  # its own filter
  # its own filter misses: the global one, matched against the output's name (a's block 0 is block 1 here)
  assert value("model.layers.1.input_layernorm.weight") == 5.0
  for k, (block, t) in enumerate(((0, 0.0), (1, 0.5), (2, 1.0)), start=2):  # a gradient along the slice
    assert value(f"model.layers.{k}.mlp.up_proj.weight") == pytest.approx((2.0 + block / 10) * (1 + 2 * t))
  # outside the blocks: the embedding the first slice's scale, the rest the last slice's, at t = 0
  assert value("lm_head.weight") == 2.25 and value("model.norm.weight") == 2.5
  assert value("model.embed_tokens.weight") == 1.0
  assert np.asarray(got["model.layers.1.mlp.up_proj.weight"]).dtype == np.float64  # the input's dtype
  assert stack.setting([{"filter": "x", "value": 1}], "y", 0.0) is None


def _run_yaml(tmp_path, case: str, config: dict) -> str:
  return run_mergekit_yaml(tmp_path, case, config, fixture_script())


@pytest.mark.parametrize("case", ["repeat", "drop", "two_models", "scaled"])
def test_a_mergekit_stack_yaml_gives_mergekits_model(tmp_path, case):
  script = fixture_script()
  file = os.path.join(script.OUT, f"{case}.safetensors")
  want = load_file(file)
  with safe_open(file, "np") as f:
    meta = f.metadata()
  assert json.loads(meta["mergekit_config"]) == script.CASES[case]
  out = _run_yaml(tmp_path, case, script.CASES[case])
  got = load_file(os.path.join(out, "model.safetensors"))
  assert sorted(got) == sorted(want)
  for k in want:
    assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["num_hidden_layers"] == int(meta["num_hidden_layers"])


@pytest.mark.parametrize("case", ["repeat", "drop", "scaled"])
def test_transformers_loads_the_stack_with_mergekits_logits(tmp_path, case):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  script = fixture_script()
  out = _run_yaml(tmp_path, case, script.CASES[case])
  model, info = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids = torch.from_numpy(np.load(os.path.join(FIXTURES, "hf", "llama", "input_ids.npy")))
  with torch.no_grad():
    got = model.eval()(ids).logits.float().numpy()
  np.testing.assert_allclose(got, np.load(os.path.join(script.OUT, f"{case}_logits.npy")), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["repeat", "two_models", "scaled"])
def test_stack_matches_mergekit_live(tmp_path, case):
  pytest.importorskip("mergekit")
  script = fixture_script()
  want, layers = script.run_mergekit(script.CASES[case], str(tmp_path / "mk"))
  got = load_file(os.path.join(_run_yaml(tmp_path, case, script.CASES[case]), "model.safetensors"))
  assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
