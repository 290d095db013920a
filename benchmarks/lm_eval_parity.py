"""The parity table of xlt's lm-eval backend against lm-eval's `hf` backend: for each tiny
checkpoint (tests/fixtures/make_lm_eval_fixtures.py, whose hf answers are in
tests/fixtures/lm_eval_hf/), the largest |loglikelihood difference| over the multiple-choice
and rolling requests, whether is_greedy agrees everywhere, how many greedy generations are
equal, and whether the multiple-choice scores are equal. Needs neither lm-eval nor torch.

  python benchmarks/lm_eval_parity.py [--out=results/benchmarks/lm_eval_parity.json]
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/lm_eval_parity.py \\
      --mesh=data=2,fsdp=2,tensor=2 --out=results/benchmarks/lm_eval_parity_mesh.json   (8 CPU devices)

Prints a markdown table (docs/evaluate.md shows it) and writes the rows as JSON to --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def _make():
  spec = importlib.util.spec_from_file_location("make_lm_eval_fixtures", os.path.join(FIXTURES,
                                                                                     "make_lm_eval_fixtures.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def family_row(family: str, d: str, mesh_spec: str | None) -> dict:
  import numpy as np

  from xlt import decode, hf_tokenizer, pretrained
  from xlt.eval import requests as req

  with open(os.path.join(FIXTURES, "lm_eval_hf", f"{family}.json")) as f:
    hf = json.load(f)
  mesh = decode.make_mesh(mesh_spec)
  cfg, params = pretrained.load(d, mesh=mesh)
  tok = hf_tokenizer.load(d)
  m = req.Model(cfg, params, tok, mesh, batch=4)
  prefix = req.prefix_id(tok)
  mc = hf["samples"]["xlt_words_mc"]
  pairs = [req.encode_pair(tok, c, x, prefix) for s in mc for c, x in s["arguments"]]
  ours, theirs = req.loglikelihood_tokens(m, pairs), [r[0] for s in mc for r in s["resps"]]
  rolling = hf["samples"]["xlt_words_rolling"]
  ours_r = req.loglikelihood_rolling(m, [tok.encode(s["arguments"][0][0]) for s in rolling], prefix)
  gen = hf["samples"]["xlt_words_gen"]
  kwargs = gen[0]["arguments"][0][1]
  texts = req.generate(m, [tok.encode(s["arguments"][0][0]) for s in gen], until=kwargs["until"] + ["</s>"],
                       max_gen_toks=kwargs["max_gen_toks"])
  with open(os.path.join(FIXTURES, "lm_eval_tasks", "words.json")) as f:
    docs = json.load(f)["mc"]["test"]
  labels = [docs[s["doc_id"]]["label"] for s in mc]
  k, correct = 0, 0
  for s, label in zip(mc, labels):
    n = len(s["arguments"])
    correct += int(np.argmax([x[0] for x in ours[k:k + n]]) == label)
    k += n
  return {"family": family, "requests": len(pairs) + len(rolling) + len(gen),
          "max_abs_loglikelihood": max(abs(a[0] - b[0]) for a, b in zip(ours, theirs)),
          "max_abs_rolling": max(abs(a - s["resps"][0][0]) for a, s in zip(ours_r, rolling)),
          "is_greedy_equal": all(a[1] == b[1] for a, b in zip(ours, theirs)),
          "generations_equal": sum(t == s["resps"][0][0] for t, s in zip(texts, gen)), "generations": len(gen),
          "acc": correct / len(mc), "acc_hf": hf["results"]["xlt_words_mc"]["acc,none"]}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=os.path.join(ROOT, "results", "benchmarks", "lm_eval_parity.json"))
  p.add_argument("--mesh", default=None)
  args = p.parse_args()
  make = _make()
  with tempfile.TemporaryDirectory() as tmp:
    rows = [family_row(f, make.model_dir(f, tmp), args.mesh) for f in make.FAMILIES]
  print("| family | requests | max abs loglikelihood diff | max abs rolling diff | is_greedy equal | "
        "generations equal | acc (xlt / hf) |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['family']} | {r['requests']} | {r['max_abs_loglikelihood']:.1e} | {r['max_abs_rolling']:.1e} | "
          f"{r['is_greedy_equal']} | {r['generations_equal']}/{r['generations']} | {r['acc']:.2f} / {r['acc_hf']:.2f} |")
  from xlt.io import fileio

  fileio.write_text(args.out, json.dumps({"mesh": args.mesh, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
  main()
