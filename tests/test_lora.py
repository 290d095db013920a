"""LoRA on a tiny GPT: exactness at init, merged vs adapter forward, frozen base after
training, partial LoRA by partition, adapter checkpoints, LoRA layer swapping."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import compiled
from xlt import lora, merge, model, partition, train
from xlt.param_paths import path_names

apply, lora_apply = compiled(model.apply), compiled(lora.apply)

CFG = model.Config(vocab_size=16, block_size=8, num_layers=4, num_heads=2, d_model=8)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 16, (3, 6)), jnp.int32)


def base():
  return model.init_params(CFG, jax.random.key(0))


def with_random_b(adapters, seed=1):
  """Adapters with b drawn at random (a trained adapter), so their delta is not zero."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32) * 0.1 if path_names(p)[-1] == "b" else x,
      adapters)


def test_zero_b_equals_the_base_exactly():
  params = base()
  adapters = lora.init(params, jax.random.key(1), rank=2, alpha=4.0)
  assert float(adapters["scale"]) == np.float32(4.0 / np.sqrt(2))
  assert adapters["block_0"]["attn"]["qkv"]["kernel"]["a"].shape == (2, 8)   # [r, in=D]
  assert adapters["block_0"]["attn"]["qkv"]["kernel"]["b"].shape == (24, 2)  # [out=3HK, r]
  assert adapters["block_0"]["attn"]["proj"]["kernel"]["a"].shape == (2, 8)  # in = H*K
  assert adapters["block_3"]["mlp"]["fc"]["kernel"]["b"].shape == (32, 2)
  assert "lm_head" not in adapters and "wte" not in adapters  # projections only
  want, _ = apply(CFG, params, TOKENS)
  got, _ = lora_apply(CFG, {"base": params, "lora": adapters}, TOKENS)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for w, m in zip(jax.tree.leaves(params), jax.tree.leaves(lora.merge_into(params, adapters))):
    np.testing.assert_array_equal(np.asarray(m), np.asarray(w))


def test_merged_in_lora_equals_the_adapter_forward():
  params = base()
  adapters = with_random_b(lora.init(params, jax.random.key(1), rank=3, alpha=2.0))
  merged = lora.merge_into(params, adapters)
  want, _ = lora_apply(CFG, {"base": params, "lora": adapters}, TOKENS)
  got, _ = apply(CFG, merged, TOKENS)
  assert not np.allclose(np.asarray(want), np.asarray(apply(CFG, params, TOKENS)[0]), atol=1e-3)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
  # the merged kernel is W + s * (b @ a) in the [out, in] rows view, here for mlp/fc ([D, F])
  ab = adapters["block_1"]["mlp"]["fc"]["kernel"]
  w = params["block_1"]["mlp"]["fc"]["kernel"]
  np.testing.assert_allclose(np.asarray(merged["block_1"]["mlp"]["fc"]["kernel"]),
                             np.asarray(w + adapters["scale"] * (ab["b"] @ ab["a"]).T), atol=1e-6)
  # the KV-cache decoding path runs the adapters too
  cache = model.init_cache(CFG, 3, 8)
  dec, _ = lora.apply(CFG, {"base": params, "lora": adapters}, TOKENS, cache, 0)
  np.testing.assert_allclose(np.asarray(dec), np.asarray(want), atol=2e-5)


def opt_config():
  return ml_collections.ConfigDict(dict(name="adamw", peak_lr=1e-2, schedule="constant", warmup_steps=0,
                                        total_steps=10, b1=0.9, b2=0.99, weight_decay=0.1, clip=1.0))


def test_training_moves_only_the_adapters():
  params = base()
  labels = partition.labels(params, partition.preset_rules("C", 4, 1, 1))
  adapters = lora.init(params, jax.random.key(1), rank=2, alpha=4.0, labels=labels, trainable="task")
  # partial LoRA on the task partition of [C] (bottom 1, top 1): blocks 1 and 2 only
  assert sorted(k for k in adapters if k != "scale") == ["block_1", "block_2"]
  composite = {"base": params, "lora": adapters}
  tx = train.make_optimizer(opt_config())  # any optax transformation: it sees the adapters only
  state = train.init_state(CFG, tx, [0], jax.tree.map(lambda x: x[None], composite))
  state = jax.tree.map(lambda x: x[0], state)
  # no optimizer state of the size of the base: Adam's moments cover the adapters only
  state_size = sum(np.size(x) for x in jax.tree.leaves(state["opt_state"]))
  assert state_size <= 2 * lora.num_params(adapters) + 4
  batch = {"tokens": TOKENS, "loss_mask": jnp.ones((3, 5), jnp.float32)}
  step = jax.jit(lambda s, b: train.train_step(s, b, cfg=CFG, tx=tx))
  for _ in range(3):
    state, metrics = step(state, batch)
  new = state["params"]
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new["base"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # base bit for bit
  assert float(new["lora"]["scale"]) == float(adapters["scale"])
  moved = new["lora"]["block_1"]["mlp"]["fc"]["kernel"]["b"]
  assert np.abs(np.asarray(moved)).max() > 0


def test_simultaneous_lora_alternates_the_partitions_adapters():
  params = base()
  kernel_labels = partition.labels(params, partition.preset_rules("C", 4, 1, 1))
  composite = {"base": params, "lora": with_random_b(lora.init(params, jax.random.key(1), rank=2, alpha=4.0))}
  trainable, _ = lora.split(composite)
  labels = lora.labels(trainable, kernel_labels)
  assert labels["block_0"]["mlp"]["fc"]["kernel"] == {"a": "language", "b": "language"}
  assert labels["block_2"]["attn"]["qkv"]["kernel"]["b"] == "task"
  tx = partition.alternating(opt_config(), labels, order=("task", "language"))
  state = jax.tree.map(lambda x: x[0], train.init_state(CFG, tx, [0], jax.tree.map(lambda x: x[None], composite)))
  batch = {"tokens": TOKENS, "loss_mask": jnp.ones((3, 5), jnp.float32)}
  new, _ = jax.jit(lambda s, b: train.train_step(s, b, cfg=CFG, tx=tx))(state, batch)  # step 0: task's turn
  old_ad, new_ad = composite["lora"], new["params"]["lora"]
  for block, moved in (("block_0", False), ("block_1", True), ("block_2", True), ("block_3", False)):
    same = all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(old_ad[block]), jax.tree.leaves(new_ad[block])))
    assert same != moved, block


def test_adapter_checkpoint_round_trip(tmp_path):
  params = base()
  adapters = with_random_b(lora.init(params, jax.random.key(1), rank=2, alpha=4.0))
  lora.save(adapters, str(tmp_path / "adapters.safetensors"))
  back = lora.load(str(tmp_path / "adapters.safetensors"))
  assert jax.tree.structure(back) == jax.tree.structure(jax.tree.map(np.asarray, adapters))
  for x, y in zip(jax.tree.leaves(adapters), jax.tree.leaves(back)):
    np.testing.assert_array_equal(np.asarray(x), y)
  # per block r * (in + out): qkv 2 * (8 + 24), proj 2 * (8 + 8), fc 2 * (8 + 32), proj 2 * (32 + 8)
  assert lora.num_params(adapters) == 4 * (64 + 32 + 80 + 80)


def test_lora_layer_swap_picks_the_right_adapters():
  params = base()
  task = with_random_b(lora.init(params, jax.random.key(1), rank=2, alpha=4.0), seed=1)
  lang = with_random_b(lora.init(params, jax.random.key(2), rank=2, alpha=4.0), seed=2)
  swapped = merge.layer_swap(task, lang, bottom=1, top=1, non_block="average")
  for block, source in (("block_0", lang), ("block_1", task), ("block_2", task), ("block_3", lang)):
    for x, y in zip(jax.tree.leaves(swapped[block]), jax.tree.leaves(source[block])):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert float(swapped["scale"]) == float(task["scale"])


def test_bad_lora_arguments_fail_clearly():
  params = base()
  with pytest.raises(ValueError, match="rank 9 exceeds block_0/attn/proj/kernel's 8 x 8 matrix"):
    lora.init(params, jax.random.key(0), rank=9, alpha=1.0)
  stray = lora.init(params, jax.random.key(0), rank=2, alpha=1.0)
  stray["block_9"] = stray.pop("block_3")
  with pytest.raises(ValueError, match="LoRA adapters for no projection of the model: \\['block_9/attn/proj/kernel'"):
    lora.apply(CFG, {"base": params, "lora": stray}, TOKENS)
  with pytest.raises(ValueError, match="the base lacks"):
    lora.merge_into(params, stray)
  with pytest.raises(ValueError, match="positive integer"):
    lora.init(params, jax.random.key(0), rank=0, alpha=1.0)
  labels = partition.labels(params, partition.preset_rules("C", 4, 1, 1))
  with pytest.raises(ValueError, match=r"trainable labels \['ability'\] are not in the label tree"):
    lora.init(params, jax.random.key(0), rank=2, alpha=1.0, labels=labels, trainable="ability")


def test_testbed_lora_compositions_take_the_right_adapters():
  from configs import merge_peft
  from xlt.experiments.testbed import peft as testbed_peft

  c = merge_peft.get_config()  # the config with the LoRA recipes
  c.lora.presets, c.lora.swaps = ("C",), ("1,1,0",)
  params = jax.tree.map(np.asarray, base())
  names = [r.name for r in testbed_peft.lora_plan(c)]
  assert names == ["LoRA task expert", "LoRA language expert", "partial LoRA task expert [C]",
                   "partial LoRA language expert [C]", "simultaneous LoRA [C] k=1"]
  adapters = {n: jax.tree.map(np.asarray, with_random_b(lora.init(params, jax.random.key(k), rank=2, alpha=4.0), k))
              for k, n in enumerate(names)}
  labels = partition.labels(params, partition.preset_rules("C", 4, 1, 1))
  for name, keep in (("partial LoRA task expert [C]", "task"), ("partial LoRA language expert [C]", "language")):
    trainable, rebuild = lora.split({"base": params, "lora": adapters[name]})
    cells = lora.labels(trainable, labels)  # b = 0 outside the trained partition
    adapters[name] = rebuild(jax.tree_util.tree_map_with_path(
        lambda p, x, l: x if l == keep or path_names(p)[-1] == "a" else np.zeros_like(x), trainable, cells))["lora"]
  models = testbed_peft.compose_lora(c, params, adapters)
  task, lang = adapters["LoRA task expert"], adapters["LoRA language expert"]
  swapped = models["LoRA layer swap b=1 u=1 t=0"]
  for block, src in (("block_0", lang), ("block_1", task), ("block_2", task), ("block_3", lang)):
    want = lora.merge_into(params, src)[block]
    for x, y in zip(jax.tree.leaves(swapped[block]), jax.tree.leaves(want)):
      np.testing.assert_array_equal(x, np.asarray(y))
  both = models["LoRA freeze-then-train [C]"]
  for block, src in (("block_0", "language"), ("block_1", "task"), ("block_3", "language")):
    want = lora.merge_into(params, adapters[f"partial LoRA {src} expert [C]"])[block]
    for x, y in zip(jax.tree.leaves(both[block]), jax.tree.leaves(want)):
      np.testing.assert_allclose(x, np.asarray(y), atol=1e-6)


def test_pretrained_projections_get_adapters():
  """A Llama's separate q / k / v (grouped key/value heads) and SwiGLU gate / up get adapters
  beside o_proj and down_proj; the adapter forward (with the KV cache too) equals the merged
  model's, and training moves the adapters only."""
  import os

  from xlt import pretrained

  cfg, params = pretrained.load(os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama"))
  adapters = lora.init(params, jax.random.key(1), rank=2, alpha=4.0)
  d, h, g, k, f = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_width, cfg.mlp_width
  shapes = {f"{kind}/{name}": (v["weight"]["a"].shape, v["weight"]["b"].shape)
            for kind in ("attn", "mlp") for name, v in adapters["block_1"][kind].items()}
  assert shapes == {"attn/q": ((2, d), (h * k, 2)), "attn/k": ((2, d), (g * k, 2)), "attn/v": ((2, d), (g * k, 2)),
                    "attn/proj": ((2, h * k), (d, 2)), "mlp/gate": ((2, d), (f, 2)), "mlp/up": ((2, d), (f, 2)),
                    "mlp/proj": ((2, f), (d, 2))}  # [r, in], [out, r]
  tokens = jnp.asarray([[1, 5, 9, 7, 30, 2]], jnp.int32)
  want, _ = apply(cfg, params, tokens)
  got, _ = lora_apply(cfg, {"base": params, "lora": adapters}, tokens)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # b = 0: the base exactly
  adapters = with_random_b(adapters)
  merged, _ = apply(cfg, lora.merge_into(params, adapters), tokens)
  forward, _ = lora_apply(cfg, {"base": params, "lora": adapters}, tokens)
  assert not np.allclose(np.asarray(forward), np.asarray(want), atol=1e-3)
  np.testing.assert_allclose(np.asarray(merged), np.asarray(forward), atol=2e-5, rtol=1e-5)
  dec, _ = lora_apply(cfg, {"base": params, "lora": adapters}, tokens, model.init_cache(cfg, 1, 8), 0)
  np.testing.assert_allclose(np.asarray(dec), np.asarray(forward), atol=2e-5)
  composite = {"base": params, "lora": adapters}
  tx = train.make_optimizer(opt_config())
  state = jax.tree.map(lambda x: x[0], train.init_state(cfg, tx, [0], jax.tree.map(lambda x: x[None], composite)))
  batch = {"tokens": tokens, "loss_mask": jnp.ones((1, 5), jnp.float32)}
  new, _ = jax.jit(lambda s, b: train.train_step(s, b, cfg=cfg, tx=tx))(state, batch)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new["params"]["base"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for name in ("q", "k", "v"):
    moved = new["params"]["lora"]["block_0"]["attn"][name]["weight"]["b"]
    assert not np.array_equal(np.asarray(moved), np.asarray(adapters["block_0"]["attn"][name]["weight"]["b"]))


def test_adapter_gradients_leave_the_output_gradients_untransposed(autodiff_products):
  """The adapters' gradients contract the tokens. Written as plain jnp products, XLA:CPU ran
  them by writing each adapted projection's output gradient transposed, [out, tokens], in the
  fusion that computes it (a strided pass over the largest activations).
  Through xlt.matmul only the rank-r operand is transposed, and the gradient equals the plain
  products' to float rounding."""
  import re

  params = base()
  adapters = with_random_b(lora.init(params, jax.random.key(1), rank=2, alpha=4.0))
  trained, rebuild = lora.split({"base": params, "lora": adapters})
  f = lambda t: lora.apply(CFG, rebuild(t), TOKENS)[0].std()
  hlo = jax.jit(jax.grad(f)).lower(trained).compile().as_text()
  tokens = TOKENS.size  # 18; the projections' outputs: qkv 24, fc 32, proj 8
  for out in (24, 32, 8):
    assert not re.findall(rf"f32\[{out},({tokens}|{TOKENS.shape[0]},{TOKENS.shape[1]})\]", hlo), out
  got = jax.jit(jax.grad(f))(trained)
  autodiff_products()
  want = jax.jit(jax.grad(f))(trained)  # a fresh function (jax.grad's), traced with the patch
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got, want)
