"""The loaded-model step's matrix products alone, in XLA:CPU and in PyTorch: how far ahead of
PyTorch the step could be if it were nothing but its products.

  python benchmarks/product_ceiling.py --out=results/benchmarks/product_ceiling.json
  python benchmarks/product_ceiling.py --shapes=small --modes=full --rounds=1   # one row

For each of benchmarks/finetune_step.py's shapes and modes, the products one training step
multiplies: every projection's forward product (q, k, v, o, gate, up, down, the head), its
input gradient, the weight gradient of each trained matrix (full: all; static: the MLPs'),
and LoRA's rank-8 products on the seven projections. Attention's products are left out: each
tool runs its own attention kernel (PyTorch's sdpa fuses them) and they are under a tenth of
the step's FLOPs at these shapes. The last row is one 4096 x 4096 x 4096 product: the rate each
library reaches on this machine's cores when the shape limits nothing, so the step's rates read
as a share of what the machine gives (XLA's step products run at about that rate). Each
distinct product is timed alone (median of repeated calls after one that compiles), in a
fresh process per tool and round, rounds alternating which goes first: XLA on one CPU device
using every core (the fine-tuning kind's mesh), PyTorch with `torch.set_num_threads(cores)`.
Both hold the projections' weights [out, in] as torch's Linear does (the loaded model's
`dense_layout="weight"`): a forward product is `x @ w.T`, an input gradient the plain
`dy @ w`, a weight gradient `dy.T @ x` (xlt: `xlt.matmul.dense_t`'s backward pass, as the step
runs it); LoRA's products are plain `a @ b` and `x.T @ dy` (xlt: `xlt.matmul.dense`'s). The
table's ratio is PyTorch's products' time over xlt's: the most the step can lead by when both
tools spend nothing besides their products.

  python benchmarks/product_ceiling.py --workdir=runs/finetune --out=results/benchmarks/product_ceiling.json

With --workdir, each round also times benchmarks/finetune_step.py's two steps on its checkpoints
(written there if missing; each tool in a fresh process, as that benchmark runs them), so the
steps and the products are measured side by side on the same day: the table adds both steps'
times, their ratio, and PyTorch's step over xlt's products alone, the step ratio xlt would reach
if it spent nothing besides its products (at the tiny shape, where one product lasts a fraction
of a millisecond, timing each alone overstates its share of a step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import results_file  # noqa: E402  (neither imports jax nor torch)
from benchmarks.compare import median_seconds, version  # noqa: E402
from benchmarks import finetune_step  # noqa: E402
from benchmarks.finetune_step import LORA, MODES, SHAPES, pick  # noqa: E402

TOOLS = ("xlt", "torch")
# one large square product: the rate each library reaches on this machine when nothing limits
# it but the cores, against which the step's products' rates read as a share of the attainable
REFERENCE = ("mm", (4096, 4096, 4096))


def products(shape: str, mode: str) -> list[tuple[str, tuple[int, int, int]]]:
  """(kind, (M, K, N)) of every product of one step, repeated as often as the step runs it:
  kind "mm" is [M, K] @ [K, N]; "mt" is [M, K] @ w.T with w [N, K] (a projection's forward);
  "wgrad" is a weight gradient x^T dy with x [K, M], dy [K, N] (K the tokens) of a LoRA
  factor; "wgrad_t" a projection's, dy^T x with dy [K, M], x [K, N] ([out, in])."""
  spec = SHAPES[shape]
  c, tokens = spec["config"], spec["batch"] * spec["seq"]
  h, m, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
  kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
  layer = {"q": (h, h), "k": (h, kv), "v": (h, kv), "o": (h, h), "gate": (h, m), "up": (h, m), "down": (m, h)}
  trained = {"full": set(layer), "static": {"gate", "up", "down"}, "lora": set()}[mode]
  out = []
  for name, (fan_in, fan_out) in layer.items():
    one = [("mt", (tokens, fan_in, fan_out)), ("mm", (tokens, fan_out, fan_in))]  # forward, input gradient
    if name in trained:
      one.append(("wgrad_t", (fan_out, tokens, fan_in)))
    if mode == "lora":  # x A, (x A) B; their input gradients; dB, dA
      r = LORA["rank"]
      one += [("mm", (tokens, fan_in, r)), ("mm", (tokens, r, fan_out)), ("mm", (tokens, fan_out, r)),
              ("mm", (tokens, r, fan_in)), ("wgrad", (r, tokens, fan_out)), ("wgrad", (fan_in, tokens, r))]
    out += one * c["num_hidden_layers"]
  out += [("mt", (tokens, h, vocab)), ("mm", (tokens, vocab, h))]  # the head and its input gradient
  if mode == "full":
    out.append(("wgrad_t", (vocab, tokens, h)))
  return out


def flops(kind_dims) -> int:
  m, k, n = kind_dims[1]
  return 2 * m * k * n


# ---------------------------------------------------------------------------- children


def _xlt_timers():
  os.environ.setdefault("XLT_CPU_DEVICES", "1")
  from xlt import allocator, cpu_devices

  cpu_devices.configure()
  allocator.preload()
  import jax
  import jax.numpy as jnp

  from xlt import matmul

  mm = jax.jit(lambda a, b: a @ b)
  mt = jax.jit(lambda x, w: matmul.dense_t(x, w, 1))
  # the weight gradients as xlt's step takes them (xlt.matmul's backward passes)
  wgrad = jax.jit(lambda x, dy: jax.vjp(lambda w: matmul.dense(x, w, (((1,), (0,)), ((), ()))),
                                        jnp.zeros((x.shape[1], dy.shape[1])))[1](dy)[0])
  wgrad_t = jax.jit(lambda dy, x: jax.vjp(lambda w: matmul.dense_t(x, w, 1),
                                          jnp.zeros((dy.shape[1], x.shape[1])))[1](dy)[0])

  def timer(kind, dims):
    m, k, n = dims
    if kind in ("mm", "mt"):
      a, b = jnp.ones((m, k)), jnp.ones((k, n) if kind == "mm" else (n, k))
      f = mm if kind == "mm" else mt
      return lambda: f(a, b).block_until_ready()
    a, b = jnp.ones((k, m)), jnp.ones((k, n))
    f = wgrad if kind == "wgrad" else wgrad_t
    return lambda: f(a, b).block_until_ready()

  return timer, {"jax": jax.__version__, "device": f"{jax.device_count()} CPU device"}


def _torch_timers():
  import torch

  torch.set_num_threads(len(os.sched_getaffinity(0)))

  def timer(kind, dims):
    m, k, n = dims
    if kind in ("mm", "mt"):
      a, b = torch.ones(m, k), torch.ones(k, n) if kind == "mm" else torch.ones(n, k)
      return (lambda: a @ b) if kind == "mm" else (lambda: a @ b.T)
    x, dy = torch.ones(k, m), torch.ones(k, n)
    return lambda: x.T @ dy

  return timer, {"torch": torch.__version__, "threads": torch.get_num_threads()}


def child(tool: str, keys: list, min_seconds: float) -> dict:
  timer, info = _xlt_timers() if tool == "xlt" else _torch_timers()
  seconds = {}
  for kind, dims in keys:
    seconds[json.dumps([kind, dims])] = median_seconds(timer(kind, tuple(dims)), 2, 5, min_seconds, 200)
  return {"seconds": seconds, **info}


# ---------------------------------------------------------------------------- the parent


def _products_round(keys: list, order, min_seconds: float, tmp: str) -> dict:
  got = {}
  for tool in order:
    path = os.path.join(tmp, f"{tool}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", tool, "--keys", json.dumps(keys),
           "--min_seconds", str(min_seconds), "--child_out", path]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
      sys.exit(f"the {tool} child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    with open(path) as f:
      got[tool] = json.load(f)
    print(f"  {tool}: {len(keys)} products timed", file=sys.stderr, flush=True)
  return got


def run_rounds(jobs: list[tuple[str, str]], rounds: int, min_seconds: float, workdir: str = "") -> list[dict]:
  """Each round: every product in a fresh process per tool; with `workdir`, then each job's
  step as finetune_step.py times it (its children, its default timing) under "steps"."""
  keys = sorted({(k, d) for s, mode in jobs for k, d in products(s, mode)} | {REFERENCE})
  step_args = argparse.Namespace(workdir=workdir, xlt_mesh="config", update="config")
  out = []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(rounds):
      print(f"round {r + 1}", file=sys.stderr, flush=True)
      got = _products_round(keys, TOOLS if r % 2 == 0 else TOOLS[::-1], min_seconds, tmp)
      if workdir:
        got["steps"] = {}
        for i, (shape, mode) in enumerate(jobs):
          job, order = f"{shape}/{mode}", TOOLS if (r + i) % 2 == 0 else TOOLS[::-1]
          got["steps"][job] = {t: finetune_step.run_child(t, job, step_args, finetune_step.TIMING, tmp) for t in order}
      out.append(got)
  return out


COLUMNS = ["shape", "mode", "products per step", "GFLOP per step", "xlt products ms", "PyTorch products ms",
           "PyTorch / xlt (products)", "xlt GFLOP/s", "PyTorch GFLOP/s"]
STEP_COLUMNS = ["xlt step ms", "PyTorch step ms", "xlt / PyTorch (steps)", "PyTorch step / xlt products"]


def _step_cells(job: str, rounds: list[dict], products_s: list[float]) -> list:
  """The steps' medians over rounds, the median of the rounds' paired step ratios, and that of
  PyTorch's step over xlt's products in the same round."""
  steps = [r["steps"][job] for r in rounds]
  med = statistics.median
  return [round(med([s["xlt"]["step_s"] for s in steps]) * 1e3, 1),
          round(med([s["torch"]["step_s"] for s in steps]) * 1e3, 1),
          round(med([s["torch"]["step_s"] / s["xlt"]["step_s"] for s in steps]), 3),
          round(med([s["torch"]["step_s"] / p for s, p in zip(steps, products_s)]), 3)]


def table_rows(jobs, rounds: list[dict]) -> list[list]:
  """One row per (shape, mode), then REFERENCE's row (shape "4096^3 GEMM", mode "-"); with the
  steps measured, STEP_COLUMNS' cells after COLUMNS' ("-" in the reference's row)."""
  rows, with_steps = [], all("steps" in r for r in rounds)
  for shape, mode in [*jobs, ("4096^3 GEMM", "-")]:
    prods = [REFERENCE] if mode == "-" else products(shape, mode)
    sums = {t: [sum(r[t]["seconds"][json.dumps([k, list(d)])] for k, d in prods) for r in rounds] for t in TOOLS}
    per_tool = {t: statistics.median(sums[t]) for t in TOOLS}
    gflop = sum(flops(p) for p in prods) / 1e9
    rows.append([shape, mode, len(prods), round(gflop, 2), round(per_tool["xlt"] * 1e3, 1),
                 round(per_tool["torch"] * 1e3, 1), round(per_tool["torch"] / per_tool["xlt"], 3),
                 round(gflop / per_tool["xlt"], 1), round(gflop / per_tool["torch"], 1)])
    if with_steps:
      rows[-1] += ["-"] * len(STEP_COLUMNS) if mode == "-" else _step_cells(f"{shape}/{mode}", rounds, sums["xlt"])
  return rows


def main(a) -> None:
  t_start = time.perf_counter()
  jobs = [(s, m) for s in pick(a.shapes, SHAPES, "shapes") for m in pick(a.modes, MODES, "modes")]
  for shape in sorted({s for s, _ in jobs}) if a.workdir else ():
    finetune_step.write_checkpoint(os.path.join(a.workdir, shape), SHAPES[shape]["config"], finetune_step.SEED)
  rounds = run_rounds(jobs, a.rounds, a.min_seconds, a.workdir)
  rows = table_rows(jobs, rounds)
  columns = COLUMNS + (STEP_COLUMNS if a.workdir else [])
  print("| " + " | ".join(columns) + " |")
  for row in rows:
    print("| " + " | ".join(str(x) for x in row) + " |")
  if a.out:
    steps = (" The steps: benchmarks/finetune_step.py's children on the checkpoints under --workdir (its default "
             "timing, xlt's mesh and optimizer update from configs/finetune.py), in the same rounds, alternating "
             "which tool goes first; ratios are medians of the rounds' paired ratios." if a.workdir else "")
    results_file.write(
        a.out, benchmark=os.path.splitext(os.path.basename(a.out))[0],
        title="The loaded-model step's products alone: XLA:CPU against PyTorch, ms per step",
        columns=columns, rows=rows, wall_s=time.perf_counter() - t_start,
        versions={p: version(p) for p in ("jax", "torch", *(("transformers", "peft") if a.workdir else ()))},
        notes=(f"{a.rounds} rounds; medians of each product's time, summed over the step's products (attention's "
               "left out); xlt: XLA on one CPU device, every core; PyTorch: torch.set_num_threads(cores); float32."
               + steps + " " + a.notes).strip(), details={"rounds": rounds})


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
  p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
  p.add_argument("--rounds", type=int, default=2, help="fresh processes per tool")
  p.add_argument("--min_seconds", type=float, default=0.3, help="each product timed at least this long")
  p.add_argument("--workdir", default="", help="also time finetune_step.py's steps on the checkpoints here")
  p.add_argument("--out", default="", help="the results file (docs/speed.md's schema)")
  p.add_argument("--notes", default="", help="appended to the file's notes")
  p.add_argument("--child", choices=TOOLS, help=argparse.SUPPRESS)
  p.add_argument("--keys", help=argparse.SUPPRESS)
  p.add_argument("--child_out", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child:
    result = child(args.child, json.loads(args.keys), args.min_seconds)
    with open(args.child_out, "w") as f:
      json.dump(result, f)
  else:
    main(args)
