"""The training loop for an ensemble of models: data, jitted steps, periodic held-out
evaluation, per-member early stopping, metrics and checkpoints.

Each member stops on its own once its held-out score has not improved by `min_delta`
for `patience` evaluations (or reached `target_score`), but never before `min_steps`
(tasks like addition sit on a long plateau before they learn). A stopped member drops
out of the compiled step (its state stays as it was), and the loop ends when all have
stopped or after `train.steps` steps.

With several processes (xlt.distributed) every process runs this loop on the same global
state: each reads its own rows of every batch, and only process 0 logs and writes metrics.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Callable, Sequence

import jax
import numpy as np
import optax
from tqdm.auto import tqdm

from xlt import checkpoint as ckpt_lib
from xlt import distributed
from xlt import ensemble as ensemble_lib
from xlt import lora as lora_lib
from xlt import metrics as metrics_lib
from xlt import model as model_lib
from xlt import neurons as neurons_lib
from xlt import sharding
from xlt import train as train_lib
from xlt.data import pipeline


@dataclasses.dataclass(frozen=True)
class Member:
  """One model of the ensemble and what it trains on.

  A plain member has one training set and trains every parameter. A member trained by
  partitions (xlt.partition) gives, per phase, a training set and which partition cells the
  phase updates (`trainable`, flags over the ensemble's cells); phases take turns,
  `steps_per_phase` steps each (simultaneous partition training), or there is one phase
  (a frozen partition).
  """

  name: str  # e.g. "mixed/seed_1": the run name in logs
  seed: int  # initialisation and data order
  train: dict | tuple[dict, ...]  # {"tokens": [N, T], "loss_mask": [N, T-1]}, or one per phase
  trainable: tuple[tuple[bool, ...], ...] | None = None  # per phase: flags over partition cells
  steps_per_phase: int = 1

  @property
  def phases(self) -> tuple[dict, ...]:
    return (self.train,) if isinstance(self.train, dict) else tuple(self.train)


def member_streams(members: Sequence[Member], batch_size: int, rows: np.ndarray | None = None):
  """Each member's grain stream (only `rows` of each batch, when given: this process's share).
  When any member trains by partitions, every batch carries `trainable` flags (all on for the
  plain members), which the gated optimizer reads."""
  cells = {len(f) for m in members if m.trainable is not None for f in m.trainable}
  if len(cells) > 1:
    raise ValueError(f"members disagree on the number of partition cells: {sorted(cells)}")
  streams = []
  for m in members:
    flags = m.trainable
    if flags is None and cells:
      flags = [[True] * next(iter(cells))] * len(m.phases)
    streams.append(pipeline.phased_batches(m.phases, flags, batch_size, m.seed, m.steps_per_phase, rows))
  return streams


def train_ensemble(c, model_cfg: model_lib.Config, members: Sequence[Member],
                   evaluate: Callable[[object, np.ndarray], Sequence[float]] | None, workdir: str, *,
                   tx: optax.GradientTransformation | None = None, mesh=None,
                   stop_after: int | None = None, progress: bool = True, init_params=None):
  """Trains the members together, from random initialisations or from `init_params`
  (stacked [E, ...], one model per member: fine-tuning). `evaluate(params, member_ids)` returns one held-out
  score (higher is better) for each of the given members, whose stacked params it gets.
  `stop_after` ends the call early (as a crash would) without finishing the run: a later
  call resumes from the last checkpoint.

  Returns dict(state, history, stopped_at, tokens_per_s, finished).
  """
  t = c.train
  if t.steps <= 0 or t.batch_size <= 0:
    raise ValueError(f"train.steps and train.batch_size must be positive, got {t.steps}, {t.batch_size}")
  mesh = mesh or sharding.make_mesh(c.mesh)
  sharding.check_batch(t.batch_size, mesh)
  accum = int(t.get("grad_accum", 1))
  if t.batch_size % accum:
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by train.grad_accum={accum}")
  rules = tuple(tuple(r) for r in c.get("sharding_rules", sharding.DEFAULT_RULES))
  tx = tx or train_lib.make_optimizer(c.opt)
  seeds = [m.seed for m in members]

  def abstract_state(n):
    # from init_params when given: a LoRA composite (xlt.lora) is not the model's own tree
    params = None if init_params is None else jax.tree.map(lambda x: x[:n], init_params)
    return jax.eval_shape(lambda: train_lib.init_state(model_cfg, tx, seeds[:n], params))

  if init_params is not None:
    want = jax.eval_shape(lambda: jax.vmap(lambda k: model_lib.init_params(model_cfg, k))(
        jax.random.split(jax.random.key(0), len(members))))
    base = (init_params["base"] if lora_lib.is_composite(init_params) else
            init_params["params"] if neurons_lib.is_composite(init_params) else init_params)
    if jax.tree.map(lambda x: x.shape, base) != jax.tree.map(lambda x: x.shape, want):
      raise ValueError("init_params do not match the model config (one model per member, stacked)")

  platform = mesh.devices.flat[0].platform
  strategy = ensemble_lib.resolve(t.get("ensemble", "auto"), platform, mesh=mesh, members=len(members))
  progress = progress and distributed.is_main()  # one progress bar, not one per process
  if progress:  # which strategy ran belongs in the run's log (main.py keeps absl at WARNING)
    tqdm.write(f"training {len(members)} members together: {strategy} over the ensemble axis on {platform}, "
               f"mesh {dict(mesh.shape)}")

  @functools.lru_cache(maxsize=None)
  def step_for(n):  # one compiled step per ensemble size: stopped members drop out
    s = t.get("ensemble", "auto")
    if s == "devices" and n < len(members) and ensemble_lib.why_not_devices(mesh, n) is not None:
      s = "map"  # members stopped, fewer are left than devices (at the start resolve raises)
    return train_lib.make_step(model_cfg, tx, mesh, rules, abstract_state(n), accum, gated, s)

  gated = any(m.trainable is not None for m in members)
  _, state_sh, batch_sh = step_for(len(members))
  seq = members[0].phases[0]["tokens"].shape[1] - 1
  rows = None
  if distributed.multi_process():  # this process reads only the rows its devices hold
    rows = distributed.local_rows(batch_sh["tokens"], (len(members), t.batch_size, seq + 1), axis=1)
  data = pipeline.stack(member_streams(members, t.batch_size, rows))
  mngr = ckpt_lib.manager(os.path.join(workdir, "ckpt"))
  restored = ckpt_lib.restore(mngr, ckpt_lib.abstract(abstract_state(len(members)), state_sh), data)
  if restored is None:
    with jax.set_mesh(mesh):
      # the seeds are an argument, not constants: one program for any seeds of this size
      state = jax.jit(lambda s, p: train_lib.init_state(model_cfg, tx, s, p),
                      out_shardings=state_sh)(np.asarray(seeds, np.uint32), init_params)
    loop = {"step": 0, "best": [-np.inf] * len(members), "since_best": [0] * len(members),
            "history": [[] for _ in members], "stopped_at": [None] * len(members)}
  else:
    state, loop = restored
  writer = metrics_lib.Writer(workdir, [m.name for m in members])
  schedule = train_lib.make_schedule(c.opt)

  # `state` holds every member (for checkpoints and the result); `live` the indices of
  # the members still training and `sub` a copy of their state, which the compiled step
  # updates (and donates). `merged()` is the current state of every member.
  def split(full):
    live = np.flatnonzero(np.asarray(full["active"]))
    return live, ensemble_lib.take(full, live)

  def merged():
    return sub if len(live) == len(members) else ensemble_lib.put(state, live, sub)

  def evaluate_and_stop(step):
    nonlocal state, live, sub
    state = merged()
    scores = np.asarray(evaluate(sub["params"], live), float)  # only members still training
    active = np.asarray(state["active"]).copy()
    for i, s in zip(live, scores):
      m = members[i]
      loop["history"][i].append([step, float(s)])
      writer.write(step, m.name, {"val_score": s})
      if s > loop["best"][i] + t.min_delta:
        loop["best"][i], loop["since_best"][i] = float(s), 0
      else:
        loop["since_best"][i] += 1
      if step >= t.get("min_steps", 0) and (loop["since_best"][i] >= t.patience or s >= t.target_score):
        active[i] = False
        loop["stopped_at"][i] = step
    state = jax.device_put({**state, "active": active}, state_sh)
    live, sub = split(state)
    writer.flush()

  live, sub = split(state)
  start = loop["step"]
  bar = tqdm(total=t.steps, initial=start, disable=not progress, desc=os.path.basename(workdir) or "train",
             dynamic_ncols=True)
  pending, timer, timed_steps, tok_s = None, None, 0, float("nan")
  step = start
  with jax.set_mesh(mesh):
    while step < t.steps and len(live):
      if stop_after is not None and step >= stop_after:
        break
      batch = next(data)
      if len(live) < len(members):
        batch = {k: v[live] for k, v in batch.items()}
      if rows is not None:
        batch = distributed.global_batch(batch, batch_sh)
      sub, metrics = step_for(len(live))[0](sub, batch)
      if rows is not None and platform == "cpu":
        # XLA:CPU across processes: a host-side op (the lr for the log, an evaluation's
        # indexing) dispatched while a step waits in a cross-process collective hung the run
        # for good, at random steps, on a 2-core machine; so each step finishes first.
        jax.block_until_ready(metrics)
      step += 1
      # Read the previous step's metrics only now, so the host never waits on the step
      # it just dispatched.
      if pending is not None and pending[0] % t.log_every == 0:
        p_step, p_live, p_metrics = pending
        loss, gnorm = np.asarray(p_metrics["loss"]), np.asarray(p_metrics["grad_norm"])
        if timer is not None and timed_steps:
          tok_s = t.batch_size * seq * timed_steps / (time.perf_counter() - timer)
        for j, i in enumerate(p_live):
          writer.write(p_step, members[i].name, {"loss": loss[j], "lr": schedule(p_step),
                                                 "grad_norm": gnorm[j], "tokens_per_s": tok_s})
        bar.set_postfix(loss=f"{loss.mean():.3f}", tok_s=f"{tok_s:,.0f}", live=len(p_live))
        timer, timed_steps = time.perf_counter(), 0
      pending = (step, live, metrics)
      timed_steps += len(live)
      if timer is None:  # first step compiled: start timing from here
        jax.block_until_ready(metrics)
        timer, timed_steps = time.perf_counter(), 0
      bar.update(1)
      if evaluate is not None and (step % t.eval_every == 0 or step == t.steps):
        # the step's collectives finish before evaluation's programs start: on XLA:CPU the
        # devices share one thread pool, and a collective left waiting beside another
        # program's once aborted a run (rendezvous timeout) on a busy 2-core machine
        jax.block_until_ready(sub)
        evaluate_and_stop(step)
        timer, timed_steps = None, 0  # evaluation time is not training time
      loop["step"] = step
      if step % t.checkpoint_every == 0 or step == t.steps:
        ckpt_lib.save(mngr, step, merged(), data, loop)
  state = merged()
  bar.close()
  finished = step >= t.steps or not len(live)
  if finished and mngr.latest_step() != step:
    ckpt_lib.save(mngr, step, state, data, loop)
  mngr.wait_until_finished()
  writer.close()
  for i in range(len(members)):
    if loop["stopped_at"][i] is None and finished:
      loop["stopped_at"][i] = step
  return {"state": state, "history": loop["history"], "stopped_at": loop["stopped_at"],
          "tokens_per_s": tok_s, "finished": finished, "step": step}


def best_steps(history, stopped_at) -> list:
  """Per member, the step of its best held-out score (the first, on ties; as
  `checkpoint.BestParams` keeps it), or where it stopped if it was never evaluated."""
  return [max(h, key=lambda sv: sv[1])[0] if h else s for h, s in zip(history, stopped_at)]
