"""xlt's lm-eval backend against lm-eval's own `hf` backend (torch + transformers) on the same
small model and requests: loglikelihood requests/s and generate_until new tokens/s.

  python benchmarks/lm_eval_speed.py --workdir=runs/lm_eval_speed --out=results/benchmarks/lm_eval_speed.json
  python benchmarks/lm_eval_speed.py --smoke          # tiny sizes: checks the script runs

Runs where xlt, lm-eval, torch and transformers are all installed (a venv: see
tests/fixtures/make_lm_eval_fixtures.py). It writes a Llama-shaped float32 model with
transformers' own `save_pretrained` from a seeded random init (--hidden, --layers, 4 heads,
2 key/value heads, MLP 2.75 x hidden, context --context) with a word-level tokenizer of
--vocab made-up words, so the hf backend and xlt's read the same files. Requests, the same
for both backends: --ll loglikelihood requests of their own context each (contexts of 16 to
--ctx words, continuations of 1 to 4 words); --mc multiple-choice questions, a context with 4
such continuations (arc, hellaswag and m_mmlu ask this way: lm-eval's hf backend reuses one
context's logits only where every continuation is one token); --gen generate_until requests
(contexts of 8 to 32 words, until a word that does not occur, max_gen_toks --new), where
tokens/s counts the tokens written (a row ends early where the random model writes EOS).

Each backend answers each kind of request once as a warm-up (xlt compiles its programs then;
timed apart as "first call s"), then --rounds more times, the two backends alternating (which
goes first flips by round); a rate is the median round, a ratio the median of the rounds'
paired ratios; each round's CPU seconds (the process's, all threads) are kept too. Both use
batch --batch. xlt starts as `python -m xlt.eval` does: the CPU's cores as devices, one per
core (xlt.cpu_devices; XLT_CPU_DEVICES sets the count), each running its share of every batch's
rows (a data mesh); --one_device runs it on one device with the cores as its threads. hf runs on
torch's CPU threads. The answers are compared (loglikelihoods to 1e-4,
generations exactly). Prints a markdown table and writes the results file (results/benchmarks
schema: columns, rows, command, commit, machine) to --out. Timings on a shared machine vary by
tens of percent between runs, and torch's threads lose more than XLA's when other processes
keep the cores busy: compare the two within one run, on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def write_model(out: str, *, vocab: int, hidden: int, layers: int, context: int) -> str:
  """A seeded random Llama and a word-level tokenizer (w0 ... w<vocab-4>) in `out`."""
  import torch
  import transformers
  from tokenizers import Tokenizer, models, pre_tokenizers

  if os.path.exists(os.path.join(out, "model.safetensors")):
    return out
  torch.manual_seed(0)
  config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                                    num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=context, bos_token_id=1, eos_token_id=2, pad_token_id=0)
  transformers.LlamaForCausalLM(config).eval().save_pretrained(out)
  words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(vocab - 4)]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                              unk_token="<unk>", pad_token="<pad>")
  fast.save_pretrained(out)
  return out


def make_requests(args):
  """(independent loglikelihood requests, multiple-choice ones: --mc contexts with 4 choices
  each, generate_until requests), the same for both backends."""
  from lm_eval.api.instance import Instance

  rng = random.Random(0)
  words = lambda n: " ".join(f"w{rng.randrange(10, args.vocab - 4)}" for _ in range(n))
  ll = [Instance("loglikelihood", {}, (words(rng.randrange(16, args.ctx)), " " + words(rng.randrange(1, 5))), i)
        for i in range(args.ll)]
  mc = []
  for _ in range(args.mc):
    context = words(rng.randrange(16, args.ctx))
    mc += [Instance("loglikelihood", {}, (context, " " + words(rng.randrange(1, 5))), len(mc)) for _ in range(4)]
  gen = [Instance("generate_until", {}, (words(rng.randrange(8, 33)),
                                         {"until": ["w0 w0 w0"], "max_gen_toks": args.new, "do_sample": False}), i)
         for i in range(args.gen)]
  return ll, mc, gen


KINDS = ("ll", "mc", "gen")


def run_kind(lm, kind: str, requests) -> tuple[float, float, list]:
  """(wall seconds, this process's CPU seconds: all its threads, answers) of one call."""
  t, cpu = time.perf_counter(), time.process_time()
  if kind == "gen":
    answers = lm.generate_until(requests, disable_tqdm=True)
  else:
    answers = [x[0] for x in lm.loglikelihood(requests, disable_tqdm=True)]
  return time.perf_counter() - t, time.process_time() - cpu, answers


def measure(lms: dict, requests: dict, rounds: int) -> dict:
  """Per backend and request kind: the first call's seconds (xlt compiles then), each round's
  wall and CPU seconds (the backends alternate, which goes first by round), the answers."""
  out = {name: {} for name in lms}
  for kind in KINDS:
    for name, lm in lms.items():
      first, _, answers = run_kind(lm, kind, requests[kind])
      out[name][kind] = {"first_s": first, "s": [], "cpu_s": [], "answers": answers}
    for r in range(rounds):
      for name in (list(lms) if r % 2 == 0 else list(lms)[::-1]):
        wall, cpu, _ = run_kind(lms[name], kind, requests[kind])
        out[name][kind]["s"].append(wall)
        out[name][kind]["cpu_s"].append(cpu)
  return out


def summary(m: dict, requests: dict) -> tuple[list[str], list[list]]:
  """The schema's columns and rows: per request kind, each backend's rate (median round) and
  their ratio (the median of the rounds' ratios, each pair measured back to back)."""
  columns = ["requests", "unit", "xlt", "hf", "xlt / hf", "xlt first call s", "hf first call s"]
  titles = {"ll": "loglikelihood, one context each", "mc": "loglikelihood, 4 choices per context",
            "gen": "generate_until"}
  rows = []
  for kind in KINDS:
    if kind == "gen":  # word-level tokenizer: a word is a token
      count, unit = sum(len(text.split()) for text in m["xlt"]["gen"]["answers"]), "new tokens/s"
    else:
      count, unit = len(requests[kind]), "requests/s"
    rate = {name: [count / t for t in m[name][kind]["s"]] for name in m}
    ratio = statistics.median(x / h for x, h in zip(rate["xlt"], rate["hf"]))
    rows.append([f"{titles[kind]} ({len(requests[kind])})", unit, round(statistics.median(rate["xlt"]), 1),
                 round(statistics.median(rate["hf"]), 1), round(ratio, 2), round(m["xlt"][kind]["first_s"], 1),
                 round(m["hf"][kind]["first_s"], 1)])
  return columns, rows


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default="runs/lm_eval_speed")
  p.add_argument("--out", default=None)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--context", type=int, default=512)
  p.add_argument("--ll", type=int, default=256, help="loglikelihood requests, one context each")
  p.add_argument("--mc", type=int, default=64, help="multiple-choice contexts (4 loglikelihood requests each)")
  p.add_argument("--ctx", type=int, default=200, help="longest loglikelihood context, in words")
  p.add_argument("--gen", type=int, default=32, help="generate_until requests")
  p.add_argument("--new", type=int, default=64, help="max_gen_toks")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--one_device", action="store_true",
                 help="xlt on one CPU device (XLT_CPU_DEVICES=1) instead of one per core (xlt.cpu_devices)")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--notes", default="", help="a caveat for the results file (e.g. 'taken on a busy machine')")
  p.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
  args = p.parse_args()
  t_start = time.perf_counter()
  if args.one_device:
    os.environ["XLT_CPU_DEVICES"] = "1"
  from xlt import cpu_devices

  # as `python -m xlt.eval` starts, before jax starts its backend: the cores as devices (one
  # per core), each batch's rows split over them
  cpu_devices.configure()
  if args.smoke:
    args.vocab, args.hidden, args.layers, args.context, args.ll, args.mc, args.ctx, args.gen, args.new, args.rounds = (
        256, 64, 2, 128, 16, 4, 40, 4, 8, 1)
    args.workdir = os.path.join(args.workdir, "smoke")
  d = write_model(os.path.join(args.workdir, f"llama_{args.hidden}x{args.layers}_v{args.vocab}"), vocab=args.vocab,
                  hidden=args.hidden, layers=args.layers, context=args.context)
  requests = dict(zip(KINDS, make_requests(args)))
  from lm_eval.models.huggingface import HFLM

  from xlt import decode
  from xlt.eval.harness import XltLM

  mesh = decode.cpu_data_mesh()
  lms = {"xlt": XltLM(pretrained=d, batch_size=args.batch, dtype="float32", mesh=mesh),
         "hf": HFLM(pretrained=d, batch_size=args.batch, dtype="float32", device="cpu")}
  m = measure(lms, requests, args.rounds)
  xlt, hf = m["xlt"], m["hf"]
  agree = {"max_abs_loglikelihood": max(abs(a - b) for k in ("ll", "mc")
                                        for a, b in zip(xlt[k]["answers"], hf[k]["answers"])),
           "generations_equal": sum(a == b for a, b in zip(xlt["gen"]["answers"], hf["gen"]["answers"])),
           "generations": len(requests["gen"])}
  columns, rows = summary(m, requests)
  print(f"model {os.path.basename(d)}, batch {args.batch}, xlt mesh {mesh or 'one device'}, median of {args.rounds} "
        f"rounds; agreement {agree}")
  print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
  for row in rows:
    print("| " + " | ".join(str(x) for x in row) + " |")
  if args.out:
    import jax
    import lm_eval
    import torch
    import transformers

    from benchmarks import results_file

    results_file.write(
        args.out, benchmark=os.path.splitext(os.path.basename(args.out))[0],
        title="lm-eval requests: xlt's backend against lm-eval's hf backend", columns=columns, rows=rows,
        wall_s=time.perf_counter() - t_start, notes=args.notes,
        versions={"jax": jax.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                  "lm_eval": lm_eval.__version__},
        args=vars(args), agreement=agree, xlt_mesh=mesh or "one device",
        seconds={name: {k: {key: v[key] for key in ("first_s", "s", "cpu_s")} for k, v in kinds.items()}
                 for name, kinds in m.items()})


if __name__ == "__main__":
  main()
