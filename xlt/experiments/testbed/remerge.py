r"""More merges of a finished testbed run's experts, scored as the run scored its own, without
training anything: each merge's goal score paired seed by seed with a reference merge (task
arithmetic) and with the best expert. Exploratory, not preregistered: an added look at a
finished run, no claim of a study.

  python -m xlt.experiments.testbed.remerge --workdir=runs/claims_study/depth_6 --stage=finetune_r1 \
      [--merge="tsv_m" --merge="regmean alpha=0.9" ...] [--seeds=N] \
      --out=results/exploratory/merge_methods_depth6.json
  python -m xlt.experiments.testbed.remerge render [--results=FILE ...] [--doc=docs/merge.md]

The workdir is read only (its config.json, base/ and fine-tune stage: xlt.structure.load_run);
nothing is written there. Per seed the base, the task and language experts, the reference
(`--reference`, a merge of the run's own list: "task arithmetic λ=1.0") and every `--merge`
(default MERGES: the subspace, mask and data-aware methods) are built, the data-aware ones with
statistics from each expert's own training data (testbed_statistics), and all are scored on
the run's evaluation sets (testbed._score_all, greedy exact match). The base, experts and
reference are scored again beside the new merges, and their scores compared with the run's
recorded ones (`recorded`: the largest difference per model; 0 when the scoring reproduces).

The results file: per merge its goal mean and 95% t interval, the paired differences to the
reference and to the best expert (xlt.stats.paired: mean, 95% t interval, sign), each with the
two-sided t test's p (xlt.claims.t_test) and Holm's decision over the merges at family-wise 5%
(xlt.stats.holm), its merge time; the testbed's rows of every model (testbed_report.rows); the
command, commit, machine, date and wall time. `render` writes its section of docs/merge.md.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shlex
import sys
import tempfile
import time

import numpy as np

from xlt import claims, merge, report, stats, structure
from xlt import results as results_lib
from xlt.experiments.testbed import experiment as testbed
from xlt.experiments.testbed import regimes as testbed_regimes
from xlt.experiments.testbed import report as testbed_report
from xlt.experiments.testbed import statistics as testbed_statistics

# the methods of issue 44, each at the defaults of its registry function (its paper's)
MERGES = ("tsv_m", "iso_c", "iso_cts", "consensus", "tall_mask expert=0", "magmax", "localize_and_stitch",
          "localize_and_stitch losses='data'", "regmean", "fisher")
REFERENCE = "task arithmetic λ=1.0"
SCORED = ("base", "task expert", "language expert")
RESULTS_GLOB = os.path.join(report.RESULTS_DIR, "exploratory", "merge_methods_*.json")
DOC = os.path.join(report.ROOT, "docs", "merge.md")
BEGIN = "<!-- testbed merge rows: written by python -m xlt.experiments.testbed.remerge render; do not edit -->"
END = "<!-- end of testbed merge rows -->"


def specs(c, merges, reference: str) -> list[tuple[str, str, dict]]:
  """(label, method, options) of the reference (found among the run's merges) and each merge
  spec ("method option=value ...", merge.registry.parse_spec), checked against the testbed's inputs."""
  own = {label: (label, method, options) for label, method, options in testbed.merges(c)}
  if reference not in own:
    raise ValueError(f"reference {reference!r} is not a merge of the run; its merges: {', '.join(own)}")
  out = [own[reference]]
  for spec in merges:
    method, options = merge.registry.parse_spec(spec, "--merge")
    merge.registry.check_among(method, testbed_statistics.placeholder(method, options, 2), testbed.MERGE_INPUTS, spec)
    if spec in [o[0] for o in out] or spec in SCORED:
      raise ValueError(f"--merge {spec!r} is given twice (or names a scored model)")
    out.append((spec, method, options))
  return out


def _regime(c, stage: str) -> dict:
  if c.task != "arithmetic_regimes":
    return {}
  i = int(stage.removeprefix("finetune_r"))
  lr, steps = testbed_regimes.regimes(c)[i]
  return {"regime": i, "peak_lr": lr, "finetune_steps": steps}


def recorded_differences(workdir: str, rows: list[dict], regime: dict) -> dict:
  """{model: the largest |rescored - recorded| over its rows' per-seed values} for the models
  the run itself scored (its results.json, this regime's rows)."""
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    old = {(r["condition"], r["role"], r["metric"]): r["values"] for r in json.load(f)
           if r.get("regime") == regime.get("regime")}
  out = {}
  for r in rows:
    if (key := (r["condition"], r["role"], r["metric"])) in old:
      d = float(np.max(np.abs(np.subtract(r["values"], old[key][:len(r["values"])]))))
      out[r["condition"]] = max(out.get(r["condition"], 0.0), d)
  return out


def _compare(goal: dict, labels: list[str], against) -> list[dict]:
  """Each label's paired goal difference to `against` (a label, or per label the row's best
  expert), with its t test's p and Holm's decision over the labels."""
  out = []
  for label in labels:
    other = against(label)
    d = stats.paired(goal[label], goal[other])
    out.append({"against": other, "mean": d["mean"], "ci95": d["half"], "low": d["low"], "high": d["high"],
                "sign": d["sign"], "p": claims.t_test(np.subtract(goal[label], goal[other]))})
  for o, rejected in zip(out, stats.holm([o["p"] for o in out])):
    o["holm_rejects"] = bool(rejected)
  return out


def summarise(rows: list[dict], merged: list[str], reference: str) -> list[dict]:
  """Per merge (and the reference): its goal interval and its paired differences (`_compare`)."""
  goal = {r["condition"]: r["values"] for r in rows if r["role"] == "goal" and r["metric"] == "exact_match"}
  best = next(r["vs_best_expert"]["expert"] for r in rows if r.get("vs_best_expert"))
  vs_ref = _compare(goal, merged, lambda _: reference)
  vs_best = _compare(goal, [reference] + merged, lambda _: best)
  out = []
  for k, label in enumerate([reference] + merged):
    iv = stats.interval(goal[label])
    out.append({"merge": label, "goal": {"mean": iv["mean"], "ci95": iv["half"], "low": iv["low"], "high": iv["high"]},
                "vs_reference": vs_ref[k - 1] if k else None, "vs_best_expert": vs_best[k]})
  return out


def run(workdir: str, stage: str, merges=MERGES, reference: str = REFERENCE, seeds: int = 0, log=print) -> dict:
  """The results of the module docstring (without command and wall time)."""
  c, prep, models = structure.load_run(workdir, stage)
  models = models[:seeds] if seeds else models
  todo = specs(c, merges, reference)
  regime, seed_ids = _regime(c, stage), prep.seeds[:len(models)]
  experts = {r.name: r for r in prep.of("full")}
  per_seed, merge_s = [], {label: 0.0 for label, _, _ in todo}
  for i, (base, task, lang) in enumerate(models):
    statistics = testbed_statistics.for_seed(c, prep, [experts["task expert"], experts["language expert"]], i)
    models_i = {"base": base, "task expert": task, "language expert": lang}
    for spec in todo:
      t = time.time()
      models_i.update(testbed.merge_models(c, base, task, lang, [spec], statistics))
      merge_s[spec[0]] += time.time() - t
    per_seed.append(models_i)
    log(f"remerge: seed {seed_ids[i]}: {len(models_i)} models")
  names = list(per_seed[0])
  with tempfile.TemporaryDirectory() as tmp:  # the answers are not kept: the workdir is read only
    scores = testbed._score_all(prep.cfg, prep.task, per_seed, prep.sets, c.eval.batch_size, seed_ids, tmp)
  rows = testbed_report.rows(c, names, scores, prep.sets, seed_ids, {r.name: r.trained_on for r in prep.recipes})
  merged = [label for label, _, _ in todo[1:]]
  summary = summarise(rows, merged, reference)
  for s in summary:
    s["merge_s"] = merge_s[s["merge"]]
  return {"title": "Testbed rows of the subspace, mask and data-aware merges", "exploratory": True,
          "preregistered": False, "workdir": workdir, "stage": stage, **regime, "seeds": seed_ids,
          "reference": reference, "best_expert": summary[0]["vs_best_expert"]["against"],
          "merges": [{"label": label, "method": m, "options": o} for label, m, o in todo[1:]],
          "statistics": testbed_statistics.settings(c), "recorded": recorded_differences(workdir, rows, regime),
          "summary": summary, "rows": rows}


# --------------------------------------------------------------------------- the doc section


def _pts(x) -> str:
  return "–" if x is None else f"{100 * x:+.2f}"


def _diff(d: dict) -> str:
  if d is None:
    return "(reference)"
  marker = testbed_report.MARKERS[d["sign"]]
  return f"{_pts(d['mean'])} [{_pts(d['low'])}, {_pts(d['high'])}]{marker} p={d['p']:.3f}{' H' if d['holm_rejects'] else ''}"


def section(result: dict) -> str:
  """The generated part of docs/merge.md: provenance, then one row per merge."""
  regime = (f", regime {result['regime']} (peak lr {result['peak_lr']:g}, {result['finetune_steps']} steps)"
            if "regime" in result else "")
  recorded = max(result["recorded"].values()) if result["recorded"] else None
  lines = [BEGIN, "", f"**Exploratory, not preregistered.** `{result['command']}` at {result['commit'][:10]}, "
           f"{result['machine']}, {result['date'][:10]}, {result['wall_s'] / 60:.1f} min: the experts of "
           f"`{result['workdir']}`{regime}, seeds {', '.join(map(str, result['seeds']))}, nothing retrained. "
           f"Data-aware statistics from {result['statistics']['examples']} examples of each expert's own training "
           "set. The base, experts and reference rescored here differ from the run's recorded scores by at most "
           f"{'–' if recorded is None else f'{100 * recorded:.2f}'} points.", "",
           f"Goal exact match (%), mean ± 95% half-width over {len(result['seeds'])} seeds; differences in points, "
           "paired by seed, [95% t interval], ▲ / ▼ where it lies above / below 0, the two-sided t test's p, "
           "and H where Holm's procedure over the merges rejects at family-wise 5%.", "",
           f"| merge | goal | − {result['reference']} | − best expert ({result['best_expert']}) | merge s |",
           "|---|---|---|---|---|"]
  for s in result["summary"]:
    g = s["goal"]
    goal = f"{100 * g['mean']:.2f}" + ("" if g["ci95"] is None else f" ± {100 * g['ci95']:.2f}")
    lines.append(f"| {s['merge']} | {goal} | {_diff(s['vs_reference'])} | {_diff(s['vs_best_expert'])} | "
                 f"{s['merge_s']:.1f} |")
  return "\n".join(lines + ["", *answer(result), END])


def same_scores(rows: list[dict]) -> dict[str, str]:
  """{model: an earlier model with the very same per-seed values on every row}."""
  by = {}
  for r in rows:
    by.setdefault(r["condition"], []).append((r["role"], r["metric"], tuple(r["values"])))
  out, seen = {}, {}
  for name, values in by.items():
    key = tuple(values)
    if key in seen:
      out[name] = seen[key]
    seen.setdefault(key, name)
  return out


def answer(result: dict) -> list[str]:
  """The question the rows answer (is any merge significantly above the reference or the best
  expert?), read from the results; then the merges that scored exactly as another."""
  merges = result["summary"][1:]
  above = lambda key, holm: [s["merge"] for s in merges if s[key]["sign"] == "+" and (s[key]["holm_rejects"] or not holm)]
  names = lambda xs: ", ".join(xs) or "none"
  out = [f"Significantly above {result['reference']} (Holm over the merges): {names(above('vs_reference', True))}; "
         f"by its unadjusted interval alone: {names(above('vs_reference', False))}. Above the best expert (Holm): "
         f"{names(above('vs_best_expert', True))}; unadjusted: {names(above('vs_best_expert', False))}. "
         "merge s: the merge's time summed over the seeds, the data-aware ones with their statistics, in a "
         "niced process on a shared machine.", ""]
  same = same_scores(result["rows"])
  if same := {k: v for k, v in same.items() if k in [s["merge"] for s in merges]}:
    out += ["Scored exactly as another model on every set and seed: " + "; ".join(
        f"{k} as {v}" for k, v in same.items()) + ".", ""]
  return out


def render(results=None, doc: str = DOC, write: bool = True) -> str:
  """`doc` with its section replaced by the one the results files give (`results`, a list of
  paths; default every RESULTS_GLOB file), ordered by workdir and regime."""
  with open(doc, encoding="utf-8") as f:
    text = f.read()
  if BEGIN not in text or END not in text:
    raise ValueError(f"{doc} has no testbed merge rows markers")
  found = []
  for path in results or sorted(glob.glob(RESULTS_GLOB)):
    with open(path, encoding="utf-8") as f:
      found.append(json.load(f))
  found.sort(key=lambda r: (r["workdir"], r.get("regime", 0)))
  body = "\n\n".join(section(r)[len(BEGIN):-len(END)].strip() for r in found) or "No results yet."
  new = text[:text.index(BEGIN)] + BEGIN + "\n\n" + body + "\n\n" + END + text[text.index(END) + len(END):]
  if write:
    results_lib.atomic_write(doc, new)
  return new


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = argparse.ArgumentParser(prog="python -m xlt.experiments.testbed.remerge", description=__doc__.split("\n\n")[0])
  if argv[:1] == ["render"]:
    p.add_argument("--results", action="append", default=None, help="a results file (repeatable; default: "
                   "every results/exploratory/merge_methods_*.json)")
    p.add_argument("--doc", default=DOC)
    a = p.parse_args(argv[1:])
    try:
      render(a.results, a.doc)
    except (ValueError, OSError) as e:
      print(f"remerge: {e}", file=sys.stderr)
      return 2
    return 0
  p.add_argument("--workdir", required=True, help="a finished testbed or regime-map run (read only)")
  p.add_argument("--stage", default="", help="its fine-tune stage: finetune, or finetune_r<i> (a regime map)")
  p.add_argument("--merge", action="append", default=None, help="a merge spec 'method option=value ...' "
                 "(repeatable; default: " + "; ".join(MERGES) + ")")
  p.add_argument("--reference", default=REFERENCE, help="the run's merge each merge is paired with")
  p.add_argument("--seeds", type=int, default=0, help="the first N seeds (0: all)")
  p.add_argument("--out", required=True, help="the results JSON file")
  a = p.parse_args(argv)
  stage = a.stage or ("finetune" if os.path.isdir(os.path.join(a.workdir, "finetune")) else "finetune_r0")
  if os.path.abspath(a.out).startswith(os.path.abspath(a.workdir) + os.sep):
    print("remerge: --out lies inside the workdir, which is read only", file=sys.stderr)
    return 2
  start = time.time()
  try:
    result = run(a.workdir, stage, a.merge or MERGES, a.reference, a.seeds)
  except (ValueError, OSError) as e:
    print(f"remerge: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  command = "python -m xlt.experiments.testbed.remerge " + shlex.join(argv)
  result = {**result, "command": command, "commit": report.git_commit(), "machine": report.machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(time.time() - start, 1)}
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  results_lib.atomic_write(a.out, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
  for s in result["summary"]:
    log_line = f"{s['merge']}: goal {100 * s['goal']['mean']:.2f}; vs best expert {_diff(s['vs_best_expert'])}"
    print(log_line + ("" if s["vs_reference"] is None else f"; vs reference {_diff(s['vs_reference'])}"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
