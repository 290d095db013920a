"""Training throughput of xlt's jitted step on this machine.

  python benchmarks/train_step.py                      # graph reference config, E=1 and E=9
  python benchmarks/train_step.py --ensemble 1 --seq 128 --batch 64

Reports tokens/s (every position of every sequence of every ensemble member) and
achieved GFLOP/s (6·N·tokens + attention), median over timed steps after warm-up, and
the speedup of training E models together (one vmapped step) over E separate runs one
after the other (E × the single model's step time). For the allocator effect, run it
with and without LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.
"""

import argparse
import time

import jax
import numpy as np

from xlt import model as model_lib
from xlt import sharding
from xlt import train as train_lib
import ml_collections


def bench(layers, heads, width, vocab, seq, batch, ensemble, steps, accum=1):
  cfg = model_lib.Config(vocab_size=vocab, block_size=max(seq, 128), num_layers=layers,
                         num_heads=heads, d_model=width)
  opt = ml_collections.ConfigDict(dict(name="adamw", schedule="cosine", peak_lr=3e-3,
                                       warmup_steps=10, total_steps=1000, b1=0.9, b2=0.95,
                                       weight_decay=0.1, clip=1.0))
  tx = train_lib.make_optimizer(opt)
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  seeds = list(range(ensemble))
  abstract = jax.eval_shape(lambda: train_lib.init_state(cfg, tx, seeds))
  step, st_sh, _ = train_lib.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract, accum)
  with mesh:
    state = jax.jit(lambda: train_lib.init_state(cfg, tx, seeds), out_shardings=st_sh)()
  rng = np.random.default_rng(0)
  batch_ = {"tokens": rng.integers(0, vocab, (ensemble, batch, seq + 1)).astype(np.int32),
            "loss_mask": np.ones((ensemble, batch, seq), np.float32)}
  times = []
  for i in range(steps + 3):
    t0 = time.perf_counter()
    state, m = step(state, batch_)
    jax.block_until_ready(m)
    if i >= 3:
      times.append(time.perf_counter() - t0)
  dt = float(np.median(times))
  n = model_lib.count_params(jax.tree.map(lambda x: x[0], state["params"]))
  tokens = ensemble * batch * seq
  flops = 6 * n * tokens + ensemble * batch * 12 * layers * seq * seq * width
  return tokens / dt, flops / dt / 1e9, dt


if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--layers", type=int, default=6)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--width", type=int, default=64)
  p.add_argument("--vocab", type=int, default=104)
  p.add_argument("--seq", type=int, nargs="+", default=[128, 29])
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--ensemble", type=int, nargs="+", default=[1, 9])
  p.add_argument("--accum", type=int, default=1)
  p.add_argument("--steps", type=int, default=20)
  a = p.parse_args()
  print("| layers | width | batch | seq | ensemble | step ms | tokens/s | GFLOP/s | vs separate runs |")
  print("|---|---|---|---|---|---|---|---|---|")
  for seq in a.seq:
    single = None
    for e in a.ensemble:
      tps, gf, dt = bench(a.layers, a.heads, a.width, a.vocab, seq, a.batch, e, a.steps, a.accum)
      single = dt if e == 1 else single
      speedup = f"{single * e / dt:.2f}x" if single else "–"
      print(f"| {a.layers} | {a.width} | {a.batch} | {seq} | {e} | {dt*1e3:.1f} | {tps:,.0f} | {gf:.1f} | {speedup} |",
            flush=True)
