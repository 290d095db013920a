"""Why a rerun of the merge testbed under another float rounding redraws its bases: training one
from scratch is chaotic. The testbed's base stage (configs/merge.py, one seed) is trained in
separate processes that differ only in how the batch is split over CPU devices (2 against
`XLT_CPU_DEVICES=1`), in float32 and in float64 (parameters, Adam state and compute), and once
more with the same devices as a determinism check:

  python benchmarks/testbed_chaos.py --out=results/benchmarks/testbed_chaos.json [--steps=600]

For each pair it prints the logged training loss of both runs at every 50 steps and their
relative difference |a - b| / a, and records the first step at which it passes 0.1% and 1%.
A same-device pair must agree exactly. If float64 only delays the split (a difference 10^9
times smaller reaching 1% a few hundred steps later), precision is no lever: a base trained
again is another base, and the testbed's stability has to be read with the bases either shared
(`--config.bases_from`) or redrawn (benchmarks/testbed_stability.py, docs/testbed.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xlt import results as results_lib  # noqa: E402

# float64 needs the parameters (and so Adam's moments) in float64 too, a model field the config
# files leave at its default: a config file that sets it
FLOAT64_CONFIG = '''from configs import merge


def get_config():
  c = merge.get_config()
  c.model.dtype = c.model.param_dtype = "float64"
  return c
'''
RUNS = {"float32, 2 devices": ("float32", 2), "float32, 1 device": ("float32", 1),
        "float32, 2 devices again": ("float32", 2), "float64, 2 devices": ("float64", 2),
        "float64, 1 device": ("float64", 1)}
PAIRS = (("float32, 2 devices", "float32, 2 devices again"), ("float32, 2 devices", "float32, 1 device"),
         ("float64, 2 devices", "float64, 1 device"))


def train_base(name: str, precision: str, devices: int, steps: int, tmp: str) -> dict[int, float]:
  """Trains seed 0's base for `steps` steps in a process of its own; {step: training loss}."""
  config = os.path.join(ROOT, "configs", "merge.py")
  env = dict(os.environ, XLT_CPU_DEVICES=str(devices), PYTHONPATH=ROOT)
  if precision == "float64":
    config = os.path.join(tmp, "merge_float64.py")
    with open(config, "w") as f:
      f.write(FLOAT64_CONFIG)
    env["JAX_ENABLE_X64"] = "1"
  workdir = os.path.join(tmp, name.replace(", ", "_").replace(" ", "_"))
  cmd = [sys.executable, "-m", "xlt.main", f"--config={config}", f"--workdir={workdir}", "--config.num_seeds=1",
         f"--stop_after={steps}"]
  done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit(f"testbed_chaos: {name} failed: {done.stderr.strip().splitlines()[-1:]}")
  with open(os.path.join(workdir, "base", "metrics.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r and r["step"] <= steps}


def divergence(a: dict[int, float], b: dict[int, float]) -> dict:
  """Per logged step the relative loss difference, and the first steps past 0.1% and 1%."""
  rel = {s: abs(a[s] - b[s]) / abs(a[s]) for s in sorted(a) if s in b}
  first = lambda level: next((s for s, r in rel.items() if r > level), None)
  return {"relative": rel, "first_above_0.1%": first(1e-3), "first_above_1%": first(1e-2),
          "identical": all(r == 0.0 for r in rel.values())}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, default=600, help="base training steps per run (of configs/merge.py's 2,000)")
  p.add_argument("--out", default="", help="write the losses and divergences as JSON here")
  a = p.parse_args(argv)
  t0, losses = time.time(), {}
  with tempfile.TemporaryDirectory() as tmp:
    for name, (precision, devices) in RUNS.items():  # one at a time: 2-device runs need both cores
      losses[name] = train_base(name, precision, devices, a.steps, tmp)
  pairs = {f"{x} | {y}": divergence(losses[x], losses[y]) for x, y in PAIRS}
  for key, d in pairs.items():
    x, y = key.split(" | ")
    print(f"\n{key}: first above 0.1% at step {d['first_above_0.1%']}, above 1% at step {d['first_above_1%']}")
    print("| step | loss, " + x + " | loss, " + y + " | relative difference |\n|---|---|---|---|")
    for s, r in d["relative"].items():
      print(f"| {s} | {losses[x][s]:.9f} | {losses[y][s]:.9f} | {r:.2e} |")
  result = {"command": "python benchmarks/testbed_chaos.py" + (f" --steps={a.steps}" if a.steps != 600 else ""),
            "steps": a.steps, "seed": 0, "wall_s": time.time() - t0, "losses": losses, "pairs": pairs}
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    results_lib.atomic_write(a.out, json.dumps(result, indent=1))
  same = pairs[f"{PAIRS[0][0]} | {PAIRS[0][1]}"]["identical"]
  print(f"\nsame devices twice: {'identical' if same else 'DIFFERENT (the runs are not deterministic)'}")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
