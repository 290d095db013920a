"""docs/merge.md's table of merge methods, rendered from their declarations (xlt.merge.declare)
so that it cannot fall behind them:

  python -m xlt.merge.methods_doc docs/merge.md           # rewrites the table in place
  python -m xlt.merge.methods_doc docs/merge.md --check   # exit 1 (one line) while it is stale
"""

from __future__ import annotations

from xlt.merge import fileio, registry


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


def with_methods_table(doc: str) -> str:
  """`doc` (docs/merge.md's text) with the part between its table markers rendered anew."""
  if TABLE_BEGIN not in doc or TABLE_END not in doc:
    raise ValueError("the document has no methods table markers (registry.TABLE_BEGIN / TABLE_END)")
  head, rest = doc.split(TABLE_BEGIN, 1)
  return head + methods_table() + rest.split(TABLE_END, 1)[1]


def main(argv: list[str]) -> int:
  """python -m xlt.merge.methods_doc docs/merge.md [--check]: writes the document's methods table, or
  with --check exits 1 (one line) when it is stale."""
  path = argv[1]
  with open(path) as f:
    text = f.read()
  fresh = with_methods_table(text)
  if "--check" in argv[2:]:
    if fresh != text:
      print(f"{path}: the methods table is stale: run python -m xlt.merge.methods_doc {path}")
      return 1
    return 0
  fileio.write_text(path, fresh)
  return 0


if __name__ == "__main__":
  import sys
  sys.exit(main(sys.argv))
