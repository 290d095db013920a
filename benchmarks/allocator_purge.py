"""How mimalloc returns freed memory, measured on training steps: its default purge
(MIMALLOC_PURGE_DECOMMITS=1: MADV_DONTNEED, the pages leave the process at once) against
MADV_FREE (=0: the kernel takes them only when memory runs short), xlt.allocator's setting.

  python benchmarks/allocator_purge.py [--rounds 2] [--steps 12] [--workdir runs/finetune] \\
      [--out results/exploratory/allocator_purge.json]

An XLA:CPU step frees and reallocates buffers of up to hundreds of MB (activations, gradients,
Adam's new moments). A page purged with MADV_DONTNEED is faulted in and zeroed by the kernel
when the next step writes it again: system time that comes and goes with mimalloc's purge
timing (MIMALLOC_PURGE_DELAY), so some steps run at their usual speed and others much slower.
Each job runs in fresh processes, one per setting, the settings alternating order each round;
a process compiles the step, runs 3 steps unmeasured, then times --steps steps. Reported per
job and setting: the mean and median step time (the mean is what a run's throughput sees),
the share of steps slower than 1.5x the job's median over both settings, system time and minor
page faults per step (getrusage), and the process's peak RSS.

Jobs: compare.py's training jobs by name (graph_29, text_proxy, ...) and finetune:<shape>/<mode>
(benchmarks/finetune_step.py's xlt step with the optimizer update in the map, as it was measured
here, not the fine-tuning kind's "auto", on the checkpoints it wrote under --workdir; with
transformers installed, `benchmarks/finetune_step.py --quick --shapes=tiny,small,medium
--workdir=DIR` writes them). Training values do not depend on the allocator
(tests/test_allocator.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # xlt/
sys.path.insert(0, HERE)  # results_file.py, profile_step.py

SETTINGS = {"decommit (mimalloc's default)": "1", "MADV_FREE (xlt's)": "0"}
JOBS = ("finetune:tiny/full", "finetune:small/full", "finetune:small/lora", "finetune:small/static",
        "finetune:medium/full", "text_proxy", "addition_ref")


def child(a) -> None:
  """One job's steps in this process (re-executed with mimalloc preloaded); prints a JSON line."""
  from xlt import allocator, cpu_devices

  cpu_devices.configure()
  allocator.preload()
  import resource

  import jax

  import profile_step

  job = argparse.Namespace(job=a.child, workdir=a.workdir, update="map")
  mesh, step, state, batch, _ = profile_step.job_setup(job)
  with jax.set_mesh(mesh):
    compiled = step.lower(state, batch).compile()
    for _ in range(3):
      state, _ = compiled(state, batch)
      jax.block_until_ready(state)
    times, before = [], resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(a.steps):
      start = time.perf_counter()
      state, _ = compiled(state, batch)
      jax.block_until_ready(state)
      times.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
  print(json.dumps({"malloc": allocator.in_use(), "times": times,
                    "sys_s": (after.ru_stime - before.ru_stime) / a.steps,
                    "minflt": (after.ru_minflt - before.ru_minflt) / a.steps, "maxrss_mib": after.ru_maxrss / 1024}))


def run_child(job: str, decommits: str, a) -> dict:
  env = dict(os.environ, XLT_ALLOCATOR="mimalloc", MIMALLOC_PURGE_DECOMMITS=decommits)
  env.pop("LD_PRELOAD", None)
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", job, "--steps", str(a.steps),
                        "--workdir", a.workdir], env=env, capture_output=True, text=True)
  if out.returncode:
    raise SystemExit(f"{job} (MIMALLOC_PURGE_DECOMMITS={decommits}) failed: {out.stderr.strip()[-1500:]}")
  got = json.loads(out.stdout.strip().splitlines()[-1])
  if got["malloc"] != "mimalloc":
    raise SystemExit(f"{job}: the child ran with {got['malloc']}, not mimalloc (pip install cmeel-mimalloc)")
  return got


def job_rows(job: str, runs: dict[str, list[dict]]) -> list[list]:
  every = [t for rs in runs.values() for r in rs for t in r["times"]]
  slow = 1.5 * statistics.median(every)
  rows = []
  for name, rs in runs.items():
    times = [t for r in rs for t in r["times"]]
    rows.append([job, name, 1e3 * statistics.fmean(times), 1e3 * statistics.median(times),
                 sum(t > slow for t in times) / len(times), 1e3 * statistics.fmean(r["sys_s"] for r in rs),
                 statistics.fmean(r["minflt"] for r in rs), max(r["maxrss_mib"] for r in rs)])
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--jobs", default=",".join(JOBS), help="comma-separated")
  p.add_argument("--rounds", type=int, default=2, help="processes per job and setting")
  p.add_argument("--steps", type=int, default=12, help="steps timed per process")
  p.add_argument("--workdir", default=os.path.join(os.path.dirname(HERE), "runs", "finetune"),
                 help="finetune jobs: the checkpoints' directory")
  p.add_argument("--out", default="results/exploratory/allocator_purge.json")
  p.add_argument("--child", help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.child:
    return child(a)
  from importlib import metadata

  import results_file

  start, rows = time.perf_counter(), []
  for job in a.jobs.split(","):
    runs = {name: [] for name in SETTINGS}
    for r in range(a.rounds):
      for name in (list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]):
        runs[name].append(run_child(job, SETTINGS[name], a))
    rows += job_rows(job, runs)
    for row in rows[-len(SETTINGS):]:
      print(row, flush=True)
  results_file.write(
      a.out, benchmark="allocator_purge", title="mimalloc's purge: decommit against MADV_FREE, per training step",
      columns=["job", "purge", "mean ms", "median ms", "slow steps", "system ms / step", "minor faults / step",
               "peak RSS MiB"],
      rows=rows, wall_s=time.perf_counter() - start,
      versions={k: metadata.version(k) for k in ("jax", "cmeel-mimalloc")},
      notes=f"{a.rounds} fresh processes per job and setting (alternating), {a.steps} timed steps each after 3 "
            "unmeasured; 'slow steps': the share over 1.5x the job's median over both settings; mimalloc "
            "preloaded (xlt.allocator), MIMALLOC_PURGE_DECOMMITS set to 1 (mimalloc's default) or 0.")


if __name__ == "__main__":
  main()
