"""The papers' claims, tested on a finished merge-testbed run with its seeds' paired intervals:

  python benchmarks/testbed_claims.py runs/merge [runs/merge_peft] --out=results/benchmarks/merge_claims.json

Each claim is a set of paired differences on the goal (exact match, seed by seed: the same seed's
models share a base), each with its 95% t interval (xlt.stats.paired), and a verdict read from
them: "holds" when every difference the claim needs is significantly in its favour, "fails" when
one is significantly against it, "undecided" otherwise.

  layer swapping beats both experts         the best layer swap (by mean goal) - each expert
  simultaneous training is second           every other recipe's goal - simultaneous training's
                                            (it is second when at most one is significantly above)
  train-then-revert >= freeze-then-train    per partition preset: TTR - FTT (undecided when its
                                            interval holds 0, whichever side the mean is on)
  LoRA tracks full fine-tuning              per LoRA recipe: LoRA - its full version (needs a run
                                            with LoRA: configs/merge_peft.py), on the goal and
                                            on the ability it trained (task or language)

Prints one line per claim and writes every difference as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import testbed_stability  # noqa: E402
from xlt import stats  # noqa: E402


def load(workdir: str) -> dict:
  """{(model, role): per-seed exact match} of a finished testbed workdir."""
  return {key: row["values"] for key, row in testbed_stability.load_rows(workdir).items()}


def diff(scores: dict, a: str, b: str, role: str = "goal") -> dict:
  d = stats.paired(scores[(a, role)], scores[(b, role)])
  return {"a": a, "b": b, "role": role, "mean": d["mean"], "low": d["low"], "high": d["high"], "sign": d["sign"]}


def verdict(needed: list[dict]) -> str:
  """holds: all significantly in favour; fails: one significantly against; else undecided."""
  if any(d["sign"] == "-" for d in needed):
    return "fails"
  return "holds" if needed and all(d["sign"] == "+" for d in needed) else "undecided"


def models(scores: dict) -> list[str]:
  return list(dict.fromkeys(m for m, _ in scores))


def claims(scores: dict) -> list[dict]:
  names = models(scores)
  goal = lambda m: sum(scores[(m, "goal")]) / len(scores[(m, "goal")])
  out = []
  swaps = [m for m in names if m.startswith("layer swap")]
  if swaps:
    best = max(swaps, key=goal)
    d = [diff(scores, best, e) for e in ("task expert", "language expert")]
    out.append({"claim": "layer swapping beats both experts", "verdict": verdict(d), "differences": d})
  for sim in [m for m in names if m.startswith("simultaneous [")]:
    others = [m for m in names if m != sim and m != "base"]
    d = [diff(scores, m, sim) for m in others]
    above = [x for x in d if x["sign"] == "+"]
    out.append({"claim": f"{sim} is second", "verdict": "holds" if len(above) <= 1 else "fails",
                "significantly_above": [x["a"] for x in above], "differences": d})
  for ftt in [m for m in names if m.startswith("freeze-then-train [")]:
    ttr = ftt.replace("freeze-then-train", "train-then-revert")
    if ttr in names:
      d = [diff(scores, ttr, ftt)]
      out.append({"claim": f"{ttr} >= {ftt}", "verdict": verdict(d), "differences": d})
  for lora in [m for m in names if "LoRA" in m and (m.startswith("LoRA") or m.startswith("partial LoRA"))]:
    full = re.sub(r"LoRA ", "", lora, count=1)
    if full in names:
      trained = "task" if "task" in lora else "language"
      d = [diff(scores, lora, full), diff(scores, lora, full, trained)]
      # tracks: neither difference significant
      v = "holds" if all(x["sign"] == "" for x in d) else "fails"
      out.append({"claim": f"{lora} tracks {full}", "verdict": v, "differences": d})
  return out


def line(c: dict) -> str:
  if "significantly_above" in c:
    return (f"{c['claim']}: {c['verdict'].upper()}: {len(c['significantly_above'])} recipes significantly above it: "
            + ", ".join(c["significantly_above"]))
  shown = [f"{d['a']} - {d['b']} ({d['role']}) {100 * d['mean']:+.2f} [{_pt(d['low'])}, {_pt(d['high'])}]"
           for d in c["differences"][:4]]
  more = f"; +{len(c['differences']) - 4} more" if len(c["differences"]) > 4 else ""
  return f"{c['claim']}: {c['verdict'].upper()}: " + "; ".join(shown) + more


def _pt(x) -> str:
  return "–" if x is None else f"{100 * x:+.2f}"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("workdirs", nargs="+", help="finished testbed runs (the default, and configs/merge_peft.py's)")
  p.add_argument("--out", default="")
  a = p.parse_args(argv)
  result = {}
  for w in a.workdirs:
    result[os.path.abspath(w)] = cs = claims(load(w))
    print(f"## {w}")
    for c in cs:
      print(line(c))
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".tmp", "w") as f:
      json.dump(result, f, indent=1)
    os.replace(a.out + ".tmp", a.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
