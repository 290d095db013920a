"""docs/merge.md's tables rendered from what they describe, so that they cannot fall behind it:
the merge methods from their declarations (xlt.merge.declare), and the parity with fusion-bench
from results/benchmarks/merge_fusion_parity.json (benchmarks/merge_parity_fusion.py):

  python -m xlt.merge.methods_doc docs/merge.md           # rewrites the tables in place
  python -m xlt.merge.methods_doc docs/merge.md --check   # exit 1 (one line) while it is stale
"""

from __future__ import annotations

import json
import os

from xlt.io import fileio
from xlt.merge import registry


TABLE_BEGIN = "<!-- methods table: written by `python -m xlt.merge.methods_doc docs/merge.md`; do not edit -->"
TABLE_END = "<!-- end of methods table -->"


def methods_table() -> str:
  """docs/merge.md's table of every method, rendered from the declarations: its inputs, its
  options, mergekit's name for it, whether it needs a naming rule, and its paper."""
  naming = lambda m: "yes" if m.layer_aware is True else "with some options" if m.layer_aware else "no"
  rows = ["| method | inputs | options | mergekit | needs a naming rule | paper |", "|---|---|---|---|---|---|"]
  for m in registry.METHODS.values():
    options = ", ".join(o.name + ("" if o.required else f"={o.default!r}") for o in m.options) or "—"
    rows.append(f"| {m.name} | {registry.role_list(m)} | {options.replace('|', '/')} | {m.mergekit or '—'} | "
                f"{naming(m)} | {m.paper.replace('|', '/')} |")
  return "\n".join([TABLE_BEGIN, *rows, TABLE_END])


PARITY_BEGIN = "<!-- fusion-bench parity: written by `python -m xlt.merge.methods_doc docs/merge.md`; do not edit -->"
PARITY_END = "<!-- end of fusion-bench parity -->"
PARITY = os.path.join("results", "benchmarks", "merge_fusion_parity.json")  # relative to the repository


def parity_table(result: dict) -> str:
  """The parity table of a merge_fusion_parity.json: each case's method, options and largest
  absolute difference to fusion-bench."""
  rows = [f"fusion-bench {result['fusion_bench']}, on {result['inputs']}:", "",
          "| case | method | options | max abs difference |", "|---|---|---|---|"]
  for case, c in result["cases"].items():
    options = ", ".join(f"{k}={v!r}" for k, v in c["options"].items()) or "defaults"
    rows.append(f"| {case} | {c['method']} | {options} | {c['max_abs_diff']:.1e} |")
  return "\n".join([PARITY_BEGIN, *rows, PARITY_END])


def _between(doc: str, begin: str, end: str, text: str) -> str:
  if begin not in doc or end not in doc:
    raise ValueError(f"the document has no markers {begin!r} ... {end!r}")
  head, rest = doc.split(begin, 1)
  return head + text + rest.split(end, 1)[1]


def with_methods_table(doc: str, parity: dict | None = None) -> str:
  """`doc` (docs/merge.md's text) with its methods table rendered anew, and its parity table
  from `parity` (a merge_fusion_parity.json) when given."""
  doc = _between(doc, TABLE_BEGIN, TABLE_END, methods_table())
  return doc if parity is None else _between(doc, PARITY_BEGIN, PARITY_END, parity_table(parity))


def read_parity(doc_path: str) -> dict:
  """The parity results of the repository that holds `doc_path` (docs/<name>.md)."""
  with open(os.path.join(os.path.dirname(os.path.abspath(doc_path)), "..", PARITY)) as f:
    return json.load(f)


def main(argv: list[str]) -> int:
  """python -m xlt.merge.methods_doc docs/merge.md [--check]: writes the document's tables, or
  with --check exits 1 (one line) when they are stale."""
  path = argv[1]
  with open(path) as f:
    text = f.read()
  fresh = with_methods_table(text, read_parity(path))
  if "--check" in argv[2:]:
    if fresh != text:
      print(f"{path}: the tables are stale: run python -m xlt.merge.methods_doc {path}")
      return 1
    return 0
  fileio.write_text(path, fresh)
  return 0


if __name__ == "__main__":
  import sys
  sys.exit(main(sys.argv))
