"""The regime map's figures (testbed_regimes): the recipe families, their lines over the regimes,
table.md (one row per recipe, one column per regime) and regime_map.png.

A family's line per regime, from the goal exact-match rows (each with its regime's fields):
  each      one line per member model (the experts, task arithmetic per lambda, TIES and DARE,
            the soups, MAET, data mixing);
  best/mean two lines: "(mean of k)", the per-seed mean over the k members with its 95% t
            interval over seeds (xlt.stats), and "(best of k)", the member with the highest mean
            in that regime (chosen on these test scores: an upper envelope, not a method), with
            its own interval (layer swaps; freeze-then-train and train-then-revert over the
            partition presets).
x = the regime's task expert's mean relative delta (row field task_expert_delta). numpy and
matplotlib only; no jax.
"""

from __future__ import annotations

import numpy as np

from xlt import stats
from xlt.experiments.testbed import report as testbed_report
from xlt.io import fileio

STYLES = ("-", "--", ":", "-.")


def families(c, merges) -> list[tuple[str, str, list[str]]]:
  """(family, "each" | "best/mean", member model names) in plot order; `merges` is testbed.
  merges(c) (label, method, options), so the config's swaps, lambdas and extras are its members."""
  of = lambda *methods: [label for label, method, _ in merges if method in methods]
  presets = c.partition.presets
  return [("experts", "each", ["task expert", "language expert"]),
          ("data mixing", "each", ["data mixing"]),
          ("layer swap", "best/mean", of("layer_swap")),
          ("task arithmetic", "each", of("task_arithmetic")),
          ("TIES / DARE", "each", of("ties", "dare")),
          ("freeze-then-train", "best/mean", [f"freeze-then-train [{p}]" for p in presets]),
          ("train-then-revert", "best/mean", [f"train-then-revert [{p}]" for p in presets]),
          ("soups", "each", of("soup")),
          ("MAET", "each", of("maet"))]


def _point(row: dict, values, model: str) -> dict:
  iv = stats.interval(values)
  return {"regime": row["regime"], "x": row["task_expert_delta"], "mean": iv["mean"], "ci95": iv["half"],
          "values": [float(v) for v in values], "model": model}


def lines(rows: list[dict], families_) -> list[dict]:
  """[{label, family, aggregate, points: [{regime, x, mean, ci95, values, model}] by regime}] for each
  family (`families`) with members among the goal exact-match rows."""
  goal = {(r["regime"], r["condition"]): r for r in rows if (r["role"], r["metric"]) == ("goal", "exact_match")}
  regimes = sorted({k for k, _ in goal})
  out = []
  for family, how, members in families_:
    members = [m for m in members if all((k, m) in goal for k in regimes)]
    if how == "each" or len(members) == 1:
      out += [{"label": m, "family": family, "aggregate": False,
               "points": [_point(goal[(k, m)], goal[(k, m)]["values"], m) for k in regimes]} for m in members]
    elif members:
      mean, best = [], []
      for k in regimes:
        values = np.mean([goal[(k, m)]["values"] for m in members], axis=0)
        mean.append(_point(goal[(k, members[0])], values, f"mean of {len(members)}"))
        top = max(members, key=lambda m: goal[(k, m)]["mean"])
        best.append(_point(goal[(k, top)], goal[(k, top)]["values"], top))
      out += [{"label": f"{family} (best of {len(members)})", "family": family, "points": best, "aggregate": True},
              {"label": f"{family} (mean of {len(members)})", "family": family, "points": mean, "aggregate": True}]
  return out


def _regime_heads(rows) -> list[dict]:
  heads = {}
  for r in rows:
    heads.setdefault(r["regime"], {k: r[k] for k in ("regime", "peak_lr", "finetune_steps", "task_expert_delta",
                                                     "language_expert_delta")})
  return [heads[k] for k in sorted(heads)]


def table(c, rows: list[dict], model_names, lines_) -> str:
  """table.md: one row per model (goal exact match in %, mean ± 95% half-width) and per
  aggregated family line, one column per regime; the regimes' settings and deltas above."""
  heads = _regime_heads(rows)
  find = {(r["regime"], r["condition"]): r for r in rows if (r["role"], r["metric"]) == ("goal", "exact_match")}
  n = rows[0]["seeds"]
  out = [f"{c.name}: goal exact match (%) by fine-tuning regime, mean ± half-width of the 95% t interval over "
         f"{n} seeds.",
         "relative delta: ||expert − base|| / ||base|| over all parameters, mean over seeds. best of k: the member "
         "with the highest mean in that regime (chosen on these scores); mean of k: the per-seed mean over them.", "",
         "| model | " + " | ".join(f"r{h['regime']}" for h in heads) + " |",
         "|---|" + "---|" * len(heads),
         "| *peak lr* | " + " | ".join(f"{h['peak_lr']:g}" for h in heads) + " |",
         "| *steps* | " + " | ".join(str(h["finetune_steps"]) for h in heads) + " |",
         "| *task expert relative delta* | " + " | ".join(f"{h['task_expert_delta']:.4g}" for h in heads) + " |",
         "| *language expert relative delta* | " + " | ".join(f"{h['language_expert_delta']:.4g}" for h in heads)
         + " |"]
  for name in model_names:
    out.append(f"| {name} | " + " | ".join(testbed_report.cell(find.get((h["regime"], name))) for h in heads) + " |")
  for line in lines_:
    if line["aggregate"]:  # "(best of k)", "(mean of k)": the models' own rows are above
      by = {p["regime"]: p for p in line["points"]}
      out.append(f"| {line['label']} | " + " | ".join(testbed_report.cell(by.get(h["regime"])) for h in heads) + " |")
  return "\n".join(out) + "\n"


def plot(path: str, lines_: list[dict], title: str = "", regime_labels: dict | None = None):
  """regime_map.png: per line, goal exact match (%) against the task expert's relative delta
  (log x), with 95% interval bars (each line nudged sideways by up to ±4% of x so the bars stay
  apart); a colour per family (the experts in black), a line style per member; the regimes on
  the top axis (`regime_labels` {regime: label}, default "r<i>")."""
  # the Agg canvas without pyplot: draws off-screen and leaves the caller's backend alone
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  from matplotlib.ticker import NullLocator

  fig = Figure(figsize=(10, 5.5))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  colours = {"experts": "k"}
  within: dict[str, int] = {}
  for j, line in enumerate(lines_):
    colour = colours.setdefault(line["family"], f"C{(len(colours) - 1) % 10}")
    style = STYLES[within.setdefault(line["family"], 0) % len(STYLES)]
    within[line["family"]] += 1
    pts = sorted(line["points"], key=lambda p: p["x"])
    yerr = [100 * (p["ci95"] or 0.0) for p in pts]
    nudge = 1.0 + 0.08 * (j / max(len(lines_) - 1, 1) - 0.5)
    ax.errorbar([p["x"] * nudge for p in pts], [100 * p["mean"] for p in pts], yerr=yerr if any(yerr) else None,
                color=colour, linestyle=style, marker="o", markersize=4, capsize=3, alpha=0.85, label=line["label"])
  ax.set_xscale("log")
  ax.set_xlabel("task expert's relative delta ||θ − θ_base|| / ||θ_base|| (mean over seeds)")
  ax.set_ylabel("goal exact match (%)")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  if lines_:
    ticks = {p["regime"]: p["x"] for p in lines_[0]["points"]}
    labels = regime_labels or {}
    top = ax.twiny()
    top.set_xscale("log")
    top.set_xlim(ax.get_xlim())
    top.set_xticks([ticks[k] for k in sorted(ticks)], [labels.get(k, f"r{k}") for k in sorted(ticks)], fontsize=7)
    top.xaxis.set_minor_locator(NullLocator())
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  with fileio.atomic_open(path) as f:
    fig.savefig(f, format="png", dpi=120)
