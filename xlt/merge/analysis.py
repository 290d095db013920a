"""Where did fine-tuning change a model? The layer-swapping paper's analysis (section
3.2, figure 2): for every parameter tensor, the share of its rows whose mean absolute
change (MAV of expert - base) exceeds a threshold, drawn as a heatmap of blocks (block 0
at the bottom) by within-block parameter. Its language experts changed most in the
bottom and top blocks, its math experts in the second half: the picture that motivates
which blocks to swap.
"""

from __future__ import annotations

import numpy as np

from xlt.io import fileio
from xlt.merge import core
from xlt.param_paths import XLT, Naming, path_str

_KIND_ORDER = ("attn", "mlp", "norm")  # the paper's columns: attention left, MLP right
_NON_BLOCK_ORDER = ("embedding", "head")  # input end first, drawn at the bottom


def default_threshold(expert, base, *, naming: Naming = XLT) -> float:
  """The median row MAV of expert - base over all rows of all tensors (each row counted
  once): about half the rows count as changed, so the heatmap shows *where* change sits
  rather than saturating. When more than half the rows did not move (e.g. embedding rows
  of unused tokens) this is 0, and "changed" means "changed at all". (The paper picked
  1.9e-5 and 1.0e-5 by hand for its LLAMA 3.1 8B experts.)"""
  mavs = [m for _, m in core.row_mavs(expert, base, naming)]
  return float(np.median(np.concatenate(mavs))) if mavs else 0.0


def row_change(expert, base, *, threshold: float, naming: Naming = XLT) -> dict:
  """The share of rows changed by more than `threshold` (row MAV > threshold), per tensor.

  Returns {"blocks": [0, .., L-1], "columns": within-block names ("attn/qkv/kernel"),
  attention then MLP then norms, "share": [L][C] (None where a block lacks the column),
  "non_block": {"wte/embedding": share, ...}, embeddings first and the head last,
  "threshold": threshold}. Rows are `naming.rows` (output units; a 1-D tensor is one
  row, so its share is 0 or 1).
  """
  if not threshold >= 0:
    raise ValueError(f"row_change threshold must be >= 0, got {threshold}")
  shares, kinds, non_block, num_blocks = {}, {}, {}, 0
  for p, mavs in core.row_mavs(expert, base, naming):
    share = float(np.mean(mavs > threshold)) if mavs.size else 0.0
    block, kind = naming.block_kind(p)
    if block is None:
      non_block[path_str(p)] = (kind, share)
      continue
    column = naming.local_name(p)
    shares[block, column] = share
    kinds.setdefault(column, kind)
    num_blocks = max(num_blocks, block + 1)
  # sorted() is stable: tree order within a kind.
  rank = {k: i for i, k in enumerate(_KIND_ORDER)}
  columns = sorted(kinds, key=lambda c: rank.get(kinds[c], len(rank)))
  rank = {k: i for i, k in enumerate(_NON_BLOCK_ORDER)}
  outside = sorted(non_block, key=lambda n: rank.get(non_block[n][0], len(rank)))
  return {"blocks": list(range(num_blocks)), "columns": columns,
          "share": [[shares.get((b, c)) for c in columns] for b in range(num_blocks)],
          "non_block": {n: non_block[n][1] for n in outside}, "threshold": float(threshold)}


def plot_row_change(change: dict, path: str, title: str | None = None) -> None:
  """Writes `change` (from `row_change`) as a PNG heatmap: blocks up the y axis (block 0
  at the bottom, as in the paper's figure 2), within-block parameters along x, colour =
  share of rows changed (0-1, darker = more); the non-block parameters in a strip on the
  right. Written to a temporary file and renamed, so `path` is never half written."""
  # matplotlib only here, and without pyplot: the Agg canvas draws off-screen and leaves
  # the caller's backend and global figure state alone.
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  grid = np.array([[np.nan if s is None else s for s in row] for row in change["share"]], float)
  grid = grid.reshape(len(change["blocks"]), len(change["columns"]))
  names, strip = list(change["non_block"]), [[s] for s in change["non_block"].values()]
  num_cols, num_blocks = max(len(change["columns"]), 1), max(len(change["blocks"]), 1)

  width = 2.0 + 0.45 * num_cols + (2.2 if names else 0.0)  # inches: room for labels
  fig = Figure(figsize=(width, 1.6 + 0.3 * max(num_blocks, len(names))))
  FigureCanvasAgg(fig)
  panels = fig.add_gridspec(1, 2 if names else 1, width_ratios=[num_cols, 1] if names else None, wspace=0.9)
  style = dict(cmap="Greens", vmin=0.0, vmax=1.0, aspect="auto", origin="lower", interpolation="nearest")
  ax = fig.add_subplot(panels[0, 0])
  image = ax.imshow(grid, **style)
  ax.set_xticks(range(len(change["columns"])), change["columns"], rotation=60, ha="right", fontsize=7)
  ax.set_yticks(range(len(change["blocks"])), [str(b) for b in change["blocks"]], fontsize=7)
  ax.set_ylabel("block")
  if names:
    side = fig.add_subplot(panels[0, 1])
    side.imshow(np.array(strip, float), **style)
    side.set_xticks([])
    side.set_yticks(range(len(names)), names, fontsize=7)
    side.set_title("outside blocks", fontsize=8)
  fig.colorbar(image, ax=fig.axes, label=f"share of rows with MAV > {change['threshold']:.3g}", shrink=0.8)
  if title:
    fig.suptitle(title, fontsize=10)

  with fileio.atomic_open(path) as f:
    fig.savefig(f, format="png", dpi=120, bbox_inches="tight")
