"""Time to first result of xlt's commands, as a new user meets them: with no persistent
compilation cache, with an empty one (the first run ever: cold) and with the one that run filled
(every later run: warm), the cache xlt's commands keep when XLT_COMPILATION_CACHE asks
(xlt/compile_cache.py; this script sets it per run).

  python benchmarks/cold_start.py --out=results/benchmarks/cold_start.json
  python benchmarks/cold_start.py --smoke     # one round, no file: checks the script runs

The commands, each on the tiny Llama fixture (tests/fixtures/hf/llama) with made-up words:
  generate      python -m xlt.generate: 8 prompts, 8 new tokens each
  merge_search  python -m xlt.merge_search: slerp's t over 3 trials, each scored on 8 prompts
  finetune      python -m xlt.main --config=configs/finetune.py: one step of each of its default
                recipes, their merges and evaluation on the 8 prompts
  eval          python -m xlt.eval on lm-eval's own tasks, where lm-eval is installed (skipped
                otherwise, and said so in the file)
Each is a fresh process (interpreter start, imports, loading and XLA's compilation count), run
--rounds times per condition, conditions interleaved round by round; a cell is the median wall
time. The peers' own start (lm-eval's hf backend) is in docs/speed.md's lm-eval table, not here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "hf", "llama")
CONDITIONS = ("no cache", "cold cache", "warm cache")


def _write_jsonl(path: str, records: list[dict]) -> str:
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  return path


def commands(work: str) -> dict[str, list[str]]:
  """Each command's argv (its outputs under `work`, removed before each run)."""
  prompts = _write_jsonl(os.path.join(work, "prompts.jsonl"),
                         [{"prompt": f"w4 w{i}", "answer": f"w{i + 1}"} for i in range(6, 14)])
  task = _write_jsonl(os.path.join(work, "task.jsonl"),
                      [{"prompt": f"w4 w{i}", "completion": f"w{i + 1}"} for i in range(6, 46)])
  lang = _write_jsonl(os.path.join(work, "language.jsonl"),
                      [{"prompt": f"w5 w{i}", "completion": f"w{i} w{i}"} for i in range(6, 46)])
  out = lambda name: os.path.join(work, "out", name)
  cmds = {
      "generate": ["-m", "xlt.generate", f"--model={FIXTURE}", f"--prompts={prompts}", "--max_new=8", "--batch=8",
                   f"--output={out('generate.jsonl')}"],
      "merge_search": ["-m", "xlt.merge_search", "--method=slerp", f"--input=base={FIXTURE}",
                       f"--input=other={FIXTURE}", "--space=t=float:0:1", f"--prompts={prompts}", "--max_new=2",
                       "--batch=8", "--trials=3", "--sampler=random", f"--output={out('search')}"],
      "finetune": ["-m", "xlt.main", "--config=configs/finetune.py", f"--workdir={out('finetune')}",
                   f"--config.base={FIXTURE}", f"--config.data.task={task}", f"--config.data.language={lang}",
                   "--config.data.block_size=24", "--config.data.val_fraction=0.2", "--config.train.steps=1",
                   "--config.train.eval_every=1", "--config.train.batch_size=4",
                   f"--config.eval.prompts=('{prompts}',)", "--config.eval.max_new=2"],
  }
  if importlib.util.find_spec("lm_eval") is not None:
    cmds["eval"] = ["-m", "xlt.eval", f"--model={FIXTURE}", "--tasks=lambada_openai", "--limit=8",
                    f"--output={out('eval')}"]
  return cmds


def run_once(argv: list[str], work: str, cache: str | None) -> float:
  shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
  os.makedirs(os.path.join(work, "out"))
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env.update(PYTHONPATH=ROOT, XLT_COMPILATION_CACHE=cache or "off")
  start = time.perf_counter()
  r = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
  wall = time.perf_counter() - start
  if r.returncode != 0:
    raise SystemExit(f"cold_start: {' '.join(argv[:2])} failed: {r.stderr.strip().splitlines()[-1:]}")
  return wall


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--out", default="")
  p.add_argument("--smoke", action="store_true", help="one round, nothing written")
  a = p.parse_args(argv)
  rounds = 1 if a.smoke else a.rounds
  start = time.time()
  work = tempfile.mkdtemp(prefix="xlt-cold-start-")
  try:
    cmds = commands(work)
    times = {name: {c: [] for c in CONDITIONS} for name in cmds}
    for _ in range(rounds):
      for name, cmd in cmds.items():
        cache = os.path.join(work, f"cache-{name}")
        shutil.rmtree(cache, ignore_errors=True)  # every round's cold run starts from nothing
        times[name]["no cache"].append(run_once(cmd, work, None))
        times[name]["cold cache"].append(run_once(cmd, work, cache))
        times[name]["warm cache"].append(run_once(cmd, work, cache))
  finally:
    shutil.rmtree(work, ignore_errors=True)
  rows = [[name, *(statistics.median(t[c]) for c in CONDITIONS),
           statistics.median(t["no cache"]) / statistics.median(t["warm cache"])] for name, t in times.items()]
  columns = ["command", *(f"{c} s" for c in CONDITIONS), "no cache / warm"]
  print("| " + " | ".join(columns) + " |")
  for r in rows:
    print(f"| {r[0]} | " + " | ".join(f"{x:.1f}" for x in r[1:]) + " |")
  if a.out and not a.smoke:
    import jax

    from benchmarks import results_file
    notes = ("" if "eval" in cmds else "xlt.eval not timed: lm-eval is not installed here. ") + (
        f"Median of {rounds} rounds; each a fresh process.")
    results_file.write(a.out, benchmark="cold_start", title="Time to first result: no cache, cold and warm "
                       "persistent compilation cache, s", columns=columns, rows=rows, wall_s=time.time() - start,
                       versions={"jax": jax.__version__}, notes=notes, times=times)
  return 0


if __name__ == "__main__":
  sys.exit(main())
