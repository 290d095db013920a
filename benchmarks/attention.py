"""Which attention trains fastest here: xlt's (xlt.model.causal_attention: the mask an added
bias, the queries cut into xlt.matmul.causal_query_chunks chunks, normalised after the value
product) against its earlier form (`mask_select`), itself in one chunk or in a fixed number
of chunks (`chunks_2` .. `chunks_8`), a head-major variant and `jax.nn.dot_product_attention`,
each inside the whole training step of benchmarks/compare.py's shapes, on every CPU device as
`python -m xlt.main` runs. The variants take turns step by step, so the machine's noise falls
on all alike.

  python benchmarks/attention.py [--jobs text_proxy,graph_128] [--steps 30] [--seq 512]

Prints ms per step (median over steps, with the quartiles) and each variant's speed relative
to xlt's. `--seq` runs the jobs at another sequence length (the position table grows to it;
graph_128 at 512 tokens is the graph model at the text reference's length). Each variant is
traced while `xlt.model.causal_attention` is it, and all compute the same function (the
first step's losses agree; tests/test_model.py checks xlt's against a plain softmax).
`jax_dpa` is `jax.nn.dot_product_attention` with jax's default implementation, which in jax
0.10.2 is its XLA one (cuDNN only on request, in 16-bit floats on an NVIDIA GPU), so on a CPU
it answers whether jax's composition of the same ops compiles better than xlt's.
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
import numpy as np  # noqa: E402

import compare  # noqa: E402
from xlt import matmul, model as model_lib, sharding  # noqa: E402


XLT = model_lib.causal_attention  # bound now: the benchmark swaps the module's attribute


def mask_select(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p, query_chunks=1):
  """xlt's former attention: the mask a select, every score computed."""
  del query_chunks
  dt = q_BxHxTxK.dtype
  att = jnp.where(mask_TxS, matmul.attention_scores(q_BxHxTxK, k_BxHxSxK).astype(jnp.float32), -1e30)
  p = jnp.exp(att - jax.lax.stop_gradient(att.max(-1, keepdims=True)))
  out = matmul.attention_values(drop(p).astype(dt), v_BxHxSxK)
  return (out.astype(jnp.float32) / p.sum(-1).transpose(0, 2, 1)[..., None]).astype(dt)


def one_chunk(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p, query_chunks=1):
  """xlt's attention with every query in one chunk (all scores computed)."""
  del query_chunks
  return XLT(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop)


def head_major(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p, query_chunks=1):
  """Plain einsums with the value product written head-major ([B, H, T, K]) and one
  transpose to [B, T, H, K] after it."""
  del query_chunks
  dt = q_BxHxTxK.dtype
  att = jnp.where(mask_TxS, jnp.einsum("bhtk,bhsk->bhts", q_BxHxTxK, k_BxHxSxK).astype(jnp.float32), -1e30)
  p = jnp.exp(att - jax.lax.stop_gradient(att.max(-1, keepdims=True)))
  out = jnp.einsum("bhts,bhsk->bhtk", drop(p).astype(dt), v_BxHxSxK)
  return (out.astype(jnp.float32) / p.sum(-1, keepdims=True)).astype(dt).transpose(0, 2, 1, 3)


def jax_dpa(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p, query_chunks=1):
  """jax.nn.dot_product_attention (its inputs are [B, T, H, K]; xlt already scaled q)."""
  del drop, query_chunks  # it has no dropout of the weights: the benchmark's models have none
  t = lambda x: x.transpose(0, 2, 1, 3)
  return jax.nn.dot_product_attention(t(q_BxHxTxK), t(k_BxHxSxK), t(v_BxHxSxK), mask=mask_TxS[None, None],
                                      scale=1.0)


def fixed_chunks(n):
  """xlt's attention with its queries in n chunks at any length (xlt picks the count by T)."""
  def attention(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop=lambda p: p, query_chunks=1):
    del query_chunks
    return XLT(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, mask_TxS, drop, n if q_BxHxTxK.shape[2] == k_BxHxSxK.shape[2] else 1)
  return attention


VARIANTS = {"xlt": XLT, "mask_select": mask_select, "one_chunk": one_chunk,
            "head_major": head_major, "jax_dpa": jax_dpa,
            **{f"chunks_{n}": fixed_chunks(n) for n in (2, 3, 4, 8)}}


def main(a):
  mesh = sharding.make_mesh({"data": -1})
  jobs = {j["name"]: j for j in compare.plan() if j["kind"] == "train"}
  unknown = set(a.jobs.split(",")) - set(jobs)
  if unknown:
    raise SystemExit(f"unknown jobs {sorted(unknown)}; training jobs: {sorted(jobs)}")
  variants = a.variants.split(",")
  if set(variants) - set(VARIANTS):
    raise SystemExit(f"unknown variants {sorted(set(variants) - set(VARIANTS))}; known: {sorted(VARIANTS)}")
  print(f"{len(jax.devices())} {jax.devices()[0].platform} devices, jax {jax.__version__}; ms per step, "
        f"median of {a.steps} steps per variant, variants taking turns step by step\n")
  print("| shape | attention | ms per step | quartiles | speed vs xlt's |\n|---|---|---|---|---|")
  for name in a.jobs.split(","):
    job = jobs[name]
    model, t = dict(job["model"]), a.seq or job["seq"]
    model["block_size"] = max(model["block_size"], t)
    cfg = model_lib.Config(**model)
    runs = {}
    for variant in variants:
      model_lib.causal_attention = VARIANTS[variant]  # read when the step is traced (its first call below)
      try:
        # the same seed for every variant: the same initial state and batch
        step, state, batch = compare.single_model_step(cfg, job["batch"], t, mesh, np.random.default_rng(0))
        with jax.set_mesh(mesh):
          state, metrics = step(state, batch)
          state, _ = step(state, batch)  # a second warm-up step
        print(f"<!-- {name} {variant}: first loss {float(np.asarray(metrics['loss'])[0]):.6f} -->", flush=True)
      finally:
        model_lib.causal_attention = XLT
      runs[variant] = [step, state, []]
    with jax.set_mesh(mesh):
      for _ in range(a.steps):
        for run in runs.values():
          t0 = time.perf_counter()
          run[1], _ = run[0](run[1], batch)
          jax.block_until_ready(run[1])
          run[2].append(time.perf_counter() - t0)
    base = statistics.median(runs[variants[0]][2])
    label = f"{name} at {t} tokens" if a.seq else name
    for variant, (_, _, times) in runs.items():
      q1, med, q3 = (float(x) * 1e3 for x in np.percentile(times, [25, 50, 75]))
      print(f"| {label} | {variant} | {med:.1f} | {q1:.1f}-{q3:.1f} | {base * 1e3 / med:.2f} |", flush=True)


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--jobs", default="text_proxy,graph_128", help="training jobs of benchmarks/compare.py")
  p.add_argument("--variants", default="xlt,mask_select,one_chunk,head_major,jax_dpa",
                 help="the first is the baseline of the speed column")
  p.add_argument("--steps", type=int, default=30, help="timed steps per variant")
  p.add_argument("--seq", type=int, default=0, help="sequence length instead of each job's")
  main(p.parse_args())
