"""benchmarks/gpu_check.py's dry run (--quick: tiny shapes, on the test's CPU devices): a step job
and the decoding job run, and their results file is in docs/speed.md's schema and renders."""

import json
import os

from benchmarks import gpu_check
from xlt import speed_doc


def test_dry_run_writes_a_renderable_results_file(tmp_path):
  lora = gpu_check.xlt_job(gpu_check.JOBS["xlt lora cudnn"], quick=True, steps=1)
  assert lora["trained"] < lora["params"] and lora["step_s"] > 0 and lora["batch"] == gpu_check.QUICK_BATCH[0]
  # LoRA's model FLOPs: 4 N through the frozen base + 6 N of the adapters (+ attention)
  cfg = gpu_check.model_config(gpu_check.QUICK, "auto", "bfloat16", "none", lora["seq"])
  base = lora["params"] - gpu_check.QUICK["vocab_size"] * gpu_check.QUICK["d_model"]  # untied: the lookup
  want = gpu_check.model_flops_per_token(cfg, (4 * base + 6 * lora["trained"]) / 6, lora["seq"])
  assert abs(lora["model_flops_per_step"] - want * lora["batch"] * lora["seq"]) < 1e-6 * want
  decode = gpu_check.decode_job(gpu_check.JOBS["xlt decode"], quick=True, steps=1)
  assert decode["batch 8"]["new_tokens_per_s"] > 0
  results = {"xlt lora cudnn": lora, "torch lora": {"step_s": 2 * lora["step_s"]}, "xlt decode": decode,
             "xlt full cudnn": {"error": "out of memory"}}
  rows = gpu_check.table_rows(results)
  assert [r[0] for r in rows] == ["1B LoRA r16", "1B greedy decoding, batch 8: new tok/s"]
  assert rows[0][-1] == 2.0 and rows[0][3] is None  # xlt / PyTorch; no MFU without a GPU's peak
  out = tmp_path / "benchmarks" / "gpu_check.json"
  gpu_check.write(str(out), results, 12.0, quick=True)
  record = json.loads(out.read_text())
  assert {"command", "commit", "machine", "date", "wall_s", "columns", "rows"} <= set(record)
  assert "(dry run, tiny shapes)" in speed_doc.render(speed_doc.load(os.path.dirname(out)))


def test_back_to_back_steps_wait_once_after_the_last_dispatch():
  """A training loop's timing: every step dispatched before any is waited for, then one wait
  on the last (a read in between would queue behind the steps dispatched since)."""
  events = []

  def dispatch():
    events.append("dispatch")
    return len(events)

  def wait(handle):
    events.append(("wait", handle))

  seconds = gpu_check._back_to_back_step(dispatch, wait, steps=3)
  assert events == ["dispatch", ("wait", 1), "dispatch", "dispatch", "dispatch", ("wait", 5)]
  assert seconds >= 0
