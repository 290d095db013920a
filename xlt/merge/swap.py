"""Layer swapping (Bandarkar et al., "Layer swapping for zero-shot cross-lingual
transfer in large language models", Algorithm 1).

Two experts fine-tuned from the same base: a *task* expert (e.g. math, trained in the
high-resource language) and a *language* expert (general data in the target language).
The merged model takes the bottom and top blocks from the language expert, where the
paper finds language-specific change concentrated, and the middle from the task expert;
optional *transition zones* between them are weighted averages of both.

    block:   0 .. bottom-1 | lower transition | task blocks | upper transition | top blocks
    source:  language      | average          | task        | average          | language

The paper's defaults for the 32-block LLAMA 3.1 8B: bottom 5, top 2, no transition
zones (its tested ranges: bottom 3-5, top 0-2, transitions 0-2 each); parameters outside
the blocks (embeddings, final norm, output layer) work best as averages of the experts.
"""

from __future__ import annotations

from xlt.merge import combine, core, declare
from xlt.param_paths import XLT, Naming

NON_BLOCK_RULES = ("average", "task", "language")
MODULES = ("attn", "mlp", "norm")  # the kinds of a block's parameters (xlt.param_paths' block_kind)


def swapped_modules(modules) -> tuple[str, ...] | None:
  """The module kinds `modules` names ("attn", "mlp", "norm"; a sequence, or a string of them
  joined by "," or "+": "attn+norm" is one value of a merge search's choice), or None for
  "all" (the whole block)."""
  if isinstance(modules, str):
    if modules == "all":
      return None
    modules = [m.strip() for m in modules.replace("+", ",").split(",") if m.strip()]
  kinds = tuple(modules) if isinstance(modules, (list, tuple)) else ()
  if not kinds or any(not isinstance(k, str) or k not in MODULES for k in kinds):
    raise ValueError(f"layer swap: modules must be 'all' or kinds among {', '.join(MODULES)}, got {modules!r}")
  return kinds


def swap_plan(num_blocks: int, bottom: int, top: int, lower_transition: int = 0,
              upper_transition: int = 0, task_weight: float = 1.0,
              language_weight: float = 1.0) -> list[float]:
  """The language expert's weight in each block, block 0 first: 1.0 = the language
  expert's block, 0.0 = the task expert's, in between = a transition block
  language_weight / (task_weight + language_weight).

  Algorithm 1 with L = num_blocks, b = bottom, u = top, t_b, t_u = the transitions:
    l < b or l > L-1-u                 -> language expert
    b <= l < b + t_b                   -> transition (lower zone)
    L-1-u-t_u < l <= L-1-u             -> transition (upper zone)
    otherwise                          -> task expert
  The paper's line 5 ("else if l > b-1+t_b or l < L-u-t_u: task") must read "and":
  with "or", every block that is not swapped meets one of the two conditions whenever
  the zones fit (b + t_b + t_u + u <= L), so no block would ever be a transition.
  """
  for what, v in (("num_blocks", num_blocks), ("bottom", bottom), ("top", top),
                  ("lower_transition", lower_transition), ("upper_transition", upper_transition)):
    if int(v) != v or v < 0:
      raise ValueError(f"layer swap: {what} must be a non-negative integer, got {v}")
  if bottom + lower_transition + upper_transition + top > num_blocks:
    raise ValueError(
        f"layer swap: bottom={bottom} + lower_transition={lower_transition} + "
        f"upper_transition={upper_transition} + top={top} = "
        f"{bottom + lower_transition + upper_transition + top} blocks exceeds the model's "
        f"{num_blocks}: the zones would overlap")
  blend = transition_weight(task_weight, language_weight)
  last = num_blocks - 1
  plan = []
  for l in range(num_blocks):
    if l < bottom or l > last - top:
      plan.append(1.0)
    elif l < bottom + lower_transition or l > last - top - upper_transition:
      plan.append(blend)
    else:
      plan.append(0.0)
  return plan


def transition_weight(task_weight: float, language_weight: float) -> float:
  """The language expert's share in a transition block (and in averaged non-block
  parameters): language_weight / (task_weight + language_weight)."""
  if task_weight < 0 or language_weight < 0 or task_weight + language_weight <= 0:
    raise ValueError(f"layer swap: weights must be non-negative with a positive sum, got "
                     f"task_weight={task_weight}, language_weight={language_weight}")
  return float(language_weight) / (float(task_weight) + float(language_weight))


def num_blocks_of(tree, naming: Naming = XLT, expected: int | None = None) -> int:
  """The number of blocks L: the largest block index in the tree plus one; checked
  against `expected` when given."""
  blocks = [b for p, _ in core.leaves_with_paths(tree) if (b := naming.block_kind(p)[0]) is not None]
  if not blocks:
    raise ValueError(f"no block parameters found under the {naming.name!r} naming")
  found = max(blocks) + 1
  if expected is not None and expected != found:
    raise ValueError(f"num_blocks={expected} was given but the parameters have {found} blocks "
                     f"(largest block index {found - 1})")
  return found


@declare.method("layer_swap", ("task_expert", "language_expert"), paper=combine.LAYER_SWAPPING, layer_aware=True)
def layer_swap(task_expert, language_expert, *, bottom: int, top: int, lower_transition: int = 0,
               upper_transition: int = 0, task_weight: float = 1.0, language_weight: float = 1.0,
               non_block: str = "average", num_blocks: int | None = None, modules: str | tuple = "all",
               naming: Naming = XLT):
  """Layer swapping: the task expert with its bottom and top blocks replaced by the
  language expert's.

  Args:
    task_expert, language_expert: parameter trees of one structure, both fine-tuned from
      the same base model; a list of several experts of one kind is averaged (a uniform
      soup) before swapping, as in the paper's appendix A.4.
    bottom: how many blocks from the input end (block 0 up) come from the language
      expert (the paper's b; it uses 5 of 32 blocks by default, 3-5 all work).
    top: how many blocks from the output end come from the language expert (u; the
      paper's default 2 of 32, 0-2 all work).
    lower_transition, upper_transition: how many blocks just above the bottom zone / just
      below the top zone are weighted averages of both experts (t_b, t_u; 0 by default,
      1-2 tested: the paper saw no significant gain, but conjectures they matter when the
      experts have drifted further apart).
    task_weight, language_weight: the weights of the average, w_task and w_lang:
      (w_task * task + w_lang * lang) / (w_task + w_lang). Equal weights are a plain
      average; `combine.magnitude_weights([task, lang], base)` gives the paper's
      magnitude-adjusted alternative.
    non_block: parameters outside the blocks (embedding, head): "average" (with the same
      weights; the paper's finding), "task" or "language".
    num_blocks: the block count L, checked against the tree's when given.
    modules: which of a swapped (or transition) block's parameters come from the language
      expert: "all" (the whole block, the paper's), or kinds among "attn", "mlp" and "norm"
      (a tuple, or "attn,mlp" / "attn+mlp" on the command line): "attn" swaps the attention alone, "mlp"
      the MLP alone (module-wise swapping; the rest of the block stays the task expert's).
      A block's norms are "norm": listed, they move too.
    naming: how paths name blocks (`naming.XLT` for xlt.model).

  Every parameter inside a block (norms included) moves with its block; the paper's
  Algorithm 1 gives a layer number to the attention and feed-forward parameters only,
  but a block's norms are trained with, and scale the inputs of, that block's weights.
  """
  # Several experts of one kind are souped first (the paper's appendix A.4: "language soup
  # w/ math soup"); a soup of one model is that model.
  task_expert, language_expert = (
      combine.soup(e, naming=naming) if isinstance(e, (list, tuple)) else e
      for e in (task_expert, language_expert))
  core.check_compatible([task_expert, language_expert], ["task expert", "language expert"])
  if non_block not in NON_BLOCK_RULES:
    raise ValueError(f"layer swap: non_block must be one of {NON_BLOCK_RULES}, got {non_block!r}")
  plan = swap_plan(num_blocks_of(task_expert, naming, num_blocks), bottom, top, lower_transition,
                   upper_transition, task_weight, language_weight)
  non_block_weight = {"average": transition_weight(task_weight, language_weight),
                      "task": 0.0, "language": 1.0}[non_block]
  kinds = swapped_modules(modules)

  def merge(path, task, lang):
    block, kind = naming.block_kind(path)
    w = non_block_weight if block is None else plan[block] if kinds is None or kind in kinds else 0.0
    if w == 0.0:
      return task
    if w == 1.0:
      return lang
    # task + w * (lang - task): exact when both experts agree, unlike w_t * t + w_l * l.
    t = core.as_compute(task)
    return t + w * (core.as_compute(lang) - t)

  return core.map_leaves(merge, task_expert, language_expert)
