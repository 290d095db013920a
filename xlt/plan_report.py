"""xlt.plan's compilation of each candidate and its report (xlt.plan's docstring says what and
why; xlt.roofline the convention of its times): `plan_candidate` compiles one stage on one mesh
with one remat policy, `text` prints a plan, `markdown` / `render` the tables of docs/scale.md."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import time

from xlt import cli, roofline
from xlt.io import fileio

GiB = 1 << 30
# --remat's names: model.Config's (remat, remat_policy)
REMATS = {"none": ("none", "nothing"), "block": ("block", "nothing"), "block:dots": ("block", "dots")}


def _matmul_params(params, trained_mask=None) -> int:
  """Parameters in matmul weights (leaves of 2+ dims) of one model, less the input embedding
  (a gather) unless the head reads it (tied); only `trained_mask`'s True leaves when given."""
  import jax

  from xlt.param_paths import path_names

  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  masks = jax.tree.leaves(trained_mask) if trained_mask is not None else [True] * len(leaves)
  tied = not any("lm_head" in path_names(p) for p, _ in leaves)
  n = 0
  for (p, x), m in zip(leaves, masks):
    names = path_names(p)
    if m and len(x.shape) >= 2 and "wpe" not in names and ("wte" not in names or tied):
      n += math.prod(x.shape)
  return n


def _one_model(stage):
  """One member's parameters as shapes: its init_params' first, or a fresh model's (a stage
  trained from scratch has none)."""
  import jax

  from xlt import model as model_lib

  if stage.init_params is None:
    return jax.eval_shape(lambda: model_lib.init_params(stage.model, jax.random.key(0)))
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), stage.init_params)


def _flops_counts(stage, tx) -> tuple[int, int]:
  """(matmul parameters of one model, those it trains): a LoRA composite trains its adapters,
  a static freeze its unfrozen leaves, anything else (a gated optimizer: its phases' union) all."""
  import jax

  from xlt import composite

  one = _one_model(stage)
  base = composite.base(one)
  trained = composite.split(one)[0]
  frozen = getattr(tx, "frozen", None)
  mask = None if frozen is None else jax.tree.map(lambda f: not f, frozen)
  if composite.is_composite(one):  # adapters: every one of their leaves is a matmul's
    return _matmul_params(base), sum(math.prod(x.shape) for x in jax.tree.leaves(trained))
  return _matmul_params(base), _matmul_params(trained, mask)


def _analytic(cfg, stage, tx, mesh, config, seq, platform) -> dict:
  """xlt.memory's estimate of one member, times the members (their state; vmapped, their
  activations too)."""
  import jax

  from xlt import memory, sharding

  one = _one_model(stage)
  frozen = getattr(tx, "frozen", None)
  inner = getattr(tx, "inner", tx)
  trainable = None if frozen is None else jax.tree.map(lambda f: not f, frozen)
  rules = tuple(tuple(r) for r in config.get("sharding_rules", sharding.DEFAULT_RULES))
  est = memory.estimate(cfg, one, inner, mesh, batch=config.train.batch_size, seq=seq, trainable=trainable,
                        remat=cfg.remat == "block", grad_accum=int(config.train.get("grad_accum", 1)),
                        platform=platform, rules=rules)
  e = len(stage.members)
  return {p: est[p] * e for p in (*memory.PARTS, "total")}


def _analytic_plan(cfg, stage, config, tx, mesh, chip, limit) -> dict:
  """A GPU candidate, not compiled: xlt.memory's estimate against the memory, and the time the
  model FLOPs take at the chip's peak (a lower bound; MFU then 100% by definition: none given)."""
  seq = stage.members[0].phases[0]["tokens"].shape[1] - 1
  est = _analytic(cfg, stage, tx, mesh, config, seq, "gpu")
  n, n_trained = _flops_counts(stage, tx)
  flops = roofline.model_flops(cfg, n, n_trained, len(stage.members) * config.train.batch_size * seq, seq)
  out = {"analytic_only": True, "analytic": est, "model_flops": flops, "fits": est["total"] <= limit,
         "roofline": {"step_s": flops / mesh.size / chip.bf16_flops, "bound": "flops"}}
  if not out["fits"]:
    out["advice"] = (f"{stage.name} on mesh {_mesh_text(dict(mesh.shape))}: does not fit (analytic): "
                     f"{est['total'] / GiB:.2f} GiB per device of {limit / GiB:.2f}: try "
                     f"{_remedy(cfg.remat, est['activations'] > est['params'] + est['opt_state'])}")
  return out


def _mesh_text(m: dict) -> str:
  return f"{m['data']}x{m['fsdp']}x{m['tensor']}"


def _exhausted(error: Exception) -> str:
  """The TPU compiler's own words for a step over the chip's memory, in one line."""
  line = next((x for x in str(error).splitlines() if "RESOURCE_EXHAUSTED" in x), str(error).splitlines()[0])
  return line.split("RESOURCE_EXHAUSTED:", 1)[-1].strip().rstrip(".")


def _remedy(remat: str, temp_bound: bool) -> str:
  """What shrinks the larger part: the temporaries (activations, gathered weights) or the state."""
  if temp_bound:
    return (("--remat=block (model.remat), " if remat == "none" else "") +
            "a larger train.grad_accum, a smaller train.batch_size, or more devices")
  return ("more fsdp devices (a larger slice, or a mesh 1xNx1), LoRA, or bfloat16 parameters and optimizer state "
          "(param_dtype, opt.state_dtype)")


def _advice(peak: int, limit: int, mem, remat: str, stage_name: str, spec: dict) -> str:
  """The one line of a candidate that does not fit, naming what to change."""
  args, temp = mem["argument"], mem["temp"]
  return (f"{stage_name} on mesh {_mesh_text(spec)} remat={remat}: does not fit: {peak / GiB:.2f} GiB per device of "
          f"{limit / GiB:.2f} (arguments {args / GiB:.2f}, temp {temp / GiB:.2f}): try "
          f"{_remedy(remat, temp >= args)}")


def _compile(cfg, stage, config, tx, mesh):
  """(compiled step, abstract state, its shardings, the abstract batch): xlt.loop's own step."""
  import jax
  import numpy as np

  from xlt import loop as loop_lib

  accum = int(config.train.get("grad_accum", 1))
  seeds = [m.seed for m in stage.members]
  step, st_sh, b_sh = loop_lib.step_builder(config, cfg, stage.members, tx, mesh, accum,
                                            stage.init_params)(len(seeds))
  abstract = loop_lib.abstract_state(cfg, tx, seeds, stage.init_params)
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, st_sh)
  e, b = len(seeds), config.train.batch_size
  t = stage.members[0].phases[0]["tokens"].shape[1]
  batch = {"tokens": jax.ShapeDtypeStruct((e, b, t), np.int32, sharding=b_sh["tokens"]),
           "loss_mask": jax.ShapeDtypeStruct((e, b, t - 1), np.float32, sharding=b_sh["loss_mask"])}
  if "trainable" in b_sh:
    cells = len(stage.members[0].trainable[0])
    batch["trainable"] = jax.ShapeDtypeStruct((e, cells), np.bool_, sharding=b_sh["trainable"])
  with jax.set_mesh(mesh):
    compiled = step.lower(state, batch).compile()
  return compiled, abstract, st_sh, batch


def plan_candidate(c, stage, config, tx, devices, spec: dict, remat: str | None, chip, limit: int | None) -> dict:
  """One stage compiled on one mesh with one remat policy: the module doc's figures."""
  from xlt import memory, sharding

  cfg = stage.model if remat is None else dataclasses.replace(
      stage.model, remat=REMATS[remat][0], remat_policy=REMATS[remat][1])
  remat = remat or next(k for k, v in REMATS.items() if v == (cfg.remat, cfg.remat_policy))
  spec = {k: v for k, v in spec.items() if k not in ("devices", "cpu_devices")}  # the target's devices
  out = {"mesh": {k: int(spec.get(k, 1)) for k in ("data", "fsdp", "tensor")}, "remat": remat}
  try:
    mesh = sharding.make_mesh(spec, devices)
    out["mesh"] = dict(mesh.shape)
    sharding.check_batch(config.train.batch_size, mesh)
    if chip in roofline.GPUS.values():
      return {**out, **_analytic_plan(cfg, stage, config, tx, mesh, chip, limit)}
    t0 = time.time()
    compiled, abstract, st_sh, batch = _compile(cfg, stage, config, tx, mesh)
  except ValueError as e:  # a mesh the devices, the batch or a parameter does not divide
    return {**out, "error": str(e).splitlines()[0]}
  except Exception as e:  # noqa: BLE001  (a TPU compiler refuses a step over the chip's HBM)
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return {**out, "fits": False, "compile_s": round(time.time() - t0, 1), "error": _exhausted(e),
            "advice": f"{stage.name} on mesh {_mesh_text(out['mesh'])} remat={remat}: does not fit: {_exhausted(e)}: "
                      f"try {_remedy(remat, temp_bound=True)}"}
  ma = compiled.memory_analysis()
  mem = {"argument": ma.argument_size_in_bytes, "output": ma.output_size_in_bytes, "alias": ma.alias_size_in_bytes,
         "temp": ma.temp_size_in_bytes, "code": ma.generated_code_size_in_bytes}
  # live at once: the arguments, the outputs not aliased to them (the donated state is) and the
  # temporaries; XLA's own peak_memory_in_bytes is kept beside it (on XLA:CPU it counts no temp)
  mem["peak"] = mem["argument"] + mem["output"] - mem["alias"] + mem["temp"]
  mem["xla_peak"] = getattr(ma, "peak_memory_in_bytes", 0)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  hlo = compiled.as_text()
  found = roofline.collectives(hlo, mesh.size)
  seq = batch["loss_mask"].shape[-1]
  out.update(compile_s=round(time.time() - t0, 1), memory=mem,
             state_bytes=memory.tree_bytes(abstract, st_sh), batch_bytes=memory.tree_bytes(batch, {
                 k: v.sharding for k, v in batch.items()}),
             flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
             collectives=roofline.summarize(found), sent=sum(x["sent"] for x in found),
             while_loops=roofline.while_loops(hlo))
  platform = devices[0].platform
  out["analytic"] = _analytic(cfg, stage, tx, mesh, config, seq, platform)
  out["ratio"] = mem["peak"] / out["analytic"]["total"] if out["analytic"]["total"] else None
  n, n_trained = _flops_counts(stage, tx)
  tokens = len(stage.members) * config.train.batch_size * seq
  out["model_flops"] = roofline.model_flops(cfg, n, n_trained, tokens, seq)
  if chip is not None:
    out["roofline"] = roofline.step_time(chip, out["flops"], out["bytes_accessed"], out["sent"],
                                         out["model_flops"] / mesh.size)
    out["mfu"] = out["model_flops"] / (mesh.size * chip.bf16_flops * out["roofline"]["step_s"])
  need = mem["peak"] + mem["code"]
  out["fits"] = None if limit is None else need <= limit
  if out["fits"] is False:
    out["advice"] = _advice(need, limit, mem, remat, stage.name, out["mesh"])
  return out


def _bound(t: dict) -> str:
  """A step time's bound, saying where its FLOPs are the model's count (above the compiled)."""
  return "flops, model's count" if t["bound"] == "flops" and t.get("flops_from") == "model" else t["bound"]


def _gib(n) -> str:
  return f"{n / GiB:.2f}"


def _size(n) -> str:
  """Bytes in GiB, or MiB / KiB when small (the text's columns)."""
  for unit, scale in (("G", GiB), ("M", 1 << 20), ("K", 1 << 10)):
    if abs(n) >= scale:
      return f"{n / scale:.2f}{unit}"
  return f"{int(n)}B"


def _row(x: dict) -> str:
  m = x["mesh"]
  mesh = f"{m['data']}x{m['fsdp']}x{m['tensor']}"
  if "error" in x:
    return f"  {mesh:>9} {x['remat']:>10} {'NO' if x.get('fits') is False else '':>4}  {x['error'][:150]}"
  if x.get("analytic_only"):
    return (f"  {mesh:>9} {x['remat']:>10} {'yes' if x['fits'] else 'NO':>4}  analytic: xlt.memory "
            f"{_size(x['analytic']['total'])} per device, at least {x['roofline']['step_s'] * 1e3:.1f} ms (model FLOPs "
            "at peak); not compiled")
  mem, fits = x["memory"], {True: "yes", False: "NO", None: "-"}[x["fits"]]
  time_s = f"{x['roofline']['step_s'] * 1e3:9.1f} {x['roofline']['bound']:>5}" if "roofline" in x else f"{'-':>15}"
  mfu = f"{x['mfu'] * 100:5.1f}%" if "mfu" in x else f"{'-':>6}"
  return (f"  {mesh:>9} {x['remat']:>10} {fits:>4} {_size(mem['peak']):>8} {_size(mem['argument']):>8} "
          f"{_size(mem['temp']):>8} {x['flops'] / 1e12:9.3f} {x['sent'] / 2**20:10.1f} {time_s} {mfu} "
          f"{_size(x['analytic']['total']):>8} {x['ratio']:6.2f}")


HEADER = (f"  {'mesh DxFxT':>9} {'remat':>10} {'fits':>4} {'peak':>8} {'args':>8} {'temp':>8} {'TFLOP':>9} "
          f"{'coll. MiB':>10} {'step ms':>9} {'bound':>5} {'MFU':>6} {'xlt.mem':>8} {'ratio':>6}")


def rank(candidates: list[dict]) -> list[dict]:
  """Fitting candidates first, by predicted step time (else by peak memory), then the rest."""
  def key(x):
    if "error" in x:
      return (3, 0)
    t = x["roofline"]["step_s"] if "roofline" in x else x.get("memory", x["analytic"])["peak" if "memory" in x
                                                                                         else "total"]
    return (0 if x["fits"] is not False else 1, t)  # (a refused compile: error and fits False, last)
  return sorted(candidates, key=key)


def text(result: dict) -> str:
  """The plan as the command prints it."""
  lines = [f"xlt.plan: {result['config']} on {result['target']}"
           + (f", {result['chip']} ({_gib(result['limit'])} GiB per device)" if result.get("limit") else ""),
           "  per device; peak = the compiled step's live bytes (arguments + outputs - aliased + temp); "
           "step ms = roofline max(FLOPs, HBM, ICI) (xlt.roofline); xlt.mem = xlt.memory's estimate, ratio = "
           "peak / it"]
  for s in result["stages"]:
    lines += ["", f"stage {', '.join(s['names'])} ({s['members']} model(s) in one step)", HEADER]
    lines += [_row(x) for x in s["candidates"]]
    best = next((x for x in s["candidates"] if "error" not in x and "collectives" in x), None)
    if best:
      coll = ", ".join(f"{op} x{v['count']} {v['bytes'] / 2**20:.1f} MiB" for op, v in best["collectives"].items())
      lines.append(f"  collectives of the first: {coll or 'none'}")
    lines += [f"  {x['advice']}" for x in s["candidates"] if x.get("advice")]
  return "\n".join(lines)


BEGIN, END = "<!-- xlt.plan tables: begin -->", "<!-- xlt.plan tables: end -->"


def render(pattern: str, doc: str) -> str:
  """The tables of the plan files `pattern` (a glob), printed, or written into `doc` between
  its BEGIN and END lines."""
  tables = markdown([pattern])
  if not doc:
    print(tables, end="")
    return tables
  with open(doc) as f:
    old = f.read()
  if BEGIN not in old or END not in old:
    raise cli.UserError(f"--doc={doc}: no {BEGIN} ... {END} lines to put the tables between")
  head, rest = old.split(BEGIN, 1)
  fileio.write_text(doc, f"{head}{BEGIN}\n{tables}{END}{rest.split(END, 1)[1]}")  # temp + rename: never half a doc
  return tables


def markdown(paths: list[str]) -> str:
  """The tables of docs/scale.md from plan files: recipe x target -> fits, memory, time, MFU."""
  files = sorted(p for pattern in paths for p in glob.glob(pattern))
  if not files:
    raise cli.UserError(f"no plan files match {paths}")
  lines = ["| config | stage | target | mesh | remat | fits | peak GiB / HBM | step ms | MFU | collectives MiB sent "
           "| xlt.memory GiB | ratio |", "|" + "---|" * 12]
  plans = []
  for path in files:
    with open(path) as f:
      plans.append((os.path.basename(path), json.load(f)))
  for _, r in plans:
    for s in r["stages"]:
      for x in s["candidates"]:
        m = x["mesh"]
        if x.get("analytic_only"):
          lines.append(f"| {r['config'].split('/')[-1]} | {', '.join(s['names'])} | {r['target']} | "
                       f"{_mesh_text(m)} | {x['remat']} | {'yes' if x['fits'] else '**no**'} (analytic) | "
                       f"- / {_gib(r['limit'])} | >= {x['roofline']['step_s'] * 1e3:.0f} | - | - | "
                       f"{_gib(x['analytic']['total'])} | - |")
          continue
        if "error" in x:
          lines.append(f"| {r['config'].split('/')[-1]} | {', '.join(s['names'])} | {r['target']} | "
                       f"{_mesh_text(m)} | {x['remat']} | {'**no**' if x.get('fits') is False else 'error'}: "
                       f"{x['error']} |" + " |" * 6)
          continue
        step = f"{x['roofline']['step_s'] * 1e3:.0f} ({_bound(x['roofline'])})" if "roofline" in x else "-"
        mfu = f"{x['mfu'] * 100:.1f}%" if "mfu" in x else "-"
        if x.get("mfu", 0) > 1:  # the compiled FLOPs fell below the model's: no ceiling (docs/scale.md)
          mfu += " (void: compiled FLOPs below the model's)"
        lines.append(f"| {r['config'].split('/')[-1]} | {', '.join(s['names'])} | {r['target']} | "
                     f"{m['data']}x{m['fsdp']}x{m['tensor']} | {x['remat']} | "
                     f"{ {True: 'yes', False: '**no**', None: '-'}[x['fits']]} | "
                     f"{_gib(x['memory']['peak'])} / {_gib(r['limit']) if r.get('limit') else '-'} | {step} | {mfu} | "
                     f"{x['sent'] / 2**20:.0f} | {_gib(x['analytic']['total'])} | {x['ratio']:.2f} |")
  return "\n".join(lines) + "\n" + provenance(plans)


PROVENANCE = ("command", "commit", "date", "machine", "wall_s")


def provenance(plans: list[tuple[str, dict]]) -> str:
  """Beneath the table, how each plan file (name, its contents) was made (xlt.plan.provenance's
  fields), so that a figure can be traced to its command and checkout; a file from before they
  were recorded says so."""
  lines = ["", "How each plan was made (the command, run from the checkout's root, at the commit):", ""]
  for name, r in plans:
    if not all(k in r for k in PROVENANCE):
      lines.append(f"- {name}: not recorded")
      continue
    lines.append(f"- {name}: `{r['command']}` at {r['commit']}, {r['date']}, {r['machine']}, "
                 f"wall {r['wall_s']:.0f} s")
  return "\n".join(lines) + "\n"
