"""xlt's lm-eval backend against lm-eval's own `hf` backend (torch + transformers) on the same
small model and requests: loglikelihood requests/s and generate_until new tokens/s.

  python benchmarks/lm_eval_speed.py --workdir=runs/lm_eval_speed --out=runs/lm_eval_speed.json
  python benchmarks/lm_eval_speed.py --smoke          # tiny sizes: checks the script runs

Runs where xlt, lm-eval, torch and transformers are all installed (a venv: see
tests/fixtures/make_lm_eval_fixtures.py). It writes a Llama-shaped float32 model with
transformers' own `save_pretrained` from a seeded random init (--hidden, --layers, 4 heads,
2 key/value heads, MLP 2.75 x hidden, context --context) with a word-level tokenizer of
--vocab made-up words, so the hf backend and xlt's read the same files. Requests: --ll
loglikelihood requests (contexts of 16 to --ctx words, continuations of 1 to 4 words) and
--gen generate_until requests (contexts of 8 to 32 words, until a word that does not occur,
max_gen_toks --new), the same for both backends; tokens/s counts the tokens written (a row
ends early where the random model writes EOS).

Each backend answers every request once as a warm-up (xlt compiles its programs then; timed
apart as "first s"), then --rounds more times; the figure is the median round. Both use batch
--batch. xlt runs on the default device (the CPU's cores as one device), hf on torch's CPU
threads. The answers are compared (loglikelihoods to 1e-4, generations exactly). Prints a
markdown table and writes the measurements to --out. Timings on a shared machine vary by tens
of percent between runs: compare the two within one run.
"""

from __future__ import annotations

import argparse
import json
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
  from lm_eval.api.instance import Instance

  rng = random.Random(0)
  words = lambda n: " ".join(f"w{rng.randrange(10, args.vocab - 4)}" for _ in range(n))
  ll = [Instance("loglikelihood", {}, (words(rng.randrange(16, args.ctx)), " " + words(rng.randrange(1, 5))), i)
        for i in range(args.ll)]
  gen = [Instance("generate_until", {}, (words(rng.randrange(8, 33)),
                                         {"until": ["w0 w0 w0"], "max_gen_toks": args.new, "do_sample": False}), i)
         for i in range(args.gen)]
  return ll, gen


def timed(fn, rounds: int) -> tuple[float, list[float], object]:
  t = time.perf_counter()
  answers = fn()
  first = time.perf_counter() - t
  times = []
  for _ in range(rounds):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return first, times, answers


def measure(name: str, lm, ll, gen, args) -> dict:
  f_ll, t_ll, a_ll = timed(lambda: lm.loglikelihood(ll, disable_tqdm=True), args.rounds)
  f_gen, t_gen, a_gen = timed(lambda: lm.generate_until(gen, disable_tqdm=True), args.rounds)
  new_tokens = sum(len(text.split()) for text in a_gen)  # word-level tokenizer: a word is a token
  return {"backend": name, "ll_first_s": f_ll, "ll_s": t_ll, "ll_per_s": len(ll) / statistics.median(t_ll),
          "gen_first_s": f_gen, "gen_s": t_gen, "gen_tokens_per_s": new_tokens / statistics.median(t_gen),
          "loglikelihoods": [x[0] for x in a_ll], "generations": a_gen}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default="runs/lm_eval_speed")
  p.add_argument("--out", default=None)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--context", type=int, default=512)
  p.add_argument("--ll", type=int, default=256, help="loglikelihood requests")
  p.add_argument("--ctx", type=int, default=200, help="longest loglikelihood context, in words")
  p.add_argument("--gen", type=int, default=32, help="generate_until requests")
  p.add_argument("--new", type=int, default=64, help="max_gen_toks")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
  args = p.parse_args()
  if args.smoke:
    args.vocab, args.hidden, args.layers, args.context, args.ll, args.ctx, args.gen, args.new, args.rounds = (
        256, 64, 2, 128, 16, 40, 4, 8, 1)
    args.workdir = os.path.join(args.workdir, "smoke")
  d = write_model(os.path.join(args.workdir, f"llama_{args.hidden}x{args.layers}_v{args.vocab}"), vocab=args.vocab,
                  hidden=args.hidden, layers=args.layers, context=args.context)
  ll, gen = make_requests(args)
  from lm_eval.models.huggingface import HFLM

  from xlt.eval.harness import XltLM

  rows = [measure("xlt", XltLM(pretrained=d, batch_size=args.batch, dtype="float32"), ll, gen, args),
          measure("hf", HFLM(pretrained=d, batch_size=args.batch, dtype="float32", device="cpu"), ll, gen, args)]
  xlt, hf = rows
  agree = {"max_abs_loglikelihood": max(abs(a - b) for a, b in zip(xlt["loglikelihoods"], hf["loglikelihoods"])),
           "generations_equal": sum(a == b for a, b in zip(xlt["generations"], hf["generations"]))}
  print(f"model {os.path.basename(d)}, {args.ll} loglikelihood requests, {args.gen} x {args.new} new tokens, "
        f"batch {args.batch}, median of {args.rounds}")
  print("| backend | loglikelihood req/s | first call s | generate_until tok/s | first call s |")
  print("|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['backend']} | {r['ll_per_s']:.1f} | {r['ll_first_s']:.1f} | {r['gen_tokens_per_s']:.1f} | "
          f"{r['gen_first_s']:.1f} |")
  print(f"xlt / hf: {xlt['ll_per_s'] / hf['ll_per_s']:.2f}x loglikelihood, "
        f"{xlt['gen_tokens_per_s'] / hf['gen_tokens_per_s']:.2f}x generation; agreement {agree}")
  if args.out:
    from xlt.io import fileio

    from xlt import report

    record = {"command": "python benchmarks/lm_eval_speed.py " + " ".join(sys.argv[1:]), "commit": report.git_commit(),
              "machine": report.machine(), "date": time.strftime("%Y-%m-%d"), "args": vars(args), "rows": rows,
              "agreement": agree}
    fileio.write_text(args.out, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
  main()
