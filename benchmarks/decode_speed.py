"""Greedy decoding of a loaded Llama: xlt (xlt.decode.greedy) against transformers' `generate`,
eager and, as a second peer, with the static cache and torch.compile, in new tokens/s at
batch 1, 8 and 64 on the CPU.

  python benchmarks/decode_speed.py --out=results/benchmarks/decode_speed.json
  python benchmarks/decode_speed.py --quick       # smoke test: 1 round, batch 1 and 8, 16 new tokens
  python benchmarks/decode_speed.py --peers=eager   # no torch.compile peer (it compiles for minutes)

Runs where xlt, torch and transformers are installed together (a venv: see
tests/fixtures/make_lm_eval_fixtures.py). All three read the same files: a seeded random
float32 `LlamaForCausalLM` of --shape written once by transformers' `save_pretrained` under
--workdir (benchmarks/hf_models.write_checkpoint), loaded by xlt through xlt.pretrained.load.

  tiny   hidden 256, 4 layers, 8 heads, 2 key/value heads, MLP 704, vocab 8000
  small  hidden 512, 6 layers, 8 heads, 4 key/value heads, MLP 1408, vocab 32000

Each batch row is a prompt of --prompt random tokens (seeded, the same for every tool), and
each tool writes exactly --new tokens per row, greedily, with no stop token (transformers:
its generation config's `eos_token_id=None`, so no row ends early). Timed: the whole call,
prompt prefill included, from token ids to new token ids on the host; the first call (xlt's
and torch.compile's compilation) is timed apart, then the median of --reps calls. new tokens/s
= batch x new / that time, steady state: compilation is its own columns ("xlt compile s",
"torch.compile s": in the first round, the first call less a steady one; every batch size
compiles anew; inductor's caches start empty in each run and serve the later rounds).

  xlt        decode.greedy: the prefill and a jitted `lax.while_loop` over the new tokens, with
             the KV cache, on jax's default CPU device (every core)
  eager      model.generate(do_sample=False): transformers' dynamic cache, PyTorch eager
  compiled   model.generate(cache_implementation="static", compile_config=CompileConfig(
             fullgraph=True, dynamic=False, mode="default")), compiled on the CPU too
             (transformers compiles only on accelerators unless told); the prompt's prefill
             stays eager, as transformers runs it. Where torch.compile cannot work (inductor
             needs a C++ compiler) or generate skips it, that batch's row says why in its
             "compiled peer" column and has no tokens/s; the other tools' rows are unaffected

Measured as benchmarks/finetune_step.py measures: in each round every tool runs in a fresh
subprocess (every batch size in turn), the tools in an order that rotates by round, so a drift of
the shared machine's speed spreads over all three. The table gives the median over rounds of
each tool's tokens/s and the median of the rounds' ratios. Each tool's new tokens are compared
with xlt's ("same"): a random model's logits can tie to rounding, so a few rows may differ.
Prints a markdown table; --out writes the results file (results/benchmarks schema: columns,
rows, command, commit, machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.hf_models import write_checkpoint  # noqa: E402

SHAPES = {
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                 intermediate_size=704, vocab_size=8000),
    "small": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                  intermediate_size=1408, vocab_size=32000),
}
TOOLS = ("xlt", "eager", "compiled")
SEED = 0


def prompts(batch: int, length: int, vocab: int):
  import numpy as np

  return np.random.default_rng(SEED + batch).integers(3, vocab, (batch, length)).astype(np.int32)


def _timed(run, reps: int) -> dict:
  t0 = time.perf_counter()
  ids = run()
  first = time.perf_counter() - t0
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  return {"first_s": first, "s": statistics.median(times), "times": times, "ids": ids}


# ---------------------------------------------------------------------------- children


def xlt_child(a) -> dict:
  import jax

  from xlt import decode, pretrained

  cfg, params = pretrained.load(a.model, dtype="float32", dense_layout=decode.DENSE_LAYOUT)  # as xlt.generate
  out = {}
  for batch in a.batches:
    rows = prompts(batch, a.prompt, cfg.vocab_size).tolist()
    run = lambda: decode.greedy(cfg, params, rows, max_new=a.new).ids  # noqa: B023
    out[str(batch)] = _timed(run, a.reps)
  return {"batches": out, "versions": {"jax": jax.__version__}}


def torch_child(a, compiled: bool) -> dict:
  import torch
  import transformers

  torch.set_num_threads(os.cpu_count())
  model = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
  config = copy.deepcopy(model.generation_config)
  # no stop token: every row writes --new tokens, as xlt's (which is given no stop id)
  config.update(do_sample=False, max_new_tokens=a.new, eos_token_id=None, pad_token_id=0)
  if compiled:
    config.update(**compiled_generation(transformers))
  out, failed = {}, None
  for batch in a.batches:
    ids = torch.from_numpy(prompts(batch, a.prompt, model.config.vocab_size)).long()

    def run():
      with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)[:, ids.shape[1]:].tolist()  # noqa: B023

    if not compiled:
      out[str(batch)] = _timed(run, a.reps)
      continue
    if failed:  # every batch size compiles anew: the same failure again, minutes later
      out[str(batch)] = {"error": failed}
      continue
    try:
      out[str(batch)] = _timed(run, a.reps)
    except Exception as e:  # noqa: BLE001  (inductor's errors have no common base: record, go on)
      failed = compile_failure(e)
      out[str(batch)] = {"error": failed}
      continue
    if getattr(model, "_compiled_call", None) is None:  # generate fell back to eager without raising
      out[str(batch)] = {"error": "generate did not compile the forward pass (transformers skipped it)"}
  return {"batches": out, "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
          "threads": torch.get_num_threads()}


def compiled_generation(transformers) -> dict:
  """The generation-config fields of the second peer, as transformers 5 reads them: a static
  cache (`StaticCache`, its shapes fixed by batch x (prompt + new)), which generate's
  `_valid_auto_compile_criteria` requires before it swaps in `get_compiled_call`'s
  `torch.compile(model.__call__)` for the decoding steps (the prefill stays eager). On a CPU
  that criterion also wants `compile_config._compile_all_devices` (transformers compiles only
  on accelerators unless told). mode "default": "reduce-overhead" means CUDA graphs."""
  compile_config = transformers.CompileConfig(fullgraph=True, dynamic=False, mode="default")
  compile_config._compile_all_devices = True
  return {"cache_implementation": "static", "compile_config": compile_config}


def compile_failure(e: BaseException) -> str:
  """One line for a results row: why torch.compile failed here (e.g. no C++ compiler)."""
  lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
  return f"torch.compile failed: {type(e).__name__}: {lines[0] if lines else ''}"[:300]


def child_main(a) -> None:
  a.batches = [int(b) for b in a.batches.split(",")]
  result = xlt_child(a) if a.child == "xlt" else torch_child(a, a.child == "compiled")
  with open(a.child_out, "w") as f:
    json.dump(result, f)


# ---------------------------------------------------------------------------- the parent


def run_child(tool: str, a, model: str, tmp: str) -> dict:
  out = os.path.join(tmp, f"{tool}.json")
  cmd = [sys.executable, os.path.abspath(__file__), "--child", tool, "--model", model, "--child_out", out,
         "--batches", a.batches, "--prompt", str(a.prompt), "--new", str(a.new), "--reps", str(a.reps)]
  # inductor's on-disk caches in this run's own folder: the first round compiles cold, as a
  # user's first call would, whatever earlier runs left in the default folder
  env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
  if proc.returncode:
    sys.exit(f"the {tool} child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  with open(out) as f:
    result = json.load(f)
  print(f"  {tool}: " + ", ".join(f"batch {b} {r['s']:.3f} s (first {r['first_s']:.1f} s)" if "s" in r
                                  else f"batch {b} {r['error']}" for b, r in result["batches"].items())
        + f"; {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
  return result


def summary(rounds: list[dict], a) -> tuple[list[str], list[list]]:
  """The schema's columns and rows: per batch, each tool's median new tokens/s over rounds, the
  median of the rounds' xlt / peer ratios, the share of each peer's new tokens equal to xlt's,
  and apart from those, each compiling tool's compile time in the first round (cold caches:
  later rounds reuse inductor's, see run_child): its first call less its steady call. A peer
  left out by --peers has None throughout; one whose batch failed in any round (torch.compile
  with no C++ compiler, say) too, with the reason in the last column ("ok" when it compiled
  and ran)."""
  columns = ["batch", "xlt tok/s", "eager tok/s", "xlt / eager", "compiled tok/s", "xlt / compiled",
             "same tokens eager", "same tokens compiled", "xlt compile s", "torch.compile s", "compiled peer"]
  rows = []
  for b in a.batches.split(","):
    runs = {t: [r[t]["batches"][b] for r in rounds] for t in TOOLS if t in rounds[0]}
    errors = {t: next((x["error"] for x in xs if "error" in x), None) for t, xs in runs.items()}
    ok = {t: xs for t, xs in runs.items() if not errors[t]}
    per_s = {t: [int(b) * a.new / x["s"] for x in xs] for t, xs in ok.items()}
    mine = [t for row in runs["xlt"][0]["ids"] for t in row]
    rate, ratio, same, compile_s = {}, {}, {}, {}
    for t in TOOLS:
      if t not in ok:
        rate[t] = ratio[t] = same[t] = compile_s[t] = None
        continue
      rate[t] = round(statistics.median(per_s[t]), 1)
      ratio[t] = round(statistics.median(x / y for x, y in zip(per_s["xlt"], per_s[t])), 2)
      theirs = [t_ for row in ok[t][0]["ids"] for t_ in row]
      same[t] = round(sum(x == y for x, y in zip(mine, theirs)) / len(mine), 3)
      compile_s[t] = round(max(0.0, ok[t][0]["first_s"] - ok[t][0]["s"]), 1)  # round 1: cold caches
    status = None if "compiled" not in runs else errors["compiled"] or "ok"
    rows.append([int(b), rate["xlt"], rate["eager"], ratio["eager"], rate["compiled"], ratio["compiled"],
                 same["eager"], same["compiled"], compile_s["xlt"], compile_s["compiled"], status])
  return columns, rows


def main(a) -> None:

  t_start = time.perf_counter()
  if a.quick:
    a.rounds, a.batches, a.reps, a.new = 1, "1,8", 1, 16
  model = os.path.join(a.workdir, a.shape)
  write_checkpoint(model, SHAPES[a.shape], SEED)
  tools = ["xlt"] + [t for t in a.peers.split(",") if t]
  if any(t not in TOOLS[1:] for t in tools[1:]):
    sys.exit(f"--peers: each one of {', '.join(TOOLS[1:])}")
  rounds = []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(a.rounds):
      order = tools[r % len(tools):] + tools[:r % len(tools)]  # who goes first rotates by round
      print(f"round {r + 1}: {', '.join(order)}", file=sys.stderr, flush=True)
      rounds.append({tool: run_child(tool, a, model, tmp) for tool in order})
  columns, rows = summary(rounds, a)
  print(f"{a.shape} Llama, prompt {a.prompt} tokens, {a.new} new tokens per row, median of {a.rounds} rounds "
        f"({a.reps} calls each)")
  print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
  for row in rows:
    print("| " + " | ".join(str(x) for x in row) + " |")
  if a.out:
    from benchmarks import results_file

    versions = {k: v for r in rounds[0].values() for k, v in r["versions"].items()}
    results_file.write(
        a.out, benchmark=os.path.splitext(os.path.basename(a.out))[0],
        title=f"Greedy decoding of a loaded Llama ({a.shape}), new tokens/s", columns=columns, rows=rows,
        wall_s=time.perf_counter() - t_start, versions=versions, notes=a.notes,
        shape=SHAPES[a.shape], prompt=a.prompt, new=a.new, rounds=a.rounds, reps=a.reps,
        torch_threads=next((r["threads"] for r in rounds[0].values() if "threads" in r), None),
        round_seconds=[{t: {b: r[t]["batches"][b].get("times") for b in r[t]["batches"]} for t in tools} for r in rounds])


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", default=os.path.join(ROOT, "runs", "decode_speed"), help="where the checkpoint goes")
  p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
  p.add_argument("--batches", default="1,8,64", help="batch sizes, comma-separated")
  p.add_argument("--prompt", type=int, default=32, help="prompt tokens per row")
  p.add_argument("--new", type=int, default=64, help="new tokens per row")
  p.add_argument("--reps", type=int, default=3, help="timed calls per batch after the first")
  p.add_argument("--rounds", type=int, default=3, help="fresh subprocesses per tool")
  p.add_argument("--peers", default="eager,compiled", help="which of eager,compiled to run (comma-separated)")
  p.add_argument("--out", default="", help="write the results file here")
  p.add_argument("--notes", default="", help="a caveat for the results file (e.g. 'taken on a busy machine')")
  p.add_argument("--quick", action="store_true", help="1 round, batch 1 and 8, 16 new tokens: a smoke test")
  p.add_argument("--child", choices=TOOLS, help=argparse.SUPPRESS)
  p.add_argument("--model", help=argparse.SUPPRESS)
  p.add_argument("--child_out", help=argparse.SUPPRESS)
  args = p.parse_args()
  (child_main if args.child else main)(args)
