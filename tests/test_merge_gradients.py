"""mergekit's per-model parameters given as gradients over the layers (`weight: [0.2, 1.0]` under
one model, per-model density and gamma lists, a global density list) or filtered by tensor name
(`filter:`), run from a mergekit YAML
(xlt.merge.from_mergekit -> xlt.merge.layerwise), compared with mergekit's outputs
(tests/fixtures/mergekit/gradients/, written by tests/fixtures/make_mergekit_fixtures_gradients.py;
live where mergekit is installed)."""

import json
import os

import numpy as np
import pytest
import yaml
from safetensors import safe_open
from safetensors.numpy import load_file

from conftest import load_script
from xlt.merge import from_mergekit, registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
TOLERANCE = 1e-5  # float32 rounding (xlt accumulates in float64, mergekit in float32)


def fixture_script():
  return load_script("tests/fixtures/make_mergekit_fixtures_gradients.py")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  return fixture_script().make_models(str(tmp_path_factory.mktemp("models")))


def run_yaml(tmp_path, case: str, models: dict) -> dict:
  from configs import merge_files
  from xlt.merge.__main__ import merge_config, with_yaml
  script = fixture_script()
  yml = tmp_path / f"{case}.yml"
  yml.write_text(yaml.safe_dump(script.with_paths(script.CASES[case], models)))
  out = str(tmp_path / case)
  merge_config(with_yaml(merge_files.get_config(), str(yml)) | {"output": out, "heatmaps": False})
  return load_file(os.path.join(out, "model.safetensors"))


@pytest.mark.parametrize("case", list(fixture_script().CASES))
def test_a_per_model_gradient_yaml_gives_mergekits_merge(tmp_path, models, case):
  script = fixture_script()
  file = os.path.join(script.OUT, f"{case}.safetensors")
  with safe_open(file, "np") as f:
    assert json.loads(f.metadata()["mergekit_config"]) == script.CASES[case]
  want, got = load_file(file), run_yaml(tmp_path, case, models)
  assert sorted(want) == sorted(k for k in script.TENSORS if k in got)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{case} {k}")
  # the gradient matters: the blocks differ from what the gradient's first value alone gives
  last = max(int(k.split(".")[2]) for k in want if ".layers." in k)
  first = {k: v for k, v in want.items() if f".layers.{last}." in k}
  assert any(np.abs(first[k] - want[k.replace(f".layers.{last}.", ".layers.0.")]).max() > 1e-3 for k in first)


def test_per_model_gradients_map_to_per_expert_lists():
  cfg = {"merge_method": "task_arithmetic", "base_model": "a", "parameters": {"lambda": 0.5},
         "models": [{"model": "b", "parameters": {"weight": [0.2, 1.0]}}, {"model": "c", "parameters": {"weight": 0.4}}]}
  assert from_mergekit.from_mergekit(cfg)["options"] == {"lambdas": [[0.1, 0.5], 0.2]}
  ties = {"merge_method": "ties", "base_model": "a",
          "models": [{"model": "b", "parameters": {"density": [0.2, 0.8]}}, {"model": "c", "parameters": {"density": 0.5}}]}
  assert from_mergekit.from_mergekit(ties)["options"]["densities"] == [[0.2, 0.8], 0.5]
  dare = {"merge_method": "dare_linear", "base_model": "a", "parameters": {"density": [0.25, 0.75]},
          "models": [{"model": "b"}, {"model": "c"}]}
  assert from_mergekit.from_mergekit(dare)["options"]["drop"] == [0.75, 0.25]
  slerp = {"merge_method": "slerp", "base_model": "a", "models": [{"model": "a"}, {"model": "b"}],
           "parameters": {"t": {"filter": "mlp", "value": [0, 1]}}}
  assert from_mergekit.from_mergekit(slerp)["options"] == {"t": [{"filter": "mlp", "value": [0.0, 1.0]}]}
  dare["parameters"]["density"] = [{"filter": "mlp", "value": [0.25, 0.75]}, {"value": 0.5}]
  assert from_mergekit.from_mergekit(dare)["options"]["drop"] == [{"filter": "mlp", "value": [0.75, 0.25]},
                                                                 {"value": 0.5}]
  with pytest.raises(ValueError, match=r"parameters.density\[0\]: a filtered value is \{filter"):
    from_mergekit.from_mergekit(dare | {"parameters": {"density": [{"filter": "mlp", "valeu": 1}]}})
  with pytest.raises(ValueError, match="parameters.normalize: true with per-layer or filtered weights"):
    from_mergekit.from_mergekit(cfg | {"parameters": {"normalize": True}})
  with pytest.raises(ValueError, match=r"models\[0\].parameters.select_topk: a gradient .* is supported for t, weight"):
    from_mergekit.from_mergekit({"merge_method": "sce", "base_model": "a",
                                 "models": [{"model": "b", "parameters": {"select_topk": [0.1, 0.2]}}]})


def test_a_per_expert_gradient_is_each_blocks_merge_by_hand():
  rng = np.random.default_rng(0)
  tree = lambda: {f"model.layers.{b}.{n}": rng.normal(size=(3, 4)) for b in range(3)
                  for n in ("mlp.w", "self_attn.q.weight")} | {
      "model.embed_tokens.weight": rng.normal(size=(5, 4))}
  base, a, b = tree(), tree(), tree()
  got = registry.merge("task_arithmetic", {"base": base, "experts": [a, b]}, {"lambdas": [[0.0, 1.0], 0.5]},
                       naming="hf")
  for k in base:
    block = 0 if "embed" in k else int(k.split(".")[2])  # outside the blocks: the first value
    np.testing.assert_allclose(got[k], base[k] + block / 2 * (a[k] - base[k]) + 0.5 * (b[k] - base[k]), atol=1e-6)
  filtered = [{"filter": "self_attn", "value": [0.0, 1.0]}, {"filter": "embed", "value": 2.0}]
  got = registry.merge("task_arithmetic", {"base": base, "experts": [a, b]},
                       {"lambdas": [filtered + [{"value": 0.25}], 0.5]}, naming="hf")
  for k in base:
    lam = 2.0 if "embed" in k else int(k.split(".")[2]) / 2 if "self_attn" in k else 0.25
    np.testing.assert_allclose(got[k], base[k] + lam * (a[k] - base[k]) + 0.5 * (b[k] - base[k]), atol=1e-6)
  with pytest.raises(ValueError, match=r"option lambdas\[0\]: no filter matches tensor model.layers.0.mlp.w"):
    registry.merge("task_arithmetic", {"base": base, "experts": [a, b]}, {"lambdas": [filtered, 0.5]}, naming="hf")
  with pytest.raises(ValueError, match="della reads tensors together"):
    registry.merge("della", {"base": base, "experts": [a, b]}, {"density": [[0.5, 0.9], 0.5]}, naming="hf")


@pytest.mark.parametrize("case", ["ties", "breadcrumbs", "slerp_filter", "ties_slices"])
def test_gradients_match_mergekit_live(tmp_path, models, case):
  pytest.importorskip("mergekit")
  script = fixture_script()
  want = script.run_mergekit(script.CASES[case], models, str(tmp_path / "mk"))
  got = run_yaml(tmp_path, case, models)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=TOLERANCE, atol=TOLERANCE, err_msg=k)


def test_slices_map_to_a_merge_over_slices_of_their_depth(tmp_path, models):
  script = fixture_script()
  mapped = from_mergekit.from_mergekit(script.with_paths(script.CASES["linear_slices"], models))
  assert mapped["method"] == "layer_slices" and mapped["options"]["merge_method"] == "soup"
  assert mapped["options"]["ranges"] == [[[0, 2], [0, 2]], [[3, 4], [2, 3]]]
  assert mapped["options"]["per_slice"] == [{"weights": [1.0, [0.0, 1.0]]}, {"weights": [0.3, 0.7]}]
  run_yaml(tmp_path, "linear_slices", models)
  with open(tmp_path / "linear_slices" / "config.json") as f:
    assert json.load(f)["num_hidden_layers"] == 3
  bad = script.with_paths(script.CASES["linear_slices"], models)
  bad["slices"][1]["sources"].reverse()
  with pytest.raises(ValueError, match=r"slices\[1\]: its sources are .* the same models in the same order"):
    from_mergekit.from_mergekit(bad)
  bad["slices"][1]["sources"].reverse()
  bad["slices"][1]["sources"][1]["layer_range"] = [2, 4]
  with pytest.raises(ValueError, match=r"slices\[1\]: its sources' layer ranges must be non-empty and of one length"):
    from_mergekit.from_mergekit(bad)
