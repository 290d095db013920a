"""Loading a Hugging Face checkpoint: xlt.pretrained.load against transformers' from_pretrained,
every weight read, wall time and peak RSS, on Llama-shaped float32 checkpoints made here.

  python benchmarks/load_speed.py --peer_python=PEER/bin/python --rounds=3 \\
      --out=results/benchmarks/load_speed.json

(PEER: a virtual environment with torch and transformers; the checkpoints go under --cache,
by default xlt_load_speed in the system's temporary directory.)

The checkpoints are written once into --cache (kept when already there, with the same shape,
seed and writer's alignment) by xlt's own writer (xlt.io.hf_dir, the layout transformers'
save_pretrained writes: config.json, shards + index; the tensors' bytes start on a 64-byte
boundary, where save_pretrained's start on an 8-byte one, so the tensors xlt keeps as stored,
the embedding and norms, are views of the file for xlt too), from seeded random normals, one
tensor at a time:
  963MiB  hidden 1536, 8 layers, 12 heads / 4 key-value heads, MLP 2816, vocab 32000, 500 MB shards
  3.4GB   hidden 2048, 16 layers, 16 heads / 4 key-value heads, MLP 5632, vocab 32000, 2 GB shards
(--shapes picks some; "tiny" is a seconds-long check of the script itself).

Each measurement is a fresh process, the two tools alternating (--rounds each, the order
swapped every round). A child imports its library (jax's backend started / transformers'
Llama module imported), records its RSS, then times
  load: xlt `pretrained.load(dir)` until every parameter is on the device; transformers
    `AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)`;
  read: every weight summed once, the same numpy sum over a zero-copy host view of each
    parameter on both sides. transformers memory-maps the files and reads a tensor's pages when
    it is first touched, so its `load` returns before the weights are in memory: "load + read"
    is the figure that compares equal work, and the one the table reports.
"CPU s" is the child's CPU time (every thread's) over load and read: on a busy machine,
where a tool's threads wait for a core, it is steadier than the wall time.
Peak RSS is the child's ru_maxrss at the end minus its RSS after the imports (the checkpoint's
pages count while they are mapped), divided by the checkpoint's bytes. The files sit in the page
cache after the first round, so both tools read them from memory (one unmeasured warm-up load
per checkpoint comes first).

xlt's children run under this interpreter (from the repository root, so this checkout's xlt),
transformers' under --peer_python (a virtual environment with torch and transformers).
Writes results/benchmarks/load_speed.json in the speed-results schema (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# imports neither jax nor torch: the xlt child must start as xlt.main does first
from benchmarks.hf_models import checkpoint_bytes, is_written, mark_written, peak_mib, rss_mib, xlt_start  # noqa: E402
# name: (LlamaConfig entries, shard size)
SHAPES = {
    "tiny": (dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=352, vocab_size=1000), "1MB"),
    "963MiB": (dict(hidden_size=1536, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
                    intermediate_size=2816, vocab_size=32000), "500MB"),
    "3.4GB": (dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
                   intermediate_size=5632, vocab_size=32000), "2GB"),
}
_RESULT = "RESULT "


def _cpu_s() -> float:
  """CPU seconds of this process so far, every thread's, user and system."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


class _Normal:
  """A seeded random float32 tensor, drawn when the writer reads it (one at a time)."""

  def __init__(self, shape, seed: int):
    import numpy as np
    self.shape, self.seed, self.dtype = tuple(shape), seed, np.dtype(np.float32)

  def __array__(self, dtype=None, copy=None):
    import numpy as np
    x = np.random.default_rng(self.seed).standard_normal(self.shape, np.float32)
    x *= 0.02
    return x


def write_checkpoint(path: str, name: str, seed: int) -> None:
  """The `name` checkpoint in `path`, unless a stamp says it is there already."""
  shape, shard = SHAPES[name]
  from xlt.io import tensor_files
  want = {"shape": shape, "seed": seed, "shard": shard, "data_align": tensor_files.DATA_ALIGN}
  if is_written(path, want):
    return
  from xlt import pretrained
  from xlt.io import hf_dir

  hf = dict(model_type="llama", architectures=["LlamaForCausalLM"], max_position_embeddings=2048,
            rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            dtype="float32", **shape)
  cfg = pretrained.config_from_hf(hf)
  shapes = pretrained._leaf_shapes(cfg)
  tensors = {}
  for leaf, m in pretrained.table(cfg, "llama", shapes).items():
    for n in m.names:
      tensors[n] = _Normal(pretrained._hf_shape(m, leaf[-1], shapes[leaf]), seed + len(tensors))
  hf_dir.write_model_dir(tensors, path, config=pretrained.config_to_hf(cfg, "llama", hf), max_shard_bytes=shard,
                         overwrite=True, card={"method": "benchmarks/load_speed.py", "seed": seed})
  mark_written(path, want)


def load_child(tool: str, path: str) -> dict:
  """One timed load of `path` by `tool` in this (fresh) process."""
  import numpy as np

  t0 = time.perf_counter()
  if tool == "xlt":
    xlt_start()
    import jax

    from xlt import pretrained
    jax.devices()
  else:
    import torch
    import transformers
    import transformers.models.llama.modeling_llama  # noqa: F401
  imported, base, cpu0 = time.perf_counter(), rss_mib(), _cpu_s()
  if tool == "xlt":
    _, params = pretrained.load(path)
    weights = jax.block_until_ready(jax.tree_util.tree_leaves(params))
    views = lambda: (np.asarray(x) for x in weights)  # a CPU array's host view: no copy
  else:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    weights = list(model.parameters())
    views = lambda: (p.detach().numpy() for p in weights)
  loaded, after = time.perf_counter(), rss_mib() - base
  total = float(sum(np.sum(v, dtype=np.float32) for v in views()))  # every weight read once
  read = time.perf_counter()
  return {"tool": tool, "import_s": imported - t0, "load_s": loaded - imported, "read_s": read - imported,
          "cpu_s": _cpu_s() - cpu0,
          "after_above_mib": after, "peak_above_mib": peak_mib() - base, "peak_mib": peak_mib(),
          "sum": total, "params": int(sum(v.size for v in views()))}


def _child(args, python: str, *flags) -> dict:
  cmd = [python, os.path.abspath(__file__), f"--cache={args.cache}", f"--seed={args.seed}", *flags]
  env = dict(os.environ, PYTHONPATH=ROOT) if python == sys.executable else None
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
  lines = [x for x in proc.stdout.splitlines() if x.startswith(_RESULT)]
  if proc.returncode or not lines:
    sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return json.loads(lines[-1][len(_RESULT):])


def measure(args) -> dict:
  runs = {}
  for name in args.shapes:
    path = os.path.join(args.cache, name)
    t0 = time.perf_counter()
    _child(args, sys.executable, f"--worker=write:{name}")
    size = checkpoint_bytes(path)
    print(f"checkpoint {path}: {size / 2**20:.0f} MiB ({time.perf_counter() - t0:.0f} s)", flush=True)
    python = {"xlt": sys.executable, "transformers": args.peer_python}
    for tool in python:  # warm-up: the files into the page cache, each tool's first start
      _child(args, python[tool], f"--worker=load:{tool}:{name}")
    runs[name] = {"bytes": size, "runs": []}
    for r in range(args.rounds):
      for tool in (("xlt", "transformers") if r % 2 == 0 else ("transformers", "xlt")):
        m = _child(args, python[tool], f"--worker=load:{tool}:{name}") | {"round": r}
        runs[name]["runs"].append(m)
        print(f"{name} round {r} {tool}: load {m['load_s']:.2f} s, load + read {m['read_s']:.2f} s "
              f"({m['cpu_s']:.2f} CPU s), "
              f"peak {m['peak_above_mib']:.0f} MiB above imports ({m['peak_above_mib'] * 2**20 / size:.3f}x)",
              flush=True)
  return runs


COLUMNS = ["checkpoint", "MiB", "xlt load + read s", "transformers load + read s", "xlt / transformers",
           "xlt load s", "transformers load s", "xlt CPU s", "transformers CPU s", "xlt peak RSS / file",
           "transformers peak RSS / file"]


def rows(runs: dict) -> list[list]:
  """Per checkpoint: medians of the rounds, the largest peak RSS (above the imports) / file."""
  out = []
  for name, r in runs.items():
    med, peak = {}, {}
    for tool in ("xlt", "transformers"):
      ms = [m for m in r["runs"] if m["tool"] == tool]
      med[tool] = {k: statistics.median(m[k] for m in ms) for k in ("load_s", "read_s", "cpu_s")}
      peak[tool] = max(m["peak_above_mib"] for m in ms) * 2**20 / r["bytes"]
    x, t = med["xlt"], med["transformers"]
    out.append([name, round(r["bytes"] / 2**20, 1), round(x["read_s"], 3), round(t["read_s"], 3),
                round(x["read_s"] / t["read_s"], 3), round(x["load_s"], 3), round(t["load_s"], 3),
                round(x["cpu_s"], 3), round(t["cpu_s"], 3),
                round(peak["xlt"], 3), round(peak["transformers"], 3)])
  return out


def _versions(peer_python: str) -> dict:
  import jax
  code = "import torch, transformers, json; print(json.dumps([torch.__version__, transformers.__version__]))"
  out = subprocess.run([peer_python, "-c", code], capture_output=True, text=True).stdout.strip()
  torch_v, tf_v = json.loads(out) if out else (None, None)
  return {"jax": jax.__version__, "torch": torch_v, "transformers": tf_v}


def _worker(args) -> None:
  kind, *rest = args.worker.split(":")
  if kind == "write":
    write_checkpoint(os.path.join(args.cache, rest[0]), rest[0], args.seed)
    out = {}
  else:
    out = load_child(rest[0], os.path.join(args.cache, rest[1]))
  print(_RESULT + json.dumps(out), flush=True)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "xlt_load_speed"), help="where the checkpoints are written (and kept)")
  p.add_argument("--peer_python", default=sys.executable, help="a Python with torch and transformers")
  p.add_argument("--shapes", default="963MiB,3.4GB", help=f"comma-separated, of {', '.join(SHAPES)}")
  p.add_argument("--rounds", type=int, default=3, help="measurements per tool and checkpoint (alternating)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="", help="the results file (speed-results schema)")
  p.add_argument("--notes", default="", help="a caveat recorded with the results (e.g. a busy machine)")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  args = p.parse_args()
  args.cache = os.path.abspath(args.cache)
  if args.worker:
    return _worker(args)
  args.shapes = [s for s in args.shapes.split(",") if s]
  bad = [s for s in args.shapes if s not in SHAPES]
  if bad or args.rounds < 1:
    sys.exit(f"error: unknown shape {bad[0]!r} (known: {', '.join(SHAPES)})" if bad else "error: --rounds >= 1")
  t0 = time.perf_counter()
  runs = measure(args)
  table = rows(runs)
  print("\n| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
  for row in table:
    print("| " + " | ".join(str(x) for x in row) + " |")
  if args.out:
    from benchmarks import results_file
    results_file.write(
        args.out, benchmark=os.path.splitext(os.path.basename(args.out))[0],
        title="Loading a Hugging Face checkpoint, every weight read", columns=COLUMNS, rows=table,
        wall_s=time.perf_counter() - t0, versions=_versions(args.peer_python),
        notes=args.notes or ("Medians of alternating rounds, each a fresh process; peak RSS above the "
                             "imports over the checkpoint's bytes, the largest round."),
        measurements=runs)


if __name__ == "__main__":
  main()
