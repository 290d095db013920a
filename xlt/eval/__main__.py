"""Scores a Hugging Face model directory on lm-evaluation-harness tasks, in-process:

  python -m xlt.eval --model=DIR --tasks=mgsm_2shot_de,mgsm_2shot_sw [--output=scores.json]
      [--num_fewshot=N] [--limit=N] [--batch=16] [--mesh=data=4,tensor=2] [--dtype=bfloat16]
      [--include_path=DIR] [--apply_chat_template] [--max_gen_toks=N] [--metadata=JSON]

Task configs come from lm-eval, xlt's own (xlt/eval/tasks: MGSM over the user's files, see
docs/evaluate.md) and --include_path. Prints lm-eval's table and writes {"results": ...,
"configs": ...} to --output (atomically). On a CPU the cores are devices, one per core
(xlt.cpu_devices, as `python -m xlt.main`; XLT_CPU_DEVICES=1: one device), and without --mesh
each batch's rows are split over them (xlt.decode.cpu_data_mesh). Needs lm-eval (`pip install
'xlt[eval]'`); a user error (a missing model directory, an unknown task, no lm-eval) is one
line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from xlt import cli
from xlt.cli import UserError
from xlt.io import fileio

def _parser() -> argparse.ArgumentParser:
  p = cli.Parser(prog="python -m xlt.eval", description=__doc__.split("\n\n")[0])
  p.add_argument("--model", required=True, help="a Hugging Face model directory")
  p.add_argument("--tasks", required=True, help="comma-separated lm-eval task (or group) names")
  p.add_argument("--output", help="the scores written as JSON")
  p.add_argument("--num_fewshot", type=int, default=None)
  p.add_argument("--limit", type=float, default=None, help="documents per task (a fraction if < 1)")
  p.add_argument("--batch", type=int, default=16, help="requests per batch")
  p.add_argument("--mesh", default=None,
                 help="e.g. data=4,tensor=2 (default: on a CPU, data over its cores as devices; else one device)")
  p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
  p.add_argument("--include_path", default=None, help="a folder of more task configs")
  p.add_argument("--apply_chat_template", action="store_true", help="prompts through the model's chat template")
  p.add_argument("--max_gen_toks", type=int, default=256, help="new tokens at most, where a task sets none")
  p.add_argument("--metadata", default=None, help="JSON passed to the task configs (e.g. {\"mgsm_dir\": ...})")
  p.add_argument("--traceback", action="store_true", help="on an error, the full trace instead of one line")
  return p


def evaluate(model_dir: str, tasks: list[str], *, batch: int = 16, mesh: str | None = None, dtype: str | None = None,
             num_fewshot: int | None = None, limit: float | None = None, include_path: str | None = None,
             apply_chat_template: bool = False, max_gen_toks: int = 256, metadata: dict | None = None) -> dict:
  """lm-eval's results dict ({"results": {task: {metric: value}}, ...}) of `tasks` on the model
  directory `model_dir`, run by xlt's backend."""
  from xlt.eval import scores

  options = scores.Options(batch=batch, num_fewshot=num_fewshot, limit=limit, include_path=include_path,
                           metadata=metadata, max_gen_toks=max_gen_toks)  # a nonsense number: one line, first
  if not scores.available():
    raise UserError("lm-eval is not installed (pip install 'xlt[eval]')")
  from xlt.eval import harness

  try:
    manager = scores.check(tasks, options, where="--tasks")
  except ValueError as e:
    raise UserError(str(e)) from None
  lm = harness.XltLM(pretrained=model_dir, dtype=dtype, batch_size=batch, mesh=mesh, max_gen_toks=max_gen_toks)
  import lm_eval

  return lm_eval.simple_evaluate(model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit, task_manager=manager,
                                 apply_chat_template=apply_chat_template, log_samples=False)


def run(argv: list[str], cpu_devices: bool = False) -> dict:
  """The command; `cpu_devices`: the process made the CPU's cores devices (xlt.cpu_devices), and
  a batch's rows are split over them where --mesh is not given."""
  args = _parser().parse_args(argv)
  if not os.path.isdir(args.model):
    raise UserError(f"no model directory {args.model}")
  if args.batch < 1 or args.max_gen_toks < 1:
    raise UserError(f"--batch and --max_gen_toks must be positive, got {args.batch}, {args.max_gen_toks}")
  try:
    metadata = json.loads(args.metadata) if args.metadata else None
  except json.JSONDecodeError as e:
    raise UserError(f"--metadata is not JSON: {e.msg}") from None
  tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  if args.mesh is None and cpu_devices:  # the cores that `python -m xlt.eval` made devices
    from xlt import decode

    args.mesh = decode.cpu_data_mesh()
  out = evaluate(args.model, tasks, batch=args.batch, mesh=args.mesh, dtype=args.dtype, num_fewshot=args.num_fewshot,
                 limit=args.limit, include_path=args.include_path, apply_chat_template=args.apply_chat_template,
                 max_gen_toks=args.max_gen_toks, metadata=metadata)
  from lm_eval.utils import make_table

  print(make_table(out))
  record = {"model": args.model, "results": out["results"], "configs": out.get("configs", {})}
  if args.output:
    fileio.write_text(args.output, json.dumps(record, indent=1, default=str) + "\n")
    print(f"scores written to {os.path.abspath(args.output)}")
  else:
    print("scores not written to a file (--output=FILE writes them as JSON)")
  return record


def main(argv=None, cpu_devices: bool = False) -> int:
  return cli.run_command("xlt.eval", lambda a: run(a, cpu_devices), argv)


if __name__ == "__main__":
  from xlt import cpu_devices as cpu_devices_lib

  # as `python -m xlt.main` starts, before jax starts its backend: on a CPU one device per core
  # (XLT_CPU_DEVICES sets the count), the default --mesh then splits every batch's rows over them
  try:
    cpu_devices_lib.configure()
  except ValueError as e:  # a bad XLT_CPU_DEVICES / XLT_CPU_CORES
    print(f"xlt.eval: error: {e}", file=sys.stderr)
    sys.exit(2)
  sys.exit(main(cpu_devices=True))
