"""Fine-tuning a loaded Llama: one training step of xlt against PyTorch eager
(transformers' `LlamaForCausalLM`) on the same weights, full fine-tuning, LoRA and the static frozen-partition step, on the CPU.

  PY=../peervenv/bin/python   # a venv with torch, transformers, peft and xlt
  $PY benchmarks/finetune_step.py --shapes=tiny,small --out=results/benchmarks/finetune_step.json
  $PY benchmarks/finetune_step.py --shapes=medium --rounds=2 --out=results/benchmarks/finetune_step_medium.json
  $PY benchmarks/finetune_step.py --shapes=small --modes=full --xlt_mesh=data --out=runs/ft_data.json  # every device
  $PY benchmarks/finetune_step.py --quick --shapes=tiny --out=runs/ft.json      # smoke test
  $PY benchmarks/finetune_step.py --shapes=tiny --modes=lora,static --update=vmap --out=runs/ft_vmap.json

Runs where torch, transformers, peft and xlt are installed together, and cmeel-mimalloc (`python
-m xlt.main`'s malloc, xlt.allocator; without it xlt runs on glibc's, slower: the notes say which). Both tools start from the
same files: a seeded random float32 `LlamaForCausalLM` of each shape, written once by
transformers' `save_pretrained` under --workdir (kept when already there with the same config),
read by xlt through `xlt.pretrained.load` and by PyTorch through `from_pretrained`:

  tiny   hidden 256, 4 layers, 8 heads, 2 key/value heads, MLP 704, vocab 8000; batch 8 x 128
  small  hidden 512, 6 layers, 8 heads, 4 key/value heads, MLP 1408, vocab 32000; batch 4 x 256
  medium hidden 1024, 4 layers, 16 heads, 4 key/value heads, MLP 2816, vocab 16000; batch 2 x 256

The step: forward, masked next-token cross-entropy (every target counted), backward,
global-norm clipping at 1.0, AdamW (b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1 on matrices
only), all float32. Modes: `full` trains every parameter; `lora` trains rank-8 adapters on
every attention and MLP projection (q, k, v, o, gate, up, down), rsLoRA scale alpha / sqrt(r)
with alpha 16, the base frozen; `static` is the frozen-partition step (a partition recipe
with fixed flags): only the MLPs (gate, up, down) train, xlt through `xlt.train.static_freeze`
(no weight gradients and no optimizer state for the frozen leaves), PyTorch with
`requires_grad` off for every other parameter. xlt: `xlt.train.make_step(make_optimizer(...))` over the
fine-tuning kind's mesh (configs/finetune.py: on a CPU one device, XLA's threads spreading each
op over the cores; `--xlt_mesh=data` splits the batch over one device per core), a LoRA
model as the composite {"base", "lora"} of `xlt.lora.init`. PyTorch: eager (no torch.compile),
transformers' default attention (sdpa), `use_cache=False`, `torch.optim.AdamW(foreach=True)`,
`clip_grad_norm_(foreach=True)`, torch.set_num_threads(cores); LoRA through peft's
`get_peft_model` (LoraConfig r=8, lora_alpha=16, use_rslora=True, no dropout). Both take the
same random batch (numpy, seeded), so their first-step losses should agree (a check that the
weights loaded alike; the table shows both).

Measured as benchmarks/compare.py measures, in pairs: in each round every job runs in a fresh
subprocess per tool, the two tools back to back (which goes first alternates by round and job),
so a drift of the shared machine's speed hits both sides of a pair. A measurement is the median
step time after warm-up (the first step, xlt's compile, is timed apart); tokens/s = batch x seq
/ step time, the table's tokens/s the median over rounds and its xlt / PyTorch the median of the
rounds' paired ratios. Written as docs/speed.md's schema (benchmarks/results_file.py;
`python -m xlt.report` renders it). "other cores" is the most CPU that other processes used during any of the
job's measurements (compare.py's measure: PyTorch's OpenMP threads lose far more than XLA's pool
when the cores are oversubscribed). Prints a markdown table and writes every measurement as
JSON to --out. On a shared machine timings move by tens of percent between runs: compare the
two tools within one run.
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

# Nothing here may import jax or torch at module level: the xlt child must call
# xlt.cpu_devices.configure() and xlt.allocator.preload() before jax is imported.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import results_file  # noqa: E402
from benchmarks.compare import OPT, _busy_seconds, median_seconds, version  # noqa: E402
from benchmarks.hf_models import write_checkpoint  # noqa: E402

# LlamaConfig keyword arguments and the batch of each shape
SHAPES = {
    "tiny": dict(config=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                             intermediate_size=704, vocab_size=8000), batch=8, seq=128),
    "small": dict(config=dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                              intermediate_size=1408, vocab_size=32000), batch=4, seq=256),
    "medium": dict(config=dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                               intermediate_size=2816, vocab_size=16000), batch=2, seq=256),
}
MODES = ("full", "lora", "static")
LORA = dict(rank=8, alpha=16.0)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOOLS = ("xlt", "torch")
SEED = 0


# ---------------------------------------------------------------------------- the batch


def tokens(spec: dict):
  """The benchmark's batch of `spec`'s shape, [B, T + 1] int32: the same in both tools."""
  import numpy as np

  rng = np.random.default_rng(SEED)
  return rng.integers(0, spec["config"]["vocab_size"], (spec["batch"], spec["seq"] + 1)).astype(np.int32)


def _timed(run, timing: dict) -> dict:
  """The first call's seconds (xlt: the compile) and the median step after warm-up."""
  t0 = time.perf_counter()
  loss = run()
  first = time.perf_counter() - t0
  step = median_seconds(run, timing["warmup"], timing["steps"], timing["min_seconds"])
  return {"first_step_s": first, "step_s": step, "first_loss": loss}


# ---------------------------------------------------------------------------- children


def trained_in_static(path: str) -> bool:
  """The static step's partition: the MLPs train (xlt's mlp/*, transformers' mlp.*)."""
  return "mlp" in path


UPDATES = ("config", "auto", "map", "vmap")
TIMING = dict(warmup=1, steps=3, min_seconds=2.0)  # the defaults of --warmup, --steps, --min_seconds


def update_of(update: str) -> str:
  """--update's value: where xlt's optimizer update runs (xlt.train.ensemble_step); "config" is
  the fine-tuning kind's (configs/finetune.py's train.update)."""
  if update != "config":
    return update
  from configs import finetune

  return finetune.get_config().train["update"]  # not .update: ConfigDict.update is a method


def _xlt_state(cfg, tx, mesh, params, mode: str, update: str = "config"):
  """xlt's jitted step and its initial state for `params` (one model), fully, as LoRA, or
  with the static frozen partition; `update`: where the optimizer's update runs (`update_of`)."""
  import jax

  from xlt import composite, lora, param_paths, sharding, train

  if mode == "lora":
    params = {"base": params, "lora": lora.init(params, jax.random.key(SEED), **LORA)}
  if mode == "static":
    frozen = jax.tree_util.tree_map_with_path(lambda p, _: not trained_in_static(param_paths.path_str(p)), params)
    tx = train.static_freeze(tx, frozen)
  stacked = jax.tree.map(lambda x: x[None], params)
  abstract = jax.eval_shape(lambda p: train.init_state(cfg, tx, [SEED], p), stacked)
  step, st_sh, _ = train.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract, update=update_of(update))
  with jax.set_mesh(mesh):
    state = jax.jit(lambda p: train.init_state(cfg, tx, [SEED], p), out_shardings=st_sh)(stacked)
  trained = composite.split(params)[0]
  if mode == "static":
    return step, state, sum(x.size for x, f in zip(jax.tree.leaves(trained), jax.tree.leaves(tx.frozen)) if not f)
  return step, state, sum(x.size for x in jax.tree.leaves(trained))


# --xlt_mesh: how xlt spreads the step over a CPU's cores. config: configs/finetune.py's mesh
# (the fine-tuning kind's: one of xlt.cpu_devices' devices); data: every device (one per core,
# the batch split, parameters and the AdamW update replicated on each: xlt's default for its own
# models); fsdp: the same devices with the parameters and optimizer state sharded along `embed`
# (the update split); one: one device in the process (XLT_CPU_DEVICES=1).
XLT_MESHES = {"config": None, "data": {"data": -1}, "fsdp": {"fsdp": -1}, "one": {"data": -1}}


def mesh_spec(xlt_mesh: str) -> dict:
  if XLT_MESHES[xlt_mesh] is not None:
    return XLT_MESHES[xlt_mesh]
  from configs import finetune

  return finetune.get_config().mesh.to_dict()


def xlt_setup(workdir: str, job: str, xlt_mesh: str = "config", update: str = "config"):
  """(mesh, jitted step, initial state, trained parameter count, batch) of xlt's `job`
  ("small/full") on the checkpoint under `workdir` (benchmarks/profile_step.py traces it)."""
  import ml_collections
  import numpy as np

  from xlt import pretrained, sharding, train

  shape, mode = job.split("/")
  spec = SHAPES[shape]
  tx = train.make_optimizer(ml_collections.ConfigDict(OPT))
  mesh = sharding.make_mesh(mesh_spec(xlt_mesh))
  cfg, params = pretrained.load(os.path.join(workdir, shape))
  batch = {"tokens": tokens(spec)[None], "loss_mask": np.ones((1, spec["batch"], spec["seq"]), np.float32)}
  return (mesh, *_xlt_state(cfg, tx, mesh, params, mode, update), batch)


def xlt_child(workdir: str, timing: dict, job: str, xlt_mesh: str = "config", update: str = "config") -> dict:
  import jax

  from xlt import allocator

  mesh, step, state, trainable, batch = xlt_setup(workdir, job, xlt_mesh, update)
  holder = [state]  # the step donates its state: each call replaces it

  def run():
    with jax.set_mesh(mesh):
      holder[0], m = step(holder[0], batch)
    jax.block_until_ready(holder[0])
    return float(m["loss"][0])

  n = mesh.devices.size
  return {**_timed(run, timing), "trainable_params": int(trainable), "versions": {"jax": jax.__version__},
          "allocator": allocator.in_use(),
          "device": jax.devices()[0].device_kind + (f" x {n} (batch split over them)" if n > 1 else " x 1")
          + f" of {len(jax.devices())}"}


def _torch_model(path: str, mode: str):
  """transformers' LlamaForCausalLM from `path`, LoRA-wrapped by peft for `lora`, and its
  AdamW over the trainable parameters (decay on matrices only, as xlt's)."""
  import torch
  import transformers

  model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
  if mode == "lora":
    import peft

    model = peft.get_peft_model(model, peft.LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], use_rslora=True,
                                                       target_modules=list(TARGETS), lora_dropout=0.0, bias="none"))
  if mode == "static":
    for name, p in model.named_parameters():
      p.requires_grad_(trained_in_static(name))
  model.train()
  trained = [p for p in model.parameters() if p.requires_grad]
  groups = [{"params": [p for p in trained if p.ndim > 1], "weight_decay": OPT["weight_decay"]},
            {"params": [p for p in trained if p.ndim <= 1], "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=OPT["peak_lr"], betas=(OPT["b1"], OPT["b2"]), eps=1e-8, foreach=True)
  return model, opt, trained


def torch_child(workdir: str, timing: dict, job: str) -> dict:
  import torch
  import torch.nn.functional as F

  torch.set_num_threads(os.cpu_count())
  shape, mode = job.split("/")
  spec = SHAPES[shape]
  tok = torch.from_numpy(tokens(spec)).long()
  inputs, targets = tok[:, :-1], tok[:, 1:].flatten()
  mask = torch.ones(spec["batch"] * spec["seq"])
  model, opt, trained = _torch_model(os.path.join(workdir, shape), mode)

  def run():
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=inputs, use_cache=False).logits
    ce = F.cross_entropy(logits.flatten(0, 1), targets, reduction="none")
    loss = (ce * mask).sum() / mask.sum().clamp(min=1.0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trained, OPT["clip"], foreach=True)
    opt.step()
    return float(loss)

  return {**_timed(run, timing), "trainable_params": sum(p.numel() for p in trained),
          "attention": model.config._attn_implementation, "versions": {"torch": torch.__version__},
          "device": "cpu", "threads": torch.get_num_threads()}


def child_main(a) -> None:
  timing = json.loads(a.timing)
  result = (xlt_child(a.workdir, timing, a.job, a.xlt_mesh, a.update) if a.child == "xlt"
            else torch_child(a.workdir, timing, a.job))
  with open(a.child_out, "w") as f:
    json.dump(result, f)


# ---------------------------------------------------------------------------- the parent


def run_child(tool: str, job: str, a, timing: dict, tmp: str) -> dict:
  """One fresh subprocess of `tool` timing `job`: its result, wall time, and how many cores
  other processes kept busy meanwhile (the CPU is shared; compare.py's measure)."""
  out = os.path.join(tmp, "child.json")
  cmd = [sys.executable, os.path.abspath(__file__), "--child", tool, "--job", job, "--workdir", a.workdir,
         "--timing", json.dumps(timing), "--child_out", out]
  t0, busy0, own0 = time.perf_counter(), _busy_seconds(), sum(os.times()[2:4])
  cmd += ["--xlt_mesh", a.xlt_mesh, "--update", a.update]
  env = dict(os.environ, **({"XLT_CPU_DEVICES": "1"} if tool == "xlt" and a.xlt_mesh == "one" else {}))
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
  wall = time.perf_counter() - t0
  if proc.returncode:
    sys.exit(f"the {tool} child ({job}) failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  other = max(0.0, _busy_seconds() - busy0 - (sum(os.times()[2:4]) - own0)) / wall
  with open(out) as f:
    result = {**json.load(f), "wall_s": wall, "other_cores": other}
  print(f"  {tool} {job}: {result['step_s'] * 1e3:.0f} ms/step, first {result['first_step_s']:.1f} s, "
        f"other processes {other:.2f} cores", file=sys.stderr, flush=True)
  return result


def summary(report: dict) -> list[dict]:
  """Per job: each tool's tokens/s per round and median, the xlt / PyTorch ratio."""
  rows = []
  for job in report["jobs"]:
    spec = SHAPES[job.split("/")[0]]
    tokens_per_step = spec["batch"] * spec["seq"]
    row = {"job": job, "batch": spec["batch"], "seq": spec["seq"]}
    for tool in TOOLS:
      results = [r[job][tool] for r in report["rounds"]]
      row[tool] = {"rounds": [tokens_per_step / x["step_s"] for x in results],
                   "first_loss": results[0]["first_loss"], "first_step_s": results[0]["first_step_s"],
                   "trainable_params": results[0]["trainable_params"]}
      row[tool]["tokens_per_s"] = statistics.median(row[tool]["rounds"])
    row["ratio_rounds"] = [x / t for x, t in zip(row["xlt"]["rounds"], row["torch"]["rounds"])]
    row["ratio"] = statistics.median(row["ratio_rounds"])  # of the pairs measured back to back
    row["other_cores"] = max(r[job][tool]["other_cores"] for r in report["rounds"] for tool in TOOLS)
    rows.append(row)
  return rows


COLUMNS = ["shape", "mode", "trainable M", "xlt tok/s", "PyTorch tok/s", "xlt / PyTorch", "lowest round ratio",
           "highest round ratio", "first loss xlt", "first loss PyTorch", "xlt compile s", "other cores (max)"]


def table_rows(report: dict) -> list[list]:
  """The results file's rows (raw numbers, COLUMNS)."""
  out = []
  for row in report["summary"]:
    x, t = row["xlt"], row["torch"]
    shape, mode = row["job"].split("/")
    out.append([f"{shape} ({row['batch']} x {row['seq']})", mode, round(x["trainable_params"] / 1e6, 3),
                round(x["tokens_per_s"], 1), round(t["tokens_per_s"], 1), round(row["ratio"], 3),
                round(min(row["ratio_rounds"]), 3), round(max(row["ratio_rounds"]), 3), round(x["first_loss"], 4),
                round(t["first_loss"], 4), round(x["first_step_s"], 1), round(row["other_cores"], 2)])
  return out


def pick(value: str, allowed, what: str) -> list[str]:
  names = [v for v in value.split(",") if v]
  unknown = sorted(set(names) - set(allowed))
  if unknown or not names:
    sys.exit(f"unknown --{what} {unknown or value!r}; expected some of {', '.join(allowed)}")
  return names


def main(a) -> None:
  t_start = time.perf_counter()
  shapes, modes = pick(a.shapes, SHAPES, "shapes"), pick(a.modes, MODES, "modes")
  timing = (dict(warmup=1, steps=2, min_seconds=0.0) if a.quick else
            dict(warmup=a.warmup, steps=a.steps, min_seconds=a.min_seconds))
  for shape in shapes:
    write_checkpoint(os.path.join(a.workdir, shape), SHAPES[shape]["config"], SEED)
  jobs = [f"{shape}/{mode}" for shape in shapes for mode in modes]
  report = {"jobs": jobs, "timing": timing, "shapes": {k: SHAPES[k] for k in shapes}, "lora": LORA,
            "targets": TARGETS, "opt": OPT, "update": update_of(a.update), "rounds": []}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(1 if a.quick else a.rounds):
      report["rounds"].append({})
      for i, job in enumerate(jobs):  # the two tools back to back, alternating which goes first
        order = TOOLS if (r + i) % 2 == 0 else TOOLS[::-1]
        report["rounds"][-1][job] = {tool: run_child(tool, job, a, timing, tmp) for tool in order}
  report["summary"] = summary(report)
  rows = table_rows(report)
  print("| " + " | ".join(COLUMNS) + " |")
  for row in rows:
    print("| " + " | ".join(str(x) for x in row) + " |")
  if a.out:
    device = report["rounds"][0][jobs[0]]["xlt"]["device"]
    device += ", malloc " + report["rounds"][0][jobs[0]]["xlt"].get("allocator", "?")
    results_file.write(
        a.out, benchmark=os.path.splitext(os.path.basename(a.out))[0],
        title="Loaded Llama training step: xlt against PyTorch eager + transformers (+ peft), tokens/s",
        columns=COLUMNS, rows=rows, wall_s=time.perf_counter() - t_start,
        versions={p: version(p) for p in ("jax", "torch", "transformers", "peft")},
        notes=(f"{len(report['rounds'])} rounds; xlt on {device}, mesh {a.xlt_mesh}; optimizer update "
               f"{update_of(a.update)}; float32; full fine-tuning, LoRA rank 8 (rsLoRA, alpha 16) on q, k, v, o, "
               "gate, up, down, and static: the MLPs trained, the rest frozen. "
               + a.notes).strip(), details=report)


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", default=os.path.join(ROOT, "runs", "finetune"), help="where the checkpoints go")
  p.add_argument("--out", default="", help="the results file (docs/speed.md's schema, every measurement in it)")
  p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
  p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
  p.add_argument("--xlt_mesh", choices=XLT_MESHES, default="config",
                 help="xlt's devices: config (configs/finetune.py's mesh), data (every device, the batch split), "
                      "fsdp (parameters sharded), one (one CPU device in the process)")
  p.add_argument("--update", choices=UPDATES, default="config",
                 help="where xlt's optimizer update runs (xlt.train.ensemble_step): config (configs/finetune.py's "
                      "train.update), map (in the map with the gradients), vmap (vmapped over the stacked state) or "
                      "auto (vmap, except a gated optimizer's)")
  p.add_argument("--notes", default="", help="appended to the file's notes (e.g. 'taken on a busy machine')")
  p.add_argument("--rounds", type=int, default=3, help="fresh subprocesses per tool")
  p.add_argument("--warmup", type=int, default=TIMING["warmup"], help="untimed steps after the first")
  p.add_argument("--steps", type=int, default=TIMING["steps"], help="timed steps per job and round (at least)")
  p.add_argument("--min_seconds", type=float, default=TIMING["min_seconds"],
                 help="more steps (up to 50) until this much is timed")
  p.add_argument("--quick", action="store_true", help="1 round, 1 warm-up, 2 timed steps: a smoke test")
  p.add_argument("--child", choices=TOOLS, help=argparse.SUPPRESS)
  p.add_argument("--job", help=argparse.SUPPRESS)
  p.add_argument("--timing", help=argparse.SUPPRESS)
  p.add_argument("--child_out", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child == "xlt":  # as `python -m xlt.main` starts, before jax loads (may re-execute)
    from xlt import allocator, cpu_devices

    cpu_devices.configure()
    allocator.preload()
  (child_main if args.child else main)(args)
