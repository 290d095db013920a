"""xlt's subspace and data-aware merges against fusion-bench's on the same files: wall time and
peak memory (RSS) of TSV-M, Iso-C and RegMean, each tool in its own process, rounds alternating.

  python benchmarks/merge_vs_fusion.py --rounds=3 \
      --out=results/benchmarks/merge_vs_fusion.json

Runs where fusion-bench and xlt's dependencies are installed (a venv with torch, transformers,
fusion-bench, jax, flax, ml_collections). The inputs are benchmarks/merge_vs_mergekit.py's
Llama-shaped float32 checkpoints (a base and two fine-tunes; --hidden / --layers / --vocab / --mlp
size them, by default ~400 MiB each), and for RegMean a small dataset: --examples random token
sequences of --seq_len tokens (seeded, the same for both tools and both experts), batches of
--batch. Both on the CPU:

  tsv_m, iso_c  xlt: `python -m xlt.merge` (no heatmaps); fusion-bench: its merging function
                on the state dicts (TSVM_utils.compute_and_sum_svd_mem_reduction, iso_c), read and
                written with safetensors.torch: the same work without its Hydra program around it.
  regmean       each tool loads both experts, runs them over the dataset collecting every attn /
                mlp linear map's input Gram matrix, merges (alpha 0.9, fusion-bench's
                reduce_non_diagonal_ratio) and writes the result. xlt: xlt.pretrained.load,
                xlt.merge_statistics.grams, the registry's regmean, xlt.pretrained.save (what
                `python -m xlt.merge_data` runs, without its tokenizer and JSON-lines reader: the
                inputs have no tokenizer); fusion-bench: transformers' LlamaForCausalLM with
                forward hooks as its regmean_merging computes them (lm_head left out, as xlt's
                targets do), then its merging_with_regmean_weights.

The results file (the speed schema: docs/speed.md) has per method and tool the median wall
time and the largest peak RSS, the ratios (and of the median CPU seconds, which compare the
tools' work on a busy machine), and the largest |xlt - fusion-bench| of the outputs.
Each method can run on its own (--methods), so the benchmark fits in pieces of a few minutes:
a later run on the same inputs merges its methods' rows into the --out it finds (replacing those
methods' earlier rows, keeping the others, and recording each method's command in "runs"):

  python benchmarks/merge_vs_fusion.py --methods=tsv_m --out=results/benchmarks/merge_vs_fusion.json
  python benchmarks/merge_vs_fusion.py --methods=iso_c --out=results/benchmarks/merge_vs_fusion.json
  python benchmarks/merge_vs_fusion.py --methods=regmean --out=results/benchmarks/merge_vs_fusion.json
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import merge_vs_mergekit as shared  # noqa: E402  (its checkpoint writer and child-process timer)

METHODS = ("tsv_m", "iso_c", "regmean")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FUSION = """
import sys, torch
from safetensors.torch import load_file, save_file
method, base, a, b, out = sys.argv[1:6]
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

# fusion-bench's regmean_merging, its hook and merge, on a transformers Llama over token batches
FUSION_REGMEAN = """
import sys
from collections import defaultdict
import numpy as np, torch
from safetensors.torch import save_file
from transformers import LlamaForCausalLM
from fusion_bench.method.regmean.regmean import merging_with_regmean_weights
a, b, tokens, out, alpha, batch = sys.argv[1:7]
tokens, batch = torch.from_numpy(np.load(tokens)).long(), int(batch)
params, grams = defaultdict(list), []
for path in (a, b):
  model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
  gram, count = {}, {}
  def hook(name):
    def f(module, inputs, output):
      x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
      n = count.get(name, 0)
      gram[name] = (gram.get(name, 0) * n + x.T @ x) / (n + x.shape[0])
      count[name] = n + x.shape[0]
    return f
  handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and ".layers." in n]
  with torch.no_grad():
    for i in range(0, len(tokens), batch):
      model(input_ids=tokens[i:i + batch])
  for h in handles:
    h.remove()
  grams.append(gram)
  for n, p in model.named_parameters():
    params[n].append(p.detach())
merged = merging_with_regmean_weights(params, grams, reduce_non_diagonal_ratio=float(alpha))
save_file({k: v.contiguous() for k, v in merged.items()}, out + ".safetensors")
"""

# what python -m xlt.merge_data runs for regmean, on token batches instead of a JSON-lines file
XLT_REGMEAN = """
import sys
import jax, numpy as np
from xlt import merge_statistics, pretrained
from xlt.merge import registry
a, b, tokens, out, alpha, batch = sys.argv[1:7]
tokens, batch = np.load(tokens), int(batch)
models, grams = [], []
for path in (a, b):
  cfg, params = pretrained.load(path)
  grams.append(merge_statistics.grams(cfg, params, [tokens[i:i + batch] for i in range(0, len(tokens), batch)]))
  models.append(jax.tree.map(np.asarray, params))
  del params
merged = registry.merge("regmean", {"experts": models}, {"grams": grams, "alpha": float(alpha)})
pretrained.save(cfg, merged, out, source_dir=a)
"""


def commands(method: str, dirs: list[str], out: str, python: str, data: dict) -> dict:
  base, a, b = dirs
  if method == "regmean":
    extra = [data["tokens"], None, str(data["alpha"]), str(data["batch"])]
    return {"xlt": [python, "-c", XLT_REGMEAN, a, b, extra[0], f"{out}_xlt", *extra[2:]],
            "fusion-bench": [python, "-c", FUSION_REGMEAN, a, b, extra[0], f"{out}_fusion", *extra[2:]]}
  xlt = [python, "-m", "xlt.merge", "--config=" + shared._config_path(), f"--config.output={out}_xlt",
         "--config.heatmaps=false", f"--config.method={method}", f"--config.inputs.base={base}",
         f"--config.inputs.experts={a},{b}", "--overwrite"]
  return {"xlt": xlt, "fusion-bench": [python, "-c", FUSION, method, base, a, b, f"{out}_fusion"]}


def max_abs_diff(xlt_dir: str, fusion_file: str) -> float:
  import numpy as np
  from safetensors.numpy import load_file
  a, b = load_file(os.path.join(xlt_dir, "model.safetensors")), load_file(fusion_file)
  if set(a) != set(b):
    raise RuntimeError(f"the outputs hold different tensors: {sorted(set(a) ^ set(b))[:3]}")
  return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)


def rows(results: list[dict], methods, diffs: dict) -> list[list]:
  out = []
  for method in methods:
    by = {tool: [x for x in results if x["method"] == method and x["tool"] == tool] for tool in ("xlt", "fusion-bench")}
    wall = {t: statistics.median(x["wall_s"] for x in v) for t, v in by.items()}
    rss = {t: max(x["peak_rss_mib"] for x in v) for t, v in by.items()}
    cpu = {t: statistics.median(x["cpu_s"] for x in v) for t, v in by.items()}
    out.append([method, round(wall["xlt"], 2), round(wall["fusion-bench"], 2), round(wall["xlt"] / wall["fusion-bench"], 2),
                round(rss["xlt"]), round(rss["fusion-bench"]), round(rss["xlt"] / rss["fusion-bench"], 2),
                round(cpu["xlt"] / cpu["fusion-bench"], 2), len(by["xlt"]), float(f"{diffs[method]:.3g}")])
  return out


def versions(python: str) -> dict:
  code = ("import json, importlib.metadata as m\nout = {}\nfor p in ('jax', 'torch', 'transformers', 'fusion-bench'):"
          "\n  try: out[p] = m.version(p)\n  except m.PackageNotFoundError: out[p] = None\nprint(json.dumps(out))")
  return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def write_tokens(work: str, examples: int, seq_len: int, vocab: int) -> str:
  import numpy as np
  path = os.path.join(work, f"tokens_{examples}x{seq_len}.npy")
  np.save(path, np.random.default_rng(0).integers(0, vocab, (examples, seq_len)).astype(np.int32))
  return path


def earlier(path: str | None, inputs: dict) -> dict:
  """The record at path when it holds a run on the same inputs (its rows are merged with this
  run's), {} when there is none; exits 2 when it holds another input's."""
  if not path or not os.path.exists(path):
    return {}
  with open(path) as f:
    record = json.load(f)
  if record.get("inputs") != inputs:
    sys.exit(f"error: {path} holds a run on other inputs ({record.get('inputs')}); pass another --out or remove it")
  return record


def merged_record(old: dict, methods: list[str], table: list[list], results: list[dict], run: dict) -> dict:
  """rows, measurements, runs and wall time: this run's methods replace their earlier rows."""
  rows_by = {r[0]: r for r in old.get("rows", [])} | {r[0]: r for r in table}
  runs = {m: r for m, r in old.get("runs", {}).items() if m not in methods} | {m: run for m in methods}
  return {"rows": [rows_by[m] for m in METHODS if m in rows_by],
          "measurements": [x for x in old.get("measurements", []) if x["method"] not in methods] + results,
          "runs": {m: runs[m] for m in METHODS if m in runs},
          "wall_s": sum(r["wall_s"] for r in {id(r): r for r in runs.values()}.values())}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "xlt_fusion_bench"), help="where the checkpoints and outputs go")
  ap.add_argument("--out", default=None, help="the results file (the speed schema), written atomically")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--methods", default=",".join(METHODS))
  ap.add_argument("--hidden", type=int, default=1024)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--vocab", type=int, default=16000)
  ap.add_argument("--mlp", type=int, default=1536)
  ap.add_argument("--examples", type=int, default=32, help="RegMean: token sequences per expert")
  ap.add_argument("--seq_len", type=int, default=64, help="RegMean: tokens per sequence")
  ap.add_argument("--batch", type=int, default=8, help="RegMean: sequences per forward pass")
  ap.add_argument("--notes", default="", help="a caveat for the results file (e.g. taken on a busy machine)")
  args = ap.parse_args()
  methods = args.methods.split(",")
  if unknown := sorted(set(methods) - set(METHODS)):
    ap.error(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
  inputs = {k: getattr(args, k) for k in ("hidden", "layers", "vocab", "mlp", "examples", "seq_len", "batch")}
  old = earlier(args.out, inputs)
  start = time.time()
  os.makedirs(args.work, exist_ok=True)
  dirs = shared.write_models(args.work, args.hidden, args.layers, args.vocab, args.mlp)
  size_mib = os.path.getsize(os.path.join(dirs[0], "model.safetensors")) / 2**20
  data = {"tokens": write_tokens(args.work, args.examples, args.seq_len, args.vocab), "alpha": 0.9, "batch": args.batch}
  results, diffs = [], {}
  for method in methods:
    out = os.path.join(args.work, method)
    cmds = commands(method, dirs, out, sys.executable, data)
    for r in range(args.rounds):
      for tool in (("xlt", "fusion-bench") if r % 2 == 0 else ("fusion-bench", "xlt")):
        m = {"method": method, "tool": tool, "round": r, **shared.run_child(cmds[tool])}
        print(json.dumps(m), flush=True)
        results.append(m)
    diffs[method] = max_abs_diff(f"{out}_xlt", f"{out}_fusion.safetensors")
  columns = ["method", "xlt s", "fusion-bench s", "xlt / fusion-bench (time)", "xlt peak RSS MiB",
             "fusion-bench peak RSS MiB", "xlt / fusion-bench (RSS)", "xlt / fusion-bench (CPU s)", "rounds", "max |xlt - fusion-bench|"]
  table = rows(results, methods, diffs)
  print("| " + " | ".join(columns) + " |\n" + "\n".join("| " + " | ".join(map(str, r)) + " |" for r in table))
  if args.out:
    sys.path.insert(0, ROOT)
    from benchmarks import results_file
    from xlt import report
    run = {"command": results_file.command_line(), "commit": report.git_commit(ROOT), "wall_s": round(time.time() - start, 1)}
    merged = merged_record(old, methods, table, results, run)
    results_file.write(
        args.out, benchmark=os.path.splitext(os.path.basename(args.out))[0],
        title="Subspace and data-aware merges against fusion-bench, wall time and peak RSS", columns=columns,
        rows=merged["rows"], wall_s=merged["wall_s"], versions=versions(sys.executable),
        notes=(f"Inputs: three {size_mib:.1f} MiB float32 Llama-shaped checkpoints (hidden {args.hidden}, "
                        f"{args.layers} layers, vocab {args.vocab}, MLP {args.mlp}); RegMean over {args.examples} random "
                        f"sequences of {args.seq_len} tokens per expert. Median wall time and largest peak RSS of each "
                        "tool's own process over alternating rounds. " + args.notes).strip(),
        inputs=inputs, runs=merged["runs"], measurements=merged["measurements"])

if __name__ == "__main__":
  main()
