"""docs/pretrained.md's walkthrough ("Recipes on a pretrained model, here with no download"), run
as written, and what it printed recorded:

  python benchmarks/walkthrough_pretrained.py --out=results/benchmarks/walkthrough_pretrained.json

From the repository root, in runs/base and runs/ft (both must not exist, or pass --fresh), the
three documented commands as subprocesses: the base (configs/llama_base.py), the finetune run
(every documented flag), and xlt.generate on the layer swap's directory with the task prompts.
Records each command with its wall time, the finetune table's exact match of every model on each
prompt file (runs/ft/results.json), and generate's score of the same model and file, and fails
(exit 1) when the two disagree: the finetune table and xlt.generate must score alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xlt import report  # noqa: E402
from xlt.io import fileio  # noqa: E402

SWAP_DIR = "runs/ft/models/layer_swap_bottom_1_top_1"
COMMANDS = [
    ["-m", "xlt.main", "--config=configs/llama_base.py", "--workdir=runs/base"],
    ["-m", "xlt.main", "--config=configs/finetune.py", "--workdir=runs/ft", "--config.base=runs/base/hf",
     "--config.data.task=runs/base/data/task.jsonl", "--config.data.language=runs/base/data/language.jsonl",
     "--config.merges=('layer_swap bottom=1 top=1',)", "--config.data.block_size=64",
     "--config.train.batch_size=32", "--config.opt.peak_lr=3e-4",
     "--config.eval.prompts=('runs/base/data/prompts.jsonl','runs/base/data/task_prompts.jsonl',"
     "'runs/base/data/language_prompts.jsonl')", "--config.eval.max_new=8"],
    ["-m", "xlt.generate", f"--model={SWAP_DIR}", "--prompts=runs/base/data/task_prompts.jsonl",
     "--output=runs/ft/out.jsonl", "--answers=runs/base/data/task_prompts.jsonl", "--match=exact", "--max_new=8"],
]


def run(args: list[str]) -> tuple[float, str]:
  start = time.time()
  done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
  if done.returncode != 0:
    raise SystemExit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
  return time.time() - start, done.stdout


def table(results_path: str) -> dict:
  """{model: {prompt file role: exact match}} of the finetune run's rows."""
  with open(results_path) as f:
    rows = json.load(f)
  out = {}
  for r in rows:
    if r["metric"] == "exact_match":
      out.setdefault(r["condition"], {})[r["role"]] = r["mean"]
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks", "walkthrough_pretrained.json"))
  p.add_argument("--fresh", action="store_true", help="remove runs/base and runs/ft first")
  a = p.parse_args(argv)
  for d in ("runs/base", "runs/ft"):
    if os.path.exists(os.path.join(ROOT, d)):
      if not a.fresh:
        raise SystemExit(f"{d} exists: the walkthrough starts from nothing (pass --fresh to remove it)")
      shutil.rmtree(os.path.join(ROOT, d))
  steps = []
  for args in COMMANDS:
    wall, stdout = run(args)
    steps.append({"command": "python " + " ".join(args), "wall_s": round(wall, 1), "stdout_tail": stdout[-3000:]})
    print(f"{wall:7.1f} s  python {' '.join(args[:3])} ...", flush=True)
  scores = table(os.path.join(ROOT, "runs", "ft", "results.json"))
  generated = re.search(r"accuracy (\d\.\d+) \((\d+)/(\d+)", steps[-1]["stdout_tail"])
  swap = "layer_swap bottom=1 top=1"
  role = next(k for k in scores[swap] if "task" in k and "language" not in k) if swap in scores else None
  result = {"name": "walkthrough_pretrained", "command": "python benchmarks/walkthrough_pretrained.py",
            "commit": report.git_commit(), "machine": report.machine(), "date": time.strftime("%Y-%m-%d"),
            "steps": steps, "finetune_table": scores,
            "generate": {"model": SWAP_DIR, "prompts": "task_prompts", "accuracy": float(generated.group(1)),
                         "correct": int(generated.group(2)), "total": int(generated.group(3))},
            "table_role": role}
  exact = result["generate"]["correct"] / result["generate"]["total"]  # not the printed, rounded accuracy
  agree = role is not None and abs(scores[swap][role] - exact) < 1e-9
  result["agree"] = agree
  fileio.write_text(a.out, json.dumps(result, indent=1))
  print(json.dumps(scores, indent=1))
  print(f"generate: {result['generate']}; finetune table ({role}): {scores.get(swap, {}).get(role)}; agree: {agree}")
  return 0 if agree else 1


if __name__ == "__main__":
  sys.exit(main())
