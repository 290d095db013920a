"""xlt's merge tool against mergekit on the same files: wall time and peak memory (RSS) of
each tool's command, each in its own subprocess, for task_arithmetic, ties and a layer swap
(mergekit: passthrough slices A [0, b), B [b, L-u), A [L-u, L)).

  ../peervenv/bin/python benchmarks/merge_vs_mergekit.py --out=runs/merge_vs_mergekit.json

Runs where both tools are installed (a virtual environment with mergekit and xlt). It writes
three Llama-shaped float32 checkpoints (a base and two fine-tunes: the base plus seeded noise;
HF names and a config.json; by default hidden 1024, 8 layers, vocab 16000, MLP 1536: ~400 MiB
each), then runs the tools in alternating rounds (xlt, mergekit, xlt, ... per method; --rounds
each), and prints a markdown table of the median wall time and the largest peak RSS per tool
and method, and writes every measurement as JSON to --out. Both run on the CPU with their
defaults for a command-line user: xlt's `python -m xlt.merge` (no heatmaps: mergekit draws
none), mergekit's `mergekit-yaml ... --no-cuda --no-copy-tokenizer`. Timings on a shared
machine vary by tens of percent from run to run: compare the tools within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

METHODS = ("task_arithmetic", "ties", "layer_swap")


def llama_tensors(rng, hidden: int, layers: int, vocab: int, mlp: int) -> dict:
  """{HF name: float32 array} of a Llama (no GQA, untied head), weights ~ N(0, 0.02)."""
  shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
            "lm_head.weight": (vocab, hidden)}
  for i in range(layers):
    p = f"model.layers.{i}."
    shapes |= {p + f"self_attn.{n}_proj.weight": (hidden, hidden) for n in "qkvo"}
    shapes |= {p + "mlp.gate_proj.weight": (mlp, hidden), p + "mlp.up_proj.weight": (mlp, hidden),
               p + "mlp.down_proj.weight": (hidden, mlp), p + "input_layernorm.weight": (hidden,),
               p + "post_attention_layernorm.weight": (hidden,)}
  return {k: (rng.standard_normal(s, dtype=np.float32) * 0.02 if len(s) > 1 else np.ones(s, np.float32))
          for k, s in shapes.items()}


def write_models(root: str, hidden: int, layers: int, vocab: int, mlp: int) -> list[str]:
  """base, expert_a, expert_b under root (kept when already there with the same config)."""
  from safetensors.numpy import save_file
  config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": mlp, "num_hidden_layers": layers, "num_attention_heads": 16,
            "num_key_value_heads": 16, "vocab_size": vocab, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu",
            "rope_theta": 10000.0}
  dirs = [os.path.join(root, n) for n in ("base", "expert_a", "expert_b")]
  if all(_same_config(d, config) for d in dirs):
    return dirs
  base = llama_tensors(np.random.default_rng(0), hidden, layers, vocab, mlp)
  for seed, d in enumerate(dirs):
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = base if seed == 0 else {k: x + rng.standard_normal(x.shape, dtype=np.float32) * 1e-3
                                      for k, x in base.items()}
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
      json.dump(config, f, indent=1)
  return dirs


def _same_config(d: str, config: dict) -> bool:
  try:
    with open(os.path.join(d, "config.json")) as f:
      return json.load(f) == config and os.path.exists(os.path.join(d, "model.safetensors"))
  except OSError:
    return False


def mergekit_yaml(method: str, base: str, a: str, b: str, layers: int, bottom: int, top: int) -> str:
  if method == "layer_swap":  # A = the language expert (outer layers), B = the task expert
    ranges = [(b, 0, bottom), (a, bottom, layers - top), (b, layers - top, layers)]
    slices = "".join(f"  - sources:\n      - model: {m}\n        layer_range: [{lo}, {hi}]\n" for m, lo, hi in ranges)
    return f"slices:\n{slices}merge_method: passthrough\ndtype: float32\n"
  density = "\n      density: 0.2" if method == "ties" else ""
  models = "".join(f"  - model: {m}\n    parameters:\n      weight: 1.0{density}\n" for m in (a, b))
  return f"models:\n{models}merge_method: {method}\nbase_model: {base}\ndtype: float32\n"


def commands(method: str, dirs: list[str], out: str, work: str, layers: int, python: str) -> dict:
  """{tool: argv} for one method; both tools read the same YAML's merge (xlt through its own
  flags, so the table times xlt's merge and not its YAML mapping)."""
  base, a, b = dirs
  bottom, top = 2, 1
  yml = os.path.join(work, f"{method}.yml")
  with open(yml, "w") as f:
    f.write(mergekit_yaml(method, base, a, b, layers, bottom, top))
  xlt = [python, "-m", "xlt.merge", "--config=" + _config_path(), f"--config.output={out}_xlt",
         "--config.heatmaps=false"]
  if method == "layer_swap":
    xlt += ["--config.method=layer_swap", f"--config.inputs.task_expert={a}", f"--config.inputs.language_expert={b}",
            f"--config.options.bottom={bottom}", f"--config.options.top={top}", "--config.options.non_block=language"]
  else:
    xlt += [f"--config.method={method}", f"--config.inputs.base={base}", f"--config.inputs.experts={a},{b}"]
    if method == "ties":
      xlt += ["--config.options.density=0.2", "--config.options.convention=mergekit"]
  mergekit = [os.path.join(os.path.dirname(python), "mergekit-yaml"), yml, f"{out}_mergekit", "--no-cuda",
              "--no-copy-tokenizer", "--quiet"]
  return {"xlt": xlt, "mergekit": mergekit}


def _config_path() -> str:
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "merge_files.py")


def run_child(argv: list[str]) -> dict:
  """Runs argv through this script's --child mode, which reports the grandchild's own
  RUSAGE_CHILDREN peak RSS: the tool's process alone, not earlier runs'."""
  raw = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(argv)],
                       capture_output=True, text=True)
  if raw.returncode:
    raise RuntimeError(f"{' '.join(argv)} failed ({raw.returncode}):\n{raw.stderr[-2000:]}")
  return json.loads(raw.stdout.strip().splitlines()[-1])


def child(argv: list[str]) -> None:
  start = time.perf_counter()
  proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  wall = time.perf_counter() - start
  if proc.returncode:
    sys.stderr.write(proc.stderr[-2000:])
    sys.exit(proc.returncode)
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  # CPU seconds as well: on a busy machine they compare the tools' work where wall time cannot
  print(json.dumps({"wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux: KiB
                    "cpu_s": usage.ru_utime + usage.ru_stime}))


def max_abs_diff(dir_a: str, dir_b: str) -> float:
  """The largest |a - b| over every tensor of two output directories: both tools must agree."""
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
  from xlt.io import hf_dir as hf
  (_, a), (_, b) = hf.read_model_dir(dir_a), hf.read_model_dir(dir_b)
  if set(a) != set(b):
    raise RuntimeError(f"{dir_a} and {dir_b} hold different tensors: {sorted(set(a) ^ set(b))[:3]}")
  return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)))) for k in a)


def table(results: list[dict], size_mib: float) -> str:
  lines = ["| method | tool | wall s (median) | peak RSS MiB (max) | rounds |",
           "|---|---|---|---|---|"]
  for method in METHODS:
    for tool in ("xlt", "mergekit"):
      rows = [r for r in results if r["method"] == method and r["tool"] == tool]
      if rows:
        lines.append(f"| {method} | {tool} | {statistics.median(r['wall_s'] for r in rows):.1f} | "
                     f"{max(r['peak_rss_mib'] for r in rows):.0f} | {len(rows)} |")
  return "\n".join(lines) + f"\n\n(each input {size_mib:.0f} MiB, float32)"


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "xlt_merge_bench"),
                  help="where the checkpoints and outputs go")
  ap.add_argument("--out", help="the JSON file of every measurement (required)")
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--methods", default=",".join(METHODS))
  ap.add_argument("--hidden", type=int, default=1024)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--vocab", type=int, default=16000)
  ap.add_argument("--mlp", type=int, default=1536)
  ap.add_argument("--child", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    return child(json.loads(args.child))
  if not args.out:
    ap.error("--out is required")
  os.makedirs(args.work, exist_ok=True)
  dirs = write_models(os.path.join(args.work, "models"), args.hidden, args.layers, args.vocab, args.mlp)
  size_mib = os.path.getsize(os.path.join(dirs[0], "model.safetensors")) / 2**20
  results, agreement = [], {}
  for method in args.methods.split(","):
    argvs = commands(method, dirs, os.path.join(args.work, method), args.work, args.layers, sys.executable)
    for r in range(args.rounds):
      for tool in ("xlt", "mergekit") if r % 2 == 0 else ("mergekit", "xlt"):
        shutil.rmtree(os.path.join(args.work, f"{method}_{tool}"), ignore_errors=True)
        m = run_child(argvs[tool]) | {"method": method, "tool": tool, "round": r}
        print(json.dumps(m), flush=True)
        results.append(m)
    diff = max_abs_diff(os.path.join(args.work, f"{method}_xlt"), os.path.join(args.work, f"{method}_mergekit"))
    print(f"{method}: max |xlt - mergekit| = {diff:.3g}", flush=True)
    agreement[method] = diff
  report = table(results, size_mib) + "; max |xlt - mergekit| over all tensors: " + ", ".join(
      f"{m} {d:.2g}" for m, d in agreement.items())
  print(report)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump({"results": results, "agreement": agreement, "input_mib": size_mib, "argv": sys.argv, "table": report}, f, indent=1)


if __name__ == "__main__":
  main()
