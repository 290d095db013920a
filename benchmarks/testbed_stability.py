"""Is the merge testbed an instrument? Two finished runs of the same config that differ only in
float rounding (the default 2 CPU devices against `XLT_CPU_DEVICES=1`), side by side:

  python benchmarks/testbed_stability.py runs/merge runs/merge_1dev --out=results/benchmarks/merge_stability.json

The test (issue 33): the same set of recipes significantly above the best single expert on the
goal (the paired 95% interval of the difference above 0 in both runs), and no row's mean moving
by more than its interval: |mean_2 - mean_1| <= the first run's 95% half-width, for every model
on every role (goal, task, language, source language; exact match). Prints a markdown table of
every model's goal and the rows that moved, writes the comparison as JSON, and exits 1 when the
test fails (0 when it holds), so a script can check it.

Whether the two runs share their bases (the same base/best_params.npz, as a rerun with
`--config.bases_from` has) decides what the test can show. Sharing them, the second run redraws
only the recipes, and the test is the issue's line as it stands. Training its own, the second run
redraws every base (training one from scratch is chaotic: docs/testbed.md), so each row is a fresh
sample of the same population, and even then a row's mean leaves the first run's 95% interval
with probability 1 - xlt.stats.capture(n) (12% at 5 seeds). For such a pair the script also
reports how many rows that predicts, the rows whose means differ beyond sampling error
(Welch's test per row, with Holm's correction over all rows, family-wise 5%), and, taking both
runs' bases as one sample of twice the seeds, each recipe's paired difference to the best expert.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xlt import report  # noqa: E402
from xlt import stats  # noqa: E402


def load_rows(workdir: str) -> dict:
  """{(model, role): row} of a finished testbed workdir's exact-match rows (xlt.report's reader)."""
  try:
    rows, _ = report.read_workdir(workdir)
  except report.UserError as e:
    raise SystemExit(f"testbed_stability: {e}") from None
  return {(r["condition"], r["role"]): r for r in rows if r.get("metric") == "exact_match"}


def significant(rows: dict, sign: str = "+") -> set[str]:
  """The models whose goal is significantly above ("+", paired interval > 0) or below ("-") the
  best expert's."""
  return {m for (m, role), r in rows.items() if role == "goal" and (r.get("vs_best_expert") or {}).get("sign") == sign}


def bases_digest(workdir: str) -> str | None:
  """The sha256 of a run's trained bases (base/best_params.npz), or None without one."""
  path = os.path.join(workdir, "base", "best_params.npz")
  if not os.path.exists(path):
    return None
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def fresh_draw(table: list[dict], first: dict, second: dict) -> dict:
  """For two runs that each drew their bases: how many rows a fresh draw puts outside the first
  run's interval (the sum over rows with a spread of 1 - capture(n)), and the rows whose means
  differ beyond sampling error (Welch per row, Holm over the rows)."""
  keys = [(e["model"], e["role"]) for e in table]
  spread = [k for k in keys if first[k].get("std") or second[k].get("std")]
  tests = [stats.welch(first[k]["values"], second[k]["values"]) for k in spread]
  rejected = stats.holm([t["p"] for t in tests])
  differ = [{"model": k[0], "role": k[1], "p": t["p"], "delta": t["diff"]}
            for k, t, r in zip(spread, tests, rejected) if r]
  expected = sum(1.0 - stats.capture(len(first[k]["values"])) for k in spread)
  return {"rows_with_spread": len(spread), "expected_outside": expected, "differ": differ,
          "replicates": not differ, "pooled": pooled(first, second)}


def pooled(first: dict, second: dict) -> dict:
  """Two runs with their own bases are one sample of twice as many bases: per model, the goal's
  paired difference to the best expert over both runs' seeds (where both name the same expert)."""
  out = {}
  for (model, role), a in first.items():
    b = second.get((model, role))
    va, vb = a.get("vs_best_expert") or {}, (b or {}).get("vs_best_expert") or {}
    if role != "goal" or not va.get("values") or not vb.get("values") or va.get("expert") != vb.get("expert"):
      continue
    diff = stats.paired(va["values"] + vb["values"], [0.0] * (len(va["values"]) + len(vb["values"])))
    out[model] = {"expert": va["expert"], **{k: diff[k] for k in ("mean", "low", "high", "n", "sign")}}
  return out


def compare(first: dict, second: dict, shared_bases: bool = True) -> dict:
  """The module doc's test over the rows both runs have; with `shared_bases` False, also what
  a fresh draw of the bases predicts (`fresh_draw`)."""
  moved, table = [], []
  for key in first:
    if key not in second:
      continue
    a, b = first[key], second[key]
    half = a.get("ci95")
    delta = b["mean"] - a["mean"]
    entry = {"model": key[0], "role": key[1], "first": a["mean"], "first_half": half, "second": b["mean"],
             "second_half": b.get("ci95"), "delta": delta,
             "within": half is not None and abs(delta) <= half + 1e-12}
    if key[1] == "goal":  # each run's paired difference to its best expert
      entry.update({f"{run}_vs_best": {k: (r.get("vs_best_expert") or {}).get(k) for k in ("expert", "mean", "low",
                                                                                          "high", "sign")}
                    for run, r in (("first", a), ("second", b))})
    table.append(entry)
    if not entry["within"]:
      moved.append(entry)
  sig1, sig2 = significant(first), significant(second)
  out = {"rows": table, "moved": moved, "significant_first": sorted(sig1), "significant_second": sorted(sig2),
         "same_significant_set": sig1 == sig2, "holds": sig1 == sig2 and not moved, "shared_bases": shared_bases,
         "below_first": sorted(significant(first, "-")), "below_second": sorted(significant(second, "-"))}
  if not shared_bases:
    out["fresh_draw"] = fresh_draw(table, first, second)
  return out


def markdown(result: dict, first: dict, second: dict) -> str:
  pct = lambda x: "–" if x is None else f"{100 * x:.2f}"
  out = ["| model | goal, run 1 (± 95%) | goal, run 2 (± 95%) | Δ | within run 1's interval | "
         "above best expert: run 1 / run 2 |", "|---|---|---|---|---|---|"]
  for e in result["rows"]:
    if e["role"] != "goal":
      continue
    s1 = (first[(e["model"], "goal")].get("vs_best_expert") or {}).get("sign") or "·"
    s2 = (second[(e["model"], "goal")].get("vs_best_expert") or {}).get("sign") or "·"
    out.append(f"| {e['model']} | {pct(e['first'])} ± {pct(e['first_half'])} | {pct(e['second'])} ± "
               f"{pct(e['second_half'])} | {100 * e['delta']:+.2f} | {'yes' if e['within'] else 'NO'} | {s1} / {s2} |")
  moved = [f"{e['model']} / {e['role']}: {pct(e['first'])} ± {pct(e['first_half'])} -> {pct(e['second'])}"
           for e in result["moved"]]
  out += ["", f"Significantly above the best expert: run 1 {result['significant_first']}, run 2 "
          f"{result['significant_second']} ({'the same' if result['same_significant_set'] else 'DIFFERENT'}).",
          f"Significantly below it: {len(result['below_first'])} models in run 1, {len(result['below_second'])} in "
          f"run 2, {len(set(result['below_first']) & set(result['below_second']))} of them in both.",
          f"Rows outside run 1's interval ({len(moved)} of {len(result['rows'])}): " + ("; ".join(moved) or "none"),
          f"Stability test: {'holds' if result['holds'] else 'FAILS'}."]
  if result["shared_bases"]:
    out.append("The runs share their bases: the second redrew only the recipes.")
  else:
    fresh = result["fresh_draw"]
    differ = [f"{e['model']} / {e['role']} ({100 * e['delta']:+.2f}, p={e['p']:.2g})" for e in fresh["differ"]]
    out.append(f"The runs trained their own bases, so each row is a fresh draw: of the {fresh['rows_with_spread']} "
               f"rows with a spread, a fresh draw puts {fresh['expected_outside']:.1f} outside run 1's interval "
               f"on average. Rows whose means differ beyond sampling error (Welch, Holm, family-wise 5%): "
               + ("; ".join(differ) or "none") + ".")
    above = {m: d for m, d in fresh["pooled"].items() if d["sign"] == "+"}
    out.append("Both runs' bases as one sample: significantly above the best expert: "
               + ("; ".join(f"{m} {100 * d['mean']:+.2f} [{100 * d['low']:+.2f}, {100 * d['high']:+.2f}], "
                            f"{d['n']} bases" for m, d in above.items()) or "none") + ".")
  return "\n".join(out)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("first", help="the default run's workdir")
  p.add_argument("second", help="the rerun's workdir (other float rounding)")
  p.add_argument("--out", default="", help="write the comparison as JSON here")
  a = p.parse_args(argv)
  first, second = load_rows(a.first), load_rows(a.second)
  digests = bases_digest(a.first), bases_digest(a.second)
  result = compare(first, second, shared_bases=digests[0] is not None and digests[0] == digests[1])
  print(markdown(result, first, second))
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
      json.dump({"first": os.path.abspath(a.first), "second": os.path.abspath(a.second), **result}, f, indent=1)
    os.replace(tmp, a.out)
  return 0 if result["holds"] else 1


if __name__ == "__main__":
  sys.exit(main())
