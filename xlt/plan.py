"""A training run planned before the hardware is booked: the step `python -m xlt.main` would run
for a config, compiled for a target it need not run on, with its memory, FLOPs and collectives
(in the spirit of MaxText's train_compile).

  python -m xlt.plan --config=configs/finetune.py --config.base=path/to/Llama-3.1-8B \\
      --topology=v5e:4x4 --meshes=1x16x1,1x8x2 --remat=none,block [--output=plan.json]
  python -m xlt.plan --config=configs/finetune.py --config.base=... --cpu_devices=8

What is compiled is xlt's own: the kind's stages (xlt.experiments: for the finetune kind each
trained recipe, its partitions, LoRA and alternation as that kind builds them), each through
xlt.loop.step_builder (the optimizer, the shardings, the ensemble strategy, grad_accum), with
the parameters and the optimizer state as jax.ShapeDtypeStructs: nothing is allocated, and for
a pretrained base a Hugging Face config.json alone is enough (no weight is read). Stages that
compile to the same step (the task and the language expert) are planned once.

Targets: `--topology` is a TPU slice as libtpu names it (v5e:4x4, v5p:2x2x2, v6e:4x8, v4:2x2x2;
`pip install 'xlt[tpu]'`, no TPU needed), `--cpu_devices=N` N fake CPU devices (without it, the
host's), `--gpus=h200:8` N GPUs, which cannot be compiled for from here: xlt.memory's analytic
estimate and a compute-bound time, labelled so. For each stage, candidate mesh (data x fsdp x
tensor: `--meshes`, default the config's) and remat policy (`--remat`: none, block =
model.remat="block" keeping nothing,
block:dots keeping the dense layers' outputs; default the config's), it reports per device the
compiled executable's argument / output / temp / code bytes against the chip's memory, the cost
analysis' FLOPs and bytes, every collective of the optimized HLO, the roofline step time and MFU
ceiling of xlt.roofline (whose docstring states the convention), and xlt.memory's analytic
estimate beside the compiler's peak. The candidates that fit are ranked by predicted step
time; one that does not fit says so in one line and what to change. `--output` writes it all
as JSON (results/plans/*.json), which `--render` tabulates:

  python -m xlt.plan --render='results/plans/*.json' --doc=docs/scale.md

Exit status: 0 when some candidate of every stage fits, 1 when one does not, 2 for a bad
command line or config (one line on stderr, as every xlt command).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import importlib.util
import json
import os
import shlex
import sys
import time
import types

from xlt import cli, plan_report, report, roofline
from xlt.io import fileio

REMATS = plan_report.REMATS


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, str]]]:
  p = cli.Parser(prog="xlt.plan", description="compile xlt's training step for a target and report its cost")
  p.add_argument("--config", default="", help="an experiment config file (path[:argument])")
  p.add_argument("--topology", default="", help="a TPU slice as libtpu names it, e.g. v5e:4x4 (needs xlt[tpu])")
  p.add_argument("--cpu_devices", type=int, default=0, help="plan for this many CPU devices")
  p.add_argument("--gpus", default="", help="NAME:N, e.g. h200:8: N GPUs, planned analytically (xlt.memory)")
  p.add_argument("--meshes", default="", help="candidate meshes DATAxFSDPxTENSOR, comma-separated (-1: the rest)")
  p.add_argument("--remat", default="", help=f"candidate remat policies, comma-separated: {', '.join(REMATS)}")
  p.add_argument("--stages", default="", help="plan only these stages (comma-separated names)")
  p.add_argument("--device_memory_gb", type=float, default=0.0, help="the memory per device (default: the chip's)")
  p.add_argument("--output", default="", help="write the plan as JSON here (a new file, unless --overwrite)")
  p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
  p.add_argument("--render", default="", help="instead of planning: the tables of these plan files (a glob)")
  p.add_argument("--doc", default="", help="with --render: replace the tables of this markdown file")
  p.add_argument("--traceback", action="store_true", help="show the full traceback of a user error")
  args, rest = p.parse_known_args(argv)
  if not args.config and not args.render:
    raise cli.UserError("--config is required (or --render=<plan files> to tabulate earlier plans)")
  overrides = []
  for a in rest:
    name, eq, value = a.lstrip("-").partition("=")
    if not a.startswith("--config.") or not eq:
      raise cli.UserError(f"unrecognized argument {a!r} (overrides are --config.<field>=<value>)")
    overrides.append((name[len("config."):], value))
  if sum(map(bool, (args.topology, args.cpu_devices, args.gpus))) > 1:
    raise cli.UserError("--topology, --cpu_devices and --gpus are targets: give one")
  if args.output and os.path.exists(args.output) and not args.overwrite:
    raise cli.UserError(f"--output={args.output} exists: give --overwrite to replace it")
  return args, overrides


def load_config(spec: str, overrides: list[tuple[str, str]]):
  """The config of `spec` (path[:argument]) with `--config.a.b=value` overrides (Python literals,
  else strings), as xlt.main reads it; `configs/*.py` import their package, found beside them."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise cli.UserError(f"--config={spec}: no such config file")
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isfile(os.path.join(folder, "__init__.py")) and os.path.dirname(folder) not in sys.path:
    sys.path.insert(0, os.path.dirname(folder))
  module_spec = importlib.util.spec_from_file_location("xlt_plan_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  c = module.get_config(arg) if arg else module.get_config()
  for field, text in overrides:
    *parents, leaf = field.split(".")
    node = c
    for k in parents:
      node = node[k] if k in node else None
      if node is None:
        raise cli.UserError(f"--config.{field}: the config has no field {field!r}")
    if leaf not in node:
      raise cli.UserError(f"--config.{field}: the config has no field {field!r}")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    if isinstance(node[leaf], str) and not isinstance(value, str):
      value = text
    node[leaf] = value
  return c


def target(args) -> tuple[list, roofline.Chip | None, str]:
  """(the devices planned for, their chip or None, a label)."""
  import jax

  if args.topology:
    try:
      from jax.experimental import topologies
      topo = topologies.get_topology_desc(args.topology, "tpu")
    except Exception as e:  # noqa: BLE001  (no libtpu, or a name it does not know)
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise cli.UserError(f"--topology={args.topology}: libtpu gives no such TPU topology ({first[:160]}); TPU "
                          "targets need `pip install 'xlt[tpu]'`, names are like v5e:4x4 or v5p:2x2x2; "
                          "--cpu_devices=N plans for CPU devices without it") from e
    devices = list(topo.devices)
    return devices, roofline.chip_of(devices[0].device_kind), f"{args.topology} ({len(devices)} devices)"
  devices = jax.devices("cpu")
  if args.gpus:  # a mesh of as many CPU devices stands for them: xlt.memory sizes the shards
    name, _, n = args.gpus.partition(":")
    if name not in roofline.GPUS or not n.isdigit() or int(n) < 1:
      raise cli.UserError(f"--gpus={args.gpus}: expected NAME:N with NAME one of {', '.join(roofline.GPUS)}")
    if int(n) > len(devices):
      raise cli.UserError(f"--gpus={args.gpus} needs {n} CPU devices to stand for them, this process has "
                          f"{len(devices)} (run it as `python -m xlt.plan`, which makes them)")
    return devices[:int(n)], roofline.GPUS[name], f"{n}x {roofline.GPUS[name].name} (analytic)"
  if args.cpu_devices:
    if args.cpu_devices > len(devices):
      raise cli.UserError(f"--cpu_devices={args.cpu_devices} but this process has {len(devices)} CPU devices "
                          "(run it as `python -m xlt.plan`, which makes them, before jax starts)")
    devices = devices[:args.cpu_devices]
  return devices, None, f"cpu ({len(devices)} devices)"


def _mesh_specs(c, text: str) -> list[dict]:
  if not text:
    return [c.mesh.to_dict()]
  out = []
  for item in text.split(","):
    parts = item.strip().split("x")
    try:
      sizes = [int(s) for s in parts]
    except ValueError:
      sizes = []
    if len(sizes) != 3:
      raise cli.UserError(f"--meshes: {item!r} is not DATAxFSDPxTENSOR (e.g. 1x8x2)")
    out.append({**c.mesh.to_dict(), "data": sizes[0], "fsdp": sizes[1], "tensor": sizes[2]})
  return out


def _remats(text: str) -> list[str | None]:
  if not text:
    return [None]  # the config's own
  names = [r.strip() for r in text.split(",")]
  if bad := [r for r in names if r not in REMATS]:
    raise cli.UserError(f"--remat: {bad[0]!r} is not one of {', '.join(REMATS)}")
  return names


def finetune_prep(c):
  """The finetune kind's Prep (xlt.experiments.finetune) from the base's config.json alone: the
  base as shapes, each dataset a stand-in of its row shape; the recipes, partitions and cells
  as the kind plans them."""
  import jax
  import numpy as np

  from xlt import partition, pretrained
  from xlt.experiments import finetune

  file = c.base if os.path.isfile(c.base) else os.path.join(c.base, "config.json")
  if not os.path.isfile(file):
    raise cli.UserError(f"base {c.base!r}: no config.json (a Hugging Face model directory, or its config.json)")
  with open(file) as f:
    hf = json.load(f)
  cfg, shapes = pretrained.abstract_of_config(hf, dtype=c.get("param_dtype") or c.dtype or None)
  if c.dtype and c.dtype != cfg.dtype:
    cfg = dataclasses.replace(cfg, dtype=c.dtype)
  if remat := {k: c[k] for k in ("remat", "remat_policy") if c.get(k)}:
    cfg = dataclasses.replace(cfg, **remat)
  rows = jax.ShapeDtypeStruct((1, c.data.block_size + 1), np.int32)
  data = {d: types.SimpleNamespace(train={"tokens": rows}) for d in finetune.DATASETS}
  labels = finetune.label_trees(c, shapes)
  if labels:
    cell_tree, cells = partition.refine([labels[p] for p in finetune.partitions(c)])
  else:
    cell_tree, cells = jax.tree.map(lambda _: "all", shapes), ("all",)
  return finetune.Prep(cfg, shapes, None, data, finetune.plan(c), labels, cell_tree, cells, None)


def stages(c) -> list:
  """The stages (common.Stage) the kind trains, their init_params as shapes where the kind's
  are a pretrained base. The finetune kind is built from config.json alone; another kind
  prepares its data as `xlt.main` would (the synthetic tasks' are small) and each later
  stage is handed its predecessors' initial parameters in place of trained ones."""
  import tempfile

  from xlt import experiments
  from xlt.experiments import common

  c = experiments.with_kind(c)
  kind = experiments.kind(c)
  if c.kind == "finetune":
    if c.neurons.enabled:
      raise cli.UserError("neurons.enabled: the trained-neuron experts depend on a short run's weights; plan "
                          "without them (--config.neurons.enabled=False)")
    prep = finetune_prep(c)
  else:
    prep = kind.prepare(c, tempfile.mkdtemp(prefix="xlt_plan_"))
  out, trained = [], {}
  for stage in kind.stages(c, prep, trained):
    out.append(stage)
    trained[stage.name] = common.Trained(stage.init_params, {"stopped_at": []}, stage, 0.0)
  return c, out


def _step_key(stage, config, tx) -> tuple:
  """What makes two stages' compiled steps the same."""
  import jax

  frozen = getattr(tx, "frozen", None)
  shapes = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), stage.init_params)
  flags = [m.trainable is not None for m in stage.members]
  return (stage.model, len(stage.members), type(tx).__name__, str(jax.tree.leaves(frozen)) if frozen else "",
          str(shapes), str(flags), json.dumps(config.to_dict(), sort_keys=True, default=repr))


def unique_stages(c, only: str):
  """[(stage, its loop config, its optimizer, the names of the stages it stands for)]."""
  from xlt import train as train_lib

  c, found = stages(c)
  if only:
    names = [s.strip() for s in only.split(",")]
    if bad := [n for n in names if n not in [s.name for s in found]]:
      raise cli.UserError(f"--stages: no stage {bad[0]!r} (the config's: {', '.join(s.name for s in found)})")
    found = [s for s in found if s.name in names]
  out = {}
  for s in found:
    config = s.config if s.config is not None else c
    tx = s.tx or train_lib.make_optimizer(config.opt)
    key = _step_key(s, config, tx)
    out.setdefault(key, [s, config, tx, []])[3].append(s.name)
  return c, [tuple(v) for v in out.values()]


def provenance(argv: list[str]) -> dict:
  """What every xlt results file records of the run that made it (its wall time is added at
  the end): the command as given, so that it can be run again, the checkout's commit, the date
  (UTC) and the machine that compiled it (for a TPU topology, the host, not the chips)."""
  return {"command": "python -m xlt.plan " + shlex.join(argv), "commit": report.git_commit(),
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "machine": report.machine()}


def run(argv: list[str]):
  start = time.time()
  args, overrides = parse(argv)
  if args.render:
    return plan_report.render(args.render, args.doc)
  c = load_config(args.config, overrides)
  devices, chip, label = target(args)
  limit = chip.hbm_bytes if chip else None
  if args.device_memory_gb:
    limit = int(args.device_memory_gb * plan_report.GiB)
  specs, remats = _mesh_specs(c, args.meshes), _remats(args.remat)
  c, groups = unique_stages(c, args.stages)
  result = {**provenance(argv), "config": args.config, "overrides": dict(overrides), "target": label,
            "devices": len(devices), "chip": chip.name if chip else devices[0].device_kind, "limit": limit,
            "stages": []}
  for stage, config, tx, names in groups:
    cands = [plan_report.plan_candidate(c, stage, config, tx, devices, spec, r, chip, limit)
             for spec in specs for r in remats]
    result["stages"].append({"names": names, "members": len(stage.members), "candidates": plan_report.rank(cands)})
  result["wall_s"] = round(time.time() - start, 1)
  print(plan_report.text(result), flush=True)
  if args.output:
    fileio.write_text(args.output, json.dumps(result, indent=1, default=float))  # temp + rename
  if any(all(x.get("fits") is False or "error" in x for x in s["candidates"]) for s in result["stages"]):
    raise SystemExit(1)
  return result


def main(argv: list[str] | None = None) -> int:
  return cli.run_command("xlt.plan", run, argv)


def _prepare_cpu_devices(argv: list[str]):
  """--cpu_devices=N makes N host devices: set before jax is imported."""
  n = next((a.split("=", 1)[1] for a in argv if a.startswith("--cpu_devices=")), None)
  n = n or next((a.rpartition(":")[2] for a in argv if a.startswith("--gpus=")), None)
  if n and n.isdigit() and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
  if any(a.startswith("--topology") for a in argv):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a topology is described, not used: no TPU is looked for


if __name__ == "__main__":
  _prepare_cpu_devices(sys.argv[1:])
  sys.exit(main())

