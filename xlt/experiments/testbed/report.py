"""The merge testbed's scores as results rows and table.md: per model and set, the mean over
seeds with its 95% t interval; on the goal, the paired difference to the best single expert;
and the share of the base's scores each model keeps on what it was not trained on.

Rows (xlt.results.make_row, one per model x role x metric; a role's score is the mean over its
sets) carry, beyond mean, std and values:
  ci95            the half-width of the 95% t interval of the mean (None with one seed);
and the model's goal exact-match row (its headline row) also:
  vs_best_expert  the goal's paired difference model - best expert, seed by seed (the expert,
                  task or language, with the highest mean goal score; seed i's expert grew
                  from seed i's base): {expert, mean, std, ci95, low, high, values, sign},
                  sign "+" / "-" when the interval lies above / below 0;
  retention       {value, sets}: per set the model's mean score / the base's, on the sets
                  (language, source_language) whose data the model did not train on; value is
                  the lowest (None for the base, or where the base scores 0).
numpy only (xlt.stats); no jax.
"""

from __future__ import annotations

import numpy as np

from xlt import results as results_lib
from xlt import stats

ROLES = ("goal", "task", "language", "source_language")
RETAINED = ("language", "source_language")  # the abilities of the base a model may lose
EXPERTS = ("task expert", "language expert")
MARKERS = {"+": " ▲", "-": " ▼", "": ""}


def metrics(role: str) -> tuple[str, ...]:
  return ("exact_match", "any_script") if role == "goal" else ("exact_match",)


def role_scores(model_names, scores, sets) -> dict[tuple[str, str, str], np.ndarray]:
  """{(model, role, metric): per-seed score}, a role's score the mean over its sets."""
  return {(name, role, metric): np.mean([scores[name][n][metric] for n in sets[role]], axis=0)
          for name in model_names for role in ROLES for metric in metrics(role)}


def best_expert(per: dict) -> str | None:
  """The single expert with the highest mean goal exact match (the first on a tie)."""
  have = [e for e in EXPERTS if (e, "goal", "exact_match") in per]
  return max(have, key=lambda e: float(np.mean(per[(e, "goal", "exact_match")]))) if have else None


def retention(per: dict, name: str, trained_on=()) -> dict:
  """{value, sets}: the model's mean score over the base's on each RETAINED set it did not
  train on (`trained_on`: roles), and the lowest of them (None where nothing compares)."""
  if name == "base" or ("base", "goal", "exact_match") not in per:
    return {"value": None, "sets": {}}
  sets = {}
  for role in RETAINED:
    base = float(np.mean(per[("base", role, "exact_match")]))
    if role not in trained_on and base > 0:
      sets[role] = float(np.mean(per[(name, role, "exact_match")])) / base
  return {"value": min(sets.values()) if sets else None, "sets": sets}


def _versus(values, best_values, expert: str) -> dict:
  d = stats.paired(values, best_values)
  return {"expert": expert, "mean": d["mean"], "std": d["std"], "ci95": d["half"], "low": d["low"],
          "high": d["high"], "values": [float(a - b) for a, b in zip(values, best_values)], "sign": d["sign"]}


def rows(c, model_names, scores, sets, seeds, trained_on: dict | None = None) -> list[dict]:
  """One row per model x role x metric; `scores` {model: {set: {metric: [per seed]}}};
  `trained_on` {model: roles its data taught} (a model not in it trained on nothing: a merge)."""
  per, trained_on = role_scores(model_names, scores, sets), trained_on or {}
  lang_of = {"goal": c.languages.target, "task": c.languages.source, "language": c.languages.target,
             "source_language": c.languages.source}
  best = best_expert(per)
  out = []
  for name in model_names:
    for role in ROLES:
      for metric in metrics(role):
        values = per[(name, role, metric)]
        row = results_lib.make_row(
            experiment=c.name, task=c.task, language=lang_of[role], role=role, condition=name,
            metric=metric, values=values, samples=None, sets=sets[role], seeds_used=seeds)
        row["ci95"] = stats.interval(values)["half"]
        if role == "goal" and metric == "exact_match":
          if best is not None:
            row["vs_best_expert"] = _versus(values, per[(best, role, metric)], best)
          row["retention"] = retention(per, name, trained_on.get(name, ()))
        out.append(row)
  return out


def cell(row: dict | None) -> str:
  """A score in %: mean ± the 95% interval's half-width (the mean alone with one seed)."""
  if row is None:
    return "–"
  if row.get("ci95") is None:
    return f"{row['mean'] * 100:.2f}"
  return f"{row['mean'] * 100:.2f} ± {row['ci95'] * 100:.2f}"


def versus_cell(row: dict) -> str:
  """The goal's paired difference to the best expert in points: mean [low, high] and ▲ / ▼
  where the interval lies above / below 0; "best expert" on that expert's own row."""
  v = row.get("vs_best_expert")
  if v is None:
    return "–"
  if v["expert"] == row["condition"]:
    return "(best expert)"
  if v["ci95"] is None:
    return f"{v['mean'] * 100:+.2f}"
  return f"{v['mean'] * 100:+.2f} [{v['low'] * 100:+.2f}, {v['high'] * 100:+.2f}]{MARKERS[v['sign']]}"


def retention_cell(row: dict) -> str:
  r = (row.get("retention") or {}).get("value")
  return "–" if r is None else f"{r * 100:.1f}"


def table(c, rows, model_names, sets) -> str:
  """table.md: per model, each role's mean ± 95% half-width, the goal's difference to the best
  expert, and retention."""
  find = {(r["condition"], r["role"], r["metric"]): r for r in rows}
  goal, tsk = sets["goal"][0], sets["task"][0]
  best = next((r["vs_best_expert"]["expert"] for r in rows if r.get("vs_best_expert")), "the best expert")
  n = rows[0]["seeds"]
  lines = [f"{c.name}: test exact match (%), mean ± half-width of the 95% t interval over {n} seeds.",
           f"goal − best expert: the goal's paired difference (points) to the {best}, seed by seed, "
           "[95% t interval]; ▲ / ▼ where it lies above / below 0.",
           "retention: the lowest share (%) of the base's score kept on the sets (language, source language) "
           "the model did not train on.", "",
           f"| model | goal: {goal} | goal − best expert | goal, any script | task: {tsk} | "
           f"language: {', '.join(sets['language'])} | source language: {', '.join(sets['source_language'])} "
           "| retention |",
           "|---|---|---|---|---|---|---|---|"]
  for name in model_names:
    g = find[(name, "goal", "exact_match")]
    cells = [cell(g), versus_cell(g), cell(find.get((name, "goal", "any_script")))]
    cells += [cell(find.get((name, role, "exact_match"))) for role in ("task", "language", "source_language")]
    lines.append(f"| {name} | " + " | ".join(cells + [retention_cell(g)]) + " |")
  return "\n".join(lines) + "\n"
