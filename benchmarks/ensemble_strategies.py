"""The graph config's 9 members: how one process best steps an ensemble.

  python benchmarks/ensemble_strategies.py [--rounds 2] [--steps 20]

Times xlt's training step of compare.py's ensemble job (9 graph models, batch 64 x 29 tokens)
two ways, in rounds, each in a fresh process:
  * together: the 9 members in one step on every core (the strategy `auto` picks,
    xlt.ensemble: on a CPU `map`, each member's step data-parallel over the devices);
  * separate: 9 single-member states stepped one after the other.
Prints member-steps per second for each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.compare import OPT, median_seconds, plan  # noqa: E402  (imports neither jax nor torch)


def _job():
  return next(j for j in plan() if j["kind"] == "ensemble")


def worker(mode: str, members: list[int], steps: int, out: str):
  import jax
  import ml_collections
  import numpy as np

  from xlt import ensemble, sharding
  from xlt import model as model_lib
  from xlt import train as train_lib

  job = _job()
  cfg, b, t = model_lib.Config(**job["model"]), job["batch"], job["seq"]
  tx = train_lib.make_optimizer(ml_collections.ConfigDict(OPT))
  mesh = sharding.make_mesh({"data": -1})
  rng = np.random.default_rng(0)

  def step_and_states(n, copies):
    abstract = jax.eval_shape(lambda: train_lib.init_state(cfg, tx, list(range(n))))
    step, st_sh = train_lib.make_step(cfg, tx, mesh, sharding.DEFAULT_RULES, abstract)[:2]
    with jax.set_mesh(mesh):
      init = jax.jit(lambda s: train_lib.init_state(cfg, tx, s), out_shardings=st_sh)
      return step, [init(np.asarray(members[k * n:(k + 1) * n], np.uint32)) for k in range(copies)]

  n = len(members)
  step, states = step_and_states(n, 1) if mode != "separate" else step_and_states(1, n)
  width = n if mode != "separate" else 1
  batch = {"tokens": rng.integers(0, cfg.vocab_size, (width, b, t + 1)).astype(np.int32),
           "loss_mask": np.ones((width, b, t), np.float32)}

  def run():
    for i, s in enumerate(states):
      states[i], m = step(s, batch)
    jax.block_until_ready((states, m))

  with jax.set_mesh(mesh):
    for _ in range(3):  # compile and warm up
      run()
    seconds = median_seconds(run, 0, steps)
  strategy = "single-member steps" if mode == "separate" else ensemble.resolve()
  with open(out, "w") as f:
    json.dump({"members": n, "step_s": seconds, "devices": len(jax.devices()), "strategy": strategy}, f)


def _spawn(args):
  return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], cwd=REPO,
                          stderr=subprocess.PIPE, text=True)


def _wait(proc):
  err = proc.communicate()[1]
  if proc.returncode:
    sys.exit(f"a worker failed (exit {proc.returncode}):\n{err[-3000:]}")


def one_round(tmp: str, r: int, steps: int) -> dict:
  members = list(range(_job()["members"]))
  out = {}
  for mode in ("together", "separate"):
    path = os.path.join(tmp, f"{mode}_{r}.json")
    _wait(_spawn(["--worker", mode, "--members", json.dumps(members), "--steps", str(steps), "--out", path]))
    out[mode] = json.load(open(path))
  return out


def rates(rnd: dict) -> dict:
  """Member-steps per second of each way."""
  e = rnd["together"]["members"]
  return {k: e / rnd[k]["step_s"] for k in ("together", "separate")}


def main(a):
  rounds = []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(a.rounds):
      rounds.append(one_round(tmp, r, a.steps))
      print(f"round {r + 1}: " + json.dumps({k: round(v, 2) for k, v in rates(rounds[-1]).items()}), file=sys.stderr,
            flush=True)
  per = [rates(r) for r in rounds]
  med = lambda k: sorted(p[k] for p in per)[len(per) // 2]
  first = rounds[0]
  print(f"9 graph models (batch 64 × 29), member-steps/s, median of {a.rounds} round(s) of {a.steps} timed steps; "
        f"{first['together']['devices']} device(s)")
  print("| way | member-steps/s | / separate | per round |")
  print("|---|---|---|---|")
  for k in ("separate", "together"):
    label = {"separate": "9 single-member steps",
             "together": f"one 9-member step ({first['together']['strategy']}, xlt's default)"}[k]
    print(f"| {label} | {med(k):.2f} | {med(k) / med('separate'):.2f} | "
          + " / ".join(f"{p[k]:.2f}" for p in per) + " |")


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--steps", type=int, default=20, help="timed steps per way and round")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  p.add_argument("--members", help=argparse.SUPPRESS)
  p.add_argument("--out", help=argparse.SUPPRESS)
  a = p.parse_args()
  if a.worker:
    from xlt import allocator, cpu_devices
    cpu_devices.configure()  # before jax: pins to XLT_CPU_CORES, one device per core
    allocator.preload()
    worker(a.worker, json.loads(a.members), a.steps, a.out)
  else:
    main(a)
