"""XLA:CPU's matrix products against the platform BLAS called from inside the compiled program:
each product alone, and as the products of the loaded Llama's training step.

  python benchmarks/blas_products.py --workdir=runs/finetune --out=results/exploratory/blas_products_xeon.json

Why: on an Intel Xeon PyTorch's products (MKL) outrun XLA:CPU's (YNNPACK) at the loaded-model
step's shapes (benchmarks/product_ceiling.py), and the jaxlib on PyPI has no oneDNN. scipy ships
OpenBLAS with AVX-512 kernels, and XLA:CPU can call a C function in place of an op (a custom
call). Here scipy's `sgemm` (its pointer from `scipy.linalg.cython_blas`) is wrapped in a ctypes
callback with the legacy custom-call signature (output pointer, operand pointers, an opaque
string holding the dimensions) and registered with `jax.ffi.register_ffi_target`: the operands
are read where XLA keeps them, no copy. Measured in one process, rounds alternating which goes
first:

1. each distinct product of benchmarks/finetune_step.py's tiny and small full steps (a
   projection's forward x @ w.T, its input gradient dy @ w, its weight gradient dy^T x as xlt
   takes it), median of repeated calls;
2. that benchmark's xlt step (full and LoRA, on the checkpoints it wrote under --workdir), as
   xlt runs it and with xlt.matmul's dense products (`dense_t`, `dense`; their backward passes
   the same three products each) replaced by the custom call while the step is traced.

Not a part of xlt: how the idea was measured (docs/speed.md, "What did not help"). The step's
results differ from xlt's by float rounding (another library's summation order).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # as `python -m xlt.main` starts: before jax is imported
  os.environ.setdefault("XLT_CPU_DEVICES", "1")  # the fine-tuning kind's one device, every core
  from xlt import allocator, cpu_devices

  cpu_devices.configure()
  allocator.preload()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import results_file  # noqa: E402
from benchmarks.compare import median_seconds  # noqa: E402
from benchmarks.product_ceiling import products  # noqa: E402
from xlt import matmul  # noqa: E402

TARGET = "xlt_benchmark_sgemm"
COLUMNS = ["what", "M x K x N", "XLA", "OpenBLAS (custom call)", "unit", "XLA time / OpenBLAS time"]


# ---------------------------------------------------------------------------- the custom call


@functools.cache
def register():
  """Registers scipy's sgemm as the CPU custom call TARGET; returns the callback (kept alive)."""
  import scipy.linalg.cython_blas as cython_blas

  api = ctypes.pythonapi
  api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]
  api.PyCapsule_GetPointer.restype = ctypes.c_void_p
  api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
  api.PyCapsule_New.restype = ctypes.py_object
  api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
  capsule = cython_blas.__pyx_capi__["sgemm"]
  i, f, p = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_float), ctypes.c_void_p
  sgemm = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, i, i, i, f, p, i, p, i, f, p, i)(
      api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule)))
  one, zero, ref, c_int = ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.byref, ctypes.c_int

  def target(out, operands, opaque, size, status):
    # row-major C[M, N] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first
    m, k, n, ta, tb = map(int, ctypes.string_at(opaque, size).split(b","))
    sgemm(b"T" if tb else b"N", b"T" if ta else b"N", ref(c_int(n)), ref(c_int(m)), ref(c_int(k)), ref(one),
          operands[1], ref(c_int(k if tb else n)), operands[0], ref(c_int(m if ta else k)), ref(zero), out,
          ref(c_int(n)))

  callback = ctypes.CFUNCTYPE(None, p, ctypes.POINTER(p), p, ctypes.c_size_t, p)(target)
  jax.ffi.register_ffi_target(TARGET, api.PyCapsule_New(ctypes.cast(callback, p), b"xla._CUSTOM_CALL_TARGET", None),
                              platform="cpu", api_version=0)
  return callback


def blas(a, b, transpose_a: bool = False, transpose_b: bool = False):
  """op(a) @ op(b) for 2-D float32 arrays, by the custom call."""
  register()
  m, k = (a.shape[1], a.shape[0]) if transpose_a else a.shape
  n = b.shape[0] if transpose_b else b.shape[1]
  return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((m, n), jnp.float32), custom_call_api_version=3,
                          vmap_method="sequential",
                          legacy_backend_config=f"{m},{k},{n},{int(transpose_a)},{int(transpose_b)}")(a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _product(x_MxK, w, w_is_NxK: bool):
  """x @ w.T (w [N, K], xlt.matmul.dense_t's layout) or x @ w (w [K, N]) by the custom call,
  its backward pass the same call: the input and the weight gradient."""
  return blas(x_MxK, w, transpose_b=w_is_NxK)


def _product_bwd(w_is_NxK, residuals, dy_MxN):
  x_MxK, w = residuals
  dw = blas(dy_MxN, x_MxK, transpose_a=True) if w_is_NxK else blas(x_MxK, dy_MxN, transpose_a=True)
  return blas(dy_MxN, w, transpose_b=not w_is_NxK), dw


_product.defvjp(lambda x, w, w_is_NxK: (_product(x, w, w_is_NxK), (x, w)), _product_bwd)


def blas_dense_t(x, w, n: int):
  """xlt.matmul.dense_t (x's last n axes against w's last n) by the custom call."""
  k = math.prod(w.shape[w.ndim - n:])
  out = _product(x.reshape(-1, k), w.reshape(-1, k), True)
  return out.reshape(x.shape[:x.ndim - n] + w.shape[:w.ndim - n])


def _blas_dense(x, w, n: int):
  """xlt.matmul.dense (x's last n axes against w's first n) by the custom call."""
  k = math.prod(w.shape[:n])
  return _product(x.reshape(-1, k), w.reshape(k, -1), False).reshape(x.shape[:x.ndim - n] + w.shape[n:])


@contextlib.contextmanager
def blas_products():
  """xlt.matmul's dense products (float32 ones) by the custom call while a step is traced."""
  plain_dense, plain_dense_t = matmul.dense, matmul.dense_t

  def dense(x, w, dimension_numbers, precision=None, preferred_element_type=None):
    (lhs_c, rhs_c), batch = dimension_numbers
    n = len(lhs_c)
    if (batch == ((), ()) and tuple(lhs_c) == tuple(range(x.ndim - n, x.ndim)) and tuple(rhs_c) == tuple(range(n))
            and x.dtype == w.dtype == jnp.float32 and preferred_element_type is None):
      return _blas_dense(x, w, n)
    return plain_dense(x, w, dimension_numbers, precision, preferred_element_type)

  def dense_t(x, w, n, precision=None):
    return blas_dense_t(x, w, n) if x.dtype == w.dtype == jnp.float32 else plain_dense_t(x, w, n, precision)

  matmul.dense, matmul.dense_t = dense, dense_t
  try:
    yield
  finally:
    matmul.dense, matmul.dense_t = plain_dense, plain_dense_t


# ---------------------------------------------------------------------------- measurements


def product_pair(kind: str, dims):
  """(XLA's, the custom call's) no-argument callables for one of product_ceiling's products."""
  m, k, n = dims
  ones = lambda *shape: jnp.ones(shape, jnp.float32)  # noqa: E731
  if kind == "mt":  # x [M, K] @ w [N, K]^T, as xlt runs a projection's forward
    a, b = ones(m, k), ones(n, k)
    xla, custom = jax.jit(lambda x, w: matmul.dense_t(x, w, 1)), jax.jit(lambda x, w: blas(x, w, transpose_b=True))
  elif kind == "mm":
    a, b = ones(m, k), ones(k, n)
    xla, custom = jax.jit(lambda x, w: x @ w), jax.jit(blas)
  else:  # "wgrad_t": dy [K, M], x [K, N] -> dy^T x, as xlt.matmul's backward pass takes it
    a, b = ones(k, m), ones(k, n)
    xla = jax.jit(lambda dy, x: jax.vjp(lambda w: matmul.dense_t(x, w, 1), jnp.zeros((m, n)))[1](dy)[0])
    custom = jax.jit(lambda dy, x: blas(dy, x, transpose_a=True))
  return (lambda: xla(a, b).block_until_ready()), (lambda: custom(a, b).block_until_ready())


def step_pair(workdir: str, job: str):
  """(XLA's, the custom call's) callables running one step of finetune_step.py's xlt `job`, and
  their first losses."""
  import finetune_step

  runs, losses = [], []
  for patch in (contextlib.nullcontext, blas_products):
    with patch():
      mesh, step, state, _, batch = finetune_step.xlt_setup(workdir, job)
      with jax.set_mesh(mesh):
        compiled = step.lower(state, batch).compile()
    holder = [state]

    def run(compiled=compiled, holder=holder, mesh=mesh, batch=batch):
      with jax.set_mesh(mesh):
        holder[0], metrics = compiled(holder[0], batch)
        jax.block_until_ready(holder[0])
      return float(np.asarray(metrics["loss"]).ravel()[0])

    losses.append(run())
    runs.append(run)
  return runs, losses


def alternate(pair, rounds: int, min_seconds: float) -> list[list[float]]:
  """Each callable's median seconds per round, the order alternating by round."""
  out = [[], []]
  for r in range(rounds):
    for i in ((0, 1) if r % 2 == 0 else (1, 0)):
      out[i].append(median_seconds(pair[i], 1, 5, min_seconds, max_steps=math.inf))
  return out


def main(a) -> None:
  t_start = time.perf_counter()
  register()
  rows, per_round = [], {}
  for shape in a.shapes.split(","):
    for kind, dims in sorted(set(products(shape, "full"))):
      if kind == "wgrad":
        continue  # LoRA's only; the full step has none
      rounds = alternate(product_pair(kind, dims), a.rounds, 0.2)
      xla_s, custom_s = map(statistics.median, rounds)
      gflop = 2 * math.prod(dims) / 1e9
      what = {"mt": "forward x @ w.T", "mm": "input gradient dy @ w", "wgrad_t": "weight gradient dy^T x"}[kind]
      rows.append([f"{shape}: {what}", " x ".join(map(str, dims)), round(gflop / xla_s, 1),
                   round(gflop / custom_s, 1), "GFLOP/s", round(xla_s / custom_s, 3)])
      per_round[f"{rows[-1][0]} {rows[-1][1]}"] = [[round(gflop / t, 1) for t in r] for r in rounds]
      print(rows[-1], flush=True)
  losses = {}
  for job in a.steps.split(","):
    pair, losses[job] = step_pair(a.workdir, job)
    rounds = alternate(pair, a.rounds, a.min_seconds)
    xla_s, custom_s = map(statistics.median, rounds)
    per_round[job] = [[round(t * 1e3, 1) for t in r] for r in rounds]
    rows.append([f"{job} step (finetune_step.py's xlt)", "-", round(xla_s * 1e3, 1), round(custom_s * 1e3, 1),
                 "ms per step", round(xla_s / custom_s, 3)])
    print(rows[-1], f"rounds {per_round[job]}, first losses {losses[job]}", flush=True)
  if a.out:
    import scipy

    results_file.write(
        a.out, benchmark=os.path.splitext(os.path.basename(a.out))[0],
        title="XLA:CPU's products against OpenBLAS (scipy's sgemm) as an XLA custom call",
        columns=COLUMNS, rows=rows, wall_s=time.perf_counter() - t_start,
        versions={"jax": jax.__version__, "scipy": scipy.__version__}, rounds=per_round,
        notes=(f"One process, XLA on one CPU device (every core); {a.rounds} rounds alternating which goes first, "
               "the median of the rounds' medians ('rounds': each round's, XLA's then the custom call's, in the "
               "row's unit). A ratio above 1: the custom call is faster. The steps' "
               f"first losses (XLA, custom call): {losses}."))


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", default=os.path.join(ROOT, "runs", "finetune"),
                 help="where benchmarks/finetune_step.py wrote its checkpoints")
  p.add_argument("--shapes", default="tiny,small", help="finetune_step.py's shapes whose products are timed")
  p.add_argument("--steps", default="tiny/full,tiny/lora,small/full,small/lora", help="finetune_step.py's xlt jobs")
  p.add_argument("--rounds", type=int, default=4, help="alternating rounds")
  p.add_argument("--min_seconds", type=float, default=2.0, help="timed per step job and round (at least 5 steps)")
  p.add_argument("--out", default="", help="the results file")
  main(p.parse_args())
