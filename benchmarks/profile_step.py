"""Where a training step's time goes: one of benchmarks/compare.py's training jobs traced with
`jax.profiler`, each of XLA's ops (fusions, copies, the all-reduce) with its time per step and
device, and for those that hold matrix products their FLOPs (read from the compiled HLO) and
speed in GFLOP/s, with the model path the op came from (`block_1/mlp/fc`, backward or not).

  python benchmarks/profile_step.py text_proxy [--steps 5] [--top 30] [--trace_dir runs/prof]
  python benchmarks/profile_step.py finetune:small/full [--workdir runs/finetune] [--update map]  # a loaded Llama's

Prints the step's median time unprofiled, a table of the costliest ops, then the totals:
time in ops with products and their speed, and the rest by kind of op. Compare the products'
GFLOP/s with a plain matmul's on the same cores to see how far a step is from its matmuls'
limit. Times are per device: the trace's op times summed over the steps and divided by steps
x devices (a data-parallel step runs the same ops on every device). On a CPU the ops run on
XLA's threads and the times are wall time of each op; on a GPU they are its kernels.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import math
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/, xlt/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # compare.py
if __name__ == "__main__":  # as `python -m xlt.main` starts: before jax is imported
  from xlt import allocator, cpu_devices

  cpu_devices.configure()
  allocator.preload()

# an instruction: name, type (a tuple's too: multi-output fusions, library calls), opcode, operands, attributes
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*?)\)(.*)$")
_KERNELS = ("fusion", "custom-call")  # the tuple-typed instructions that run as kernels (not while, tuple)
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")


def _dims(type_str: str) -> list[int] | None:
  """[2, 3] for 'f32[2,3]{1,0}'; None for a tuple or a token."""
  m = re.match(r"\w+\[([\d,]*)\]", type_str)
  return [int(d) for d in m.group(1).split(",") if d] if m else None


def _dot_flops(out_type: str, lhs_type: str | None, attrs: str) -> int:
  out, lhs = _dims(out_type), _dims(lhs_type or "")
  # a dot's attribute, or a cuBLAS call's backend config (JSON)
  contracting = re.search(r'lhs_contracting_dims=\{([\d,]*)\}|"lhs_contracting_dimensions":\[([^\]]*)\]', attrs)
  if out is None or lhs is None or contracting is None:
    return 0
  k = math.prod(lhs[int(i)] for i in re.findall(r"\d+", contracting.group(1) or contracting.group(2)))
  return 2 * math.prod(out) * k


def hlo_ops(hlo: str) -> dict[str, dict]:
  """Every instruction of a compiled HLO module's text, in the text's order (a scheduled
  module's: the order its kernels run): {name: {"flops": 2·M·N·K summed over its products (its
  own if it is a `dot` or a cuBLAS call, its fused computation's if it calls one; 0 if it has
  none), "where": its op_name metadata (the jax path it came from), "cublas": whether it is a
  cuBLAS call, "type": its result type without layouts}}. Operands' types are looked up in the
  computation that defines them; of the tuple-typed instructions only kernels (multi-output
  fusions, library calls) are listed."""
  computations: dict[str, list[tuple]] = {}
  current = None
  for line in hlo.splitlines():
    head = _COMP.match(line)
    # a computation's head is unindented (its instructions are not); a long one may hold '='
    # in XLA's /*index=N*/ comments
    if head and not line[0].isspace():
      current = computations.setdefault(head.group(1), [])
      continue
    m = _INSTR.match(line)
    if m and current is not None and (not m.group(2).startswith("(") or m.group(3) in _KERNELS):
      current.append(m.groups())

  types = {comp: {name: typ for name, typ, *_ in body} for comp, body in computations.items()}

  def flops(comp, typ, opcode, operands, attrs) -> int:
    """2·M·N·K of a `dot` or a cuBLAS call (output first in its tuple) in computation `comp`
    (its left operand's type defined there)."""
    if opcode != "dot" and not _is_cublas(opcode, attrs):
      return 0
    lhs = operands.split(",")[0].strip().split()[-1].lstrip("%")
    return _dot_flops(typ.lstrip("("), types[comp].get(lhs), attrs)

  ops = {}
  for comp, body in computations.items():
    for name, typ, opcode, operands, attrs in body:
      called = re.search(r"calls=%?([\w.\-]+)", attrs)
      if called and called.group(1) in computations and opcode in ("fusion", "custom-call"):
        total = sum(flops(called.group(1), *instr[1:]) for instr in computations[called.group(1)])
      else:
        total = flops(comp, typ, opcode, operands, attrs)
      where = re.search(r'op_name="([^"]*)"', attrs)
      ops[name] = {"flops": total, "where": where.group(1) if where else "", "cublas": _is_cublas(opcode, attrs),
                   "type": re.sub(r"\{[^}]*\}", "", typ)}
  return ops


def _is_cublas(opcode: str, attrs: str) -> bool:
  return opcode == "custom-call" and 'custom_call_target="__cublas$' in attrs


def op_times(trace_dir: str) -> collections.Counter:
  """Microseconds per op name, summed over a jax.profiler trace's complete events."""
  files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not files:
    raise SystemExit(f"no trace in {trace_dir}")
  with gzip.open(max(files, key=os.path.getmtime)) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  total = collections.Counter()
  for e in events:
    if e.get("ph") == "X":
      total[e["name"]] += e.get("dur", 0)
  return total


def _short(where: str) -> str:
  """'…/transpose(jvp(GPT))/block_1/mlp/fc/dot_general' -> 'backward block_1/mlp/fc'; outside
  the model, the jax op's name."""
  back = "backward " if "transpose(" in where else ""
  if "GPT)" not in where:
    return back + where.rsplit("/", 1)[-1]
  path = where.split("GPT)", 1)[1].lstrip(")/")
  return back + (path.rsplit("/", 1)[0] if "/" in path else path)


def report(times_us: collections.Counter, ops: dict[str, dict], per: float, top: int) -> str:
  """The table and totals; `per` = steps x devices (times are divided by it)."""
  kinds = collections.Counter()
  rows = []
  for name, us in times_us.items():
    if name in ops:  # XLA's ops; the trace's other events are the runtime's and Python's
      ms = us / 1e3 / per
      info = ops[name]
      rows.append((ms, name, info))
      kinds["ops with products" if info["flops"] else re.sub(r"\.\d+$", "", name)] += ms
  rows.sort(key=lambda r: -r[0])
  total = sum(r[0] for r in rows)
  lines = ["| op | ms | share | GFLOP | GFLOP/s | from |", "|---|---|---|---|---|---|"]
  for ms, name, info in rows[:top]:
    gf = info["flops"] / 1e9
    speed = f"{gf / ms * 1e3:.1f}" if info["flops"] and ms else ""
    lines.append(f"| {name} | {ms:.2f} | {ms / total:.1%} | {gf:.3f} | {speed} | {_short(info['where'])} |")
  dot_ms = sum(ms for ms, _, info in rows if info["flops"])
  dot_gf = sum(info["flops"] for ms, _, info in rows if info["flops"]) / 1e9
  lines.append(f"\nops: {total:.1f} ms per step and device; with products {dot_ms:.1f} ms "
               f"({dot_gf:.3f} GFLOP, {dot_gf / dot_ms * 1e3 if dot_ms else 0:.1f} GFLOP/s)")
  lines.append("by kind: " + ", ".join(f"{k} {v:.2f}" for k, v in kinds.most_common(12)))
  return "\n".join(lines)


def compare_job(a):
  """(mesh, step, state, batch, label) of one of benchmarks/compare.py's training jobs."""
  import numpy as np

  import compare
  from xlt import model as model_lib, sharding

  jobs = {j["name"]: j for j in compare.plan() if j["kind"] == "train"}
  if a.job not in jobs:
    raise SystemExit(f"unknown job {a.job!r}; training jobs: {sorted(jobs)} or finetune:<shape>/<mode>")
  job = jobs[a.job]
  mesh = sharding.make_mesh({"data": -1})
  step, state, batch = compare.single_model_step(model_lib.Config(**job["model"]), job["batch"], job["seq"],
                                                 mesh, np.random.default_rng(0))
  return mesh, step, state, batch, job["label"]


def finetune_job(a):
  """(mesh, step, state, batch, label) of benchmarks/finetune_step.py's xlt side, e.g.
  finetune:small/full, on the checkpoint that benchmark wrote under --workdir (kept there)."""
  import finetune_step as ft

  job = a.job.split(":", 1)[1]
  shape, _, mode = job.partition("/")
  if shape not in ft.SHAPES or mode not in ft.MODES:
    raise SystemExit(f"unknown job {a.job!r}; finetune:<shape>/<mode> with a shape of {', '.join(ft.SHAPES)} "
                     f"and a mode of {', '.join(ft.MODES)}")
  if not os.path.exists(os.path.join(a.workdir, shape, "config.json")):
    raise SystemExit(f"no {shape} checkpoint under {a.workdir}: run benchmarks/finetune_step.py --quick "
                     f"--shapes={shape} --workdir={a.workdir} first (it needs transformers)")
  mesh, step, state, _, batch = ft.xlt_setup(a.workdir, job, update=a.update)
  return mesh, step, state, batch, f"finetune {job}"


def job_setup(a):
  """(mesh, step, state, batch, label) of `a.job`: a finetune:<shape>/<mode> job or one of
  compare.py's training jobs (a.workdir and a.update: the finetune jobs' checkpoints and update)."""
  return finetune_job(a) if a.job.startswith("finetune:") else compare_job(a)


def main(a):
  import jax
  import numpy as np

  mesh, step, state, batch, label = job_setup(a)
  with jax.set_mesh(mesh):
    compiled = step.lower(state, batch).compile()  # run below as compiled, so its HLO is the one traced
    ops = hlo_ops(compiled.as_text())

    def one():
      nonlocal state
      state, _ = compiled(state, batch)
      jax.block_until_ready(state)

    for _ in range(3):
      one()
    times = []
    for _ in range(10):
      t0 = time.perf_counter()
      one()
      times.append(time.perf_counter() - t0)
    with jax.profiler.trace(a.trace_dir):
      for _ in range(a.steps):
        one()
  devices = mesh.devices.size  # the step's (the fine-tuning kind's mesh may use one of several)
  print(f"{label}: {devices} of {len(jax.devices())} {jax.devices()[0].platform} device(s), jax {jax.__version__}; "
        f"{np.median(times) * 1e3:.1f} ms per step unprofiled (median of 10); {a.steps} steps traced "
        f"in {a.trace_dir}\n")
  print(report(op_times(a.trace_dir), ops, a.steps * devices, a.top))


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("job", help="a training job of benchmarks/compare.py (graph_29, graph_128, addition_cpu, "
                 "addition_ref, text_proxy), or finetune:<shape>/<mode> (benchmarks/finetune_step.py's xlt step)")
  p.add_argument("--workdir", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs",
                                                   "finetune"), help="finetune jobs: the checkpoints' directory")
  p.add_argument("--update", choices=("config", "auto", "map", "vmap"), default="config",
                 help="finetune jobs: where the optimizer's update runs (finetune_step.py's --update)")
  p.add_argument("--steps", type=int, default=5, help="steps traced")
  p.add_argument("--top", type=int, default=30, help="ops listed")
  p.add_argument("--trace_dir", default=os.path.join(tempfile.gettempdir(), "xlt_profile_step"),
                 help="where the trace goes (TensorBoard/Perfetto)")
  main(p.parse_args())
