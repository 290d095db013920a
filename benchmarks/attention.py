"""Which attention trains fastest here: xlt's (xlt.model.causal_attention: masked einsums,
normalised after the value product) against `jax.nn.dot_product_attention` and a head-major
variant, each inside the whole training step of benchmarks/compare.py's shapes, on every CPU
device as `python -m xlt.main` runs, rounds alternating in one process so the machine's noise
falls on all alike.

  python benchmarks/attention.py [--jobs text_proxy,graph_128] [--rounds 3] [--steps 10]

Prints ms per step (median over rounds of each round's median) and each variant's speed
relative to xlt's. Each variant is traced while `xlt.model.causal_attention` is it, and all
compute the same function (the first step's losses agree; tests/test_model.py checks xlt's
against a plain softmax). `jax_dpa` is `jax.nn.dot_product_attention` with jax's default
implementation, which in jax 0.10.2 is its XLA one (cuDNN only on request, in 16-bit floats
on an NVIDIA GPU), so on a CPU it answers whether jax's composition of the same ops compiles
better than xlt's.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/, xlt/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # compare.py
if __name__ == "__main__":  # as `python -m xlt.main` starts: before jax is imported
  from xlt import allocator, cpu_devices

  cpu_devices.configure()
  allocator.preload()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

import compare  # noqa: E402
from xlt import model as model_lib, sharding, train as train_lib  # noqa: E402


def head_major(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p):
  """xlt's computation with the value product written head-major ([B, H, T, K]) and one
  transpose to [B, T, H, K] after it."""
  dt = q_BxHxTxK.dtype
  att = jnp.where(mask_TxS, jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxHxSxK).astype(jnp.float32), -1e30)
  p = jnp.exp(att - jax.lax.stop_gradient(att.max(-1, keepdims=True)))
  out = jnp.einsum("bhts,bhsk->bhtk", drop(p).astype(dt), v_BxHxSxK)
  return (out.astype(jnp.float32) / p.sum(-1, keepdims=True)).astype(dt).transpose(0, 2, 1, 3)


def jax_dpa(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p):
  """jax.nn.dot_product_attention (its inputs are [B, T, H, K]; xlt already scaled q)."""
  del drop  # it has no dropout of the weights: the benchmark's models have none
  t = lambda x: x.transpose(0, 2, 1, 3)
  return jax.nn.dot_product_attention(t(q_BxHxTxK), t(k_BxHxSxK), t(v_BxHxSxK), mask=mask_TxS[None, None],
                                      scale=1.0)


VARIANTS = {"xlt": model_lib.causal_attention, "head_major": head_major, "jax_dpa": jax_dpa}


def main(a):
  tx = train_lib.make_optimizer(ml_collections.ConfigDict(compare.OPT))
  mesh = sharding.make_mesh({"data": -1})
  rng = np.random.default_rng(0)
  jobs = {j["name"]: j for j in compare.plan() if j["kind"] == "train"}
  unknown = set(a.jobs.split(",")) - set(jobs)
  if unknown:
    raise SystemExit(f"unknown jobs {sorted(unknown)}; training jobs: {sorted(jobs)}")
  runs, xlt_attention = {}, model_lib.causal_attention
  for name in a.jobs.split(","):
    job = jobs[name]
    cfg, b, t = model_lib.Config(**job["model"]), job["batch"], job["seq"]
    batch = {"tokens": rng.integers(0, cfg.vocab_size, (1, b, t + 1)).astype(np.int32),
             "loss_mask": np.ones((1, b, t), np.float32)}
    abstract = jax.eval_shape(lambda: train_lib.init_state(cfg, tx, [0]))
    for variant, fn in VARIANTS.items():
      model_lib.causal_attention = fn  # read when the step is traced (its first call below)
      try:
        step, st_sh = train_lib.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract)[:2]
        with jax.set_mesh(mesh):
          state = jax.jit(lambda s: train_lib.init_state(cfg, tx, s), out_shardings=st_sh)(np.arange(1))
          state, metrics = step(state, batch)
          print(f"{name} {variant}: first loss {float(np.asarray(metrics['loss'])[0]):.6f}", flush=True)
      finally:
        model_lib.causal_attention = xlt_attention
      runs[name, variant] = [step, state, batch]

  times = {key: [] for key in runs}
  for _ in range(a.rounds):
    for key, run in runs.items():
      step, state, batch = run
      per_step = []
      with jax.set_mesh(mesh):
        for i in range(a.steps + 2):  # two warm-up steps
          t0 = time.perf_counter()
          state, _ = step(state, batch)
          jax.block_until_ready(state)
          if i >= 2:
            per_step.append(time.perf_counter() - t0)
      run[1] = state
      times[key].append(statistics.median(per_step) * 1e3)

  print(f"\n{len(jax.devices())} {jax.devices()[0].platform} devices, jax {jax.__version__}; ms per step, "
        f"median of {a.rounds} rounds (each the median of {a.steps} steps)\n")
  print("| shape | attention | ms per step | speed vs xlt's | per round |\n|---|---|---|---|---|")
  for (name, variant), ms in times.items():
    base = statistics.median(times[name, "xlt"])
    print(f"| {name} | {variant} | {statistics.median(ms):.1f} | {base / statistics.median(ms):.2f} | "
          f"{' / '.join(f'{x:.1f}' for x in ms)} |")


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--jobs", default="text_proxy,graph_128", help="training jobs of benchmarks/compare.py")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
  main(p.parse_args())
