"""How much memory a training recipe needs per device, from shapes alone (nothing is allocated).

  shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  est = memory.estimate(cfg, shapes, tx, mesh, batch=32, seq=1024)
  print(memory.format(est))
  memory.check_fits(est, 80 << 30)      # a one-line ValueError saying what to change

Four parts, each in bytes per device (and `est["global"]`: the same unsharded):

  params       every leaf, in its own dtype.
  grads        the trained part only, in the trained leaves' dtypes: the whole model (full
               fine-tune), the adapters of a LoRA composite (xlt.lora: the base gets none),
               or the leaves a `trainable` mask keeps. With grad_accum > 1 the step holds a
               second gradient-sized buffer (the scan's running sum), so twice that.
  opt_state    `jax.eval_shape(tx.init(trained))` of the actual optax transformation: Adam's
               two moments, its count, and whatever else the transformation keeps (an fp32
               master copy of bf16 parameters, a schedule's state). With a `trainable` mask
               `tx` is wrapped as `partition.freeze` wraps it, so frozen leaves hold no state.
               (partition.freeze zeroes the frozen updates inside the optimizer, so xlt's step
               still forms the frozen leaves' gradients, which its grad norm reads: for that
               recipe the full model's gradients are the safer figure; a mask's figure is what
               a step that differentiates only the trained leaves holds, as LoRA's does and as
               a `train.static_freeze` tx's does.)
  activations  what the backward pass keeps for one micro-batch (formula below).

Sharding. Parameters, gradients and optimizer state are sized by the shard shapes of the
NamedShardings training gives them (`train.state_shardings`: the model's logical axes through
`rules` onto the mesh, and every parameter-shaped optimizer leaf following its parameter), so
an `embed` axis over fsdp=4 costs a quarter per device and a replicated leaf costs all of it.
Activations split their batch over data x fsdp and their heads / MLP / vocabulary widths over
tensor (Megatron-style).

Activations of a pre-norm decoder, per layer, for a micro-batch of b = batch / grad_accum
sequences per data x fsdp shard, T = seq, D width, H heads of width K, F MLP width,
s = bytes of the compute dtype (the scores and logits are float32 in xlt's model):

  residual   2 b T D s        the block's input and the stream after attention
  norms      2 b T D s        the two norm outputs (the inputs of q/k/v and of the MLP)
  qkv        3 b T H K s      queries, keys and values (keys and values repeated to H heads)
  scores     b H C (4 + s')   the softmax weights, float32, and their copy in the compute dtype
                              for the value product (s' = s, or 0 when that is float32);
                              C = T^2 without chunking, sum over query chunks of
                              chunk x keys-up-to-its-end with `query_chunks` (xlt's causal chunks);
                              a fused kernel (cuDNN, splash: xlt.attention) keeps no scores,
                              only each query's softmax statistics, b H T 4
  attn_out   b T H K s        the attention output, before the projection
  mlp        m b T F s        m = 2 (fc out, its GELU) or 4 for a gated MLP (gate, up, act, product)

plus, once: the final norm (2 b T D s) and the head (b T V (8 + s')): float32 logits and
their softmax for the cross-entropy; and the backward pass's transients: one layer's set
again (the gradients of the layer whose backward runs) and the logits' gradient (4 b T V).
That is what XLA:CPU's buffers measure (tests/test_memory.py). On a GPU or TPU the
cross-entropy (xlt.cross_entropy) keeps no softmax and no separate float32 gradient, so the
head is counted as the float32 logits once (b T V (4 + s')), an upper bound: its residual is
the logits in the compute dtype. On an H200 (benchmarks/gpu_check.py, docs/speed.md) the
device's peak was 0.76x this estimate for a Llama 3.2 1B-shaped full step (vocabulary 128256,
B=8, T=2048; 0.74x at B=16), 0.82x for its LoRA step, and 1.15x for a Llama 3.1 8B-shaped LoRA
step with remat (B=4): leave that margin when a recipe is near the device's size.
With `remat` (jax.checkpoint per block) a layer keeps only its input (b T D s) and one
layer's full set is live again during its recomputation.
Dropout masks, the embedding gather and XLA's fusion choices are not modelled: XLA's own
figure for a compiled step (tests/test_memory.py compares) is the ground truth; this is the
estimate before compiling, and the table of what to change.

One model: an ensemble of E members holds E times the state, and, vmapped, E times the
activations.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xlt import attention as attention_lib
from xlt import composite
from xlt import matmul
from xlt import sharding
from xlt import train as train_lib

PARTS = ("params", "grads", "opt_state", "activations")


def _leaf_bytes(x, sh=None) -> int:
  shape = sh.shard_shape(x.shape) if sh is not None else x.shape
  return math.prod(shape) * np.dtype(x.dtype).itemsize


def tree_bytes(tree, shardings=None) -> int:
  """Bytes of the leaves of an abstract (or concrete) tree: per device with `shardings` (a
  matching tree of NamedShardings), else whole."""
  leaves = jax.tree.leaves(tree)
  shs = jax.tree.leaves(shardings) if shardings is not None else [None] * len(leaves)
  if len(shs) != len(leaves):
    raise ValueError(f"{len(leaves)} leaves but {len(shs)} shardings")
  return sum(_leaf_bytes(x, s) for x, s in zip(leaves, shs))


def _stack(tree):
  """The tree with the ensemble axis of one member, as training lays the state out."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, *x.shape), x.dtype), tree)


def _trainable(trained, trainable, tx):
  """(the optimizer as training runs it, a bool per trained leaf, the fraction of its
  gradients and state held)."""
  if trainable is None:
    return tx, jax.tree.map(lambda _: True, trained), 1.0
  if isinstance(trainable, (int, float)) and not isinstance(trainable, bool):
    if not 0.0 < trainable <= 1.0:
      raise ValueError(f"trainable as a fraction must be in (0, 1], got {trainable}")
    return tx, jax.tree.map(lambda _: True, trained), float(trainable)
  mask = jax.tree.map(bool, trainable)
  if jax.tree.structure(mask) != jax.tree.structure(trained):
    raise ValueError("the trainable mask must have the structure of the trained parameters "
                     f"({jax.tree.structure(trained).num_leaves} leaves), got {jax.tree.structure(mask).num_leaves}")
  labels = jax.tree.map(lambda m: "trainable" if m else "frozen", mask)
  return optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels), mask, 1.0


def state_bytes(model_cfg, params_shapes, tx, mesh, *, trainable=None, rules=sharding.DEFAULT_RULES,
                grad_accum: int = 1) -> dict:
  """{"params", "grads", "opt_state"} per device and {"global": ...} unsharded, and the
  parameter counts (module doc)."""
  trained = composite.split(params_shapes)[0]
  tx, mask, fraction = _trainable(trained, trainable, tx)
  opt_shapes = jax.eval_shape(tx.init, trained)
  abstract = {"step": jax.ShapeDtypeStruct((1,), jnp.int32), "params": _stack(params_shapes),
              "opt_state": _stack(opt_shapes), "active": jax.ShapeDtypeStruct((1,), jnp.bool_)}
  sh = train_lib.state_shardings(model_cfg, tx, mesh, rules, abstract)
  trained_sh = composite.split(sh["params"])[0]
  trained = composite.split(abstract["params"])[0]  # with the ensemble axis, as its shardings
  grad_leaves = [(x, s) for x, s, m in zip(jax.tree.leaves(trained), jax.tree.leaves(trained_sh),
                                          jax.tree.leaves(mask)) if m]
  copies = 2 if grad_accum > 1 else 1
  out, whole = {}, {}
  for part, tree, shs in (("params", abstract["params"], sh["params"]),
                          ("opt_state", abstract["opt_state"], sh["opt_state"])):
    out[part], whole[part] = tree_bytes(tree, shs), tree_bytes(tree)
  out["grads"] = copies * sum(_leaf_bytes(x, s) for x, s in grad_leaves)
  whole["grads"] = copies * sum(_leaf_bytes(x) for x, _ in grad_leaves)
  for d in (out, whole):
    d["grads"], d["opt_state"] = round(d["grads"] * fraction), round(d["opt_state"] * fraction)
  n_trained = round(fraction * sum(math.prod(x.shape) for x, _ in grad_leaves))
  return {**out, "global": whole, "num_params": sum(math.prod(x.shape) for x in jax.tree.leaves(params_shapes)),
          "num_trained": n_trained}


def _score_entries(seq: int, query_chunks: int) -> int:
  """Entries of one head's scores: T^2, or with query chunks (xlt.layers.causal_attention's
  bounds) each chunk's queries times the keys up to its end."""
  if query_chunks <= 1:
    return seq * seq
  bounds = [round(seq * i / query_chunks) for i in range(query_chunks + 1)]
  return sum((hi - lo) * hi for lo, hi in zip(bounds[:-1], bounds[1:]))


def activation_terms(model_cfg, micro_batch: int, seq: int, *, compute_dtype=None, remat: bool = False,
                     query_chunks: int = 1, tensor: int = 1, fused: bool = False,
                     accelerator: bool = False) -> dict:
  """The module doc's activation terms in bytes for `micro_batch` sequences (on one device:
  `micro_batch` is that device's share, `tensor` the tensor axis that splits the widths):
  {"per_layer": {term: bytes}, "layers", "head", "backward", "total": bytes}."""
  c, b, t = model_cfg, micro_batch, seq
  s = np.dtype(compute_dtype or c.dtype).itemsize
  s_copy = 0 if s == 4 else s  # a float32 compute dtype needs no second copy of the weights
  h, k, f = c.num_heads, c.head_width, c.mlp_width
  split = lambda n: -(-n // tensor)
  gated = getattr(c, "mlp", "gelu") in ("swiglu", "geglu")
  per_layer = {
      "residual": 2 * b * t * c.d_model * s,
      "norms": 2 * b * t * c.d_model * s,
      "qkv": 3 * b * t * split(h) * k * s,
      "scores": b * split(h) * (t * 4 if fused else _score_entries(t, query_chunks) * (4 + s_copy)),
      "attn_out": b * t * split(h) * k * s,
      "mlp": (4 if gated else 2) * b * t * split(f) * s,
  }
  full = sum(per_layer.values())
  layer_input = b * t * c.d_model * s
  layers = c.num_layers * layer_input + full if remat else c.num_layers * full
  logits = b * t * split(c.vocab_size) * 4
  # an accelerator holds the float32 logits once (xlt.cross_entropy), XLA:CPU about twice
  head = 2 * b * t * c.d_model * s + logits * (1 if accelerator else 2) + b * t * split(c.vocab_size) * s_copy
  backward = full + (0 if accelerator else logits)  # one layer's activation gradients, the logits' gradient
  return {"per_layer": per_layer, "layers": layers, "head": head, "backward": backward,
          "total": layers + head + backward}


def _attention_kernel(model_cfg, platform: str, compute_dtype, seq: int) -> str:
  """The kernel the model's attention runs on `platform` (xlt.attention.choose)."""
  return attention_lib.choose(getattr(model_cfg, "attention", "auto"), platform,
                              dtype=compute_dtype or model_cfg.dtype, softcap=model_cfg.attn_logit_softcap,
                              dropout=model_cfg.dropout > 0, head_dim=model_cfg.head_width, seq=seq)[0]


def estimate(model_cfg, params_shapes, tx, mesh, *, batch: int, seq: int, trainable=None, remat: bool = False,
             grad_accum: int = 1, compute_dtype=None, query_chunks: int | None = None, platform: str | None = None,
             rules=sharding.DEFAULT_RULES) -> dict:
  """Bytes per device of a training step (module doc).

  params_shapes: one model's parameters, abstract or concrete (a LoRA composite
    {"base", "lora"} trains its adapters only).
  tx: the optax transformation training uses (unfrozen: see `trainable`).
  mesh: the jax Mesh with axes data, fsdp, tensor (xlt.sharding.make_mesh).
  batch, seq: sequences per step and tokens per sequence (the model's input length).
  trainable: None (all of the trained part), a tree of bools over the trained part (a frozen
    partition: xlt.partition.mask), or a fraction of it (gradients and optimizer state scaled).
  remat, grad_accum: jax.checkpoint per block; micro-batches of batch / grad_accum.
  compute_dtype: the activations' dtype (default model_cfg.dtype).
  query_chunks: the causal attention's query chunks (default: what xlt's model uses for `seq`
    on this platform, xlt.matmul.causal_query_chunks).
  platform: where the step runs ("cpu", "gpu", "tpu"; default the mesh's devices'): it picks
    the attention kernel as the model does (xlt.attention.choose), and a fused kernel (cuDNN,
    splash) keeps no scores.

  Returns {"params", "grads", "opt_state", "activations", "total"} per device, "global" (the
  same unsharded), "activation_terms", "num_params", "num_trained" and "setting".
  """
  if grad_accum < 1 or batch % grad_accum:
    raise ValueError(f"grad_accum={grad_accum} must divide batch={batch}")
  out = state_bytes(model_cfg, params_shapes, tx, mesh, trainable=trainable, rules=rules, grad_accum=grad_accum)
  chunks = matmul.causal_query_chunks(seq) if query_chunks is None else query_chunks
  micro = batch // grad_accum
  shards = sharding.batch_ways(mesh)
  platform = platform or mesh.devices.flat[0].platform
  kernel = _attention_kernel(model_cfg, platform, compute_dtype, seq)
  kw = dict(compute_dtype=compute_dtype, remat=remat, query_chunks=chunks, fused=kernel in ("cudnn", "splash"),
            accelerator=platform != "cpu")
  terms = activation_terms(model_cfg, -(-micro // shards), seq, tensor=mesh.shape["tensor"], **kw)
  out["activations"] = terms["total"]
  out["global"]["activations"] = activation_terms(model_cfg, micro, seq, **kw)["total"]
  for d in (out, out["global"]):
    d["total"] = sum(d[p] for p in PARTS)
  out["activation_terms"] = terms
  out["setting"] = {"mesh": dict(mesh.shape), "batch": batch, "seq": seq, "micro_batch": micro,
                    "grad_accum": grad_accum, "remat": remat, "query_chunks": chunks, "attention": kernel,
                    "compute_dtype": str(np.dtype(compute_dtype or model_cfg.dtype))}
  return out


def _size(n: float) -> str:
  for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if abs(n) >= scale:
      return f"{n / scale:.2f} {unit}"
  return f"{int(n)} B"


def format(est: dict) -> str:  # shadows the builtin inside this module only: read as memory.format
  """A small table: each part per device and unsharded, and the setting."""
  s = est["setting"]
  lines = [f"{'':12} {'per device':>12} {'unsharded':>12}"]
  lines += [f"{p:12} {_size(est[p]):>12} {_size(est['global'][p]):>12}" for p in (*PARTS, "total")]
  lines.append(f"mesh {s['mesh']}, batch {s['batch']} x seq {s['seq']} (micro-batch {s['micro_batch']}), "
               f"remat={s['remat']}, {s['compute_dtype']}; {est['num_trained']:,} of {est['num_params']:,} "
               f"parameters trained")
  return "\n".join(lines)


def check_fits(est: dict, device_bytes: int) -> None:
  """Nothing if the estimate fits `device_bytes` per device; else a one-line ValueError with
  the largest part and what would shrink it."""
  total = est["total"]
  if total <= device_bytes:
    return
  part = max(PARTS, key=lambda p: est[p])
  s = est["setting"]
  if part == "activations":
    # activations are linear in the micro-batch: the smallest accumulation that fits, if any
    static = total - est["activations"]
    fits = [k for k in range(s["grad_accum"], s["batch"] + 1)
            if s["batch"] % k == 0 and static + est["activations"] * s["grad_accum"] / k <= device_bytes]
    advice = (f"grad_accum={fits[0]}" if fits else "a shorter seq or a smaller batch") + \
        ("" if s["remat"] else ", or remat=True")
  elif part == "params":
    advice = "shard the parameters over more devices (mesh fsdp / tensor) or store them in bfloat16"
  else:
    advice = "shard over more fsdp devices, or train fewer parameters (LoRA, a frozen partition)"
  raise ValueError(f"needs ~{_size(total)} per device, over the {_size(device_bytes)} available; the largest "
                   f"part is {part} ({_size(est[part])}): try {advice}")
