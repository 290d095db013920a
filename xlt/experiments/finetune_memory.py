"""The fine-tuning kind's memory estimate before anything loads or trains (xlt.memory's figures
for one fully trained model and for one LoRA model), and the refusal of a run that cannot fit."""

from __future__ import annotations

import jax

from xlt import lora, memory, sharding
from xlt import train as train_lib


def estimate(c, cfg, shapes, recipes) -> dict:
  """Prints the estimated memory of one fully trained model (`shapes`: the base's parameters,
  abstract); fails in one line when the models trained together would not fit
  `c.device_memory_gb` (each gets its share), or when the parameters alone would not fit the
  device's memory as it reports it (an accelerator; a CPU reports none)."""
  mesh = sharding.make_mesh(c.mesh)
  est = memory.estimate(cfg, shapes, train_lib.make_optimizer(c.opt), mesh, batch=c.train.batch_size,
                        seq=c.data.block_size, grad_accum=c.train.grad_accum, remat=cfg.remat == "block")
  together = len([r for r in recipes if r.variant == "full"]) if c.together else 1
  print(f"finetune: estimated memory of one fully trained model"
        f"{f' (x {together}: they train together)' if together > 1 else ''}\n{memory.format(est)}", flush=True)
  if c.device_memory_gb:
    memory.check_fits(est, int(c.device_memory_gb * (1 << 30)) // together)
  if any(r.variant == "lora" for r in recipes):  # its own figures: it trains the adapters alone
    print(lora_memory(c, cfg, shapes, mesh), flush=True)
  try:
    device = (mesh.devices.flat[0].memory_stats() or {}).get("bytes_limit")
  except Exception:  # noqa: BLE001  (a backend without memory statistics)
    device = None
  if device and est["params"] > device:
    raise ValueError(f"{c.base}: its parameters alone take {est['params'] / (1 << 30):.2f} GiB per device, over the "
                     f"device's {device / (1 << 30):.2f} GiB: shard them (mesh.fsdp) or use more devices")
  return est


def lora_memory(c, cfg, shapes, mesh) -> str:
  """The estimate of one LoRA model (adapters on every projection, `c.lora`'s rank and optimizer)."""
  adapters = jax.eval_shape(lambda p: lora.init(p, jax.random.key(0), rank=c.lora.rank, alpha=c.lora.alpha), shapes)
  est = memory.estimate(cfg, {"base": shapes, "lora": adapters}, train_lib.make_optimizer(c.lora.opt), mesh,
                        batch=c.lora.train.batch_size, seq=c.data.block_size, grad_accum=c.lora.train.grad_accum)
  return f"finetune: estimated memory of one LoRA model (rank {c.lora.rank}: adapters only trained)\n" + \
      memory.format(est)
