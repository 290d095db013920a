"""benchmarks/compare.py's report: the FLOPs it credits a step with, the peaks it divides
by, and the markdown table of a run's JSON report (no jax, no torch: the parent process
imports it before any worker starts)."""

from __future__ import annotations

import os
import statistics

ENSEMBLE = 9  # graph models in the ensemble job: the graph config's 3 conditions x 3 seeds
ENV_SHOWN = ("LD_PRELOAD", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "XLA_FLAGS")
BUSY_WARNING = ("compare on an idle machine; PyTorch suffers most, OMP_WAIT_POLICY=PASSIVE "
                "limits its loss")
ONE_DEVICE = "xlt_1dev"  # --one_device: xlt's worker again with XLT_CPU_DEVICES=1 (xlt.cpu_devices)


def flops_per_token(model: dict, seq: int) -> float:
  """Training FLOPs per token, PaLM's count: 6 x (matmul parameters: the blocks' qkv, proj,
  fc, proj and the output head) + 12 x layers x seq x width for attention's two matmuls
  (the whole T x T square, causal or not). Embedding lookups, norms and the optimizer
  are not counted."""
  d, layers, r = model["d_model"], model["num_layers"], model.get("mlp_ratio", 4)
  matmul_params = layers * (4 + 2 * r) * d * d + d * model["vocab_size"]
  return 6 * matmul_params + 12 * layers * seq * d


# Dense peak FLOP/s per chip by compute dtype (vendor datasheets, SXM parts, no sparsity).
# float32 matmuls run as TF32 on these GPUs by default in XLA (and in torch with
# allow_tf32, which the torch worker sets on CUDA so both do the same arithmetic).
PEAK_TFLOPS = {"H100": {"bfloat16": 989.4, "float32": 494.7}, "H200": {"bfloat16": 989.4, "float32": 494.7},
               "A100": {"bfloat16": 312.0, "float32": 156.0}}


def peak_tflops(device: str, dtype: str, override: float = 0.0) -> float | None:
  if override:
    return override
  return next((v.get(dtype) for k, v in PEAK_TFLOPS.items() if k in device), None)


def _fmt(x, unit=""):
  return "–" if x is None else (f"{x:,.0f}{unit}" if x >= 100 else f"{x:.1f}{unit}")


def _ratio(a, b):
  return "–" if a is None or b is None else f"{a / b:.2f}"


def table(report: dict) -> str:
  rounds = report["rounds"]
  get = lambda impl, name, key: [r[impl]["results"][name][key] for r in rounds if impl in r]
  med = lambda xs: statistics.median(xs) if xs else None
  per_round = lambda xs: " / ".join(_fmt(x) for x in xs) or "–"
  info = {impl: rounds[0][impl] for impl in ("xlt", "torch", ONE_DEVICE) if impl in rounds[0]}
  name = {"xlt": "xlt", "torch": "PyTorch", ONE_DEVICE: "xlt on 1 device"}
  one = ONE_DEVICE in info
  m, tm = report["machine"], report["timing"]
  busy = any(r[k]["other_cores"] > 0.2 for r in rounds for k in r)
  lines = [
      f"## xlt vs PyTorch eager, {report['date']}",
      "",
      f"- machine: {m['cpu']}, {m['cores']} cores, {m.get('isa', 'ISA not recorded')}; devices: "
      + ", ".join(f"{name[k]} {i.get('device', 'cpu')}" for k, i in info.items()),
      "- versions: " + ", ".join(f"{k} {v}" for k, v in {k: v for i in info.values()
                                                           for k, v in i["versions"].items()}.items()),
      "- allocator: " + ", ".join(f"{name[k]} {i['allocator']}" for k, i in info.items()),
      "- threads: " + ", ".join(i["threads"] for i in info.values())
      + "".join(f", {k}={os.environ[k]}" for k in ENV_SHOWN if os.environ.get(k)),
      "- cores busy with other processes while each worker ran: " + ", ".join(
          f"{name[k]} " + " / ".join(f"{r[k]['other_cores']:.2f}" for r in rounds)
          for k in info) + (f" (**not idle: {BUSY_WARNING}**)" if busy else ""),
      f"- one full AdamW step; median of {tm['steps']} steps"
      + (f" or more (≥{tm['min_seconds']:g} s timed)" if tm["min_seconds"] else "") + " after "
      f"{tm['warmup']} warm-up; decoding: median of {tm['decode_steps']} after 1 warm-up; "
      f"median of {len(rounds)} round(s), each implementation in its own process",
      "",
      "| shape | xlt tokens/s | PyTorch tokens/s | xlt / PyTorch | xlt per round | PyTorch per round |"
      + (" xlt on 1 device | xlt / xlt on 1 device |" if one else ""),
      "|---|---|---|---|---|---|" + ("---|---|" if one else ""),
  ]
  jobs = {j["name"]: j for j in report["jobs"]}
  for job_name, j in jobs.items():
    if j["kind"] == "train":
      x, t = get("xlt", job_name, "tokens_per_s"), get("torch", job_name, "tokens_per_s")
      x1 = get(ONE_DEVICE, job_name, "tokens_per_s")
      lines.append(f"| {j['label']} | {_fmt(med(x))} | {_fmt(med(t))} | {_ratio(med(x), med(t))} | "
                   f"{per_round(x)} | {per_round(t)} |"
                   + (f" {_fmt(med(x1))} | {_ratio(med(x), med(x1))} |" if one else ""))
  lines += _mfu_lines(report, jobs, get, med)
  ens = jobs.get("ensemble")
  if ens:
    tog, vm, sep, t = (get("xlt", "ensemble", "together"), get("xlt", "ensemble", "vmap"),
                       get("xlt", "ensemble", "separate"), get("torch", "ensemble", "separate"))
    strategy = get("xlt", "ensemble", "strategy")[0]
    lines.append(f"| {ens['label']}: xlt one step ({strategy}, xlt's choice here), PyTorch {ENSEMBLE} separate "
                 f"steps | {_fmt(med(tog))} | {_fmt(med(t))} | {_ratio(med(tog), med(t))} | {per_round(tog)} | "
                 f"{per_round(t)} |")
    lines.append(f"| {ens['label']}: xlt one vmapped step | {_fmt(med(vm))} | {_fmt(med(t))} | "
                 f"{_ratio(med(vm), med(t))} | {per_round(vm)} | {per_round(t)} |")
    lines.append(f"| {ens['label']}: {ENSEMBLE} separate steps in both | {_fmt(med(sep))} | {_fmt(med(t))} | "
                 f"{_ratio(med(sep), med(t))} | {per_round(sep)} | {per_round(t)} |")
    lines += ["", f"xlt ensemble, together ({strategy}) / separate: **{_ratio(med(tog), med(sep))}×** "
                  f"(per round: {' / '.join(_ratio(a, b) for a, b in zip(tog, sep))}); vmap / separate: "
                  f"{_ratio(med(vm), med(sep))}×"]
  dec = jobs.get("decode")
  if dec:
    lines += ["", f"Greedy decoding with a KV cache, graph model, batch {dec['batch']}, "
                  f"{dec['prompt']}-token prompt + {dec['new']} new tokens:", "",
              "| | xlt | PyTorch | xlt speed / PyTorch | xlt per round | PyTorch per round |"
              + (" xlt on 1 device |" if one else ""), "|---|---|---|---|---|---|" + ("---|" if one else "")]
    for key, label, faster_is_lower in (("prefill_ms", "prefill, ms", True),
                                        ("ms_per_token", "ms per new token", True),
                                        ("new_tokens_per_s", "new tokens/s (prefill included)", False)):
      x, t = get("xlt", "decode", key), get("torch", "decode", key)
      ratio = _ratio(med(t), med(x)) if faster_is_lower else _ratio(med(x), med(t))
      x1 = get(ONE_DEVICE, "decode", key)
      lines.append(f"| {label} | {_fmt(med(x))} | {_fmt(med(t))} | {ratio} | {per_round(x)} | {per_round(t)} |"
                   + (f" {_fmt(med(x1))} |" if one else ""))
  return "\n".join(lines)


def _mfu_lines(report, jobs, get, med) -> list[str]:
  """Model FLOP utilisation of each training shape, where the device's peak is known
  (PEAK_TFLOPS) or given (--peak_tflops)."""
  info = {impl: report["rounds"][0][impl] for impl in ("xlt", "torch") if impl in report["rounds"][0]}
  rows = []
  for name, j in jobs.items():
    if j["kind"] != "train":
      continue
    dtype = j["model"].get("dtype", "float32")
    fpt = flops_per_token(j["model"], j["seq"])
    cells = []
    for impl in ("xlt", "torch"):
      tps = med(get(impl, name, "tokens_per_s")) if impl in info else None
      peak = peak_tflops(info[impl].get("device", "cpu"), dtype, report.get("peak_tflops", 0.0)) if impl in info else None
      tflops = None if tps is None else tps * fpt / 1e12
      cells += [_fmt(tflops) if tflops is not None else "–",
                "–" if tflops is None or not peak else f"{100 * tflops / peak:.1f}% of {peak:g}"]
    if any(c != "–" for c in cells[1::2]):
      rows.append(f"| {j['label']} | {fpt * j['batch'] * j['seq'] / 1e9:,.1f} | " + " | ".join(cells) + " |")
  if not rows:
    return []
  return ["", "Model FLOP utilisation (FLOPs per token: `flops_per_token`; peak: dense TFLOP/s of the "
              "device for the compute dtype, float32 as TF32):", "",
          "| shape | GFLOP per step | xlt TFLOP/s | xlt MFU | PyTorch TFLOP/s | PyTorch MFU |",
          "|---|---|---|---|---|---|", *rows]


SCHEMA_COLUMNS = ["shape", "xlt tok/s", "PyTorch tok/s", "xlt / PyTorch", "lowest round ratio", "highest round ratio"]


def schema_rows(report: dict) -> list[list]:
  """The results file's rows (docs/speed.md's schema, SCHEMA_COLUMNS): per training shape, the
  ensemble and decoding (new tokens/s, prefill included), each tool's median over rounds and
  the median of the rounds' paired ratios (each pair measured back to back)."""
  rounds = report["rounds"]

  def row(label, name, x_key, t_key=None):
    pairs = [(r["xlt"]["results"][name][x_key], r["torch"]["results"][name][t_key or x_key])
             for r in rounds if "xlt" in r and "torch" in r]
    if not pairs:
      return None
    ratios = [x / t for x, t in pairs]
    return [label, round(statistics.median(x for x, _ in pairs), 1), round(statistics.median(t for _, t in pairs), 1),
            round(statistics.median(ratios), 3), round(min(ratios), 3), round(max(ratios), 3)]

  out = []
  for name, j in {j["name"]: j for j in report["jobs"]}.items():
    if j["kind"] == "train":
      out.append(row(j["label"], name, "tokens_per_s"))
    elif name == "ensemble":
      out.append(row(f"{j['label']}: {ENSEMBLE} models, xlt one step, PyTorch separate steps", name, "together",
                     "separate"))
    elif name == "decode":
      out.append(row(f"greedy decoding, batch {j['batch']}, {j['prompt']} + {j['new']} tokens: new tokens/s", name,
                     "new_tokens_per_s"))
  return [r for r in out if r]
