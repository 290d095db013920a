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
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm.auto import tqdm

from xlt import checkpoint as ckpt_lib
from xlt import composite
from xlt import distributed
from xlt import ensemble as ensemble_lib
from xlt import metrics as metrics_lib
from xlt import model as model_lib
from xlt import progress as progress_lib
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


# The checkpointed part of the loop state (xlt.checkpoint saves it as JSON beside the state).
_BOOK = ("step", "best", "since_best", "history", "stopped_at")


@dataclasses.dataclass
class _Run:
  """What one call of `train_ensemble` sets up once; the loop's steps read it."""

  t: ml_collections.ConfigDict  # the `train` config
  members: Sequence[Member]
  evaluate: Callable[[object, np.ndarray], Sequence[float]] | None
  mesh: jax.sharding.Mesh
  platform: str
  step_for: Callable[[int], tuple]  # live members -> (jitted step, state shardings, batch shardings)
  state_sh: dict
  batch_sh: dict
  rows: np.ndarray | None  # with several processes, this process's rows of every batch
  seq: int
  data: object  # grain iterator of the members' stacked batches
  mngr: ocp.CheckpointManager
  progress: bool
  writer: metrics_lib.Writer | None = None
  schedule: optax.Schedule | None = None
  bar: tqdm | None = None


@dataclasses.dataclass
class LoopState:
  """Where the loop stands.

  `state` holds every member (for checkpoints and the result); `live` the indices of the
  members still training and `sub` a copy of their state, which the compiled step updates
  (and donates); `_merged` is the current state of every member. The fields of `_BOOK`
  (early stopping, history) are checkpointed with the state; the rest belongs to this call:
  the last step's metrics, read one step late, and timing.
  """

  state: dict
  step: int
  best: list  # per member: best held-out score
  since_best: list  # per member: evaluations since it
  history: list  # per member: [[step, score], ...]
  stopped_at: list  # per member: the step it stopped at, or None
  live: np.ndarray | None = None
  sub: dict | None = None
  pending: tuple | None = None  # (step, live, metrics) of the step dispatched last
  timer: float | None = None  # start of the timing window; None: the next step starts one
  timed_steps: int = 0  # member-steps in the window
  tok_s: float = float("nan")  # the rate the log lines report: that of their last window
  total_steps: int = 0  # member-steps and seconds of every closed window: the call's rate
  total_s: float = 0.0

  def checkpointed(self) -> dict:
    return {k: getattr(self, k) for k in _BOOK}


def train_ensemble(c, model_cfg: model_lib.Config, members: Sequence[Member],
                   evaluate: Callable[[object, np.ndarray], Sequence[float]] | None, workdir: str, *,
                   tx: optax.GradientTransformation | None = None, mesh=None,
                   stop_after: int | None = None, progress: bool = True, init_params=None):
  """Trains the members together, from random initialisations or from `init_params`
  (stacked [E, ...], one model per member: fine-tuning; plain or composite, xlt.composite).
  `evaluate(params, member_ids)` returns one held-out score (higher is better) for each of the
  given members, whose stacked params it gets. `stop_after` ends the call early (as a crash
  would) without finishing the run: a later call resumes from the last checkpoint.

  Returns dict(state, history, stopped_at, tokens_per_s, finished, step). tokens_per_s is what
  this call measured: tokens (of all members) per second over the steps it ran after its first
  one, which compiles, and after the first step following each evaluation, evaluation not
  counted; NaN when it timed no step (it ran none, or only that first one).
  """
  run, tx, seeds = _setup(c, model_cfg, members, evaluate, workdir, tx, mesh, progress, init_params)
  ls = _restore_or_init(run, model_cfg, tx, seeds, init_params)
  run.writer = metrics_lib.Writer(workdir, [m.name for m in members])
  run.schedule = train_lib.make_schedule(c.opt)
  run.bar = progress_lib.Progress(run.t.steps, ls.step, os.path.basename(workdir) or "train", run.progress)
  if ls.step:
    done = ls.step >= run.t.steps or not len(ls.live)
    run.bar.note(f"{run.bar.desc}: resuming from the checkpoint of step {ls.step} of {run.t.steps}"
                 + (": it had finished" if done else f", {len(ls.live)} of {len(members)} models still training"))
  with jax.set_mesh(run.mesh):
    while ls.step < run.t.steps and len(ls.live) and (stop_after is None or ls.step < stop_after):
      _iteration(run, ls)
  return _finish(run, ls)


def _setup(c, model_cfg, members, evaluate, workdir, tx, mesh, progress, init_params):
  """Checks the config, builds the compiled steps and the data: (run, tx, seeds)."""
  t = c.train
  if t.steps <= 0 or t.batch_size <= 0:
    raise ValueError(f"train.steps and train.batch_size must be positive, got {t.steps}, {t.batch_size}")
  mesh = mesh or sharding.make_mesh(c.mesh)
  sharding.check_batch(t.batch_size, mesh)
  accum = int(t.get("grad_accum", 1))
  if t.batch_size % accum:
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by train.grad_accum={accum}")
  tx = tx or train_lib.make_optimizer(c.opt)
  seeds = [m.seed for m in members]
  if init_params is not None:
    _check_init_params(model_cfg, init_params, len(members))
  platform = mesh.devices.flat[0].platform
  strategy = ensemble_lib.resolve(t.get("ensemble", "auto"), platform)
  progress = progress and distributed.is_main()  # one progress bar, not one per process
  if progress:  # which strategy ran belongs in the run's log (main.py keeps absl at WARNING)
    tqdm.write(f"training {len(members)} model(s) together in one compiled step (train.ensemble="
               f"{t.get('ensemble', 'auto')}: {strategy}), on {platform} devices {dict(mesh.shape)}")
  step_for = step_builder(c, model_cfg, members, tx, mesh, accum, init_params)
  _, state_sh, batch_sh = step_for(len(members))
  seq = members[0].phases[0]["tokens"].shape[1] - 1
  rows = None
  if distributed.multi_process():  # this process reads only the rows its devices hold
    rows = distributed.local_rows(batch_sh["tokens"], (len(members), t.batch_size, seq + 1), axis=1)
  data = pipeline.stack(member_streams(members, t.batch_size, rows))
  mngr = ckpt_lib.manager(os.path.join(workdir, "ckpt"))
  run = _Run(t, members, evaluate, mesh, platform, step_for, state_sh, batch_sh, rows, seq, data, mngr, progress)
  return run, tx, seeds


def abstract_state(model_cfg, tx, seeds, init_params):
  """The state's shapes for `seeds`' members, from init_params when given: a composite
  (xlt.composite) is not the model's own tree. `init_params` may be shapes alone
  (jax.ShapeDtypeStruct: xlt.plan compiles the step for them)."""
  n = len(seeds)
  return jax.eval_shape(lambda p: train_lib.init_state(
      model_cfg, tx, seeds, None if p is None else jax.tree.map(lambda x: x[:n], p)), init_params)


def _check_init_params(model_cfg, init_params, n: int):
  want = jax.eval_shape(lambda: jax.vmap(lambda k: model_lib.init_params(model_cfg, k))(
      jax.random.split(jax.random.key(0), n)))
  shapes = lambda tree: jax.tree.map(lambda x: x.shape, tree)
  if shapes(composite.base(init_params)) != shapes(want):
    raise ValueError("init_params do not match the model config (one model per member, stacked)")


def step_builder(c, model_cfg, members, tx, mesh, accum: int, init_params) -> Callable[[int], tuple]:
  """live members -> (jitted step, state shardings, batch shardings): one compiled step per
  ensemble size, since stopped members drop out."""
  t = c.train
  rules = tuple(tuple(r) for r in c.get("sharding_rules", sharding.DEFAULT_RULES))
  gated = any(m.trainable is not None for m in members)
  seeds = [m.seed for m in members]

  @functools.lru_cache(maxsize=None)
  def step_for(n):
    s = t.get("ensemble", "auto")
    abstract = abstract_state(model_cfg, tx, seeds[:n], init_params)
    return train_lib.make_step(model_cfg, tx, mesh, rules, abstract, accum, gated, s, update=t.get("update", "map"))

  return step_for


def _restore_or_init(run: _Run, model_cfg, tx, seeds, init_params) -> LoopState:
  """The loop state from the run's newest checkpoint, or a fresh one."""
  abstract = abstract_state(model_cfg, tx, seeds, init_params)
  restored = ckpt_lib.restore(run.mngr, ckpt_lib.abstract(abstract, run.state_sh), run.data)
  if restored is None:
    with jax.set_mesh(run.mesh):
      # the seeds are an argument, not constants: one program for any seeds of this size
      state = jax.jit(lambda s, p: train_lib.init_state(model_cfg, tx, s, p),
                      out_shardings=run.state_sh)(np.asarray(seeds, np.uint32), init_params)
    n = len(seeds)
    book = {"step": 0, "best": [-np.inf] * n, "since_best": [0] * n,
            "history": [[] for _ in range(n)], "stopped_at": [None] * n}
  else:
    state, book = restored
  live, sub = _split(state)
  return LoopState(state=state, live=live, sub=sub, **{k: book[k] for k in _BOOK})


def _split(full):
  """(indices of the members still training, a copy of their state)."""
  live = np.flatnonzero(np.asarray(full["active"]))
  return live, ensemble_lib.take(full, live)


def _merged(run: _Run, ls: LoopState):
  """The current state of every member."""
  return ls.sub if len(ls.live) == len(run.members) else ensemble_lib.put(ls.state, ls.live, ls.sub)


def _iteration(run: _Run, ls: LoopState):
  """One training step, the previous step's log line, and when due an evaluation (early
  stopping) and a checkpoint."""
  metrics = _train_step(run, ls)
  _log_previous(run, ls)
  _time(ls, metrics)
  run.bar.update(ls.step)
  t = run.t
  if run.evaluate is not None and (ls.step % t.eval_every == 0 or ls.step == t.steps):
    _evaluate_and_stop(run, ls)
  if ls.step % t.checkpoint_every == 0 or ls.step == t.steps:
    ckpt_lib.save(run.mngr, ls.step, _merged(run, ls), run.data, ls.checkpointed())


def _train_step(run: _Run, ls: LoopState):
  """Dispatches the live members' step on the next batch; its metrics (not waited for)."""
  batch = next(run.data)
  if len(ls.live) < len(run.members):
    batch = {k: v[ls.live] for k, v in batch.items()}
  if run.rows is not None:
    batch = distributed.global_batch(batch, run.batch_sh)
  ls.sub, metrics = run.step_for(len(ls.live))[0](ls.sub, batch)
  if run.rows is not None and run.platform == "cpu":
    # XLA:CPU across processes: a host-side op (the lr for the log, an evaluation's
    # indexing) dispatched while a step waits in a cross-process collective hung the run
    # for good, at random steps, on a 2-core machine; so each step finishes first.
    jax.block_until_ready(metrics)
  ls.step += 1
  return metrics


def _log_previous(run: _Run, ls: LoopState):
  """The log line of the step before the one just dispatched, when due. Read the previous
  step's metrics only now, so the host never waits on the step it just dispatched."""
  if ls.pending is None or ls.pending[0] % run.t.log_every:
    return
  p_step, p_live, p_metrics = ls.pending
  loss, gnorm = np.asarray(p_metrics["loss"]), np.asarray(p_metrics["grad_norm"])
  _check_loss(run, p_step, p_live, loss)
  rate = _close_window(run, ls)
  ls.tok_s = ls.tok_s if rate is None else rate
  for j, i in enumerate(p_live):
    run.writer.write(p_step, run.members[i].name, {"loss": loss[j], "lr": run.schedule(p_step),
                                                   "grad_norm": gnorm[j], "tokens_per_s": ls.tok_s})
  run.bar.set_status(float(loss.mean()), ls.tok_s, len(p_live), len(run.members))
  if ls.timer is not None:  # (after an evaluation, the next step starts the window)
    ls.timer = time.perf_counter()


def _time(ls: LoopState, metrics):
  """Counts the step just dispatched in the timing window; the first step of a window only
  starts it (it compiles, or follows an evaluation, which may have dropped members)."""
  ls.pending = (ls.step, ls.live, metrics)
  ls.timed_steps += len(ls.live)
  if ls.timer is None:  # first step compiled: start timing from here
    jax.block_until_ready(metrics)
    ls.timer, ls.timed_steps = time.perf_counter(), 0


def _close_window(run: _Run, ls: LoopState) -> float | None:
  """Ends the timing window: its member-steps and seconds go to the call's totals. Its
  tokens/s, or None when it timed no step."""
  steps, ls.timed_steps = ls.timed_steps, 0
  if ls.timer is None or not steps:
    return None
  seconds = time.perf_counter() - ls.timer
  ls.total_steps, ls.total_s = ls.total_steps + steps, ls.total_s + seconds
  return run.t.batch_size * run.seq * steps / seconds


def _evaluate_and_stop(run: _Run, ls: LoopState):
  """Scores the members still training, records the scores, stops the members that are
  done (`_stops`) and drops them from the compiled step."""
  # the step's collectives finish before evaluation's programs start: on XLA:CPU the
  # devices share one thread pool, and a collective left waiting beside another
  # program's once aborted a run (rendezvous timeout) on a busy 2-core machine
  jax.block_until_ready(ls.sub)
  if ls.pending is not None:  # the step just finished: its loss is read at no extra wait
    _check_loss(run, ls.pending[0], ls.pending[1], np.asarray(ls.pending[2]["loss"]))
  _close_window(run, ls)
  ls.timer = None  # evaluation time is not training time
  ls.state = _merged(run, ls)
  scores = np.asarray(run.evaluate(ls.sub["params"], ls.live), float)  # only members still training
  active = np.asarray(ls.state["active"]).copy()
  for i, s in zip(ls.live, scores):
    ls.history[i].append([ls.step, float(s)])
    run.writer.write(ls.step, run.members[i].name, {"val_score": s})
    if _stops(run.t, ls, i, s):
      active[i] = False
      ls.stopped_at[i] = ls.step
      run.bar.note(_stop_note(run, ls, i, s))
  ls.state = jax.device_put({**ls.state, "active": active}, run.state_sh)
  ls.live, ls.sub = _split(ls.state)
  run.writer.flush()


class Diverged(ValueError):
  """A member's training loss became NaN or infinite: the stage stops, saying so (its scores
  would be those of NaN parameters, an accuracy of 0 that is no result)."""


def _check_loss(run: _Run, step: int, live, loss: np.ndarray) -> None:
  """Called only where the loss is on the host already (a log line, an evaluation, the end),
  so a healthy run gains no wait on the device."""
  if bad := [j for j in range(len(live)) if not np.isfinite(loss[j])]:
    name = run.members[live[bad[0]]].name
    raise Diverged(f"{run.bar.desc}: training diverged: {name}'s loss is {float(loss[bad[0]])} at step {step} "
                   "(its parameters are no model; a lower opt.peak_lr or opt.clip may help)")


def _stop_note(run: _Run, ls: LoopState, i: int, score: float) -> str:
  """Why member i stops training at this step, in words."""
  t, name = run.t, run.members[i].name
  best_step = max(ls.history[i], key=lambda sv: sv[1])[0]
  why = (f"it reached the target score {t.target_score}" if score >= t.target_score else
         f"its validation score has not improved on its best ({ls.best[i]:.4f}, step {best_step}) for "
         f"{ls.since_best[i]} evaluations (train.patience={t.patience}); its best parameters are kept")
  return f"{run.bar.desc}: {name} stops early at step {ls.step} of {t.steps}: {why}"


def _stops(t, ls: LoopState, i: int, score: float) -> bool:
  """Records member i's new score against its best; whether it stops now: `patience`
  evaluations without a gain of `min_delta`, or the target reached, but not before
  `min_steps`."""
  if score > ls.best[i] + t.min_delta:
    ls.best[i], ls.since_best[i] = float(score), 0
  else:
    ls.since_best[i] += 1
  return ls.step >= t.get("min_steps", 0) and (ls.since_best[i] >= t.patience or score >= t.target_score)


def _finish(run: _Run, ls: LoopState) -> dict:
  """The last checkpoint (when the run is finished) and the result."""
  if ls.timer is not None and ls.timed_steps:  # the steps since the last log line count too
    jax.block_until_ready(ls.sub)
    _close_window(run, ls)
  ls.state = _merged(run, ls)
  run.bar.close()
  if ls.pending is not None:  # the last step's loss, once, before its state is the final checkpoint
    _check_loss(run, ls.pending[0], ls.pending[1], np.asarray(ls.pending[2]["loss"]))
  finished = ls.step >= run.t.steps or not len(ls.live)
  if ls.step < run.t.steps and not len(ls.live) and run.bar.started is not None:  # (this call trained)
    run.bar.note(f"{run.bar.desc}: ends at step {ls.step} of {run.t.steps}: every model stopped early")
  if finished and run.mngr.latest_step() != ls.step:
    ckpt_lib.save(run.mngr, ls.step, ls.state, run.data, ls.checkpointed())
  ckpt_lib.wait(run.mngr)
  run.writer.close()
  if finished:
    ls.stopped_at = [ls.step if s is None else s for s in ls.stopped_at]
  tok_s = run.t.batch_size * run.seq * ls.total_steps / ls.total_s if ls.total_steps else float("nan")
  return {"state": ls.state, "history": ls.history, "stopped_at": ls.stopped_at,
          "tokens_per_s": tok_s, "finished": finished, "step": ls.step}


def best_steps(history, stopped_at) -> list:
  """Per member, the step of its best held-out score (the first, on ties; as
  `checkpoint.BestParams` keeps it), or where it stopped if it was never evaluated."""
  return [max(h, key=lambda sv: sv[1])[0] if h else s for h, s in zip(history, stopped_at)]
