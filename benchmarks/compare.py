"""xlt vs PyTorch eager, side by side, in one run: every training shape xlt uses, the
ensemble, and greedy decoding.

  pip install -e '.[bench]'                # PyTorch as an optional extra (never an xlt dependency)
  # PyPI's default Linux torch wheel pulls GBs of CUDA libraries; on a CPU machine use:
  #   pip install torch --index-url https://download.pytorch.org/whl/cpu
  python benchmarks/compare.py                      # ~6 min on the 2-core CPU
  python benchmarks/compare.py --quick              # smoke test, about a minute
  python benchmarks/compare.py --rounds 3 --json runs/compare.json
  python benchmarks/compare.py --rounds 3 --results=results/benchmarks/compare.json   # docs/speed.md's table
  python benchmarks/compare.py --reference          # on a GPU: + reference-size configs and MFU
  python benchmarks/compare.py --one_device         # + xlt on one CPU device (XLT_CPU_DEVICES=1)

Prints a markdown table: date, machine (CPU model, cores), library versions, allocator,
and per shape xlt tokens/s, PyTorch tokens/s and their ratio (with each round's numbers,
so the noise is visible). PyTorch is benchmarks/torch_gpt.py, the same model and optimizer
(tests/test_torch_gpt.py checks logits, decodes and AdamW steps agree).

What is measured:
  * training, one full step (forward, backward, global-norm clip, AdamW):
    tokens/s = ensemble x batch x seq / median step time. Shapes: graph (6 x 64, 4 heads,
    vocab 112, batch 64) at 29 and 128 tokens; addition `:cpu` (4 x 128, RoPE, vocab 32,
    batch 128, 13 tokens) and reference (12 x 128, 8 heads, batch 256, 32 tokens); the text
    proxy (model and batch read from configs/tinystories.py, block_size tokens).
  * ensemble: 9 graph models (29 tokens) in one xlt step (the strategy `auto` picks for the
    platform, xlt.ensemble: on a CPU lax.map, each member's step data-parallel over the
    devices), the same with vmap, the same 9 stepped one after the other with the
    single-model step, and PyTorch's 9 separate steps (benchmarks/ensemble_strategies.py also
    times the members split over the devices).
  * decoding: greedy with a KV cache, graph model, batch 512, 100-token prompt + 20 new
    tokens; xlt through xlt.ensemble_decode.decode_batch (jitted, after warm-up). Prefill is the
    same call with 1 new token; ms per new token = (full - prefill) / 19; new tokens/s =
    batch x 20 / full time (prefill included).

How: xlt's step is xlt.train.make_step(make_optimizer(...)) on a mesh of every device, as
`python -m xlt.main`'s default (on a CPU, one device per core: xlt.cpu_devices; `--one_device`
adds a column of the same worker on one device, what that adds); decoding goes through
xlt.ensemble_decode.decode_batch, the rows spread over the devices as evaluation spreads them. Each
implementation runs in its own subprocess (JAX and PyTorch never share a process's threads), rounds alternate between them (xlt first in
even rounds, PyTorch first in odd ones, so a drift of the machine's speed hits both), each
round takes the median over timed steps after warm-up, and the table reports the median
over rounds. XLA:CPU uses every core; PyTorch gets torch.set_num_threads(os.cpu_count()).
The xlt worker starts as `python -m xlt.main` does: `xlt.allocator.preload()` (when that
module exists) may re-execute it with a faster malloc preloaded; the table names the
allocator each worker ended up with.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Nothing here may import jax or torch at module level: the xlt worker must call
# xlt.allocator.preload() before jax is imported.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import results_file  # noqa: E402
from benchmarks.compare_table import ENSEMBLE, ONE_DEVICE, SCHEMA_COLUMNS, schema_rows, table  # noqa: E402

OPT = dict(name="adamw", schedule="cosine", peak_lr=3e-3, warmup_steps=10, total_steps=1000,
           b1=0.9, b2=0.95, weight_decay=0.1, clip=1.0)  # xlt's defaults (configs/common.py)
DECODE = dict(batch=512, prompt=100, new=20)


def _model(layers, width, heads, vocab, block, pos="learned"):
  return dict(num_layers=layers, d_model=width, num_heads=heads, vocab_size=vocab, block_size=block,
              pos_embedding=pos)


def _text_proxy():
  """configs/tinystories.py's model and batch; sequences of block_size tokens (its packed rows)."""
  from configs import tinystories

  c = tinystories.get_config()
  m, multiple = c.model, c.model.get("vocab_multiple", 8)
  vocab = -(-c.tokenizer.vocab_size // multiple) * multiple  # as xlt.model.config_from pads it
  model = dict(_model(m.num_layers, m.d_model, m.num_heads, vocab, m.block_size, m.pos_embedding),
               mlp_ratio=m.mlp_ratio, tie_embeddings=m.tie_embeddings)
  return model, c.train.batch_size, m.block_size


def _reference_jobs() -> list[dict]:
  """The reference-size configs at their own batch, accumulation and dtype (for an
  accelerator: on a 2-core CPU one text step takes minutes): configs/addition.py and
  configs/tinystories_reference.py."""
  from configs import addition, tinystories_reference

  jobs = []
  for name, module, seq in (("addition_ref_full", addition, 32), ("text_ref", tinystories_reference, None)):
    c = module.get_config()
    m, multiple = c.model, c.model.get("vocab_multiple", 8)
    vocab = -(-(c.tokenizer.vocab_size if "tokenizer" in c else 32) // multiple) * multiple
    model = dict(_model(m.num_layers, m.d_model, m.num_heads, vocab, m.block_size, m.pos_embedding),
                 mlp_ratio=m.get("mlp_ratio", 4), tie_embeddings=m.get("tie_embeddings", False),
                 dtype=m.get("dtype", "float32"))
    seq = seq or m.block_size
    accum = c.train.get("grad_accum", 1)
    jobs.append(dict(kind="train", name=name, model=model, batch=c.train.batch_size, seq=seq, accum=accum,
                     label=f"{module.__name__.split('.')[-1]}.py: {m.num_layers}×{m.d_model}, {m.num_heads} heads, "
                           f"vocab {vocab}, {model['dtype']}, batch {c.train.batch_size} × {seq}"
                           + (f" ({accum} micro-batches)" if accum > 1 else "")))
  return jobs


def plan(reference: bool = False) -> list[dict]:
  """The jobs, in the order each worker runs them (`reference`: also _reference_jobs)."""
  graph = _model(6, 64, 4, 112, 128)
  text_model, text_batch, text_seq = _text_proxy()
  t = lambda name, label, model, batch, seq: dict(kind="train", name=name, label=label, model=model,
                                                  batch=batch, seq=seq)
  return [
      t("graph_29", "graph: 6×64, batch 64 × 29", graph, 64, 29),
      t("graph_128", "graph: 6×64, batch 64 × 128", graph, 64, 128),
      t("addition_cpu", "addition `:cpu`: 4×128 RoPE, batch 128 × 13", _model(4, 128, 4, 32, 64, "rope"), 128, 13),
      t("addition_ref", "addition reference: 12×128, 8 heads, RoPE, batch 256 × 32",
        _model(12, 128, 8, 32, 64, "rope"), 256, 32),
      t("text_proxy", f"text proxy: {text_model['num_layers']}×{text_model['d_model']}, vocab "
        f"{text_model['vocab_size']}, batch {text_batch} × {text_seq}", text_model, text_batch, text_seq),
      dict(kind="ensemble", name="ensemble", label=f"{ENSEMBLE} graph models, batch 64 × 29", model=graph,
           batch=64, seq=29, members=ENSEMBLE),
      dict(kind="decode", name="decode", model=graph, **DECODE),
  ] + (_reference_jobs() if reference else [])


# --- measurement helpers (used inside the workers) ---

def median_seconds(fn, warmup: int, steps: int, min_seconds: float = 0.0, max_steps: int = 50) -> float:
  """Median time of `fn` over `steps` calls after `warmup` (the first compiles), and more
  calls, up to `max_steps`, until `min_seconds` are timed: cheap steps get more samples."""
  for _ in range(warmup):
    fn()
  times = []
  while len(times) < steps or (sum(times) < min_seconds and len(times) < max_steps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def single_model_step(cfg, batch: int, seq: int, mesh, rng):
  """One model's jitted xlt training step (compare.py's optimizer, the state donated), its
  initial state and a random batch of `batch` x `seq` tokens, as the xlt worker times a
  training job; for the benchmarks that look inside one step (attention.py, profile_step.py).
  The step is traced at its first call."""
  import jax
  import ml_collections
  import numpy as np

  from xlt import sharding, train as train_lib

  tx = train_lib.make_optimizer(ml_collections.ConfigDict(OPT))
  abstract = jax.eval_shape(lambda: train_lib.init_state(cfg, tx, [0]))
  step, st_sh = train_lib.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract)[:2]
  with jax.set_mesh(mesh):
    state = jax.jit(lambda s: train_lib.init_state(cfg, tx, s), out_shardings=st_sh)(np.arange(1))
  tokens = {"tokens": rng.integers(0, cfg.vocab_size, (1, batch, seq + 1)).astype(np.int32),
            "loss_mask": np.ones((1, batch, seq), np.float32)}
  return step, state, tokens


def allocator() -> str:
  """The malloc this process runs on, from its memory map."""
  with open("/proc/self/maps") as f:
    maps = f.read()
  for name in ("tcmalloc", "jemalloc", "mimalloc"):
    if f"lib{name}" in maps:
      return name + (" (LD_PRELOAD)" if name in os.environ.get("LD_PRELOAD", "") else "")
  return "glibc malloc"


def decode_result(full_s: float, prefill_s: float, batch: int, new: int) -> dict:
  return {"prefill_ms": prefill_s * 1e3, "ms_per_token": (full_s - prefill_s) / (new - 1) * 1e3,
          "new_tokens_per_s": batch * new / full_s}


# --- xlt worker ---

def xlt_worker(jobs, timing):
  import jax
  import ml_collections
  import numpy as np

  from xlt import ensemble, ensemble_decode, sharding
  from xlt import model as model_lib
  from xlt import train as train_lib

  tx = train_lib.make_optimizer(ml_collections.ConfigDict(OPT))
  # every device, as `python -m xlt.main`'s default mesh (on CPU: one per core, xlt.cpu_devices)
  mesh = sharding.make_mesh({"data": -1})
  rng = np.random.default_rng(0)

  compiled = {}  # (cfg, ensemble) -> (step, state shardings): the ensemble job reuses graph_29's

  def step_and_states(cfg, ensemble, copies=1, strategy="auto", accum=1):
    """xlt's jitted step for `ensemble` members, and `copies` independent states for it."""
    if (cfg, ensemble, strategy, accum) not in compiled:
      abstract = jax.eval_shape(lambda: train_lib.init_state(cfg, tx, list(range(ensemble))))
      compiled[cfg, ensemble, strategy, accum] = train_lib.make_step(
          cfg, tx, mesh, sharding.DEFAULT_RULES, abstract, accum=accum, strategy=strategy)[:2]
    step, st_sh = compiled[cfg, ensemble, strategy, accum]
    with jax.set_mesh(mesh):
      init = jax.jit(lambda s: train_lib.init_state(cfg, tx, s), out_shardings=st_sh)
      states = [init(np.arange(ensemble) + ensemble * k) for k in range(copies)]
    return step, states

  def timed(step, states, batch):
    """Median seconds for one step of each state, one after the other."""
    def run():
      for i, s in enumerate(states):
        states[i], m = step(s, batch)
      jax.block_until_ready((states, m))
    with jax.set_mesh(mesh):
      return median_seconds(run, timing["warmup"], timing["steps"], timing["min_seconds"])

  def batch_for(cfg, ensemble, b, t):
    return {"tokens": rng.integers(0, cfg.vocab_size, (ensemble, b, t + 1)).astype(np.int32),
            "loss_mask": np.ones((ensemble, b, t), np.float32)}

  out = {}
  for job in jobs:
    t0 = time.perf_counter()
    cfg = model_lib.Config(**job["model"])
    b, t = job.get("batch"), job.get("seq")
    if job["kind"] == "train":
      step, states = step_and_states(cfg, 1, accum=job.get("accum", 1))
      dt = timed(step, states, batch_for(cfg, 1, b, t))
      out[job["name"]] = {"tokens_per_s": b * t / dt, "step_ms": dt * 1e3}
    elif job["kind"] == "ensemble":
      e = job["members"]
      step, states = step_and_states(cfg, e)
      together = timed(step, states, batch_for(cfg, e, b, t))
      step, states = step_and_states(cfg, e, strategy="vmap")
      vmapped = timed(step, states, batch_for(cfg, e, b, t))
      step, states = step_and_states(cfg, 1, copies=e)
      separate = timed(step, states, batch_for(cfg, 1, b, t))
      out[job["name"]] = {"together": e * b * t / together, "vmap": e * b * t / vmapped,
                          "separate": e * b * t / separate,
                          "strategy": ensemble.resolve()}
    elif job["kind"] == "decode":
      params = jax.tree.map(lambda x: x[None], model_lib.init_params(cfg, jax.random.key(0)))
      params = jax.device_put(params, sharding.replicated(mesh))  # as the trained state lives
      prompts = rng.integers(0, cfg.vocab_size, (1, job["batch"], job["prompt"])).astype(np.int32)
      lens = np.full((1, job["batch"]), job["prompt"], np.int32)

      def decode(new):  # as evaluation decodes: rows spread over the devices, tokens to the host
        return lambda: ensemble_decode.decode_batch(cfg, params, prompts, lens, max_new=new, min_prompt=job["prompt"])

      full = median_seconds(decode(job["new"]), 1, timing["decode_steps"])
      prefill = median_seconds(decode(1), 1, timing["decode_steps"])
      out[job["name"]] = decode_result(full, prefill, job["batch"], job["new"])
    print(f"  xlt {job['name']} ({time.perf_counter() - t0:.0f} s): {out[job['name']]}", file=sys.stderr,
          flush=True)
  return out


# --- PyTorch worker ---

def torch_worker(jobs, timing):
  import torch

  from benchmarks import torch_gpt

  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  # XLA computes float32 matmuls on NVIDIA GPUs as TF32 by default; let torch do the same
  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

  def sync():
    if dev.type == "cuda":
      torch.cuda.synchronize()

  def model_and_opt(job):
    net = torch_gpt.GPT(torch_gpt.Config(**job["model"])).to(dev)
    return net, torch_gpt.make_optimizer(net)

  def data(job):
    v = job["model"]["vocab_size"]
    return (torch.randint(0, v, (job["batch"], job["seq"] + 1), device=dev),
            torch.ones(job["batch"], job["seq"], device=dev))

  def autocast(job):  # bfloat16 as xlt's: float32 weights, bfloat16 compute
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=job["model"].get("dtype") == "bfloat16")

  out = {}
  for job in jobs:
    t0 = time.perf_counter()
    b, t = job.get("batch"), job.get("seq")
    if job["kind"] in ("train", "ensemble"):
      members = [model_and_opt(job) for _ in range(job.get("members", 1))]
      tokens, mask = data(job)

      def run():
        with autocast(job):
          for net, opt in members:
            torch_gpt.train_step(net, opt, tokens, mask, accum=job.get("accum", 1))
        sync()

      dt = median_seconds(run, timing["warmup"], timing["steps"], timing["min_seconds"])
      tps = len(members) * b * t / dt
      out[job["name"]] = ({"separate": tps} if job["kind"] == "ensemble" else
                          {"tokens_per_s": tps, "step_ms": dt * 1e3})
    elif job["kind"] == "decode":
      net = torch_gpt.GPT(torch_gpt.Config(**job["model"])).to(dev).eval()
      prompts = torch.randint(0, job["model"]["vocab_size"], (job["batch"], job["prompt"]), device=dev)
      lens = torch.full((job["batch"],), job["prompt"], device=dev)

      def decode(new):
        return lambda: (torch_gpt.greedy_decode(net, prompts, lens, max_new=new, min_prompt=job["prompt"]), sync())

      full = median_seconds(decode(job["new"]), 1, timing["decode_steps"])
      prefill = median_seconds(decode(1), 1, timing["decode_steps"])
      out[job["name"]] = decode_result(full, prefill, job["batch"], job["new"])
    print(f"  torch {job['name']} ({time.perf_counter() - t0:.0f} s): {out[job['name']]}", file=sys.stderr,
          flush=True)
  return out


def worker_main(a):
  with open(a.plan) as f:
    p = json.load(f)
  if a.worker in ("xlt", ONE_DEVICE):
    import jax
    import jaxlib
    import flax
    import optax

    versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
                "optax": optax.__version__}
    threads = f"XLA default ({os.cpu_count()} cores)"
    n = len(jax.devices())
    device = jax.devices()[0].device_kind + (f" × {n} (batch split over them)" if n > 1 else "")
    results = xlt_worker(p["jobs"], p["timing"])
  else:
    import torch

    versions = {"torch": torch.__version__}
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    results = torch_worker(p["jobs"], p["timing"])
    threads = f"torch.set_num_threads({torch.get_num_threads()})"
  with open(a.out, "w") as f:
    json.dump({"results": results, "versions": versions, "allocator": allocator(), "threads": threads,
               "device": device}, f)


# --- the parent: rounds, table, JSON ---

def _busy_seconds() -> float:
  """CPU seconds every process on the machine has used (all cores, /proc/stat), or 0."""
  try:
    with open("/proc/stat") as f:
      user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
  except (OSError, ValueError):
    return 0.0
  return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_worker(impl: str, plan_path: str, tmp: str, round_: int) -> dict:
  """Runs one worker; also measures how many cores *other* processes kept busy meanwhile
  (all CPU time on the machine minus the worker's own), since a shared machine skews the
  comparison: PyTorch's OpenMP threads, spinning at barriers, slow down far more than
  XLA's thread pool when the cores are oversubscribed."""
  out = os.path.join(tmp, f"{impl}_{round_}.json")
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--plan", plan_path, "--out", out]
  env = dict(os.environ, **({"XLT_CPU_DEVICES": "1"} if impl == ONE_DEVICE else {}))
  t0, busy0, own0 = time.perf_counter(), _busy_seconds(), sum(os.times()[2:4])
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
  wall = time.perf_counter() - t0
  if proc.returncode:
    sys.exit(f"the {impl} worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  other = max(0.0, _busy_seconds() - busy0 - (sum(os.times()[2:4]) - own0)) / wall
  print("".join(ln for ln in proc.stderr.splitlines(True) if ln.startswith(f"  {impl} ")), end="", file=sys.stderr)
  print(f"round {round_ + 1} {impl}: {wall:.0f} s, other processes {other:.2f} cores", file=sys.stderr,
        flush=True)
  with open(out) as f:
    return {**json.load(f), "wall_s": wall, "other_cores": other}


def machine(cpuinfo: str = "/proc/cpuinfo") -> dict:
  """The CPU's model name, cores and widest vector ISA: machines of one model name (cloud
  VMs) differ in the last, and XLA's kernels and PyTorch's gain differently from it."""
  model, flags = "unknown CPU", set()
  try:
    with open(cpuinfo) as f:
      lines = f.read().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), model)
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
  except OSError:
    pass
  isa = next((name for name in ("avx512f", "avx2", "avx", "sse4_2") if name in flags), "unknown")
  return {"cpu": model, "cores": os.cpu_count(), "isa": isa}


def version(pkg: str) -> str:
  try:
    return importlib.metadata.version(pkg)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def main(a):
  t_start = time.perf_counter()
  impls = ["xlt"] + (["torch"] if version("torch") != "not installed" else []) + ([ONE_DEVICE] if a.one_device else [])
  if len(impls) == 1:
    print("PyTorch is not installed (pip install -e '.[bench]'): measuring xlt only.", file=sys.stderr)
  timing = (dict(steps=1, min_seconds=1.0, warmup=2, decode_steps=1) if a.quick else
            dict(steps=a.steps, min_seconds=0.0, warmup=3, decode_steps=3))
  rounds = a.rounds or (1 if a.quick else 2)
  report = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": machine(),
            "timing": timing, "jobs": plan(a.reference), "rounds": [], "peak_tflops": a.peak_tflops}
  if a.only:
    names = a.only.split(",")
    unknown = set(names) - {j["name"] for j in report["jobs"]}
    if unknown:
      sys.exit(f"unknown --only {sorted(unknown)}; jobs: {', '.join(j['name'] for j in report['jobs'])}")
    report["jobs"] = [j for j in report["jobs"] if j["name"] in names]
  with tempfile.TemporaryDirectory() as tmp:
    plan_path = os.path.join(tmp, "plan.json")
    with open(plan_path, "w") as f:
      json.dump({k: report[k] for k in ("jobs", "timing")}, f)
    for r in range(rounds):
      order = impls if r % 2 == 0 else impls[::-1]
      report["rounds"].append({impl: run_worker(impl, plan_path, tmp, r) for impl in order})
  print(table(report))
  if a.results:
    first = report["rounds"][0]
    results_file.write(
        a.results, benchmark=os.path.splitext(os.path.basename(a.results))[0],
        title="xlt's GPT against the same model in PyTorch eager, tokens/s", columns=SCHEMA_COLUMNS,
        rows=schema_rows(report), wall_s=time.perf_counter() - t_start,
        versions={k: v for i in first.values() for k, v in i["versions"].items()},
        notes=(f"{len(report['rounds'])} rounds; xlt on {first['xlt'].get('device', 'cpu')}, allocator "
               f"{first['xlt']['allocator']}; one AdamW step per shape. " + a.notes).strip(), details=report)
  if a.json:
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="1 round, 2 warm-up steps, ~1 s timed per shape: a smoke test")
  p.add_argument("--rounds", type=int, default=0, help="rounds per implementation (default 2, --quick 1)")
  p.add_argument("--steps", type=int, default=10, help="timed training steps per shape and round")
  p.add_argument("--only", default="", help="comma-separated job names, e.g. graph_29,decode")
  p.add_argument("--json", default="", help="also write every number to this file")
  p.add_argument("--results", default="", help="write the results file (docs/speed.md's schema) here")
  p.add_argument("--notes", default="", help="appended to the results file's notes (e.g. 'a busy machine')")
  p.add_argument("--reference", action="store_true",
                 help="also the reference-size addition and text configs (for an accelerator)")
  p.add_argument("--peak_tflops", type=float, default=0.0,
                 help="the device's peak TFLOP/s for MFU (default: known GPUs only)")
  p.add_argument("--one_device", action="store_true",
                 help="also run xlt on one CPU device (XLT_CPU_DEVICES=1), to show what the cores as devices add")
  p.add_argument("--worker", choices=("xlt", "torch", ONE_DEVICE), help=argparse.SUPPRESS)
  p.add_argument("--plan", help=argparse.SUPPRESS)
  p.add_argument("--out", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker in ("xlt", ONE_DEVICE):
    # as `python -m xlt.main` starts, before jax loads: the cores as devices, maybe re-exec
    # with a faster malloc (either module may be missing in an older checkout)
    for module, setup in (("cpu_devices", "configure"), ("allocator", "preload")):
      try:
        lib = __import__(f"xlt.{module}", fromlist=[module])
      except ImportError:
        continue
      getattr(lib, setup)()
  (worker_main if args.worker else main)(args)
