"""Defaults shared by every config: model, training loop, optimizer, evaluation, mesh.

Each builder returns a ConfigDict of every field (so any of them can be overridden on the
command line) with the given values replacing the defaults.
"""

import ml_collections


def _dict(defaults: dict, overrides: dict) -> ml_collections.ConfigDict:
  unknown = set(overrides) - set(defaults)
  if unknown:
    raise ValueError(f"unknown fields {sorted(unknown)}; known: {sorted(defaults)}")
  return ml_collections.ConfigDict({**defaults, **overrides})


def model(**overrides) -> ml_collections.ConfigDict:
  # vocab_multiple: the embedding table is padded to a multiple of this (unused ids), so
  # the vocab axis splits evenly over a tensor-parallel mesh axis.
  return _dict(dict(num_layers=6, num_heads=4, d_model=64, block_size=128, mlp_ratio=4,
                    tie_embeddings=False, dtype="float32", vocab_multiple=8,
                    pos_embedding="learned", rope_base=10000.0, dropout=0.0), overrides)


def train(**overrides) -> ml_collections.ConfigDict:
  """The loop: steps, batch, and per-member early stopping on the held-out score
  (stop after `patience` evaluations without a gain of `min_delta`, or at `target_score`,
  but not before `min_steps`). `ensemble`: how members train together (xlt.ensemble: auto =
  lax.map on CPU, each member's step data-parallel over the devices; vmap on accelerators).
  `update`: where a mapped step's optimizer update runs (xlt.train.ensemble_step): "map" (exact:
  the committed results bit for bit) or "auto" (vmapped over the stacked state, in place; the
  same values to float rounding; its speed: docs/speed.md)."""
  return _dict(dict(batch_size=64, steps=1000, grad_accum=1, eval_every=100, patience=5,
                    min_delta=0.005, target_score=1.0, min_steps=0, log_every=50,
                    checkpoint_every=500, ensemble="auto", update="map"), overrides)


def opt(train_config: ml_collections.ConfigDict, **overrides) -> ml_collections.ConfigDict:
  """AdamW; the schedule's length follows train.steps unless total_steps is given.
  state_dtype: the optimizer state's dtype ("" = the parameters'; "float32": fp32 Adam moments
  for bf16 parameters, xlt.train.with_state_dtype)."""
  c = _dict(dict(name="adamw", schedule="cosine", peak_lr=3e-3, warmup_steps=100, total_steps=0,
                 b1=0.9, b2=0.95, weight_decay=0.1, clip=1.0, state_dtype=""), overrides)
  if "total_steps" not in overrides:
    c.total_steps = train_config.get_ref("steps")
  return c


def mesh(**overrides) -> ml_collections.ConfigDict:
  """Mesh axes (one may be -1: all remaining devices); devices > 0 uses only the first n, and
  cpu_devices > 0 only the first n when the devices are a CPU's (xlt.cpu_devices)."""
  return _dict(dict(data=-1, fsdp=1, tensor=1, devices=-1, cpu_devices=-1), overrides)


def lm_eval(**overrides) -> ml_collections.ConfigDict:
  """How `eval.tasks` (lm-eval task names, xlt.eval.scores) run: num_fewshot -1 and limit 0 keep
  the task's own; metadata is JSON passed to the task configs (e.g. {"mgsm_dir": ...})."""
  return _dict(dict(batch_size=16, num_fewshot=-1, limit=0.0, include_path="", metadata="", max_gen_toks=256),
               overrides)


def eval_(**overrides) -> ml_collections.ConfigDict:
  return _dict(dict(batch_size=1000), overrides)


def eval_with_tasks(**overrides) -> ml_collections.ConfigDict:
  """`eval_` with `tasks`: lm-eval task names (xlt.eval.scores, in-process; the `eval` extra)
  scored on every model a kind writes, () = off; `lm_eval`: how they run (`lm_eval`)."""
  e = eval_(**overrides)
  e.tasks, e.lm_eval = (), lm_eval()
  return e
