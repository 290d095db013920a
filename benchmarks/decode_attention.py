"""Two ops of a greedy decoding step on a CPU, each in xlt's form against another that computes
the same values: the attention of one new query per row against the KV cache
(xlt.layers.causal_attention: a product per key/value head, [R, K] x [K, S] for its R query
heads, then the weights' product with the values) against a broadcast multiply and sum, and
the greedy pick (`jnp.argmax`) against the row maximum followed by the first index that holds it.

  python benchmarks/decode_attention.py [--rounds 7] [--out results/exploratory/decode_attention.json]

A decoding step's products have one row per sequence and head, so XLA:CPU runs attention as
many tiny batched products, and the pick is a reduction over the vocabulary: in a jax.profiler
trace of benchmarks/decode_speed.py's batch-64 step both were among its slowest ops for their
work. This measures whether other forms of the same ops run faster, at decoding shapes
(decode_speed.py's tiny Llama; GPT-2-, Llama-1B-, Llama-8B- and Qwen2-7B-like layers, caches
up to 2,048 tokens; compare.py's decoding) and vocabularies (8k to Qwen's 152k). The forms
take turns call by call, on one CPU device with every core, as xlt.generate runs; each row
reports the medians, their ratio and the largest difference between the forms' outputs (0: the
same numbers; the sums' order may differ).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # xlt/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # results_file.py
if __name__ == "__main__":  # one device with every core, as xlt.generate decodes on a CPU
  os.environ.setdefault("XLT_CPU_DEVICES", "1")
  from xlt import cpu_devices

  cpu_devices.configure()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import results_file  # noqa: E402
from xlt import layers, matmul  # noqa: E402

# (name, batch, query heads, key/value heads, head dim, cache length)
ATTENTION = [
    ("decode_speed tiny Llama", 1, 8, 2, 32, 96), ("decode_speed tiny Llama", 8, 8, 2, 32, 96),
    ("decode_speed tiny Llama", 64, 8, 2, 32, 96),
    ("GPT-2-like layer", 8, 12, 12, 64, 512), ("GPT-2-like layer", 64, 12, 12, 64, 512),
    ("Llama-1B-like layer", 8, 32, 8, 64, 512), ("Llama-1B-like layer", 64, 32, 8, 64, 512),
    ("Llama-1B-like layer", 1, 32, 8, 64, 2048), ("Llama-8B-like layer", 1, 32, 8, 128, 2048),
    ("Llama-8B-like layer", 8, 32, 8, 128, 2048), ("Qwen2-7B-like layer", 8, 28, 4, 128, 1024),
    ("compare.py decoding", 512, 4, 4, 32, 120),
]
# (name, batch, vocabulary)
PICK = [("tiny Llama", 1, 8000), ("tiny Llama", 64, 8000), ("Llama 2", 64, 32000), ("GPT-2", 64, 50257),
        ("Qwen", 64, 151936), ("compare.py", 512, 1024)]


def xlt_attention(q_BxHx1xK, k_BxGxSxK, v_BxGxSxK, valid_BxS):
  """xlt.model's attention for one query per row ([B, 1, H, K] out), each row's cache masked."""
  return layers.causal_attention(q_BxHx1xK, k_BxGxSxK, v_BxGxSxK, valid_BxS[:, None, None, :])


def broadcast_attention(q_BxHx1xK, k_BxGxSxK, v_BxGxSxK, valid_BxS):
  """The same values as a broadcast multiply and sum over the head dimension (scores) and over
  the cache (output), normalised after the value sum as xlt's is."""
  b, h, _, d = q_BxHx1xK.shape
  g = k_BxGxSxK.shape[1]
  q_BxGxRxK = q_BxHx1xK.reshape(b, g, h // g, d)
  s_BxGxRxS = jnp.sum(q_BxGxRxK[:, :, :, None, :] * k_BxGxSxK[:, :, None, :, :], -1)
  s_BxGxRxS = s_BxGxRxS + matmul.mask_bias(valid_BxS[:, None, None, :])
  p_BxGxRxS = jnp.exp(s_BxGxRxS - jax.lax.stop_gradient(s_BxGxRxS.max(-1, keepdims=True)))
  out_BxGxRxK = jnp.sum(p_BxGxRxS[..., None] * v_BxGxSxK[:, :, None, :, :], 3)
  out_BxGxRxK = out_BxGxRxK / p_BxGxRxS.sum(-1, keepdims=True)
  return out_BxGxRxK.reshape(b, 1, h, d)


def argmax_pick(logits_BxV):
  return jnp.argmax(logits_BxV, -1).astype(jnp.int32)


def first_max_pick(logits_BxV):
  """jnp.argmax's answer (the first index of the row maximum) for rows without NaN."""
  top_Bx1 = logits_BxV.max(-1, keepdims=True)
  index_BxV = jax.lax.broadcasted_iota(jnp.int32, logits_BxV.shape, 1)
  return jnp.min(jnp.where(logits_BxV == top_Bx1, index_BxV, logits_BxV.shape[1]), -1)


def attention_inputs(batch, heads, kv_heads, head_dim, length, seed=0):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
  q = normal(batch, heads, 1, head_dim) / np.sqrt(head_dim)
  used = rng.integers(length // 2, length + 1, batch)  # each row's cache filled to its own length
  valid = jnp.asarray(np.arange(length)[None, :] < used[:, None])
  return q, normal(batch, kv_heads, length, head_dim), normal(batch, kv_heads, length, head_dim), valid


def pick_inputs(batch, vocab, seed=0):
  logits = np.random.default_rng(seed).standard_normal((batch, vocab)).astype(np.float32)
  logits[:, [vocab // 3, vocab // 2]] = logits.max() + 1  # a tie in every row: the first index wins
  return (jnp.asarray(logits),)


def compare(forms, args, rounds: int, calls: int) -> tuple[list[float], float]:
  """Median seconds per call of each jitted form (taking turns, `calls` calls a turn) and the
  largest difference between their outputs."""
  outs = [np.asarray(f(*args)) for f in forms]  # compiled here, outside the timing
  times = [[] for _ in forms]
  for _ in range(rounds):
    for f, ts in zip(forms, times):
      start = time.perf_counter()
      for _ in range(calls):
        out = f(*args)
      jax.block_until_ready(out)
      ts.append((time.perf_counter() - start) / calls)
  diff = max(float(np.max(np.abs(o.astype(np.float64) - outs[0]))) for o in outs[1:])
  return [statistics.median(ts) for ts in times], diff


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--calls", type=int, default=20, help="calls per turn")
  parser.add_argument("--out", default="results/exploratory/decode_attention.json")
  a = parser.parse_args(argv)
  start, rows = time.perf_counter(), []
  attention = [jax.jit(xlt_attention), jax.jit(broadcast_attention)]
  for name, *shape in ATTENTION:
    (xlt_s, other_s), diff = compare(attention, attention_inputs(*shape), a.rounds, a.calls)
    b, h, g, d, s = shape
    rows.append(["attention", f"{name}: batch {b}, {h}/{g} heads x {d}, cache {s}", xlt_s * 1e3, other_s * 1e3,
                 xlt_s / other_s, diff])
    print(rows[-1], flush=True)
  pick = [jax.jit(argmax_pick), jax.jit(first_max_pick)]
  for name, b, v in PICK:
    (xlt_s, other_s), diff = compare(pick, pick_inputs(b, v), a.rounds, a.calls)
    rows.append(["greedy pick", f"{name}: batch {b}, vocabulary {v}", xlt_s * 1e3, other_s * 1e3, xlt_s / other_s,
                 diff])
    print(rows[-1], flush=True)
  results_file.write(
      a.out, benchmark="decode_attention", title="A decoding step's attention and greedy pick in two forms, ms per call",
      columns=["op", "shape", "xlt's form ms", "other form ms", "xlt / other (time)", "largest difference"],
      rows=rows, wall_s=time.perf_counter() - start, versions={"jax": jax.__version__},
      notes=f"{a.rounds} rounds of {a.calls} calls per form, taking turns; medians. Attention: xlt.layers."
            "causal_attention against a broadcast multiply and sum; greedy pick: jnp.argmax against the row "
            "maximum then the first index holding it.")


if __name__ == "__main__":
  main()
