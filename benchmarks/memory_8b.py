"""Memory per device of xlt's fine-tuning recipes on 8B-class models, from shapes alone
(xlt.memory.estimate; nothing is downloaded or allocated): the README's table.

  python benchmarks/memory_8b.py [--batch 8] [--seq 2048] [--lora_rank 16]

Models: Llama 3.1 8B and Qwen2.5-7B, their configs built by hand from the public config.json
values and read by xlt.pretrained.config_from_hf, as a download of the model would be.
Recipes, each with remat (jax.checkpoint per block) and bf16 parameters and activations:

  full         every parameter trained, Adam's two moments in float32
               (opt.state_dtype, xlt.train.with_state_dtype)
  frozen [C]   the partial task expert: the middle blocks trained, the bottom 6 and top 2 of 32
               (scaled to the depth), embeddings and head frozen: no Adam state, and the
               gradients of the trained blocks only (xlt.memory's `trainable` mask): the static
               step a partial expert trained alone takes (xlt.train.static_freeze); the gated
               step of recipes trained together forms every gradient and moment)
  LoRA r=16    adapters on every attention and MLP projection, the base frozen

Devices: one 80 GB GPU (a mesh of 1 device) and a TPU v5e-8 slice (16 GiB HBM per chip, the
parameters, gradients and Adam state sharded over fsdp=8). The meshes are of fake CPU devices
(only their shapes count): the script asks XLA for 8 before jax loads, and names the platform
each stands for, so the estimate counts what runs there: cuDNN's or splash's fused attention
(no score matrices) and the cross-entropy fused with its gradient. The device's own peak is the
ground truth: on an H200 it was 0.90-1.15x this estimate (xlt/memory.py, docs/speed.md).
"""

from __future__ import annotations

import argparse
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402 (after XLA_FLAGS)
import ml_collections  # noqa: E402
import optax  # noqa: E402

from xlt import lora, memory, model, partition, pretrained, sharding  # noqa: E402
from xlt import train as train_lib  # noqa: E402

# the public config.json values (meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B)
LLAMA_31_8B = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, hidden_act="silu",
    max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
    attention_bias=False, mlp_bias=False, torch_dtype="bfloat16",
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192))
QWEN25_7B = dict(
    model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=3584, intermediate_size=18944,
    num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, hidden_act="silu",
    max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
    use_sliding_window=False, sliding_window=131072, max_window_layers=28, torch_dtype="bfloat16")
MODELS = {"Llama 3.1 8B": LLAMA_31_8B, "Qwen2.5-7B": QWEN25_7B}
DEVICES = {"one 80 GB GPU": (dict(data=1, fsdp=1, tensor=1, devices=1), 80 << 30, "gpu"),
           "TPU v5e-8 (fsdp 8)": (dict(data=1, fsdp=8, tensor=1, devices=8), 16 << 30, "tpu")}


def optimizer() -> optax.GradientTransformation:
  """xlt's AdamW (clipping, weight decay on matrices) with float32 moments (opt.state_dtype)."""
  c = ml_collections.ConfigDict(dict(name="adamw", schedule="cosine", peak_lr=1e-5, warmup_steps=10,
                                     total_steps=1000, b1=0.9, b2=0.95, weight_decay=0.0, clip=1.0,
                                     state_dtype="float32"))
  return train_lib.make_optimizer(c)


def recipes(cfg: model.Config, shapes, rank: int) -> dict:
  """{recipe: (params shapes, trainable)} of the module doc."""
  layers = cfg.num_layers
  bottom, top = round(6 * layers / 32), round(2 * layers / 32)
  labels = partition.labels(shapes, partition.preset_rules("C", layers, bottom, top))
  adapters = jax.eval_shape(lambda p: lora.init(p, jax.random.key(0), rank=rank, alpha=2.0 * rank), shapes)
  return {"full fine-tuning": (shapes, None),
          f"frozen [C] (blocks {bottom}-{layers - top - 1} trained)": (shapes, partition.mask(labels, "task")),
          f"LoRA rank {rank}": ({"base": shapes, "lora": adapters}, None)}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=2048)
  p.add_argument("--lora_rank", type=int, default=16)
  args = p.parse_args(argv)
  tx = optimizer()
  for name, hf in MODELS.items():
    cfg = pretrained.config_from_hf(hf, dtype="bfloat16")
    shapes = jax.eval_shape(lambda cfg=cfg: model.init_params(cfg, jax.random.key(0)))
    for device, (mesh_spec, budget, platform) in DEVICES.items():
      mesh = sharding.make_mesh(mesh_spec)
      for recipe, (params, trainable) in recipes(cfg, shapes, args.lora_rank).items():
        est = memory.estimate(cfg, params, tx, mesh, batch=args.batch, seq=args.seq, trainable=trainable,
                              remat=True, platform=platform)
        try:
          memory.check_fits(est, budget)
          verdict = f"fits in {budget / (1 << 30):.0f} GiB"
        except ValueError as e:
          verdict = f"does not fit: {e}"
        print(f"### {name}, {recipe}, {device}\n{memory.format(est)}\n{verdict}\n", flush=True)


if __name__ == "__main__":
  main()
