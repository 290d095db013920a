"""The text proxy's matmuls alone: XLA:CPU (as xlt's step compiles them) against PyTorch.

  python benchmarks/matmul.py jax                   # XLA on one CPU device, all cores
  python benchmarks/matmul.py torch                 # PyTorch (the `[bench]` extra), all cores
  taskset -c 0 python benchmarks/matmul.py jax      # either on one core

Prints GFLOP/s for the text proxy's (benchmarks/compare.py) 2-D products (projections, logits,
their gradients), the attention's batched products [batch, heads, 128, 32], and the dense
layers' weight gradients (as autodiff writes them, and for jax also as
xlt.matmul.dense computes them), so a step's gap
to PyTorch can be split into its matmuls and the rest. Each product is timed alone (median of
50 calls after one that compiles). Which library runs which product: the first line says.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/, xlt/
from benchmarks.compare import median_seconds  # noqa: E402  (imports neither jax nor torch)

# [M, K] x [K, N]: the projections and MLP (2048 tokens, d 128, 4d 512), the logits (vocab 1024),
# and their gradients' shapes
PLAIN = [(2048, 128, 1024), (2048, 1024, 128), (128, 2048, 1024), (2048, 128, 512), (2048, 512, 128),
         (128, 2048, 512)]
# the dense layers' weight gradients: [tokens, in] and [tokens, out] (lm_head, MLP fc, MLP proj)
WEIGHT_GRAD = [(2048, 128, 1024), (2048, 128, 512), (2048, 512, 128)]
# the attention's products in the forward and backward passes (batch 16, 4 heads, 128 tokens, 32 per head)
BATCHED = [("bhqd,bhkd->bhqk", (16, 4, 128, 32), (16, 4, 128, 32)),
           ("bhqk,bhkd->bhqd", (16, 4, 128, 128), (16, 4, 128, 32)),
           ("bhqk,bhqd->bhkd", (16, 4, 128, 128), (16, 4, 128, 32))]


def flops(eq, a, b):
  ins = eq.split("->")[0].split(",")
  dims = {**dict(zip(ins[0], a)), **dict(zip(ins[1], b))}
  return 2 * np.prod([dims[c] for c in set(ins[0] + ins[1])])


def main(lib):
  if lib == "torch":
    import torch
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    lib = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    plain = lambda a, b: (lambda: a @ b)
    batched = lambda eq, a, b: (lambda: torch.einsum(eq, a, b))
    ones = torch.ones
    weight_grad = lambda x, dy: (lambda: x.T @ dy)
    xlt_weight_grad = None
  else:
    os.environ.setdefault("XLT_CPU_DEVICES", "1")
    from xlt import allocator, cpu_devices
    cpu_devices.configure()
    allocator.preload()
    import jax
    import jax.numpy as jnp
    lib = f"jax {jax.__version__}, {jax.device_count()} CPU device, {len(os.sched_getaffinity(0))} cores"
    mm = jax.jit(lambda a, b: a @ b)
    plain = lambda a, b: (lambda: mm(a, b).block_until_ready())

    def batched(eq, a, b):
      f = jax.jit(lambda x, y: jnp.einsum(eq, x, y))
      return lambda: f(a, b).block_until_ready()

    ones = lambda *s: jnp.ones(s)
    from xlt import matmul

    tn = jax.jit(lambda x, dy: x.T @ dy)
    weight_grad = lambda x, dy: (lambda: tn(x, dy).block_until_ready())
    # the kernel's gradient of a dense layer with input x, taken with cotangent dy
    vjp = jax.jit(lambda x, dy: jax.vjp(lambda w: matmul.dense(x, w, (((1,), (0,)), ((), ()))),
                                        jnp.zeros((x.shape[1], dy.shape[1])))[1](dy)[0])
    xlt_weight_grad = lambda x, dy: (lambda: vjp(x, dy).block_until_ready())
  print(lib)
  for m, k, n in PLAIN:
    dt = median_seconds(plain(ones(m, k), ones(k, n)), 1, 50)
    print(f"[{m}, {k}] x [{k}, {n}]: {dt * 1e3:.2f} ms, {2 * m * k * n / dt / 1e9:.0f} GFLOP/s")
  for eq, a, b in BATCHED:
    dt = median_seconds(batched(eq, ones(*a), ones(*b)), 1, 50)
    print(f"{eq} {list(a)} {list(b)}: {dt * 1e3:.2f} ms, {flops(eq, a, b) / dt / 1e9:.0f} GFLOP/s")
  # a dense layer's weight gradient x^T dy (x [tokens, in], dy [tokens, out]), contracting the
  # tokens: as autodiff writes it, and (jax) as xlt.matmul.dense's backward pass does
  for m, k, n in WEIGHT_GRAD:
    x, dy = ones(m, k), ones(m, n)
    ways = {"x^T dy": weight_grad(x, dy)}
    if xlt_weight_grad is not None:
      ways["x^T dy, xlt's backward"] = xlt_weight_grad(x, dy)
    for name, fn in ways.items():
      dt = median_seconds(fn, 1, 50)
      print(f"weight gradient {name} [{m}, {k}] [{m}, {n}]: {dt * 1e3:.2f} ms, {2 * m * k * n / dt / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
  if sys.argv[1:] not in (["jax"], ["torch"]):
    sys.exit("usage: python benchmarks/matmul.py jax|torch")
  main(sys.argv[1])
