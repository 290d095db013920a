"""The one results format of xlt: `results.json` rows (also as CSV), a markdown table
and plots. Every experiment writes rows of the same fields, so results compare and
script across tasks.

A row: {experiment, task, language, role (source/target), condition (alone/mixed/...),
metric, mean, std, seeds, values, samples, ...}. Accuracies and validities are
fractions in [0, 1].

With several processes (xlt.distributed) only process 0 writes: the others compute the same
rows and tables, and these functions write nothing for them.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Sequence

import numpy as np

from xlt import distributed
from xlt.io import fileio

FIELDS = ("experiment", "task", "language", "role", "condition", "metric", "mean", "std", "seeds",
          "samples", "values")


def make_row(**fields) -> dict:
  values = [float(v) for v in fields.pop("values")]
  missing = {"experiment", "task", "language", "role", "condition", "metric", "samples"} - set(fields)
  if missing:
    raise ValueError(f"result row is missing {sorted(missing)}")
  # std over seeds (ddof=0 with one seed gives 0, as a table would show it).
  return {**fields, "mean": float(np.mean(values)), "std": float(np.std(values, ddof=1) if len(values) > 1 else 0.0),
          "seeds": len(values), "values": values}


def atomic_write(path: str, text: str):
  """Writes via a temporary file and a rename, so a crash never leaves a torn file. (Process 0
  only: the others would write the same bytes to the same shared file.)"""
  if not distributed.is_main():
    return
  fileio.write_text(path, text)


def write(workdir: str, rows: list[dict]):
  """results.json and results.csv in the workdir."""
  atomic_write(os.path.join(workdir, "results.json"), json.dumps(rows, indent=1))
  buf = io.StringIO()
  extra = sorted({k for r in rows for k in r} - set(FIELDS))
  w = csv.DictWriter(buf, fieldnames=list(FIELDS) + extra)
  w.writeheader()
  for r in rows:
    w.writerow({**r, "values": " ".join(f"{v:.6g}" for v in r["values"])})
  atomic_write(os.path.join(workdir, "results.csv"), buf.getvalue())


def write_predictions(path: str, records: list[dict], member_names: Sequence[str]):
  """predictions.jsonl: each test prompt's decoded answer and scores, per member (by name),
  so errors can be read; written atomically."""
  lines = (json.dumps({**r, "member": member_names[r["member"]]}, ensure_ascii=False) for r in records)
  atomic_write(path, "\n".join(lines) + "\n")


def fmt(row: dict | None, percent: bool = True) -> str:
  if row is None:
    return "–"
  scale = 100 if percent else 1
  if row["seeds"] == 1:
    return f"{row['mean'] * scale:.2f}{'%' if percent else ''}"
  return f"{row['mean'] * scale:.2f}{'%' if percent else ''} ± {row['std'] * scale:.2f}"


def transfer_table(rows: list[dict], metric: str, title: str = "") -> str:
  """Markdown table in the reference's shape: per experiment, each language alone and mixed."""
  find = lambda exp, role, cond: next(
      (r for r in rows if r["experiment"] == exp and r["role"] == role and r["condition"] == cond
       and r["metric"] == metric), None)
  lines = [f"{title}" if title else "",
           "| experiment | lang 1 | lang 2 | N | M | lang 1 alone | lang 1 mixed | lang 2 alone | lang 2 mixed |",
           "|---|---|---|---|---|---|---|---|---|"]
  for exp in dict.fromkeys(r["experiment"] for r in rows):
    s, t = find(exp, "source", "mixed") or find(exp, "source", "alone"), find(exp, "target", "mixed") or find(exp, "target", "alone")
    lines.append(
        f"| {exp} | {s and s['language']} | {t and t['language']} | {s and s['samples']} | {t and t['samples']} | "
        f"{fmt(find(exp, 'source', 'alone'))} | {fmt(find(exp, 'source', 'mixed'))} | "
        f"{fmt(find(exp, 'target', 'alone'))} | {fmt(find(exp, 'target', 'mixed'))} |")
  return "\n".join(l for l in lines if l) + "\n"


def sweep_table(rows: list[dict], metric: str, title: str = "") -> str:
  """Markdown table of a sample-size sweep: one line per (language, samples)."""
  lines = [title] if title else []
  lines += ["| language | samples | " + metric + " |", "|---|---|---|"]
  for r in sorted((r for r in rows if r["metric"] == metric), key=lambda r: (r["language"], r["samples"])):
    lines.append(f"| {r['language']} | {r['samples']} | {fmt(r)} |")
  return "\n".join(lines) + "\n"


def table(rows: list[dict], metric: str, name: str, sweep: bool) -> str:
  """The markdown table of experiment (or grid) `name`: a sweep's or a transfer pair's shape."""
  title = f"{name}: test {metric} (mean ± std over seeds; one value: one seed)"
  return sweep_table(rows, metric, title) if sweep else transfer_table(rows, metric, title)


def plot_curves(path: str, curves: dict[str, list[tuple[int, float]]], ylabel: str):
  """One line per run: held-out score over training steps (written by process 0 only)."""
  if not distributed.is_main():
    return
  # The Agg canvas without pyplot: draws off-screen and leaves the caller's backend alone
  # (matplotlib.use("Agg") here would stop a notebook's plt.show() from showing anything).
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(figsize=(7, 4.5))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  for name, pts in curves.items():
    if pts:
      xs, ys = zip(*pts)
      ax.plot(xs, ys, label=name, alpha=0.8)
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  with fileio.atomic_open(path) as f:
    fig.savefig(f, format="png", dpi=120)
