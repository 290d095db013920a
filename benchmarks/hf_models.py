"""Hugging Face decoders in xlt against transformers on the CPU: loading a ~1 GB checkpoint
(wall time and peak RSS) and greedy decoding with a KV cache (new tokens/s), on the same files.

  ../peervenv/bin/python benchmarks/hf_models.py --workdir=runs/hf_models --out=runs/hf_models.json

Runs where both are installed (a virtual environment with torch, transformers and xlt). It
writes two Llama-shaped float32 checkpoints under --workdir with transformers' own
`save_pretrained` from a randomly initialised, seeded `LlamaForCausalLM` (kept when already
there with the same config): `load/` (hidden 1536, 8 layers, 12 heads, 4 key/value heads,
MLP 2816, vocab 32000: ~1.0 GB, in 500 MB shards with an index) and `decode/` (hidden 512,
4 layers, 8 heads, 2 key/value heads, MLP 1408, vocab 32000).

Loading: each measurement is a fresh subprocess, xlt and transformers alternating (--rounds
each). xlt: `xlt.pretrained.load(dir)` until every parameter is on the device
(jax.block_until_ready); transformers: `AutoModelForCausalLM.from_pretrained(dir,
dtype=torch.float32)`. Each child imports its library first (jax's backend started, the
Llama modelling module imported; "import s"), then times the load ("load s"), then sums every
weight once ("load + every weight read s"): transformers maps the safetensors files and reads
a tensor's pages when it is first used, so its load returns before the weights are in memory;
xlt's returns with them on the device. Peak RSS is the child's ru_maxrss at the end (absolute,
and above its RSS after the imports), divided by the checkpoint's size for the ratio; it counts
the mapped file pages transformers' tensors touch. "RSS after load" is what is resident when
the load returned, above the imports. The files sit in the page cache after the first round
(both tools read them from there).

Decoding: `decode/` loaded into both, batch 1 and 8, random prompts of --prompt tokens (the
same for both, seeded), --new tokens each, greedy, no stop token (transformers'
generation_config.eos_token_id unset, min_new_tokens = max_new_tokens = --new). xlt:
`xlt.generate.greedy_ids` after a warm-up call of the same shapes (the compile, timed
apart); transformers: `model.generate(do_sample=False, ...)` after a warm-up call. New
tokens/s = batch * new / seconds, the median of the rounds, each round a fresh subprocess per
tool. The continuations are compared token by token.

The xlt children start as `python -m xlt.main` does (xlt.cpu_devices, xlt.allocator: the
cores as devices, mimalloc preloaded); the parameters sit on the default device (no mesh), as
`python -m xlt.generate` places them. Prints markdown tables and writes every measurement as
JSON to --out. Timings on a shared machine vary by tens of percent between runs: compare the
two within one run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# LlamaConfig keyword arguments of the two checkpoints
LOAD_SHAPE = dict(hidden_size=1536, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
                  intermediate_size=2816, vocab_size=32000)
DECODE_SHAPE = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                    intermediate_size=1408, vocab_size=32000)
BATCHES = (1, 8)
_RESULT = "RESULT "


def rss_mib() -> float:
  """This process's resident set now, MiB (VmRSS)."""
  with open("/proc/self/status") as f:
    line = next(x for x in f if x.startswith("VmRSS:"))
  return int(line.split()[1]) / 1024


def peak_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def checkpoint_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))


# ---------------------------------------------------------------------------- children


def is_written(path: str, want: dict) -> bool:
  """Whether `path` holds the checkpoint `want` describes (its stamp, written last, says so)."""
  stamp = os.path.join(path, "benchmark.json")
  if not os.path.exists(stamp):
    return False
  with open(stamp) as f:
    return json.load(f) == want


def mark_written(path: str, want: dict) -> None:
  with open(os.path.join(path, "benchmark.json"), "w") as f:
    json.dump(want, f)


def write_checkpoint(path: str, shape: dict, seed: int, shard: str | None = None) -> None:
  """A random LlamaForCausalLM of `shape`, float32, saved by transformers in files of at most
  `shard` (None: transformers' default) (kept when `path` already holds one of the same shape,
  seed and shard). benchmarks/finetune_step.py writes its checkpoints with it too."""
  want = {"shape": shape, "seed": seed, "shard": shard}
  if is_written(path, want):
    return
  import torch
  import transformers

  torch.manual_seed(seed)
  config = transformers.LlamaConfig(max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                    **shape)
  model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
  model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
  mark_written(path, want)


def xlt_start() -> None:
  """As `python -m xlt.main` starts, before jax is imported (may re-execute this process)."""
  sys.path.insert(0, ROOT)
  from xlt import allocator, cpu_devices

  cpu_devices.configure()
  allocator.preload()


def load_child(tool: str, path: str) -> dict:
  """One timed load of `path` by `tool` in this (fresh) process."""
  t0 = time.perf_counter()
  if tool == "xlt":
    import jax

    from xlt import pretrained
    jax.devices()
  else:
    import torch
    import transformers
    import transformers.models.llama.modeling_llama  # noqa: F401
  imported, base = time.perf_counter(), rss_mib()
  if tool == "xlt":
    cfg, params = pretrained.load(path)
    weights = jax.block_until_ready(jax.tree_util.tree_leaves(params))
    total = lambda: float(sum(jax.numpy.sum(x) for x in weights))
  else:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    weights = list(model.parameters())
    total = lambda: float(sum(p.detach().sum() for p in weights))
  done, after = time.perf_counter(), rss_mib() - base
  total()  # every weight read once (transformers maps the files and reads a tensor when first used)
  read = time.perf_counter()
  return {"tool": tool, "import_s": imported - t0, "load_s": done - imported, "read_s": read - imported,
          "rss_imports_mib": base, "after_above_mib": after, "peak_mib": peak_mib(),
          "peak_above_mib": peak_mib() - base, "read_above_mib": rss_mib() - base,
          "params": int(sum(x.size if tool == "xlt" else x.numel() for x in weights))}


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
  import numpy as np
  return np.random.default_rng(seed).integers(3, vocab, (batch, length)).tolist()


def decode_child(tool: str, path: str, prompt: int, new: int, seed: int) -> dict:
  """Warm-up and timed greedy decoding at each batch size by `tool` in this process."""
  if tool == "xlt":
    from xlt import generate, pretrained
    cfg, params = pretrained.load(path)
    vocab = cfg.vocab_size

    def run(ids):
      return generate.greedy_ids(cfg, params, ids, max_new=new, batch=len(ids), stop_ids=())
  else:
    import torch
    import transformers
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    vocab = model.config.vocab_size

    def run(ids):
      x = torch.tensor(ids)
      with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new,
                             min_new_tokens=new)
      return out[:, x.shape[1]:].tolist()
  out = {"tool": tool, "batches": {}}
  for b in BATCHES:
    ids = _prompts(b, prompt, vocab, seed + b)
    t0 = time.perf_counter()
    run(ids)
    t1 = time.perf_counter()
    toks = run(ids)
    t2 = time.perf_counter()
    out["batches"][str(b)] = {"warmup_s": t1 - t0, "s": t2 - t1, "tokens_per_s": b * new / (t2 - t1),
                              "ids": toks}
  return out


# ---------------------------------------------------------------------------- parent


def _child(args, *extra) -> dict:
  """Runs this script as a child (`extra` its worker flags); returns its result."""
  cmd = [sys.executable, os.path.abspath(__file__), f"--workdir={args.workdir}", f"--prompt={args.prompt}",
         f"--new={args.new}", f"--seed={args.seed}", *extra]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
  lines = [x for x in proc.stdout.splitlines() if x.startswith(_RESULT)]
  if proc.returncode or not lines:
    sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return json.loads(lines[-1][len(_RESULT):])


def measure(args) -> dict:
  """Writes the checkpoints, then runs the alternating rounds; every measurement."""
  load_dir, decode_dir = (os.path.join(args.workdir, n) for n in ("load", "decode"))
  for d, name in ((load_dir, "load"), (decode_dir, "decode")):
    t0 = time.perf_counter()
    _child(args, f"--worker=write_{name}")
    print(f"checkpoint {d}: {checkpoint_bytes(d) / 2**20:.0f} MiB ({time.perf_counter() - t0:.0f} s)", flush=True)
  runs = {"load": [], "decode": []}
  for r in range(args.rounds):
    for tool in (("xlt", "transformers") if r % 2 == 0 else ("transformers", "xlt")):
      m = _child(args, f"--worker=load_{tool}")
      runs["load"].append(m | {"round": r})
      print(f"round {r} load {tool}: {m['load_s']:.2f} s, peak {m['peak_mib']:.0f} MiB", flush=True)
    for tool in (("transformers", "xlt") if r % 2 == 0 else ("xlt", "transformers")):
      m = _child(args, f"--worker=decode_{tool}")
      runs["decode"].append(m | {"round": r})
      rates = ", ".join(f"batch {b} {v['tokens_per_s']:.0f} tok/s" for b, v in m["batches"].items())
      print(f"round {r} decode {tool}: {rates}", flush=True)
  return {"checkpoint_bytes": checkpoint_bytes(load_dir), "decode_checkpoint_bytes": checkpoint_bytes(decode_dir),
          "runs": runs}


def _match(a: list, b: list) -> dict:
  """Rows equal, tokens equal, and the first differing position per row (None = equal)."""
  first = [next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None) for ra, rb in zip(a, b)]
  same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
  return {"rows_equal": sum(f is None for f in first), "rows": len(first), "tokens_equal": same,
          "tokens": sum(len(r) for r in a), "first_difference": first}


def summarise(result: dict) -> dict:
  """Medians per tool (largest peak RSS) and the token match, from `measure`'s runs."""
  size = result["checkpoint_bytes"] / 2**20
  load = {}
  for tool in ("xlt", "transformers"):
    ms = [m for m in result["runs"]["load"] if m["tool"] == tool]
    med = {k: statistics.median(m[k] for m in ms) for k in ("load_s", "read_s", "import_s", "after_above_mib")}
    peak = max(ms, key=lambda m: m["peak_mib"])
    load[tool] = med | {"peak_mib": peak["peak_mib"], "peak_above_mib": max(m["peak_above_mib"] for m in ms),
                        "peak_ratio": max(m["peak_above_mib"] for m in ms) / size}
  decode = {}
  for b in map(str, BATCHES):
    row = {}
    for tool in ("xlt", "transformers"):
      ms = [m["batches"][b] for m in result["runs"]["decode"] if m["tool"] == tool]
      row[tool] = {"tokens_per_s": statistics.median(m["tokens_per_s"] for m in ms),
                   "warmup_s": statistics.median(m["warmup_s"] for m in ms)}
    ids = {t: next(m["batches"][b]["ids"] for m in result["runs"]["decode"] if m["tool"] == t) for t in row}
    decode[b] = row | {"match": _match(ids["xlt"], ids["transformers"])}
  return {"checkpoint_mib": size, "load": load, "decode": decode}


def tables(summary: dict, args) -> str:
  s, lines = summary, []
  lines += [f"Loading a {s['checkpoint_mib']:.0f} MiB float32 Llama checkpoint (hidden 1536, 8 layers, GQA 12/4, "
            f"vocab 32000; 500 MB shards), medians of {args.rounds} rounds, largest peak:", "",
            "| tool | load s | load + every weight read s | import s | RSS after load above imports MiB "
            "| peak RSS above imports MiB | peak / checkpoint | peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
  for tool, m in s["load"].items():
    lines.append(f"| {tool} | {m['load_s']:.2f} | {m['read_s']:.2f} | {m['import_s']:.2f} | "
                 f"{m['after_above_mib']:.0f} | {m['peak_above_mib']:.0f} | {m['peak_ratio']:.2f}x | "
                 f"{m['peak_mib']:.0f} |")
  (x, xr), (t, tr) = ((s["load"][k]["load_s"], s["load"][k]["read_s"]) for k in ("xlt", "transformers"))
  lines += ["", f"xlt / transformers time: {x / t:.2f}x to return, {xr / tr:.2f}x with every weight read once.", "",
            f"Greedy decoding (hidden 512, 4 layers, GQA 8/2, vocab 32000, float32), prompt {args.prompt}, "
            f"{args.new} new tokens, medians of {args.rounds} rounds:", "",
            "| batch | xlt tok/s | transformers tok/s | xlt / transformers | xlt compile s | same tokens |",
            "|---|---|---|---|---|---|"]
  for b, row in s["decode"].items():
    m, x, t = row["match"], row["xlt"]["tokens_per_s"], row["transformers"]["tokens_per_s"]
    lines.append(f"| {b} | {x:.0f} | {t:.0f} | {x / t:.2f}x | {row['xlt']['warmup_s']:.1f} | "
                 f"{m['rows_equal']}/{m['rows']} rows, {m['tokens_equal']}/{m['tokens']} tokens |")
  return "\n".join(lines)


def _machine() -> str:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next(x.split(":", 1)[1].strip() for x in out.splitlines() if x.startswith("Model name"))
  except (OSError, StopIteration):
    return platform.processor()


def _worker(args) -> None:
  kind, tool = args.worker.split("_", 1)
  if kind == "write":
    shape, shard = (LOAD_SHAPE, "500MB") if tool == "load" else (DECODE_SHAPE, "5GB")
    write_checkpoint(os.path.join(args.workdir, tool), shape, args.seed, shard)
    out = {}
  else:
    if tool == "xlt":
      xlt_start()
    if kind == "load":
      out = load_child(tool, os.path.join(args.workdir, "load"))
    else:
      out = decode_child(tool, os.path.join(args.workdir, "decode"), args.prompt, args.new, args.seed)
  print(_RESULT + json.dumps(out), flush=True)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default="runs/hf_models", help="where the checkpoints are written (and kept)")
  p.add_argument("--out", default="", help="write every measurement as JSON here")
  p.add_argument("--rounds", type=int, default=3, help="measurements per tool (fresh subprocesses, alternating)")
  p.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
  p.add_argument("--new", type=int, default=128, help="new tokens per row")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--worker", help=argparse.SUPPRESS)
  args = p.parse_args()
  args.workdir = os.path.abspath(args.workdir)
  if args.worker:
    return _worker(args)
  started = datetime.datetime.now(datetime.timezone.utc)
  result = measure(args)
  summary = summarise(result)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
  meta = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": _machine(), "cores": os.cpu_count(),
          "commit": commit.strip(), "command": " ".join(sys.argv), "rounds": args.rounds}
  print(f"\n{meta['date']}, {meta['machine']} ({meta['cores']} cores), {meta['commit']}\n")
  print(tables(summary, args))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(meta | {"summary": summary, "measurements": result}, f, indent=1)


if __name__ == "__main__":
  main()
