"""Where a GPU training step's time goes, from the step benchmarks/gpu_check.py traced
(`--profile_dir`): every kernel of the trace attributed to an op of the compiled HLO, also where
XLA launches them from command buffers (CUDA graphs), whose trace events name kernels, not ops.

  python benchmarks/gpu_trace.py PROFILE_DIR [--top 25] [--peak_tflops 989]

PROFILE_DIR is gpu_check's: the trace (plugins/profile/*/*.xplane.pb, read through `xprof`, an
optional package: pip install xprof) and hlo/*after_optimizations.txt beside it. A kernel named
as an op of the module is that op (XLA's fusions and Triton's products); cuBLAS's kernels are
matched in order with the module's cuBLAS custom calls, one kernel each (their counts must
agree); cuDNN's kernels are attention. Prints the kernel time and the span it fills (first
kernel's start to the last one's end: the rest of a step's wall time is the host's), time by
class, the products grouped by the model path they come from with their TFLOP/s, and the
costliest other ops with their kernel counts and result types.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_step import _short, hlo_ops  # noqa: E402


def kernel_events(profile_dir: str) -> list[dict]:
  """The trace's GPU kernels in launch order: {name, dur (us)}."""
  planes = sorted(glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
  if not planes:
    raise SystemExit(f"gpu_trace: no *.xplane.pb under {profile_dir}")
  try:
    from xprof.convert import raw_to_tool_data
  except ImportError:
    raise SystemExit("gpu_trace: reading an xplane needs the xprof package (pip install xprof)") from None
  data, _ = raw_to_tool_data.xspace_to_tool_data([planes[-1]], "trace_viewer", {})
  events = json.loads(data)["traceEvents"]
  kernels = [e for e in events if e.get("ph") == "X" and "kernel_details" in e.get("args", {})]
  return sorted(kernels, key=lambda e: e["ts"])


def cublas_calls(ops: dict[str, dict]) -> list[dict]:
  """The cuBLAS calls among `ops` (profile_step.hlo_ops: in the scheduled module's order), each
  with its name."""
  return [dict(info, name=name) for name, info in ops.items() if info["cublas"]]


def attribute(kernels: list[dict], hlo: str) -> list[tuple[str, float, dict]]:
  """(class, microseconds, op info) per kernel: class 'cuBLAS product', 'Triton product',
  'cuDNN attention' or 'other op'."""
  ops = hlo_ops(hlo)
  calls = cublas_calls(ops)
  cublas = [k for k in kernels if k["name"].startswith(("nvjet", "sm90_xmma", "cutlass", "ampere"))]
  if len(cublas) != len(calls):
    raise SystemExit(f"gpu_trace: {len(cublas)} cuBLAS kernels in the trace, {len(calls)} cuBLAS calls in the HLO: "
                     "the trace must hold exactly one step of this module")
  matched = {id(k): c for k, c in zip(cublas, calls)}
  out = []
  for k in kernels:
    if id(k) in matched:
      out.append(("cuBLAS product", k["dur"], matched[id(k)]))
    elif "cudnn" in k["name"] or "sdpa" in k["name"]:
      out.append(("cuDNN attention", k["dur"], {"flops": 0, "where": k["name"]}))
    else:
      # the trace writes an op's kernel with '_' for the '.' before its number: fusion.3 -> fusion_3
      name = re.sub(r"_(\d+)$", r".\1", k["name"])
      info = ops.get(name, ops.get(k["name"], {"flops": 0, "where": k["name"]}))
      out.append(("Triton product" if info["flops"] else "other op", k["dur"], dict(info, name=k["name"])))
  return out


def report(rows: list[tuple[str, float, dict]], top: int, peak_tflops: float, span_us: float | None = None) -> str:
  """Time by class, products by model path, and the costliest other ops (each with its kernel
  count and result type); `span_us`: from the first kernel's start to the last one's end."""
  total = sum(us for _, us, _ in rows)
  by_class = collections.Counter()
  products = collections.defaultdict(lambda: [0, 0.0, 0])
  others = collections.defaultdict(lambda: [0, 0.0, ""])
  for cls, us, info in rows:
    by_class[cls] += us
    if info["flops"]:
      key = re.sub(r"block_\d+", "block_*", _short(info["where"]))
      products[key][0] += 1
      products[key][1] += us
      products[key][2] += info["flops"]
    elif cls == "other op":
      other = others[(info.get("name", ""), _short(info["where"]))]
      other[0] += 1
      other[1] += us
      other[2] = info.get("type", "")
  flops = sum(p[2] for p in products.values())
  product_us = by_class["cuBLAS product"] + by_class["Triton product"]
  span = f" in a {span_us / 1e3:.1f} ms span" if span_us else ""
  lines = [f"kernels: {total / 1e3:.1f} ms{span}; products {product_us / 1e3:.1f} ms ({flops / 1e12:.1f} TFLOP at "
           f"{flops / product_us / 1e6:.0f} TFLOP/s; peak {peak_tflops:.0f})",
           "by class: " + ", ".join(f"{k} {v / 1e3:.1f} ms ({v / total:.0%})" for k, v in by_class.most_common()),
           "", "| products from | kernels | ms | TFLOP/s |", "|---|---|---|---|"]
  for key, (n, us, f) in sorted(products.items(), key=lambda kv: -kv[1][1])[:top]:
    lines.append(f"| {key} | {n} | {us / 1e3:.2f} | {f / us / 1e6:.0f} |")
  lines += ["", "| other op | from | kernels | ms | result |", "|---|---|---|---|---|"]
  for (name, where), (n, us, typ) in sorted(others.items(), key=lambda kv: -kv[1][1])[:top]:
    lines.append(f"| {name} | {where} | {n} | {us / 1e3:.2f} | {typ} |")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("profile_dir")
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--peak_tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100/H200 SXM: 989)")
  a = p.parse_args(argv)
  hlos = glob.glob(os.path.join(a.profile_dir, "hlo", "*after_optimizations.txt"))
  if not hlos:
    raise SystemExit(f"gpu_trace: no hlo/*after_optimizations.txt under {a.profile_dir} (gpu_check --profile_dir "
                     "dumps it)")
  with open(max(hlos, key=os.path.getsize)) as f:  # the step's module is the largest
    hlo = f.read()
  kernels = kernel_events(a.profile_dir)
  span = max(k["ts"] + k["dur"] for k in kernels) - kernels[0]["ts"] if kernels else None
  print(report(attribute(kernels, hlo), a.top, a.peak_tflops, span))


if __name__ == "__main__":
  main()
