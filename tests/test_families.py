"""xlt.families: every family record is covered by a transformers-made fixture
(tests/fixtures/hf, made by tests/fixtures/make_hf_fixtures.py), maps its config.json onto
model.Config and back, detects its own models, and its table names every tensor of its fixtures.
The logits themselves are tests/test_pretrained.py's."""

import json
import os

import jax
import numpy as np
import pytest

from xlt import families, model, param_paths, pretrained
from xlt.io import hf_dir

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


def _fixtures() -> dict[str, dict]:
  """{fixture directory: its config.json}."""
  out = {}
  for name in sorted(os.listdir(HF)):
    with open(os.path.join(HF, name, "config.json")) as f:
      out[name] = json.load(f)
  return out


FIXTURES = _fixtures()


def test_every_family_has_a_fixture_and_every_fixture_a_family():
  by_family = {}
  for name, hf in FIXTURES.items():
    by_family.setdefault(families.of_config_json(hf).name, []).append(name)
  assert set(by_family) == set(families.BY_NAME), "a family without a fixture: add it to make_hf_fixtures.py"
  for f in families.FAMILIES:  # the record is found by either entry of its config.json
    assert families.of_config_json({"model_type": f.name}) is f
    assert families.of_config_json({"architectures": [f.architecture]}) is f


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_config_maps_both_ways_and_detects_its_family(fixture):
  hf = FIXTURES[fixture]
  family = families.of_config_json(hf)
  cfg = pretrained.config_from_hf(hf)
  assert families.of_config(cfg) is family  # what `save` writes without a config.json
  back = pretrained.config_from_hf(pretrained.config_to_hf(cfg, family.name))
  assert pretrained._normal(back) == pretrained._normal(cfg)
  assert pretrained.config_to_hf(cfg, family.name)["architectures"] == [family.architecture]


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_table_names_exactly_the_fixture_tensors(fixture):
  cfg = pretrained.config_from_hf(FIXTURES[fixture])
  family = families.of_config_json(FIXTURES[fixture])
  shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  leaves = {param_paths.path_names(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  full = family.table(cfg)
  assert leaves <= set(full)
  names = {n for leaf in leaves for n in full[leaf].names}
  stored = set(hf_dir.read_model_dir(os.path.join(HF, fixture))[1])
  tied_head = {"lm_head.weight"} if cfg.tie_embeddings else set()  # the embedding table serves
  assert names == stored - tied_head


def test_detection_order_most_specific_first():
  # a Gemma 2 config is also Gemma-like (its norm): the more specific record must come first
  gemma2 = pretrained.config_from_hf(FIXTURES["gemma2"])
  assert families.BY_NAME["gemma"].detect(gemma2) and families.of_config(gemma2).name == "gemma2"
  assert families.FAMILIES[-1].name == "llama" and families.FAMILIES[-1].detect(model.Config(vocab_size=8))


def test_unknown_family_is_one_line():
  with pytest.raises(ValueError, match="unknown model_type 'falcon'") as e:
    families.of_config_json({"model_type": "falcon", "architectures": ["FalconForCausalLM"]})
  assert "\n" not in str(e.value) and all(f.architecture in str(e.value) for f in families.FAMILIES)


def test_window_rules_follow_transformers():
  base = FIXTURES["llama"] | {"sliding_window": 4, "num_hidden_layers": 4}
  windows = {}
  for name in ("llama", "mistral", "qwen2", "gemma2"):
    cfg = pretrained.config_from_hf(base | {"model_type": name, "architectures": [], "max_window_layers": 2,
                                            "use_sliding_window": True})
    windows[name] = (cfg.sliding_window, cfg.sliding_layers)
  assert windows == {"llama": (0, None), "mistral": (4, None), "qwen2": (4, (2, 3)), "gemma2": (4, (0, 2))}
  off = pretrained.config_from_hf(base | {"model_type": "qwen2", "architectures": [], "use_sliding_window": False})
  assert (off.sliding_window, off.sliding_layers) == (0, None)
  typed = pretrained.config_from_hf(base | {"model_type": "qwen3", "architectures": [], "use_sliding_window": True,
                                            "layer_types": ["full_attention", "sliding_attention"] * 2})
  assert typed.sliding_layers == (1, 3) and np.all([typed.window(i) for i in (1, 3)])


def test_docs_table_lists_every_family_in_detection_order():
  with open(os.path.join(os.path.dirname(__file__), "..", "docs", "families.md")) as f:
    rows = [line.split("|")[1:3] for line in f if line.startswith("| ") and not line.startswith("| model_type")]
  assert [(n.strip(), a.strip()) for n, a in rows] == [(f.name, f.architecture) for f in families.FAMILIES]
