"""Model merging on plain parameter pytrees: every method of the registry (`describe()`, the
table in docs/merge.md), from layer swapping, soups, task arithmetic, TIES, DARE and MAET to
mergekit's methods, the subspace and mask methods (TSV-M, Iso-C/CTS, TALL masks, Consensus,
Localize-and-Stitch), the data-aware ones (RegMean, Fisher), LoRA adapter merging, and the
layer-swapping paper's analysis of where fine-tuning changed a model.

Depends on numpy, jax.tree_util and the standard library only (optax inside Localize-and-Stitch's
mask search, matplotlib inside the
plot function, safetensors when a file's tensor is read; `python -m xlt.merge` adds absl
and ml_collections for its config), never on the rest of xlt, so it merges any checkpoint
that loads as a pytree. Paths are read through a `Naming` (`XLT` for xlt.model's GPT, `HF` for Hugging
Face names, `from_rule(path -> (block, kind))` for any other); every merge takes `naming=`.

  declare.py  one declaration per method, next to its function (name, roles, paper, layer-
              awareness, mergekit name); per-tensor methods lifted over trees
  registry.py every declared method by name: its inputs (roles), options, paper; `merge`, `describe`
  methods_doc.py docs/merge.md's methods table, rendered from the declarations
  core.py     structure checks, leaf-wise maps (`over_leaves`: every method's preamble), deltas
  swap.py     layer swapping with transition zones
  combine.py  soup, magnitude weights, task arithmetic, TIES, DARE, MagMax, row sparsification
  sparse.py   DARE-TIES, breadcrumbs (-TIES), DELLA (-linear), SCE
  geometric.py SLERP, NuSLERP, multi-SLERP, Karcher mean, model stock, nearswap
  selective.py Arcee fusion, RAM
  maet.py     MAET (ability extraction and transfer)
  subspace.py TSV-M, Iso-C, Iso-CTS (singular subspaces of the task vectors)
  localize.py TALL masks, Consensus, Localize-and-Stitch (masks of each task's change)
  data_aware.py RegMean, RegMean++, Fisher merging (statistics from xlt.merge_statistics)
  lora_adapters.py LoRA adapters merged into one (concatenation, SVD)
  tool.py     merges of checkpoint files into a model directory (`python -m xlt.merge`)
  analysis.py per-block share of changed rows, heatmap
(xlt/param_paths.py: paths -> (block, kind) and the rows (neurons) of each tensor: XLT, HF, from_rule;
xlt/io/: safetensors files, Hugging Face model directories, atomic writes.)

Any method by name: `merge.merge("ties", {"base": b, "experts": [t, l]}, {"density": 0.2})`;
`print(merge.describe())` lists them all; `python -m xlt.merge` runs them on files.
"""

from xlt.merge.analysis import default_threshold, plot_row_change, row_change
from xlt.merge.combine import dare, magmax, magnitude_weights, soup, sparsify_rows, task_arithmetic, ties
from xlt.merge.core import check_compatible, check_range, delta, leaf_mask, map_leaves, masked_leaves, mean_abs_rows
from xlt.merge.maet import key_rows, maet
from xlt.merge.lora_adapters import PEFT_CONFIG, PEFT_PREFIX, PEFT_WEIGHTS, factors, read_peft
from xlt.io.tensor_files import load, save
from xlt.merge.tool import check_output, merge_files
from xlt.merge import registry
from xlt.merge.registry import METHODS, Method, describe, merge
from xlt.param_paths import HF, XLT, Naming, from_rule, naming_for, path_names, path_str
from xlt.merge.swap import layer_swap, swap_plan, swapped_modules

__all__ = [
    "PEFT_CONFIG", "PEFT_PREFIX", "PEFT_WEIGHTS", "factors", "read_peft", "HF", "METHODS", "Method", "XLT", "Naming", "check_compatible", "check_range", "dare", "default_threshold",
    "delta", "describe", "from_rule", "key_rows", "layer_swap", "leaf_mask", "load", "maet", "magmax",
    "magnitude_weights", "map_leaves", "masked_leaves", "mean_abs_rows", "merge", "merge_files", "check_output", "naming_for", "path_names", "path_str",
    "plot_row_change", "registry", "row_change", "save", "soup", "sparsify_rows", "swap_plan", "swapped_modules",
    "task_arithmetic", "ties",
]
