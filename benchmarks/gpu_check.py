"""The GPU checks of xlt's recipes on pretrained-shaped models, in one short run on one GPU:

  python benchmarks/gpu_check.py --out=results/benchmarks/gpu_check.json      # <= 8 minutes on one H100/H200
  python benchmarks/gpu_check.py --quick --out=runs/gpu_dry.json               # dry run: tiny shapes, any CPU

1. attention: a Llama-shaped model (GQA, RoPE, bf16 compute) computed with each attention
   kernel xlt.attention offers on the GPU: cuDNN's fused kernel, XLA's plain softmax, xlt's
   own; logits and gradients of each against a float32 XLA reference, with and without a
   sliding window; whether `auto` compiles to cuDNN's fused attention (its custom call in the
   compiled HLO).
2. steps: xlt's training step (xlt.train.make_step, one member, AdamW with clipping) on a
   model of Llama 3.2 1B's shape (randomly initialised: speed does not depend on the values),
   bf16 compute: full fine-tuning (float32 parameters and moments) with cuDNN and with XLA
   attention, and rank-16 LoRA on bf16 parameters; then PyTorch eager on the same shapes
   (transformers' LlamaForCausalLM, sdpa attention, bf16 autocast over float32 parameters
   for full fine-tuning, bf16 parameters under peft's LoRA), where torch is installed. Each
   job: its compile (first step); the step time as a training loop runs its steps (dispatched
   back to back, the loss read after the last), with tokens/s and the model FLOP utilisation
   from it (6 x trained-through parameters x tokens + 12 x layers x heads x head width x T x
   tokens, PaLM's convention, over the GPU's dense bf16 peak); the median of steps each waited
   for; the device's peak memory against xlt.memory.estimate.
3. 8B: a rank-16 LoRA step on a model of Llama 3.1 8B's shape, bf16 parameters, remat per
   block, where the GPU has the memory; its peak against the estimate.
4. decoding: greedy new tokens/s of the 1B shape (bf16), `xlt.generate.greedy_ids` after a
   warm-up call of the same shapes, at batch 8 and 64 (128-token prompts, 128 new tokens).

FLOP convention (MFU): model FLOPs per token = 6 N + 12 L H K T, N the parameters the tokens
are multiplied by (the embedding lookup excluded, the head included; for LoRA the base's
forward and input-gradient products, 4 N, plus the adapters' 6 N), L layers, H query heads of
width K, T the sequence: PaLM's count, the whole T x T attention square although causal
attention needs half; no rematerialisation counted. MFU = those FLOPs / step time / the GPU's
dense bf16 peak (989 TFLOP/s for H100 and H200 SXM).

Each job runs in its own process (peak memory is per process) under the time left of
--budget_s (480 s: the run fits 8 minutes); every finished job is written to --out at once, as
docs/speed.md's schema (benchmarks/results_file.py: one table, `python -m xlt.report` renders
it; the attention errors and every raw figure under "details"). `--quick` is a dry run at tiny
shapes that runs on a CPU as well (tests/test_gpu_check.py runs its pieces).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LLAMA_1B = dict(vocab_size=128256, d_model=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
                mlp_dim=8192, tie_embeddings=True, rope_base=500000.0)
LLAMA_8B = dict(vocab_size=128256, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                mlp_dim=14336, tie_embeddings=False, rope_base=500000.0)
SHAPES = {"llama-1b": LLAMA_1B, "llama-8b": LLAMA_8B}
# name: (shape, mode, attention, param dtype, remat, batch, seq)
FULL_1B = ("llama-1b", "full", "auto", "float32", "none", 8, 2048)
FULL_1B_B16 = FULL_1B[:5] + (16, 2048)
JOBS = {
    "xlt full cudnn": FULL_1B,
    # XLA's attention keeps each layer's T x T scores for the backward pass: at batch 8 the 1B
    # step needs ~146 GiB (out of an H200's memory), so XLA and cuDNN are compared at batch 4
    "xlt full xla": ("llama-1b", "full", "xla", "float32", "none", 4, 2048),
    "xlt full cudnn b4": FULL_1B[:5] + (4, 2048),
    # the largest batch of a power of two the H200 holds without remat (PyTorch's step at batch 8
    # already takes 75 GiB): the optimizer's update spread over twice the tokens
    "xlt full cudnn b16": FULL_1B_B16,
    "xlt lora cudnn": ("llama-1b", "lora", "auto", "bfloat16", "none", 8, 2048),
    "torch full": ("llama-1b", "full", "sdpa", "float32", "none", 8, 2048),
    "torch lora": ("llama-1b", "lora", "sdpa", "bfloat16", "none", 8, 2048),
    "xlt 8b lora": ("llama-8b", "lora", "auto", "bfloat16", "block", 4, 2048),
    "xlt decode": ("llama-1b", "decode", "auto", "bfloat16", "none", (8, 64), 128),  # batches, prompt = new
    "xlt 8b full": ("llama-8b", "full", "auto", "bfloat16", "block", 2, 2048),  # float32 moments
    "xlt full cudnn weight": FULL_1B,  # CONFIG's weight layout
    "xlt full cudnn cublas b16": FULL_1B_B16,  # under TUNED_FLAGS (ENV), as the next two
    "xlt full cudnn cublas fused": FULL_1B, "xlt full cudnn cublas fused b16": FULL_1B_B16}
# a job's model.Config fields beside its tuple's: torch's [out, in] weights (as a loaded Hugging
# Face Llama holds them); q, k, v and gate, up each computed as one product (fused_projections)
FUSED_JOBS = ("xlt full cudnn cublas fused", "xlt full cudnn cublas fused b16")
CONFIG = {"xlt full cudnn weight": dict(dense_layout="weight"),
          **dict.fromkeys(FUSED_JOBS, dict(fused_projections=True))}
# XLA's GPU flags that MaxText's GPU recipes set: cuBLAS rather than Triton's generated matrix
# products; the latency-hiding scheduler
TUNED_FLAGS = "--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_latency_hiding_scheduler=true"
# the 1B full step again under other XLA flags, a job each: its row label's tail, its XLA_FLAGS.
# Those measured to no gain (DotMerger's limit, cuBLASLt, cuDNN's fused products, Triton for
# any dot, concurrent graph regions, Triton's block-level and heroless fusions, cuDNN's norms)
# are not listed: the exploratory results files name the commits whose script ran them.
FLAG_JOBS = {"xlt full cudnn cublas": ("cuBLAS + LHS flags", TUNED_FLAGS)}
JOBS.update(dict.fromkeys(FLAG_JOBS, FULL_1B))
# a job's environment beside the parent's: its flags, and the 8B jobs' share of the device's
# memory (jax's default 75% leaves the 8B step short)
ENV = {**{job: {"XLA_FLAGS": flags} for job, (_, flags) in FLAG_JOBS.items()},
       **dict.fromkeys(("xlt full cudnn cublas b16", *FUSED_JOBS), {"XLA_FLAGS": TUNED_FLAGS}),
       "xlt 8b lora": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"},
       "xlt 8b full": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"}}
# by priority: jobs run while --budget_s lasts, so the figures come first
DEFAULT_JOBS = ("xlt full cudnn", "torch full", "xlt lora cudnn", "torch lora", "xlt 8b lora", "xlt decode",
                "xlt full cudnn weight", "xlt full cudnn b4", "xlt full xla", "attention")
QUICK_BATCH = (8, 64)  # --quick's batch and sequence (8 rows: any CPU device count the tests make divides it)
QUICK = dict(vocab_size=1024, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, mlp_dim=256)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s (SXM)
OPT = dict(name="adamw", schedule="constant", peak_lr=1e-5, warmup_steps=0, total_steps=100, b1=0.9, b2=0.95,
           weight_decay=0.0, clip=1.0)
LORA = dict(rank=16, alpha=32.0)


def model_config(shape: dict, attention: str, param_dtype: str, remat: str, seq: int):
  from xlt import model

  return model.Config(block_size=seq, norm="rmsnorm", mlp="swiglu", pos_embedding="rope", bias=False, ln_eps=1e-5,
                      dtype="bfloat16", param_dtype=param_dtype, attention=attention, remat=remat, **shape)


def model_flops_per_token(cfg, trained_through: int, seq: int) -> float:
  """PaLM's model FLOPs per token of a training step: 6 N + 12 L H K T (N: the parameters the
  step multiplies by, the embedding lookup excluded, the head included)."""
  return 6 * trained_through + 12 * cfg.num_layers * cfg.num_heads * cfg.head_width * seq


def peak_flops(kind: str) -> float | None:
  return next((v for k, v in PEAK_BF16.items() if k in kind), None)


# ------------------------------------------------------------------------------- attention


def attention_check(quick: bool) -> dict:
  import jax
  import jax.numpy as jnp

  from xlt import model

  shape = dict(QUICK if quick else dict(vocab_size=4096, d_model=1024, num_layers=2, num_heads=16, num_kv_heads=4,
                                        head_dim=64, mlp_dim=2048))
  seq, batch, out = 512, 4, {}
  tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, shape["vocab_size"])
  for window in (0, 128):
    ref_cfg = dataclasses.replace(model_config(shape, "xla", "float32", "none", seq), dtype="float32",
                                  sliding_window=window)
    params = model.init_params(ref_cfg, jax.random.key(0))

    def loss(p, cfg):
      logits = model.apply(cfg, p, tokens[:, :-1])[0].astype(jnp.float32)  # (logits, cache)
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1)), logits

    fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, ref_logits), ref_grads = fn(params, ref_cfg)
    gnorm = float(jnp.sqrt(sum(jnp.sum(g.astype(jnp.float32) ** 2) for g in jax.tree.leaves(ref_grads))))
    for impl in ("auto", "cudnn", "xla", "xlt"):
      cfg = dataclasses.replace(ref_cfg, dtype="bfloat16", attention=impl)
      (_, logits), grads = fn(params, cfg)
      diff = jax.tree.map(lambda a, b: jnp.sum((a.astype(jnp.float32) - b) ** 2), grads, ref_grads)
      hlo = fn.lower(params, cfg).compile().as_text()
      out[f"window={window} {impl}"] = {
          "logits_max_abs_err": float(jnp.max(jnp.abs(logits - ref_logits))),
          "logits_scale": float(jnp.max(jnp.abs(ref_logits))),
          "grads_rel_err": float(jnp.sqrt(sum(jax.tree.leaves(diff)))) / gnorm,
          "cudnn_fmha_in_hlo": "cudnn$fmha" in hlo or "__cudnn$fmha" in hlo}
      print("attention", window, impl, out[f"window={window} {impl}"], flush=True)
  return out


# ------------------------------------------------------------------------------- steps


def _median_step(run, steps: int) -> tuple[float, float, float]:
  """(first step's seconds, the median of `steps` steps each waited for, its loss)."""
  t0 = time.perf_counter()
  loss = run()
  first = time.perf_counter() - t0
  run()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  return first, statistics.median(times), loss


def _back_to_back_step(dispatch, wait, steps: int) -> float:
  """Seconds a step of `steps` steps dispatched back to back, as a training loop runs the steps
  between two log lines (xlt.loop; transformers' Trainer keeps the loss on the device): no
  step's loss is read until the last has been dispatched, so the host's work overlaps the
  device's. `dispatch()` starts a step and returns its loss unread; `wait(loss)` blocks until
  it is computed. (Reading a loss in between would also wait for every step dispatched since:
  on a GPU a read queues behind them.)"""
  wait(dispatch())
  t0 = time.perf_counter()
  losses = [dispatch() for _ in range(steps)]
  wait(losses[-1])
  return (time.perf_counter() - t0) / steps


def random_params(cfg):
  """N(0, 0.02) in every leaf, made on the device leaf by leaf: speed and memory do not
  depend on the values, and flax's init traces the whole model (a minute at 8B). One small
  program per distinct leaf shape (a dozen), not one program of every leaf: that one took
  most of a job's minute of set-up on the GPU."""
  import functools

  import jax

  from xlt import model

  @functools.partial(jax.jit, static_argnums=(1, 2))
  def normal(key, shape, dtype):
    return (0.02 * jax.random.normal(key, shape)).astype(dtype)

  shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  leaves, tree = jax.tree.flatten(shapes)
  keys = jax.random.split(jax.random.key(0), len(leaves))
  return tree.unflatten([normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def xlt_job(job: tuple, quick: bool, steps: int, config: dict | None = None) -> dict:
  import jax
  import ml_collections
  import numpy as np

  from xlt import composite, cross_entropy, lora, memory, sharding, train

  shape_name, mode, attention, param_dtype, remat, batch, seq = job
  shape = QUICK if quick else SHAPES[shape_name]
  batch, seq = QUICK_BATCH if quick else (batch, seq)
  cfg = dataclasses.replace(model_config(shape, attention, param_dtype, remat, seq), **(config or {}))
  # bf16 parameters trained whole keep Adam's moments in float32 (opt.state_dtype)
  state_dtype = "float32" if mode == "full" and param_dtype == "bfloat16" else ""
  tx = train.make_optimizer(ml_collections.ConfigDict(dict(OPT, state_dtype=state_dtype)))
  mesh = sharding.make_mesh({"data": -1})
  t0 = time.perf_counter()
  params = jax.block_until_ready(random_params(cfg))
  params_s = time.perf_counter() - t0
  if mode == "lora":
    params = {"base": params, "lora": lora.init(params, jax.random.key(1), **LORA)}
  stacked = jax.tree.map(lambda x: x[None], params)
  del params
  abstract = jax.eval_shape(lambda p: train.init_state(cfg, tx, [0], p), stacked)
  step, st_sh, _ = train.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract)
  with jax.set_mesh(mesh):
    state = jax.jit(lambda p: train.init_state(cfg, tx, [0], p), out_shardings=st_sh, donate_argnums=0)(stacked)
  init_s = time.perf_counter() - t0
  one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), abstract["params"])
  est = memory.estimate(cfg, one, tx, mesh, batch=batch, seq=seq, remat=remat == "block",
                        platform="gpu" if not quick else None)
  rng = np.random.default_rng(0)
  data = {"tokens": rng.integers(0, shape["vocab_size"], (1, batch, seq + 1)).astype(np.int32),
          "loss_mask": np.ones((1, batch, seq), np.float32)}
  holder = [state]

  def dispatch():
    with jax.set_mesh(mesh):
      holder[0], m = step(holder[0], data)
    return m["loss"]

  read = lambda loss: float(loss[0])
  first, synced_s, loss = _median_step(lambda: read(dispatch()), steps)
  step_s = _back_to_back_step(dispatch, jax.block_until_ready, steps)
  if os.environ.get("XLT_PROFILE_DIR"):  # one more step traced, for the profile's op table
    with jax.profiler.trace(os.environ["XLT_PROFILE_DIR"]):
      read(dispatch())
  dev = jax.devices()[0]
  stats = dev.memory_stats() or {}
  trained = sum(x.size for x in jax.tree.leaves(composite.split(one)[0]))
  base = composite.base(one) if composite.is_composite(one) else one
  through = sum(x.size for x in jax.tree.leaves(base)) - shape["vocab_size"] * shape["d_model"] * (
      0 if shape.get("tie_embeddings") else 1)
  if mode == "lora":  # the frozen base has no weight gradients: 4 N, the adapters 6 N
    through = (4 * through + 6 * trained) / 6
  return {"device": dev.device_kind, "jax": jax.__version__, "attention": est["setting"]["attention"],
          "dense_layout": cfg.dense_layout, "fused_projections": cfg.fused_projections,
          "ce_residual": cross_entropy.residual_dtype(cfg),
          "state_dtype": state_dtype or param_dtype, "batch": batch, "seq": seq,
          "params": int(sum(x.size for x in jax.tree.leaves(base))), "trained": int(trained),
          "init_s": init_s, "params_s": params_s, "first_step_s": first, "step_s": step_s, "synced_step_s": synced_s,
          "first_loss": loss,
          "tokens_per_s": batch * seq / step_s,
          "model_flops_per_step": model_flops_per_token(cfg, through, seq) * batch * seq,
          "peak_bytes": stats.get("peak_bytes_in_use"), "device_bytes": stats.get("bytes_limit"),
          "estimate_bytes": est["total"], "estimate": {k: est[k] for k in memory.PARTS}}


def torch_job(job: tuple, quick: bool, steps: int) -> dict:
  import torch
  import transformers

  shape_name, mode, _, param_dtype, _, batch, seq = job
  shape = QUICK if quick else SHAPES[shape_name]
  batch, seq = QUICK_BATCH if quick else (batch, seq)
  config = transformers.LlamaConfig(
      vocab_size=shape["vocab_size"], hidden_size=shape["d_model"], num_hidden_layers=shape["num_layers"],
      num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"], head_dim=shape["head_dim"],
      intermediate_size=shape["mlp_dim"], tie_word_embeddings=shape.get("tie_embeddings", False),
      rope_theta=shape.get("rope_base", 10000.0), max_position_embeddings=seq, attn_implementation="sdpa")
  dtype = getattr(torch, param_dtype)
  torch.manual_seed(0)
  t0 = time.perf_counter()
  dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: --quick's smoke test
  with torch.device(dev):
    model = transformers.LlamaForCausalLM(config).to(dtype)
  if mode == "lora":
    import peft

    model = peft.get_peft_model(model, peft.LoraConfig(
        r=LORA["rank"], lora_alpha=LORA["alpha"], use_rslora=True, lora_dropout=0.0, bias="none",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    for p in model.parameters():  # adapters in float32, as xlt's
      if p.requires_grad:
        p.data = p.data.float()
  model.train()
  trained = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trained, lr=OPT["peak_lr"], betas=(OPT["b1"], OPT["b2"]), eps=1e-8, weight_decay=0.0,
                          fused=dev == "cuda")
  init_s = time.perf_counter() - t0
  g = torch.Generator().manual_seed(0)
  tok = torch.randint(0, shape["vocab_size"], (batch, seq + 1), generator=g).to(dev)

  def dispatch():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=torch.bfloat16):
      logits = model(input_ids=tok[:, :-1], use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tok[:, 1:].flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trained, OPT["clip"], foreach=True)
    opt.step()
    return loss.detach()

  def read(loss):
    if dev == "cuda":
      torch.cuda.synchronize()
    return float(loss)

  first, synced_s, loss = _median_step(lambda: read(dispatch()), steps)
  step_s = _back_to_back_step(dispatch, read, steps)
  cuda = dev == "cuda"
  return {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
          "batch": batch, "seq": seq, "trained": sum(p.numel() for p in trained), "init_s": init_s,
          "first_step_s": first, "step_s": step_s, "synced_step_s": synced_s, "first_loss": loss,
          "tokens_per_s": batch * seq / step_s, "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None}


# ------------------------------------------------------------------------------- driver


def decode_job(job: tuple, quick: bool, steps: int) -> dict:
  """Greedy new tokens/s at each batch of `job` (the second call of each shape timed)."""
  import jax
  import numpy as np

  from xlt import generate

  shape_name, _, attention, param_dtype, _, batches, length = job
  shape = QUICK if quick else SHAPES[shape_name]
  length, batches = (16, batches[:1]) if quick else (length, batches)
  cfg = dataclasses.replace(model_config(shape, attention, param_dtype, "none", 2 * length + 1), dtype=param_dtype)
  params = random_params(cfg)
  out = {"device": jax.devices()[0].device_kind, "prompt": length, "new": length}
  for batch in batches:
    prompts = np.random.default_rng(0).integers(0, shape["vocab_size"], (batch, length)).tolist()
    run = lambda: generate.greedy_ids(cfg, params, prompts, max_new=length, batch=batch, stop_ids=())
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    times = []
    for _ in range(max(1, min(steps, 3))):
      t0 = time.perf_counter()
      got = run()
      times.append(time.perf_counter() - t0)
    out[f"batch {batch}"] = {"first_s": first, "s": statistics.median(times),
                             "new_tokens_per_s": sum(map(len, got)) / statistics.median(times)}
  return out


def child(name: str, quick: bool, steps: int) -> dict:
  if name == "attention":
    return attention_check(quick)
  if name == "xlt decode":
    return decode_job(JOBS[name], quick, steps)
  if name.startswith("torch"):
    return torch_job(JOBS[name], quick, steps)
  return xlt_job(JOBS[name], quick, steps, CONFIG.get(name))


COLUMNS = ["job", "xlt step s", "xlt tok/s", "xlt MFU %", "xlt step s, each waited for", "xlt peak GiB",
           "xlt estimate GiB", "PyTorch step s", "PyTorch MFU %", "xlt / PyTorch"]
# row label: (xlt job, PyTorch job or None)
ROWS = {"1B full, cuDNN attention": ("xlt full cudnn", "torch full"),
        **{f"1B full, cuDNN attention, {label}": (job, "torch full") for job, (label, _) in FLAG_JOBS.items()},
        "1B full, batch 16, cuDNN attention, cuBLAS + LHS flags": ("xlt full cudnn cublas b16", None),
        "1B full, cuDNN attention, cuBLAS + LHS flags, fused projections": (
            "xlt full cudnn cublas fused", "torch full"),
        "1B full, batch 16, cuDNN attention, cuBLAS + LHS flags, fused projections": (
            "xlt full cudnn cublas fused b16", None),
        "1B full, cuDNN attention, [out, in] weights (a loaded model's layout)": ("xlt full cudnn weight", "torch full"),
        "1B full, batch 4, cuDNN attention": ("xlt full cudnn b4", None),
        "1B full, batch 16, cuDNN attention": ("xlt full cudnn b16", None),
        "1B full, batch 4, XLA attention": ("xlt full xla", None),
        "1B LoRA r16": ("xlt lora cudnn", "torch lora"),
        "8B LoRA r16, remat": ("xlt 8b lora", None),
        "8B full, remat, float32 moments": ("xlt 8b full", None)}


def table_rows(results: dict) -> list[list]:
  """The results file's rows (COLUMNS) from the finished jobs (raw numbers; None: not measured)."""
  gib = lambda b: None if b is None else round(b / 2**30, 2)
  rows = []
  for label, (xname, tname) in ROWS.items():
    x, t = results.get(xname, {}), results.get(tname, {}) if tname else {}
    if "step_s" not in x:
      continue
    peak = peak_flops(x.get("device", ""))
    mfu = lambda r: None if not peak or "step_s" not in r else round(100 * x["model_flops_per_step"] / r["step_s"]
                                                                     / peak, 1)
    waited = round(x["synced_step_s"], 4) if "synced_step_s" in x else None
    rows.append([label, round(x["step_s"], 4), round(x["tokens_per_s"], 1), mfu(x), waited, gib(x.get("peak_bytes")),
                 gib(x.get("estimate_bytes")), round(t["step_s"], 4) if "step_s" in t else None, mfu(t),
                 round(t["step_s"] / x["step_s"], 3) if "step_s" in t else None])
  dec = results.get("xlt decode", {})
  for key, r in dec.items():
    if key.startswith("batch "):
      rows.append([f"1B greedy decoding, {key}: new tok/s", round(r["s"], 3), round(r["new_tokens_per_s"], 1),
                   None, None, None, None, None, None, None])
  return rows


def write(out: str, results: dict, wall_s: float, quick: bool) -> None:
  from benchmarks import results_file
  from xlt import report

  device = next((r["device"] for r in results.values() if isinstance(r, dict) and r.get("device")), "unknown")
  versions = next(({"jax": r["jax"]} for r in results.values() if isinstance(r, dict) and r.get("jax")), {})
  versions |= next(({"torch": r["torch"], "transformers": r["transformers"]} for r in results.values()
                    if isinstance(r, dict) and r.get("torch")), {})
  att = results.get("attention", {})
  fused = {k: v.get("cudnn_fmha_in_hlo") for k, v in att.items() if isinstance(v, dict) and "auto" in k}
  results_file.write(
      out, benchmark=os.path.splitext(os.path.basename(out))[0],
      title="One GPU: Llama-shaped steps (bf16 compute), MFU, decoding" + (" (dry run, tiny shapes)" if quick else ""),
      columns=COLUMNS, rows=table_rows(results), wall_s=wall_s, versions=versions,
      machine=f"{device} (host: {report.machine()})",
      notes=("MFU: model FLOPs 6 N + 12 L H K T per token (LoRA: 4 N of the base + 6 N of the adapters; "
             "benchmarks/gpu_check.py) over the dense bf16 peak. `auto` attention compiled to cuDNN's fused kernel: "
             + (", ".join(f"{k}: {v}" for k, v in fused.items()) or "not checked") + "."), details=results)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--budget_s", type=float, default=480.0)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke test of the script)")
  p.add_argument("--jobs", default=",".join(DEFAULT_JOBS), help=f"of attention, {', '.join(JOBS)}")
  p.add_argument("--profile_dir", default="", help="trace one extra step of --profile_job here (jax.profiler)")
  p.add_argument("--profile_job", default="xlt full cudnn")
  p.add_argument("--child", default="")
  a = p.parse_args(argv)
  if a.child:
    result = child(a.child, a.quick, a.steps)
    with open(a.out, "w") as f:
      json.dump(result, f)
    return
  start, results = time.monotonic(), {}
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  for name in a.jobs.split(","):
    left = a.budget_s - (time.monotonic() - start)
    if left < 30:
      results[name] = {"skipped": "out of time"}
      continue
    tmp = a.out + ".child.json"
    cmd = [sys.executable, __file__, "--child", name, "--out", tmp, "--steps", str(a.steps)] + (
        ["--quick"] if a.quick else [])
    t0 = time.monotonic()
    try:
      env = os.environ | ENV.get(name, {})
      if a.profile_dir and name == a.profile_job:  # the trace, and the step's compiled HLO beside it
        env["XLT_PROFILE_DIR"] = a.profile_dir
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={a.profile_dir}/hlo --xla_dump_hlo_as_text"
                            " --xla_dump_hlo_module_re=.*step.*").strip()
      proc = subprocess.run(cmd, timeout=left, capture_output=True, text=True, env=env)
      if proc.returncode == 0:
        with open(tmp) as f:
          results[name] = json.load(f)
      else:
        results[name] = {"error": proc.stderr[-3000:]}
    except subprocess.TimeoutExpired:
      results[name] = {"error": f"timed out after {left:.0f} s"}
    results[name]["wall_s"] = time.monotonic() - t0
    print(name, json.dumps(results[name])[:1500], flush=True)
    write(a.out, results, time.monotonic() - start, a.quick)
  if os.path.exists(a.out + ".child.json"):
    os.remove(a.out + ".child.json")


if __name__ == "__main__":
  main()
