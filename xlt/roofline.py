"""What a compiled training step should cost on a chip, from the compiler's own figures: the
chips' published peaks, the collectives of an optimized HLO module with their bytes, and a
roofline step time and MFU ceiling (xlt.plan reports them).

Convention (every figure per device, i.e. per chip: one TPU v5e/v5p/v6e chip is one jax device):

  compute    t_flops = FLOPs of the compiled module (cost_analysis: remat's recomputation and
             the optimizer included), or the model FLOPs below where they are more, / the
             chip's peak dense bf16 FLOP/s. Cost analysis counts a while loop's body once,
             whatever its trip count (tests/test_plan.py), so a module whose matmuls run in
             loops (grad_accum's scan; the TPU compiler's windowed matmuls, which overlap an
             FSDP all-gather with the matmul that needs it) reports fewer FLOPs than it runs;
             the model's own count is then the better floor;
  memory     t_hbm   = bytes accessed (cost_analysis) / the chip's HBM bandwidth;
  network    t_ici   = bytes each device sends in the module's collectives / the chip's ICI
             bandwidth in one direction (half the published bidirectional figure). A ring
             collective over n devices sends (n-1)/n of an all-gather's result, (n-1) times a
             reduce-scatter's result, 2 (n-1)/n of an all-reduce's operand, (n-1)/n of an
             all-to-all's and all of a collective-permute's;
  step time  max(t_flops, t_hbm, t_ici): perfect overlap, so a lower bound on the real step;
  MFU        model FLOPs / (devices x peak x step time), model FLOPs per token being
             2 N (forward) + 2 N (activation gradients) + 2 N_trained (weight gradients) over
             the matmul weights (the input embedding is a gather, not counted; a tied head is),
             plus causal attention's 2 L T H K forward and twice that backward. That is the
             usual 6 N D for full training; it counts no recomputation, so remat lowers the
             ceiling instead of raising it.

A collective inside a while loop (grad_accum's scan) is counted once per instruction, not per
iteration: with grad_accum > 1 the network figure is a lower bound too.
"""

from __future__ import annotations

import dataclasses
import math
import re

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  bf16_flops: float  # peak dense bf16 FLOP/s
  hbm_bytes: int  # HBM per chip
  hbm_bw: float  # bytes/s
  ici_bw: float  # bytes/s, one direction, all the chip's links together
  source: str


# Google Cloud's TPU pages (docs.cloud.google.com/tpu/docs/<name>), read 2026-12; HBM capacities
# as published in GB, taken as GiB (libtpu's usable limit is a little below either).
CHIPS = {
    # v4: 275 TFLOP/s, 32 GiB HBM2 at 1200 GB/s; the page gives no per-chip ICI figure, so its
    # "all-reduce bandwidth per Pod" (1.1 PB/s over 4096 chips) stands in for it
    "v4": Chip("TPU v4", 275e12, 32 * GiB, 1200e9, 1.1e15 / 4096, "docs.cloud.google.com/tpu/docs/v4"),
    # v5e: 197 TFLOP/s, 16 GB HBM2 at 819 GB/s, ICI 1600 Gbps (400 GB/s bidirectional)
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB, 819e9, 200e9, "docs.cloud.google.com/tpu/docs/v5e"),
    # v5p: 459 TFLOP/s, 95 GB HBM2e at 2765 GB/s, ICI 4800 Gbps
    "v5p": Chip("TPU v5p", 459e12, 95 * GiB, 2765e9, 600e9, "docs.cloud.google.com/tpu/docs/v5p"),
    # v6e (Trillium): 918 TFLOP/s, 32 GB HBM at 1638 GB/s, ICI 800 GB/s bidirectional
    "v6e": Chip("TPU v6e", 918e12, 32 * GiB, 1638e9, 400e9, "docs.cloud.google.com/tpu/docs/v6e"),
}

# GPUs, which xlt.plan cannot compile for from a host without one: their plans are xlt.memory's
# analytic estimate and a compute-bound time (NVIDIA's H100 / H200 SXM datasheets: dense bf16
# without sparsity, NVLink 900 GB/s bidirectional)
GPUS = {
    "h100": Chip("H100 SXM", 989e12, 80 * 10**9, 3.35e12, 450e9, "nvidia.com/en-us/data-center/h100"),
    "h200": Chip("H200 SXM", 989e12, 141 * 10**9, 4.8e12, 450e9, "nvidia.com/en-us/data-center/h200"),
}

# jax's device_kind of each chip
_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p",
          "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def chip_of(device_kind: str) -> Chip | None:
  """The chip of a jax device_kind ("TPU v5 lite"), or None (a CPU, an unknown chip)."""
  key = _KINDS.get(device_kind)
  return CHIPS[key] if key else None


COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
          "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_OP = re.compile(r"=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")


def _shape_bytes(text: str) -> list[int]:
  """Bytes of each array shape written in `text` ("bf16[8,128]{1,0}", a tuple of them)."""
  out = []
  for dtype, dims in _SHAPE.findall(text):
    if dtype in _BYTES:
      out.append(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d))
  return out


def _group_size(line: str, devices: int) -> int:
  """How many devices one replica group of the instruction holds (all of them when unsaid)."""
  if m := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line):  # mesh['a'=4,'b'=2] {'a'}
    sizes = {k.strip("'"): int(v) for k, v in (kv.split("=") for kv in m.group(1).split(","))}
    return math.prod(sizes[a.strip().strip("'")] for a in m.group(2).split(",") if a.strip())
  if m := re.search(r"replica_groups=\[([0-9,]+)\]<=", line):  # iota form [groups, size]
    return int(m.group(1).split(",")[-1])
  if m := re.search(r"replica_groups=\{\{([0-9,]*)\}", line):
    return len(m.group(1).split(","))
  if m := re.search(r"source_target_pairs=\{([^}]*)\}", line):
    return 2
  return devices


def collectives(hlo_text: str, devices: int) -> list[dict]:
  """Every collective instruction of an optimized HLO module (compiled.as_text()):
  {"op", "bytes" (its results', per device), "group" (devices per replica group), "sent" (bytes
  each device sends, the module doc's ring factors)}. An async pair counts at its -start."""
  out = []
  for line in hlo_text.splitlines():
    m = _OP.search(line)
    if not m:
      continue
    op, result = m.group(2), _shape_bytes(m.group(1))
    if not result:
      continue
    # a combined collective's tuple holds every result; an async start's holds its operands,
    # then its results (and a collective-permute's two u32 contexts, a few bytes)
    size = sum(result[len(result) // 2:]) if m.group(3) else sum(result)
    n = max(_group_size(line, devices), 1)
    sent = {"all-gather": size * (n - 1) / n, "reduce-scatter": size * (n - 1), "all-reduce": 2 * size * (n - 1) / n,
            "all-to-all": size * (n - 1) / n, "collective-permute": size}[op]
    out.append({"op": op, "bytes": size, "group": n, "sent": sent})
  return out


def summarize(found: list[dict]) -> dict:
  """{op: {"count", "bytes", "sent"}} over `collectives`' list."""
  out = {}
  for c in found:
    s = out.setdefault(c["op"], {"count": 0, "bytes": 0, "sent": 0.0})
    s["count"] += 1
    s["bytes"] += c["bytes"]
    s["sent"] += c["sent"]
  return out


def model_flops(cfg, num_matmul: int, num_trained_matmul: int, tokens: int, seq: int) -> float:
  """The module doc's model FLOPs of one step over `tokens` tokens of sequences of `seq`."""
  attention = 2 * cfg.num_layers * seq * cfg.num_heads * cfg.head_width
  return tokens * (4 * num_matmul + 2 * num_trained_matmul + 3 * attention)


def step_time(chip: Chip, flops: float, hbm_bytes: float, sent: float, model_flops: float = 0.0) -> dict:
  """The module doc's roofline: {"flops_s", "hbm_s", "ici_s", "step_s", "bound", "flops_from"},
  `model_flops` per device the floor under the compiled `flops` ("flops_from": which was used)."""
  used = "model" if model_flops > flops else "compiled"
  t = {"flops_s": max(flops, model_flops) / chip.bf16_flops, "hbm_s": hbm_bytes / chip.hbm_bw,
       "ici_s": sent / chip.ici_bw}
  bound = max(t, key=t.get)
  return {**t, "step_s": t[bound], "bound": bound.removesuffix("_s"), "flops_from": used}


def while_loops(hlo_text: str) -> int:
  """How many while instructions an HLO module holds (each body counted once by cost analysis)."""
  return len(re.findall(r"\swhile\(", hlo_text))
