"""A preregistered pilot's structure verdicts: whether each candidate base design of the merge
testbed has the structure the papers explain their results by, judged on criteria fixed in the
preregistration before the pilots ran (docs/prereg/claims_study_2.md), never on the claims.

  python -m xlt.pilots --workdir=runs/structure_pilots --prereg=docs/prereg/claims_study_2.md \\
      --runs_commit=<the commit the runs used> --out=results/studies/structure_pilots.json

Per grid point (a design) of a finished pilot run, xlt.structure's measures of its bases and
experts (written to <point>/structure_finetune.json, or read from it when it is there), then:

  S1  the base's cross-language similarity at the answer position: high through the middle
      third of the blocks, lower after the bottom zone's blocks and after the top zone's;
  S2  the base's language probe: lower accuracy through the middle third than at both edges;
  S3  the task expert keeps the task when any single edge-zone block is reverted to the base's,
      and loses it for some middle block (retention: reverted score / the expert's own);
  S4  the language expert's change sits at the edges (xlt.structure.edge_ratio);
  B1  (a design that doses the base with the task) the base half-knows the task;
  G1, G2  the first study's gates on the base's target language and the experts' own roles.

Zones: the layer-swapping paper's bottom 5 and top 2 of 32 layers, scaled up (xlt.structure.zone);
the middle third: blocks floor(L/3) .. ceil(2L/3) - 1. Layer l of a probe curve is the residual
after block l - 1 (0: the embeddings). A criterion passes for a design when it holds on the mean
curves over its bases and on more than half of its bases one by one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from xlt import claims
from xlt import report
from xlt import results as results_lib
from xlt import structure

CRITERIA = ("S1", "S2", "S3", "S4", "B1", "G1", "G2")


def zones(num_layers: int) -> dict[str, list[int]]:
  """Block indices of the bottom and top zones and of the middle third."""
  bottom, top = structure.zone(num_layers)
  middle = list(range(num_layers // 3, math.ceil(2 * num_layers / 3)))
  return {"bottom": list(range(bottom)), "top": list(range(num_layers - top, num_layers)), "middle": middle}


def _layers(blocks: list[int]) -> list[int]:
  return [b + 1 for b in blocks]  # the residual after each block


def s1(similarity, z: dict, spec: dict) -> tuple[bool, dict]:
  sim = np.asarray(similarity, float)
  mid, low, high = (float(sim[_layers(z[k])].mean()) for k in ("middle", "bottom", "top"))
  ok = mid >= spec["mid_min"] and mid - low >= spec["margin"] and mid - high >= spec["margin"]
  return ok, {"middle": mid, "bottom": low, "top": high}


def s2(accuracy, z: dict, spec: dict) -> tuple[bool, dict]:
  acc = np.asarray(accuracy, float)
  mid, low, high = (float(acc[_layers(z[k])].mean()) for k in ("middle", "bottom", "top"))
  return mid <= min(low, high) - spec["margin"], {"middle": mid, "bottom": low, "top": high}


def s3(revert_task, expert_task: float, z: dict, spec: dict) -> tuple[bool, dict]:
  keep = np.asarray(revert_task, float) / max(expert_task, 1e-9)
  edge = float(keep[z["bottom"] + z["top"]].min())
  middle = float(keep[z["middle"]].min())
  return edge >= spec["edge_keep"] and middle <= 1 - spec["middle_loss"], {"edge_min": edge, "middle_min": middle}


def s4(ratio: float, spec: dict) -> tuple[bool, dict]:
  return bool(ratio >= spec["edge_ratio"]), {"edge_ratio": float(ratio)}


def judge(measured: dict, spec: dict, dosed: bool) -> dict:
  """Each criterion's verdict for one design from its xlt.structure measures (`measured`):
  {criterion: {"passes", "mean": figures of the mean curves, "per_base": [{"passes", ...}]}};
  B1 is None for a design without a dose of the task."""
  z = zones(measured["num_layers"])
  seeds = len(measured["seeds"])
  sc = measured["scores"]
  mean = lambda xs: float(np.mean(xs))

  def per(i):  # base i's figures, or the means over bases (i None)
    pick = (lambda v: v["mean"]) if i is None else (lambda v: v["values"][i])
    one = (lambda xs: mean(xs)) if i is None else (lambda xs: xs[i])
    base_probe = measured["probe"]["base"]
    lang_ratio = measured["edge_ratio"]["language expert"]
    out = {"S1": s1(pick(base_probe["similarity"]), z, spec["S1"]), "S2": s2(pick(base_probe["accuracy"]), z, spec["S2"]),
           "S3": s3(pick(measured["revert"]["task"]), one(sc["task expert"]["task"]), z, spec["S3"]),
           "S4": s4(lang_ratio["mean"] if i is None else lang_ratio["values"][i], spec["S4"])}
    b1 = one(sc["base"]["task"])
    out["B1"] = (spec["B1"]["min"] <= b1 <= spec["B1"]["max"], {"base_task": b1}) if dosed else None
    g1 = one(sc["base"]["language"])
    g2 = (one(sc["task expert"]["task"]), one(sc["language expert"]["language"]))
    out["G1"] = (g1 >= spec["G1"], {"base_language": g1})
    out["G2"] = (min(g2) >= spec["G2"], {"task_expert_task": g2[0], "language_expert_language": g2[1]})
    return out

  at_mean, bases = per(None), [per(i) for i in range(seeds)]
  verdicts = {}
  for k in CRITERIA:
    if at_mean[k] is None:
      verdicts[k] = None
      continue
    each = [bool(b[k][0]) for b in bases]
    verdicts[k] = {"passes": bool(at_mean[k][0]) and sum(each) * 2 > seeds, "mean": at_mean[k][1],
                   "per_base": [{"passes": e, **b[k][1]} for e, b in zip(each, bases)]}
  return verdicts


def design_passes(verdicts: dict) -> bool:
  return all(v["passes"] for v in verdicts.values() if v is not None)


def analyse(workdir: str, prereg_path: str, runs_commit: str, command: str, problems: int = 0) -> dict:
  """Every preregistered design's structure verdicts (measuring a point whose structure file
  is missing)."""
  prereg = claims.read_prereg(prereg_path)
  pilot = prereg["pilot"]
  designs = []
  for point in pilot["designs"]:
    name, path = point["name"], os.path.join(workdir, point["name"])
    if not os.path.isfile(os.path.join(path, "results.json")):
      designs.append({"name": name, "status": "not run"})
      continue
    measured_path = os.path.join(path, "structure_finetune.json")
    if not os.path.isfile(measured_path):
      measured = structure.measure(path, "finetune", problems or pilot["problems"])
      results_lib.atomic_write(measured_path, json.dumps(measured, indent=1))
    with open(measured_path, encoding="utf-8") as f:
      measured = json.load(f)
    verdicts = judge(measured, pilot["criteria"], bool(point.get("dose")))
    with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
      wall = json.load(f)["wall_s"]
    designs.append({"name": name, "status": "run", "passes": design_passes(verdicts), "verdicts": verdicts,
                    "num_layers": measured["num_layers"], "seeds": measured["seeds"], "wall_s": wall})
  return {"study": prereg["study"], "stage": "pilots", "prereg": {"file": prereg_path,
          "commit": claims.file_commit(prereg_path), **pilot}, "runs_commit": runs_commit, "command": command,
          "machine": report.machine(), "designs": designs}


def _cell(v) -> str:
  if v is None:
    return "–"
  figures = ", ".join(f"{k} {x:.2f}" for k, x in v["mean"].items())
  n = sum(b["passes"] for b in v["per_base"])
  return f"{'**pass**' if v['passes'] else 'fail'} ({figures}; {n}/{len(v['per_base'])} bases)"


def table(result: dict) -> str:
  """The structure panel: one row per design, one column per criterion."""
  lines = ["| design | " + " | ".join(CRITERIA) + " | passes |", "|---" * (len(CRITERIA) + 2) + "|"]
  for d in result["designs"]:
    if d["status"] != "run":
      lines.append(f"| {d['name']} | " + " | ".join("not run" for _ in CRITERIA) + " | – |")
      continue
    cells = [_cell(d["verdicts"][k]) for k in CRITERIA]
    lines.append(f"| {d['name']} | " + " | ".join(cells) + f" | {'yes' if d['passes'] else 'no'} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m xlt.pilots", description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True, help="the pilot grid's workdir (one point per design)")
  p.add_argument("--prereg", required=True, help="the preregistration (its ```json block's \"pilot\")")
  p.add_argument("--runs_commit", required=True, help="the commit whose code ran the pilots")
  p.add_argument("--problems", type=int, default=0, help="problems per set in the measures (0: the prereg's)")
  p.add_argument("--out", required=True, help="the results file")
  a = p.parse_args(argv)
  start = time.time()
  command = " ".join(["python -m xlt.pilots"] + list(argv if argv is not None else sys.argv[1:]))
  try:
    result = analyse(a.workdir, a.prereg, a.runs_commit, command, a.problems)
  except (ValueError, OSError, KeyError) as e:
    print(f"xlt.pilots: {e}", file=sys.stderr)
    return 2
  result["wall_s"] = round(time.time() - start, 1)
  results_lib.atomic_write(a.out, json.dumps(result, indent=1))
  print(table(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
