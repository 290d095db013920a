"""xlt's subspace merges against fusion-bench's on the same files: wall time and peak memory (RSS)
of TSV-M and Iso-C, each tool in its own process, rounds alternating.

  ../fusionvenv/bin/python benchmarks/merge_vs_fusion.py --out=runs/merge_vs_fusion.json

Runs where fusion-bench and xlt's dependencies are installed (a venv with torch, fusion-bench,
jax, flax, ml_collections). The inputs are benchmarks/merge_vs_mergekit.py's Llama-shaped float32
checkpoints (a base and two fine-tunes; --hidden / --layers / --vocab / --mlp size them, by
default ~400 MiB each). xlt runs `python -m xlt.merge` (no heatmaps); fusion-bench runs its own
merging function on the state dicts (TSVM_utils.compute_and_sum_svd_mem_reduction, iso_c), read
and written with safetensors.torch: the same work without its Hydra program around it. Both on
the CPU. The table reports the median wall time and the largest peak RSS per tool and method,
and the largest |xlt - fusion-bench| of the outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import merge_vs_mergekit as shared  # noqa: E402  (its checkpoint writer and child-process timer)

METHODS = ("tsv_m", "iso_c")

FUSION = """
import sys, torch
from safetensors.torch import load_file, save_file
method, base, a, b, out = sys.argv[1:]
torch.set_num_threads(torch.get_num_threads())
pre = load_file(base + "/model.safetensors")
tvs = [{k: v - pre[k] for k, v in load_file(p + "/model.safetensors").items()} for p in (a, b)]
if method == "tsv_m":
  from fusion_bench.method.task_singular_vector.utils import TSVM_utils
  merged = TSVM_utils.compute_and_sum_svd_mem_reduction(tvs, accelerator="cpu")
else:
  from fusion_bench.method.isotropic_merging.iso_utils import iso_c
  merged = iso_c(tvs, accelerator="cpu")
save_file({k: (pre[k] + merged[k]).contiguous() for k in pre}, out + ".safetensors")
"""


def commands(method: str, dirs: list[str], out: str, python: str) -> dict:
  base, a, b = dirs
  xlt = [python, "-m", "xlt.merge", "--config=" + shared._config_path(), f"--config.output={out}_xlt",
         "--config.heatmaps=false", f"--config.method={method}", f"--config.inputs.base={base}",
         f"--config.inputs.experts={a},{b}", "--overwrite"]
  return {"xlt": xlt, "fusion-bench": [python, "-c", FUSION, method, base, a, b, f"{out}_fusion"]}


def max_abs_diff(xlt_dir: str, fusion_file: str) -> float:
  import numpy as np
  from safetensors.numpy import load_file
  a, b = load_file(os.path.join(xlt_dir, "model.safetensors")), load_file(fusion_file)
  return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "xlt_fusion_bench"), help="where the checkpoints and outputs go")
  ap.add_argument("--out", default=None, help="write every measurement here as JSON")
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--hidden", type=int, default=1024)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--vocab", type=int, default=16000)
  ap.add_argument("--mlp", type=int, default=1536)
  args = ap.parse_args()
  os.makedirs(args.work, exist_ok=True)
  dirs = shared.write_models(args.work, args.hidden, args.layers, args.vocab, args.mlp)
  size_mib = os.path.getsize(os.path.join(dirs[0], "model.safetensors")) / 2**20
  results, diffs = [], {}
  for method in METHODS:
    out = os.path.join(args.work, method)
    cmds = commands(method, dirs, out, sys.executable)
    for r in range(args.rounds):
      for tool in (("xlt", "fusion-bench") if r % 2 == 0 else ("fusion-bench", "xlt")):
        results.append({"method": method, "tool": tool, "round": r, **shared.run_child(cmds[tool])})
    diffs[method] = max_abs_diff(f"{out}_xlt", f"{out}_fusion.safetensors")
  lines = ["| method | tool | wall s (median) | peak RSS MiB (max) | rounds |", "|---|---|---|---|---|"]
  for method in METHODS:
    for tool in ("xlt", "fusion-bench"):
      rows = [x for x in results if x["method"] == method and x["tool"] == tool]
      lines.append(f"| {method} | {tool} | {statistics.median(x['wall_s'] for x in rows):.1f} | "
                   f"{max(x['peak_rss_mib'] for x in rows):.0f} | {len(rows)} |")
  print("\n".join(lines) + f"\n\n(each input {size_mib:.0f} MiB, float32; max |xlt - fusion-bench|: "
        + ", ".join(f"{m} {d:.1e}" for m, d in diffs.items()) + ")")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"inputs_mib": size_mib, "results": results, "max_abs_diff": diffs}, f, indent=1)


if __name__ == "__main__":
  main()
