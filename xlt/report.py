"""xlt's measured results as committed files, and the document generated from them.

  python -m xlt.report                    # writes docs/results.md from results/*.json, and
                                          # docs/speed.md's tables from results/benchmarks/*.json
  python -m xlt.report --check            # exit 1 (one line) if either is out of date
  python -m xlt.report collect --workdir=runs/graph --config=configs/graph.py --name=graph \
      [--command='python -m xlt.main ...'] [--metric=valid]

`results/<name>.json`, one per experiment config (and config argument, e.g. addition_cpu):
  name, config, command, reproduces (paper and table), headline (one line), metric, unit;
  measured: where the figures were measured, the defaults of every measurement: commit, date,
    machine, wall_time (and tokens_per_s when known);
  measurements: [{key, label, summary (in the results table), reference, xlt, measured?, also?}]
    reference, xlt: {mean, std, seeds, values (per seed), decimals, alone: {the same}} or null;
    "alone" is the baseline a mixed figure is compared with (lang 2 alone, limited data);
    optional in xlt: ci (half-width of the 95% t interval over seeds), and for a paired
    difference (the merge testbed's goal - best expert) low, high (its interval) and sign
    ("+" / "-": the interval lies above / below 0, shown as ▲ / ▼); files without them
    render as before;
    also: [{label, xlt}] more figures of the same model (the merge testbed's columns).
Figures are as written when they were measured: xlt's mean and std print with `decimals`
(2 unless given), reference figures and per-seed values as stored. A measurement's own
`measured` fields override the file's (grids whose points ran at different commits).

`collect` records a finished workdir: its results.json rows (xlt.results.make_row) and
summary.json (a grid's: each point's), `git rev-parse --short HEAD`, today's date (UTC) and
this machine (CPU model, cores, AVX-512 or not). An existing results/<name>.json keeps its
references, labels and summary flags by key, and its measurements that this run does not
replace (each keeps the commit and date it was measured at). The standard library only: the
render and the check import nothing heavy. results/ and docs/ are the checkout's beside the
package, or, for an installed xlt, the current directory's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

from xlt import speed_doc
from xlt.io import fileio

# the checkout whose results/ and docs/ these are: the one beside the package, else (an installed
# xlt, with no results/ beside it) the current directory, a checkout of the repository
_BESIDE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = _BESIDE if os.path.isdir(os.path.join(_BESIDE, "results")) else os.getcwd()
RESULTS_DIR = os.path.join(ROOT, "results")
DOC = os.path.join(ROOT, "docs", "results.md")
SPEED_DOC = os.path.join(ROOT, "docs", "speed.md")  # its tables: xlt.speed_doc
# the metrics that are fractions (shown in %); each task's headline metric is its kind's declaration
FRACTIONS = ("valid", "shortest", "exact_match", "any_script")
BASELINES = ("alone", "low_limited")  # the condition a mixed figure is compared with
MEASURED = ("commit", "date", "machine", "wall_time")


class UserError(Exception):
  """A bad input a user can fix: one line on stderr, exit status 2."""


def _write_text(path: str, text: str):
  fileio.write_text(path, text)


def dumps(result: dict) -> str:
  return json.dumps(result, indent=1, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------------------- render

def load(directory: str = RESULTS_DIR) -> list[dict]:
  """Every results/*.json, sorted by file name; a malformed one is a UserError naming it."""
  out = []
  for _, path, result in fileio.json_files(directory, UserError):
    missing = {"name", "config", "command", "headline", "measurements"} - set(result)
    if missing:
      raise UserError(f"{path}: missing {sorted(missing)}")
    out.append(result)
  return out


def _num(x) -> str:
  """A stored figure as written: 23.9, 98.05, 0, 4.06e+07."""
  return f"{x:.6g}" if isinstance(x, (int, float)) else str(x)


def _stat(s: dict | None) -> str:
  """mean ± std, the mean with the figure's decimals (a reference's as stored); then, where
  stored, the 95% interval: "(95% CI ± h)" of a mean, or a paired difference's
  "+d [low, high]" with ▲ / ▼ where it excludes 0."""
  if s is None or s.get("mean") is None:
    return "–"
  d = s.get("decimals", 2)
  f = lambda x: _num(x) if d is None else f"{x:.{d}f}"
  if s.get("low") is not None and s.get("high") is not None:  # a paired difference
    return (f"{'+' if s['mean'] >= 0 else ''}{f(s['mean'])} [{f(s['low'])}, {f(s['high'])}]"
            + {"+": " ▲", "-": " ▼"}.get(s.get("sign", ""), ""))
  out = f(s["mean"]) if s.get("std") is None else f"{f(s['mean'])} ± {f(s['std'])}"
  return out + (f" (95% CI ± {f(s['ci'])})" if s.get("ci") is not None else "")


def _pair(s: dict | None) -> str:
  """alone → mixed, or the one figure."""
  if not s:
    return "–"
  if s.get("text"):
    return s["text"]
  return f"{_stat(s['alone'])} → {_stat(s)}" if s.get("alone") else _stat(s)


def _seeds(x: dict | None) -> str:
  if not x or x.get("seeds") is None:
    return ""
  n, alone = x["seeds"], (x.get("alone") or {}).get("seeds")
  if alone is not None and alone != n:
    return f" ({alone} seed{'s' if alone != 1 else ''} alone, {n} mixed)"
  return f" ({n} seed{'s' if n != 1 else ''})"


def _xlt(m: dict) -> str:
  if m.get("xlt") is None:
    return m.get("not_run", "not run")
  return _pair(m["xlt"]) + _seeds(m["xlt"])


def _per_seed(m: dict) -> str:
  x = m.get("xlt") or {}
  parts = []
  if (x.get("alone") or {}).get("values"):
    parts.append("alone " + " / ".join(_num(v) for v in x["alone"]["values"]))
  if x.get("values"):
    parts.append(" / ".join(_num(v) for v in x["values"]))
  return "; ".join(parts)


def _measured(result: dict, m: dict) -> dict:
  return {**result.get("measured", {}), **m.get("measured", {})}


def _unit(result: dict, m: dict) -> str:
  """' (valid %)', ' (%)', ' (test perplexity per token)': what the figures are."""
  unit = m.get("unit") or result.get("unit", "")
  if unit == "%" and "unit" not in m and result.get("metric"):
    unit = f"{result['metric']} %"
  return f" ({unit})" if unit else ""


def _cells(result: dict, m: dict) -> list[str]:
  where = _measured(result, m)
  return [_pair(m.get("reference")), _xlt(m)] + [str(where.get(k, "unknown")) for k in ("wall_time", "machine",
                                                                                        "commit", "date")]


def _row(cells: list[str]) -> str:
  return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def _section(result: dict) -> list[str]:
  lines = ["", f"## {result['name']}", "",
           f"`{result['config']}`" + (f": {result['reproduces']}" if result.get("reproduces") else "") + ".", "",
           "```bash", result["command"], "```", "", result["headline"], ""]
  also = any(m.get("also") for m in result["measurements"])
  header = ["measurement", "reference", "xlt", "per seed"] + (["also"] if also else []) + [
      "wall time", "machine", "commit", "date"]
  lines += [_row(header), _row(["---"] * len(header))]
  for m in result["measurements"]:
    cells = _cells(result, m)
    extra = ["; ".join(f"{a['label']} {_stat(a['xlt'])}" for a in m.get("also", []))] if also else []
    lines.append(_row([m["label"] + _unit(result, m)] + cells[:2] + [_per_seed(m)] + extra + cells[2:]))
  if result.get("notes"):
    lines += [""] + [f"- {note}" for note in result["notes"]]
  return lines


def render(results: list[dict]) -> str:
  """docs/results.md: one table of every summary figure, then each experiment's command, headline
  and figures. Deterministic: the files' order (sorted by name) and content only."""
  lines = ["# Results", "",
           "Generated by `python -m xlt.report` from `results/*.json` (one file per experiment config): edit",
           "those, not this file. `python -m xlt.report collect --workdir=W --config=C --name=N` records a",
           "finished run; `python -m xlt.report --check` (run by the tests) fails while this file is stale.",
           "Reference: *Ability Transfer through Language Mixing* (the table each config names). `a → b`: the",
           "baseline (a language alone, or limited data) → mixed. Each figure says where it was measured.", "",
           _row(["experiment", "reference", "xlt: mean ± std (seeds)", "wall time", "machine", "commit", "date"]),
           _row(["---"] * 7)]
  for result in results:
    for m in result["measurements"]:
      if m.get("summary"):
        lines.append(_row([f"{result['name']}: {m['label']}{_unit(result, m)}"] + _cells(result, m)))
  for result in results:
    lines += _section(result)
  return "\n".join(lines) + "\n"


def check(results_dir: str = RESULTS_DIR, doc: str = DOC) -> str | None:
  """None when `doc` is what render gives, else the one line that says it is not."""
  want = render(load(results_dir))
  try:
    with open(doc, encoding="utf-8") as f:
      have = f.read()
  except OSError:
    have = None
  if have != want:
    return (f"{os.path.relpath(doc, ROOT)} is not the render of {os.path.relpath(results_dir, ROOT)}/*.json: "
            "run `python -m xlt.report`")
  return None


def check_speed(results_dir: str = RESULTS_DIR, doc: str = SPEED_DOC) -> str | None:
  """None when `doc`'s tables are the render of `results_dir`/benchmarks/*.json, else one line."""
  have, want = speed_doc.update(os.path.join(results_dir, "benchmarks"), doc)
  if have != want:
    return (f"{os.path.relpath(doc, ROOT)}'s tables are not the render of "
            f"{os.path.relpath(results_dir, ROOT)}/benchmarks/*.json: run `python -m xlt.report`")
  return None


# --------------------------------------------------------------------------------------- collect

def machine(cpuinfo: str = "/proc/cpuinfo") -> str:
  """'2-core AMD EPYC 7B13, AVX2, no AVX-512': the CPU model, its cores and vector extensions."""
  model, flags, cores = "unknown CPU", set(), 0
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
          cores += 1
        elif key == "model name" and model == "unknown CPU":
          model = value.strip()
        elif key == "flags" and not flags:
          flags = set(value.split())
  except OSError:
    return "unknown"
  vector = "AVX-512" if "avx512f" in flags else ("AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
  return f"{cores or os.cpu_count()}-core {model}, {vector}"


def git_commit(root: str = ROOT) -> str:
  try:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                         timeout=30)
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _read_json(path: str, what: str):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except OSError as e:
    raise UserError(f"{path}: no {what} (not a finished run?)") from e
  except ValueError as e:
    raise UserError(f"{path}: not valid JSON ({e})") from e


def read_workdir(workdir: str) -> tuple[list[dict], dict[str, dict]]:
  """(rows, {point: summary}) of a finished workdir ('' is a single experiment's point)."""
  if not os.path.isdir(workdir):
    raise UserError(f"{workdir}: no such workdir")
  rows = _read_json(os.path.join(workdir, "results.json"), "results.json")
  need = {"experiment", "task", "language", "role", "condition", "metric", "mean", "std", "seeds", "values"}
  if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and need <= set(r) for r in rows):
    raise UserError(f"{workdir}/results.json: not a list of result rows with fields {sorted(need)}")
  if os.path.isfile(os.path.join(workdir, "summary.json")):
    return rows, {"": _read_json(os.path.join(workdir, "summary.json"), "summary.json")}
  points = sorted({_point(r) for r in rows})
  if points == [""]:
    raise UserError(f"{workdir}: no summary.json (not a finished run?)")
  return rows, {p: _read_json(os.path.join(workdir, p, "summary.json"), "summary.json") for p in points}


def _point(row: dict) -> str:
  """A grid point's name (experiment 'graph_table3/diff_vocab_m256'), '' for a single experiment."""
  return row["experiment"].split("/", 1)[1] if "/" in row["experiment"] else ""


def _stats(row: dict, scale: float) -> dict:
  out = {"mean": round(row["mean"] * scale, 2), "std": round(row["std"] * scale, 2) if row["seeds"] > 1 else None,
         "seeds": row["seeds"], "values": [round(v * scale, 2) for v in row["values"]]}
  if row.get("ci95") is not None:  # the merge testbed's rows: the 95% t interval's half-width
    out["ci"] = round(row["ci95"] * scale, 2)
  return out


def _versus(row: dict) -> dict | None:
  """A testbed goal row's paired difference to the best expert, in points, or None."""
  v = row.get("vs_best_expert")
  if not v or v.get("expert") == row["condition"]:
    return None
  out = {"mean": round(v["mean"] * 100, 2), "seeds": len(v["values"]), "values": [round(x * 100, 2) for x in
                                                                                 v["values"]]}
  if v.get("ci95") is not None:
    out.update(ci=round(v["ci95"] * 100, 2), low=round(v["low"] * 100, 2), high=round(v["high"] * 100, 2),
               sign=v["sign"])
  return out


def _transfer(rows: list[dict], metric: str, scale: float) -> list[dict]:
  """Per (point, role, language): baseline → mixed as one measurement, other conditions one each."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    if r["metric"] == metric:
      groups.setdefault((_point(r), r["role"], r["language"]), []).append(r)
  out = []
  for (point, role, lang), rs in groups.items():
    prefix = f"{point}/" if point else ""
    base = next((r for r in rs if r["condition"] in BASELINES), None)
    mixed = next((r for r in rs if r["condition"] == "mixed"), None)
    if base and mixed:
      out.append({"key": f"{prefix}{role}/{lang}", "label": f"{prefix}{role} {lang}: {base['condition']} → mixed",
                  "summary": role == "target", "xlt": {**_stats(mixed, scale), "alone": _stats(base, scale)}})
      if scale == 1 and base["mean"]:  # a perplexity: the relative improvement of mixed over the baseline
        out.append({"key": f"{prefix}{role}/{lang}/improvement", "label": f"{prefix}{role} {lang}: improvement",
                    "unit": "%", "summary": False, "xlt": {
                        "mean": round((base["mean"] - mixed["mean"]) / base["mean"] * 100, 1), "decimals": 1}})
      rs = [r for r in rs if r is not base and r is not mixed]
    conditions = [r["condition"] for r in rs]
    for r in rs:
      n = f"/{r.get('samples')}" if conditions.count(r["condition"]) > 1 else ""
      out.append({"key": f"{prefix}{role}/{lang}/{r['condition']}{n}",
                  "label": f"{prefix}{role} {lang}: {r['condition']}{' n=' + n[1:] if n else ''}",
                  "summary": False, "xlt": _stats(r, scale)})
  if out and not any(m["summary"] for m in out):
    out[0]["summary"] = True
  return out


def _testbed(rows: list[dict]) -> list[dict]:
  """The merge testbed: one measurement per model, its goal score first, the other columns after
  (and, from rows that have them, the goal's difference to the best expert and retention)."""
  find = {(r["condition"], r["role"], r["metric"]): r for r in rows}
  out = []
  for name in dict.fromkeys(r["condition"] for r in rows):
    goal = find.get((name, "goal", "exact_match"))
    if goal is None:
      continue
    also = [(label, find.get(k)) for label, k in (("any script", (name, "goal", "any_script")),
                                                  ("task", (name, "task", "exact_match")),
                                                  ("language", (name, "language", "exact_match")),
                                                  ("source language", (name, "source_language", "exact_match")))]
    also = [{"label": l, "xlt": _stats(r, 100)} for l, r in also if r]
    if _versus(goal):
      also.append({"label": f"goal − {goal['vs_best_expert']['expert']}", "xlt": _versus(goal)})
    if (goal.get("retention") or {}).get("value") is not None:
      also.append({"label": "retention", "xlt": {"mean": round(goal["retention"]["value"] * 100, 1), "decimals": 1}})
    out.append({"key": name, "label": f"{name}: goal", "summary": name == "task expert",
                "xlt": _stats(goal, 100), "also": also})
  return out


def _regimes(rows: list[dict]) -> list[dict]:
  """The regime map (rows with a `regime`): the testbed's measurements of each regime, keyed
  r<i>/<model> and labelled with the regime's learning rate, steps and the task expert's delta."""
  out = []
  for i in sorted({r["regime"] for r in rows}):
    mine = [r for r in rows if r["regime"] == i]
    where = (f"r{i} (lr {mine[0]['peak_lr']:g}, {mine[0]['finetune_steps']} steps, task expert moved "
             f"{mine[0]['task_expert_delta']:.3g})")
    for m in _testbed(mine):
      out.append({**m, "key": f"r{i}/{m['key']}", "label": f"{where} {m['label']}", "summary": False})
  return out


def _wall(summary: dict) -> str:
  wall = summary.get("wall_s")
  if isinstance(wall, dict):
    wall = wall.get("total")
  return f"{wall:.0f} s" if isinstance(wall, (int, float)) else "unknown"


def _headline(measurements: list[dict]) -> str:
  parts = []
  for m in measurements:
    if m.get("summary"):
      ref = f", reference {_pair(m['reference'])}" if m.get("reference") else ""
      parts.append(f"{m['label']}: {_xlt(m)}{ref}")
  return "; ".join(parts) + "."


def declaration(config):
  """The declaration (xlt.experiments.common.Kind) of the kind that runs `config` (a config, a
  recorded config.json, or a data task alone as rows record it): its headline metric and how
  its rows are read. Imported here, not at the top: render and check stay light."""
  from xlt import experiments

  try:
    return experiments.kind({"task": config} if isinstance(config, str) else config).KIND
  except ValueError as e:
    raise UserError(str(e)) from e


def _declaration_of(workdir: str, rows: list[dict]):
  """The declaration of the kind that ran `workdir`: from its config.json (which names the
  kind), else from the task its rows record (a grid's points each hold their config)."""
  path = os.path.join(workdir, "config.json")
  if os.path.isfile(path):
    return declaration(_read_json(path, "config.json"))
  return declaration(rows[0]["task"])


def collect(workdir: str, config: str, name: str, command: str | None = None, metric: str | None = None,
            results_dir: str = RESULTS_DIR, commit: str | None = None, date: str | None = None,
            where: str | None = None) -> dict:
  """results/<name>.json from a finished workdir (see the module docstring); returns it."""
  rows, summaries = read_workdir(workdir)
  task = rows[0]["task"]
  declared = _declaration_of(workdir, rows)
  metric = metric or declared.tasks[declared.former().get(task, task)]
  if metric is None or not any(r["metric"] == metric for r in rows):
    raise UserError(f"{workdir}: no rows of metric {metric!r} (its metrics: {sorted({r['metric'] for r in rows})})")
  scale = 100 if metric in FRACTIONS else 1
  new = {"transfer": lambda: _transfer(rows, metric, scale), "testbed": lambda: _testbed(rows),
         "regimes": lambda: _regimes(rows)}[declared.measurements]()
  path = os.path.join(results_dir, f"{name}.json")
  old = _read_json(path, "results file") if os.path.isfile(path) else {}
  old_by_key = {m.get("key"): m for m in old.get("measurements", [])}
  for m in new:
    kept = old_by_key.get(m["key"], {})
    m.update({k: kept[k] for k in ("label", "summary", "reference") if k in kept})
    m.setdefault("reference", None)
    if "" not in summaries:  # a grid: each point's own wall time
      m["measured"] = {"wall_time": _wall(summaries[m["key"].split("/", 1)[0]])}
  fresh = {m["key"] for m in new}
  for m in old.get("measurements", []):  # measured in another run: keeps where and when it was
    if m.get("key") not in fresh:
      new.append({**m, "measured": _measured(old, m)})
  tokens = [s.get("train_tokens_per_s") for s in summaries.values()]
  measured = {"commit": commit or git_commit(), "date": date or datetime.datetime.now(datetime.UTC).strftime(
      "%Y-%m-%d"), "machine": where or machine(), "wall_time": _wall(summaries[""]) if "" in summaries else
      "per point"}
  if len(tokens) == 1 and isinstance(tokens[0], (int, float)):
    measured["tokens_per_s"] = round(tokens[0])
  result = {"name": name, "config": config,
            "command": command or old.get("command") or
            f"python -m xlt.main --config={config} --workdir=runs/{name}",
            "reproduces": old.get("reproduces", ""), "headline": _headline(new), "metric": metric,
            "unit": "%" if scale == 100 else old.get("unit", ""), "measured": measured, "measurements": new}
  if old.get("notes"):
    result["notes"] = old["notes"]
  _write_text(path, dumps(result))
  return result


# ------------------------------------------------------------------------------------------ main

def main(argv: list[str]) -> int:
  command = argv.pop(0) if argv and argv[0] in ("render", "collect") else "render"
  parser = argparse.ArgumentParser(prog=f"python -m xlt.report {command}")
  parser.add_argument("--results_dir", default=RESULTS_DIR)
  if command == "render":
    parser.add_argument("--check", action="store_true", help="exit 1 if the document is out of date")
    parser.add_argument("--out", default=DOC)
    parser.add_argument("--speed_out", default=None,
                        help="docs/speed.md ('' : leave it alone; default: docs/speed.md when --results_dir is "
                             "the repository's results/, else left alone)")
  else:
    for flag in ("workdir", "config", "name"):
      parser.add_argument(f"--{flag}", required=True)
    parser.add_argument("--command", default=None, help="the command that ran it (default: xlt.main's)")
    parser.add_argument("--metric", default=None, help="the headline metric (default: the task's)")
  args = parser.parse_args(argv)
  if command == "render" and args.speed_out is None:
    # another results directory's benchmarks would overwrite the repository's speed tables
    args.speed_out = SPEED_DOC if os.path.abspath(args.results_dir) == os.path.abspath(RESULTS_DIR) else ""
  try:
    if command == "collect":
      result = collect(args.workdir, args.config, args.name, args.command, args.metric, args.results_dir)
      print(f"wrote {os.path.join(args.results_dir, args.name + '.json')}: {result['headline']}")
      return 0
    if args.check:
      problem = check(args.results_dir, args.out) or (args.speed_out and check_speed(args.results_dir, args.speed_out))
      if problem:
        print(problem, file=sys.stderr)
        return 1
      return 0
    _write_text(args.out, render(load(args.results_dir)))
    if args.speed_out:
      _write_text(args.speed_out, speed_doc.update(os.path.join(args.results_dir, "benchmarks"), args.speed_out)[1])
    return 0
  except (UserError, speed_doc.FileError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
