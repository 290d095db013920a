"""What dropout costs a training step: the graph config's model (6 x 64, batch 64 x 29, one
member, one CPU device, the allocator xlt.main preloads) stepped without dropout, with xlt's
masks (xlt.model.dropout: 16 random bits per entry from the non-partitionable threefry) and
with flax's (nn.Dropout: a float uniform per entry from the partitionable threefry, which
hashes once per entry), rounds alternating in one process so the machine's noise falls on all
three alike.

  python benchmarks/dropout.py [--rounds 5] [--steps 30] [--rate 0.05]

Prints ms per step (median of each round's mean) and each variant's ratio to no dropout.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
if __name__ == "__main__":  # as `python -m xlt.main` starts: before jax is imported
  from xlt import allocator

  allocator.preload()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from configs import graph  # noqa: E402
from xlt import model, train  # noqa: E402


def flax_masks(key, x, rate):
  """nn.Dropout's computation (flax.linen.Dropout.__call__)."""
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jax.lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))


def compiled_step(c, rate: float, masks):
  """A jitted train_step of one member, traced while `model.dropout` is `masks`."""
  cfg = model.Config(vocab_size=112, block_size=c.model.block_size, num_layers=c.model.num_layers,
                     num_heads=c.model.num_heads, d_model=c.model.d_model, dropout=rate)
  tx = train.make_optimizer(c.opt)
  state = jax.tree.map(lambda x: x[0], train.init_state(cfg, tx, [0]))
  batch = {"tokens": jnp.ones((c.train.batch_size, 30), jnp.int32),
           "loss_mask": jnp.ones((c.train.batch_size, 29), jnp.float32)}
  step = jax.jit(lambda s, b: train.train_step(s, b, cfg=cfg, tx=tx))
  original, model.dropout = model.dropout, masks
  try:
    step = step.lower(state, batch).compile()
  finally:
    model.dropout = original
  return step, state, batch


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--rate", type=float, default=0.05)
  a = p.parse_args()
  c = graph.get_config()
  variants = {"no dropout": compiled_step(c, 0.0, model.dropout),
              "xlt masks": compiled_step(c, a.rate, model.dropout),
              "flax masks": compiled_step(c, a.rate, flax_masks)}
  times = {name: [] for name in variants}
  for _ in range(a.rounds):
    for name, (step, state, batch) in variants.items():
      state, _ = step(state, batch)  # warm
      jax.block_until_ready(state)
      t = time.perf_counter()
      for _ in range(a.steps):
        state, _ = step(state, batch)
      jax.block_until_ready(state)
      times[name].append((time.perf_counter() - t) / a.steps * 1e3)
  base = statistics.median(times["no dropout"])
  print(f"dropout {a.rate}, graph model, batch {c.train.batch_size} x 29, {jax.devices()[0].platform}, "
        f"{a.rounds} rounds x {a.steps} steps")
  print("| variant | ms per step (median) | / no dropout | per round |\n|---|---|---|---|")
  for name, ts in times.items():
    med = statistics.median(ts)
    print(f"| {name} | {med:.1f} | {med / base:.2f} | {' / '.join(f'{t:.1f}' for t in ts)} |")


if __name__ == "__main__":
  main()
