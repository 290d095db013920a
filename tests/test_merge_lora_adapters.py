"""xlt.merge.lora_adapters: LoRA adapters merged into one adapter (concatenation, SVD at a rank),
checked against merging their dense deltas (task arithmetic of the merged-in models), and the
merged adapter written as a PEFT adapter and read back."""

import jax
import numpy as np
import pytest

from xlt import lora, merge, peft_io, pretrained
from xlt.merge import lora_adapters

KERNEL = ("block_0", "mlp", "gate", "weight")  # Llama loads with torch's [out, in] weights


@pytest.fixture(scope="module")
def llama():
  import os
  cfg, params = pretrained.load(os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama"))
  params = jax.tree.map(np.asarray, params)
  rng = np.random.default_rng(0)
  shapes = lora.init(params, jax.random.key(0), rank=1, alpha=1.0)  # only its kernels and their sizes
  adapters = []
  for rank, alpha in ((2, 4.0), (3, 1.5)):
    adapters.append(jax.tree_util.tree_map_with_path(
        lambda p, x, rank=rank: (0.3 * rng.normal(size=(rank, x.shape[1]) if p[-1].key == "a" else (x.shape[0], rank)))
        .astype(np.float32), {k: v for k, v in shapes.items() if k != "scale"}))
    adapters[-1]["scale"] = np.float32(lora.scale(rank, alpha))
  return cfg, params, adapters


def _close(a, b, atol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=atol)


def test_concatenation_is_task_arithmetic_of_the_dense_deltas(llama):
  cfg, params, adapters = llama
  lambdas = [0.5, 2.0]
  joined = lora_adapters.concat(adapters, lambdas)
  assert joined["block_0"]["attn"]["q"]["weight"]["a"].shape[0] == 5 and float(joined["scale"]) == 1.0
  dense = merge.task_arithmetic(params, [lora.merge_into(params, a) for a in adapters], lambdas)
  _close(lora.merge_into(params, joined), dense)
  want = sum(lam * lora_adapters.delta(a, KERNEL) for lam, a in zip(lambdas, adapters))
  np.testing.assert_allclose(lora_adapters.delta(joined, KERNEL), want, atol=1e-5)


def test_svd_at_full_rank_is_exact_and_below_it_the_best_approximation(llama):
  cfg, params, adapters = llama
  dense = merge.task_arithmetic(params, [lora.merge_into(params, a) for a in adapters])
  _close(lora.merge_into(params, lora_adapters.svd(adapters, rank=5)), dense)
  one = lora_adapters.svd(adapters, rank=1)
  total = sum(lora_adapters.delta(a, KERNEL) for a in adapters)
  u, s, vt = np.linalg.svd(total)
  np.testing.assert_allclose(lora_adapters.delta(one, KERNEL), s[0] * np.outer(u[:, 0], vt[0]), atol=1e-5)
  assert one["block_0"]["mlp"]["gate"]["weight"]["b"].shape[1] == 1
  with pytest.raises(ValueError, match="rank must be a positive integer"):
    lora_adapters.svd(adapters, rank=0)


def test_a_merged_adapter_goes_out_as_peft_and_back(llama, tmp_path):
  cfg, params, adapters = llama
  joined = lora_adapters.svd(adapters, rank=4)
  config = peft_io.save(cfg, params, joined, str(tmp_path / "merged"))
  assert config["r"] == 4 and config["lora_alpha"] == pytest.approx(2.0)  # scale 1 = alpha / sqrt(4)
  _close(lora.merge_into(params, peft_io.read(str(tmp_path / "merged"), cfg, params)), lora.merge_into(params, joined))


def test_adapters_of_different_kernels_are_errors():
  a = {"scale": 1.0, "w": {"a": np.ones((1, 3)), "b": np.ones((2, 1))}}
  b = {"scale": 1.0, "w": {"a": np.ones((1, 4)), "b": np.ones((2, 1))}}
  with pytest.raises(ValueError, match="w: adapter 1's delta is 2 x 4, adapter 0's 2 x 3"):
    lora_adapters.concat([a, b])
  with pytest.raises(ValueError, match="adapters is empty"):
    lora_adapters.concat([])


def test_knots_is_ties_in_the_shared_singular_basis(llama):
  from xlt.merge import combine
  cfg, params, adapters = llama
  one = lora_adapters.knots(adapters[:1])  # one adapter: its own delta
  np.testing.assert_allclose(lora_adapters.delta(one, KERNEL), lora_adapters.delta(adapters[0], KERNEL), atol=1e-5)
  got = lora_adapters.knots(adapters, density=0.5)
  # the definition, on the dense deltas side by side
  deltas = [lora_adapters.delta(a, KERNEL) for a in adapters]
  u, s, vt = np.linalg.svd(np.concatenate(deltas, axis=1), full_matrices=False)
  u, s, vt = u[:, :5], s[:5], vt[:5]  # the rank of the deltas side by side: 2 + 3
  coords = [{"v": v} for v in np.split(vt, len(deltas), axis=1)]
  v = combine.ties({"v": np.zeros_like(coords[0]["v"])}, coords, density=0.5, convention="xlt")["v"]
  want = (u * s) @ v
  np.testing.assert_allclose(lora_adapters.delta(got, KERNEL), want, atol=1e-4)
  assert np.abs(want - sum(deltas)).max() > 1e-2  # not the plain sum


def test_a_mergekit_model_plus_adapter_reference_merges_the_peft_adapter_in(tmp_path):
  import json
  import os
  from safetensors.numpy import load_file
  from xlt.merge import from_mergekit, tool
  fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
  base, adapter = os.path.join(fixtures, "hf", "llama"), os.path.join(fixtures, "peft", "llama", "peft_adapter")
  with open(os.path.join(adapter, "adapter_config.json")) as f:
    config = json.load(f)
  scaling = config["lora_alpha"] / config["r"]  # plain LoRA
  factors = load_file(os.path.join(adapter, "adapter_model.safetensors"))
  weights = load_file(os.path.join(base, "model.safetensors"))
  want = dict(weights)
  for name in {k.rsplit(".lora_", 1)[0] for k in factors}:
    a, b = (factors[f"{name}.lora_{n}.weight"].astype(np.float64) for n in "AB")
    key = name.removeprefix("base_model.model.") + ".weight"
    want[key] = (weights[key] + scaling * b @ a).astype(np.float32)
  got = lora_adapters.with_peft(weights, adapter)
  assert sum(not np.array_equal(got[k], weights[k]) for k in got) == 4  # q_proj, v_proj of 2 layers
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=1e-6)
  # in a mergekit YAML: the adapted model as one of the inputs
  mapped = from_mergekit.from_mergekit({"merge_method": "linear", "models": [{"model": f"{base}+{adapter}"}]})
  tool.merge_files(mapped["inputs"], mapped["method"], str(tmp_path / "out"), mapped["options"], heatmaps=False)
  out = load_file(str(tmp_path / "out" / "model.safetensors"))
  for k in want:
    np.testing.assert_allclose(out[k], want[k], atol=1e-6)
  assert os.path.exists(tmp_path / "out" / "config.json")  # the model's own config, through the reference
