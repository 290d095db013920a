"""Parameter partitions: which parameters a recipe trains, freezes, reverts or swaps.

A partition gives every parameter leaf a string label ("language", "task", ...): a *label
tree* with the params' structure, which is what `optax.multi_transform` takes. It is
declared as data, an ordered list of rules (the first rule that matches a leaf wins):

  {"label": "language", "blocks": "bottom:2+top:1", "kinds": ("attn", "mlp"), "names": ("qkv",)}

  blocks  "all" | "none" | "bottom:K" | "top:J" | "0-2,5" | terms joined by "+" or ","
          ("bottom:K+top:J") | a list of ints. Default "all".
  kinds   path_info kinds: embedding, attn, mlp, norm, head; or "all" (default), which
          means the block kinds attn, mlp, norm. The non-block parameters (wte, wpe: kind
          embedding; ln_f, lm_head: kind head) match only rules that name their kind, and
          for them the block spec is ignored, so "bottom:2 of everything" never grabs them.
  names   optional: the leaf matches only if one of its path names is listed. Block norms
          are all kind "norm"; names=("ln_1",) picks the attention's input norm.

Leaves no rule matches take `rest`, or are an error naming their path. Presets of the
modular-training paper (section 3.3) come from `preset_rules`.

Recipes built on a label tree: `freeze` (train some labels, the papers' requires_grad=False
on the rest), `alternating` (section 4.5: the partitions take turns under one optimizer),
`gated_optimizer` (per-member recipes inside one vmapped ensemble step, chosen at run time
by a flag vector over the cells of `refine`; `frozen_leaves` turns fixed flags into the mask
of `train.static_freeze`, whose step differentiates only the trained leaves), and `revert` / `combine` (section 6:
train-then-revert and layer swapping of whole partitions).
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xlt import model as model_lib
from xlt import train as train_lib
from xlt.param_paths import path_names, path_str

KINDS = ("embedding", "attn", "mlp", "norm", "head")
BLOCK_KINDS = ("attn", "mlp", "norm")
PRESETS = ("A", "C", "A_inv", "C_inv")
CELL_SEP = "|"  # joins a leaf's labels into its cell name in `refine`
_BLOCK_KEY = re.compile(r"block_(\d+)$")
_RULE_KEYS = {"label", "blocks", "kinds", "names"}


# ---------------------------------------------------------------- paths and checks

def num_layers_of(tree) -> int:
  """The number of blocks, from the block_{i} keys (they must be 0..n-1)."""
  found = sorted(int(m.group(1)) for k in tree if (m := _BLOCK_KEY.match(str(k))))
  if found != list(range(len(found))):
    raise ValueError(f"block keys are not block_0..block_{{n-1}}: {found}")
  return len(found)


def _check_label(label, what: str) -> str:
  if not isinstance(label, str) or not label:
    raise ValueError(f"{what}: a label must be a non-empty string, got {label!r}")
  if CELL_SEP in label:
    raise ValueError(f"{what}: label {label!r} contains {CELL_SEP!r}, reserved for cell names")
  return label


def check_same_tree(a, b, a_name: str = "a", b_name: str = "b", shapes: bool = True):
  """ValueError naming the first differences when `a` and `b` differ in structure (or, with
  `shapes`, in a leaf's shape or dtype). Label trees are compared on structure only."""
  pa = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(a)[0]}
  pb = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(b)[0]}
  if pa.keys() != pb.keys() or jax.tree.structure(a) != jax.tree.structure(b):
    only_a, only_b = sorted(pa.keys() - pb.keys())[:5], sorted(pb.keys() - pa.keys())[:5]
    raise ValueError(f"{a_name} and {b_name} have different structures: only in {a_name}: "
                     f"{only_a}, only in {b_name}: {only_b}")
  if shapes:
    for k, x in pa.items():
      y = pb[k]
      dx, dy = getattr(x, "dtype", type(x)), getattr(y, "dtype", type(y))
      if np.shape(x) != np.shape(y) or dx != dy:
        raise ValueError(f"{k}: {a_name} has {np.shape(x)} {dx}, {b_name} has {np.shape(y)} {dy}")


def _label_set(chosen, label_tree, what: str) -> frozenset[str]:
  chosen = frozenset([chosen] if isinstance(chosen, str) else chosen)
  unknown = chosen - set(jax.tree.leaves(label_tree))
  if unknown:
    raise ValueError(f"{what}: labels {sorted(unknown)} are not in the label tree "
                     f"(it has {sorted(set(jax.tree.leaves(label_tree)))})")
  return chosen


# ---------------------------------------------------------------- declaration

def parse_blocks(spec, num_layers: int) -> frozenset[int]:
  """The block indices a block spec names (see the module docstring)."""
  if isinstance(spec, (list, tuple)) and all(isinstance(i, (int, np.integer)) for i in spec):
    bad = [int(i) for i in spec if not 0 <= i < num_layers]
    if bad:
      raise ValueError(f"block spec {list(spec)}: blocks {bad} out of range for {num_layers} blocks")
    return frozenset(int(i) for i in spec)
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"malformed block spec {spec!r}: expected a string or a list of ints")
  terms = [t.strip() for t in re.split(r"[+,]", spec)]
  if terms in (["all"], ["none"]):
    return frozenset(range(num_layers) if terms == ["all"] else ())
  out, ends = set(), {}
  for t in terms:
    if m := re.fullmatch(r"(bottom|top):(\d+)", t):
      end, n = m.group(1), int(m.group(2))
      if end in ends or n > num_layers:
        raise ValueError(f"block spec {spec!r}: {t!r} repeated or more than {num_layers} blocks")
      ends[end] = n
      out |= set(range(n)) if end == "bottom" else set(range(num_layers - n, num_layers))
    elif m := re.fullmatch(r"(\d+)(?:-(\d+))?", t):
      lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
      if lo > hi:
        raise ValueError(f"malformed block spec {spec!r}: range {t!r} runs backwards")
      if hi >= num_layers:
        raise ValueError(f"block spec {spec!r}: block {hi} out of range for {num_layers} blocks "
                         f"(0..{num_layers - 1})")
      out |= set(range(lo, hi + 1))
    else:
      raise ValueError(f"malformed block spec {spec!r} (term {t!r}); expected all, none, bottom:K, "
                       "top:J, bottom:K+top:J, a list like 0-2,5, or a list of ints")
  if sum(ends.values()) > num_layers:
    raise ValueError(f"block spec {spec!r}: bottom + top = {sum(ends.values())} > {num_layers} blocks")
  return frozenset(out)


def _normalize_rule(rule, i: int, num_layers: int, model_names: set[str]):
  rule = dict(rule.items())
  what = f"rule {i} {rule}"
  if rule.keys() - _RULE_KEYS or "label" not in rule:
    raise ValueError(f"{what}: keys must be label (required), blocks, kinds, names")
  label = _check_label(rule["label"], what)
  kinds = rule.get("kinds", "all")
  kinds = (BLOCK_KINDS if kinds == "all" else
           tuple(k.strip() for k in kinds.split(",")) if isinstance(kinds, str) else tuple(kinds))
  unknown = [k for k in kinds if k not in KINDS]
  if unknown or not kinds:
    raise ValueError(f"{what}: unknown kinds {unknown}; known: {list(KINDS)} or 'all'")
  names = rule.get("names")
  if names is not None:
    names = (names,) if isinstance(names, str) else tuple(names)
    missing = [n for n in names if n not in model_names]
    if missing or not names:
      raise ValueError(f"{what}: names {missing} occur in no parameter path; "
                       f"names there: {sorted(n for n in model_names if not _BLOCK_KEY.match(n))}")
  return label, parse_blocks(rule.get("blocks", "all"), num_layers), frozenset(kinds), names


def labels(params_or_shapes, rules: Sequence, rest: str | None = None):
  """The label tree of `rules` (first match wins; `rest` for the leaves none matches).
  Works on arrays, jax.eval_shape output, or a stacked ensemble alike."""
  num_layers = num_layers_of(params_or_shapes)
  leaves = jax.tree_util.tree_flatten_with_path(params_or_shapes)[0]
  model_names = {n for p, _ in leaves for n in path_names(p)}
  norm = [_normalize_rule(r, i, num_layers, model_names) for i, r in enumerate(rules)]
  if rest is not None:
    _check_label(rest, "rest")

  def assign(path, _):
    block, kind = model_lib.path_info(path)
    names = set(path_names(path))
    for label, blocks, kinds, only in norm:
      if kind in kinds and (block is None or block in blocks) and (only is None or names & set(only)):
        return label
    unassigned.append(f"{path_str(path)} (block {block}, kind {kind})")
    return rest

  unassigned: list[str] = []
  out = jax.tree_util.tree_map_with_path(assign, params_or_shapes)
  if unassigned and rest is None:
    raise ValueError(f"parameter {unassigned[0]} matches no rule and no `rest` label is given "
                     f"({len(unassigned)} such parameters: {', '.join(unassigned[:4])}, ...)")
  return out


def mask(label_tree, label: str | set) -> object:
  """A bool tree: True where the leaf's label is `label` (or one of a set of labels)."""
  chosen = _label_set(label, label_tree, "mask")
  return jax.tree.map(lambda l: l in chosen, label_tree)


# ---------------------------------------------------------------- presets

def preset_rules(name: str, num_layers: int, bottom: int, top: int,
                 embeddings: str = "language", head: str = "language") -> list[dict]:
  """Rules of the paper's partitions (section 3.3), at any depth; they label every leaf.

  A: all attention (with its input norm ln_1) + the MLPs (with ln_2) of the bottom `bottom`
     and top `top` blocks -> "language", the other MLPs -> "task".
  C: every parameter of the bottom `bottom` and top `top` blocks -> "language", the middle
     blocks -> "task". (The paper's [B] is C with bottom=8, top=4.)
  A_inv, C_inv: the same blocks with "language" and "task" exchanged (the paper's [Z]).
  Embeddings (wte, wpe) and head (ln_f, lm_head) take the `embeddings` and `head` labels in
  every preset, inverse ones included: they are not block parameters, so "exchanging the
  blocks' labels" says nothing about them; pass the arguments to move them.
  """
  if name not in PRESETS:
    raise ValueError(f"unknown partition preset {name!r}; known: {list(PRESETS)}")
  ends = f"bottom:{bottom}+top:{top}"
  parse_blocks(ends, num_layers)  # fails early on a negative count or bottom + top > depth
  lang, task = ("task", "language") if name.endswith("_inv") else ("language", "task")
  rules = [{"label": embeddings, "kinds": ("embedding",)}, {"label": head, "kinds": ("head",)}]
  if name.startswith("A"):
    rules += [{"label": lang, "blocks": "all", "kinds": ("attn",)},
              {"label": lang, "blocks": "all", "kinds": ("norm",), "names": ("ln_1",)},
              {"label": lang, "blocks": ends, "kinds": ("mlp",)},
              {"label": lang, "blocks": ends, "kinds": ("norm",), "names": ("ln_2",)}]
  else:
    rules += [{"label": lang, "blocks": ends, "kinds": "all"}]
  return rules + [{"label": task, "blocks": "all", "kinds": "all"}]


def from_config(pc, params):
  """The label tree of a `partition` config: either preset (+ bottom, top, and optionally
  embeddings, head) or rules (+ optional rest). Other fields are ignored (a recipe may keep
  its own settings beside these)."""
  get = lambda k, d=None: pc.get(k, d)
  preset, rules = get("preset"), get("rules")
  if bool(preset) == bool(rules):
    raise ValueError(f"a partition config needs exactly one of preset or rules, got {dict(pc.items())}")
  if preset:
    if get("bottom") is None or get("top") is None:
      raise ValueError(f"partition preset {preset!r} needs bottom and top")
    return labels(params, preset_rules(preset, num_layers_of(params), get("bottom"), get("top"),
                                       get("embeddings") or "language", get("head") or "language"))
  return labels(params, list(rules), rest=get("rest") or None)


def summary(label_tree, params) -> str:
  """A table of parameter counts per label (columns) and per part (rows) for logs."""
  check_same_tree(label_tree, params, "labels", "params", shapes=False)
  names = sorted(set(jax.tree.leaves(label_tree)))
  counts: dict[str, dict[str, int]] = {}
  for (path, x), label in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(label_tree)):
    block, kind = model_lib.path_info(path)
    row = kind if block is None else f"block_{block}"
    counts.setdefault(row, dict.fromkeys(names, 0))[label] += int(np.prod(np.shape(x)))
  rows = [r for r in ["embedding", *(f"block_{i}" for i in range(num_layers_of(params))), "head"] if r in counts]
  counts["total"] = {n: sum(counts[r][n] for r in rows) for n in names}
  grand = max(sum(counts["total"].values()), 1)
  width = max(12, *(len(n) + 2 for n in names))
  line = lambda a, xs: f"{a:<10}" + "".join(f"{x:>{width}}" for x in xs)
  out = [line("part", names + ["total"])]
  out += [line(r, [f"{counts[r][n]:,}" for n in names] + [f"{sum(counts[r].values()):,}"])
          for r in rows + ["total"]]
  share = [f"{100 * counts['total'][n] / grand:.1f}%" for n in names]
  return "\n".join(out + [line("share", share + ["100.0%"])])


# ---------------------------------------------------------------- freezing

def freeze(tx: optax.GradientTransformation, label_tree, trainable: str | set):
  """`tx` on the `trainable` labels, zero updates (and no optimizer state) elsewhere.

  The trainable labels form ONE branch, so `tx` keeps one state for them and a clip inside
  `tx` (make_optimizer's) sees only their gradients: a frozen parameter contributes nothing
  to the clipping norm, as with PyTorch's requires_grad=False in the papers. Chaining
  `clip_by_global_norm` before `freeze` instead would count the frozen gradients.
  """
  chosen = _label_set(trainable, label_tree, "freeze")
  groups = jax.tree.map(lambda l: "trainable" if l in chosen else "frozen", label_tree)
  return optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, groups)


def frozen_optimizer(opt_config, label_tree, trainable: str | set):
  """xlt's optimizer (clip included) on the `trainable` labels only."""
  return freeze(train_lib.make_optimizer(opt_config), label_tree, trainable)


# ---------------------------------------------------------------- partitions taking turns

def _decay_mask(p):
  return jax.tree.map(lambda x: x.ndim > 1, p)  # no decay on biases/LN, as make_optimizer


def _adam_core(c) -> optax.GradientTransformation:
  """AdamW without the learning rate: the part of one partition's optimizer that can rest.
  (The schedule is applied once, outside, on the global step.)"""
  if c.name not in ("adamw", "adam"):
    raise ValueError(f"partition optimizers rest Adam moments: opt.name must be adamw or adam, "
                     f"got {c.name!r}")
  core = [optax.scale_by_adam(b1=c.b1, b2=c.b2)]
  if c.name == "adamw":
    core.append(optax.add_decayed_weights(c.weight_decay, mask=_decay_mask))
  return optax.chain(*core)


def active_label(step: int, order: Sequence[str] = ("task", "language"), steps_per_switch: int = 1) -> str:
  """The label `alternating` trains at 0-based `step` (for the data pipeline's choice)."""
  if not order or int(steps_per_switch) < 1:
    raise ValueError(f"need a non-empty order and steps_per_switch >= 1, got {order}, {steps_per_switch}")
  return tuple(order)[(int(step) // int(steps_per_switch)) % len(order)]


def alternating(opt_config, label_tree, order: Sequence[str] = ("task", "language"),
                steps_per_switch: int = 1) -> optax.GradientTransformation:
  """Simultaneous partition training (paper section 4.5) as one optax transformation.

  The labels take turns, `steps_per_switch` steps each, in `order` (a label may appear more
  than once for uneven shares). Each label has its own clip + AdamW under
  `conditionally_mask`: while a label rests its updates are zero and its moments and
  bias-correction count are frozen in time; clipping and weight decay see only the active
  label. One schedule on the global step scales every update ("since there is a single
  optimizer, the learning rate schedule is the same for all").
  """
  c, k, order = opt_config, int(steps_per_switch), tuple(order)
  active_label(0, order, k)  # checks order and steps_per_switch
  present = set(jax.tree.leaves(label_tree))
  if present != set(order):
    raise ValueError(f"alternating: labels in the tree {sorted(present)} and in order {sorted(set(order))} "
                     "differ (a label not in order would never train; one not in the tree trains nothing)")
  inner = optax.chain(*([optax.clip_by_global_norm(c.clip)] if c.clip else []), _adam_core(c))

  def turn_of(label):  # conditionally_mask's counter counts every call: the global step
    slots = jnp.asarray([i for i, l in enumerate(order) if l == label])
    return lambda step: jnp.any((step // k) % len(order) == slots)

  branches = {l: optax.transforms.conditionally_mask(inner, turn_of(l)) for l in present}
  return optax.chain(optax.multi_transform(branches, label_tree),
                     optax.scale_by_learning_rate(train_lib.make_schedule(c)))


# ---------------------------------------------------------------- run-time gated cells

def refine(label_trees: Sequence) -> tuple[object, tuple[str, ...]]:
  """The common refinement of several label trees: (cell tree, sorted cell names); a leaf's
  cell is its labels in each tree joined by "|", e.g. "language|task"."""
  trees = list(label_trees)
  if not trees:
    raise ValueError("refine needs at least one label tree")
  for i, t in enumerate(trees):
    check_same_tree(trees[0], t, "label tree 0", f"label tree {i}", shapes=False)
    for l in set(jax.tree.leaves(t)):
      _check_label(l, f"label tree {i}")
  cell_tree = jax.tree.map(lambda *ls: CELL_SEP.join(ls), *trees)
  return cell_tree, tuple(sorted(set(jax.tree.leaves(cell_tree))))


def cells_of(label_tree_index: int, label: str, cell_names: Sequence[str]) -> np.ndarray:
  """bool[num_cells]: the cells that make up `label` of tree `label_tree_index` of `refine`."""
  parts = [n.split(CELL_SEP) for n in cell_names]
  if not 0 <= label_tree_index < len(parts[0]):
    raise ValueError(f"label tree index {label_tree_index} out of range for {len(parts[0])} trees")
  flags = np.array([p[label_tree_index] == label for p in parts])
  if not flags.any():
    raise ValueError(f"no cell has label {label!r} in tree {label_tree_index}; cells: {list(cell_names)}")
  return flags


def mask_grads(grads, cell_tree, cell_names: Sequence[str], trainable):
  """`grads` with the leaves of cells whose flag is off set to zero."""
  index = {n: i for i, n in enumerate(cell_names)}
  trainable = jnp.asarray(trainable).astype(bool)
  return jax.tree.map(lambda g, cell: jnp.where(trainable[index[cell]], g, jnp.zeros_like(g)),
                      grads, cell_tree)


def frozen_leaves(cell_tree, cell_names: Sequence[str], trainable) -> object:
  """A tree of Python bools: True where the leaf's cell flag is off. Fixed flags (a frozen
  partition trained alone) make the gated step static: `train.static_freeze(tx, this)`
  differentiates only the trained leaves, to the same parameters."""
  trainable = np.asarray(trainable, bool)
  if trainable.shape != (len(cell_names),):
    raise ValueError(f"need one flag per cell of {tuple(cell_names)}, got shape {trainable.shape}")
  index = {n: i for i, n in enumerate(cell_names)}
  return jax.tree.map(lambda cell: not bool(trainable[index[cell]]), cell_tree)


def gated_optimizer(opt_config, cell_tree,
                    cell_names: Sequence[str]) -> optax.GradientTransformationExtraArgs:
  """xlt's AdamW + clip whose `update(grads, state, params, trainable=bool[num_cells])`
  trains only the cells whose flag is on, the flags being a run-time array: one `tx` serves
  ensemble members with different recipes under `jax.vmap` (lax.cond becomes a select).

  Frozen cells keep their moments and Adam count and get zero updates; their gradients are
  zeroed before the global clip (clipping over the trainable cells only) and they get no
  weight decay. The schedule follows the global step. A recipe is a flag vector per step:
  all on = make_optimizer; `cells_of(t, "task", ...)` = freeze; flags following
  `active_label` = alternating.
  """
  c, cell_names = opt_config, tuple(cell_names)
  if set(jax.tree.leaves(cell_tree)) != set(cell_names):
    raise ValueError(f"cell names {cell_names} do not match the cell tree's "
                     f"{sorted(set(jax.tree.leaves(cell_tree)))}")

  def gate(updates, state, params=None, trainable=None, **_):
    if trainable is None or np.shape(trainable) != (len(cell_names),):
      raise ValueError(f"gated_optimizer.update needs trainable=bool[{len(cell_names)}] (one flag per "
                       f"cell of {cell_names}), got {None if trainable is None else np.shape(trainable)}")
    return mask_grads(updates, cell_tree, cell_names, trainable), state

  def flag(i):
    return lambda step, trainable, **_: jnp.asarray(trainable)[i].astype(bool)

  branches = {n: optax.transforms.conditionally_mask(_adam_core(c), flag(i), forward_extra_args=True)
              for i, n in enumerate(cell_names)}
  return optax.chain(optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(), gate),
                     *([optax.clip_by_global_norm(c.clip)] if c.clip else []),
                     optax.multi_transform(branches, cell_tree),
                     optax.scale_by_learning_rate(train_lib.make_schedule(c)))


# ---------------------------------------------------------------- revert and combine

def revert(params, base, label_tree, label: str | set):
  """`params` with every leaf labelled `label` (or one of a set) taken from `base`, as is."""
  check_same_tree(params, base, "params", "base")
  check_same_tree(label_tree, params, "labels", "params", shapes=False)
  chosen = _label_set(label, label_tree, "revert")
  return jax.tree.map(lambda l, p, b: b if l in chosen else p, label_tree, params, base)


def combine(sources: Mapping[str, object], label_tree):
  """Params whose leaves of each label come from that label's source, e.g.
  combine({"task": task_expert, "language": language_expert}, labels)."""
  present = set(jax.tree.leaves(label_tree))
  if set(sources) != present:
    raise ValueError(f"combine: sources {sorted(sources)} must be exactly the labels {sorted(present)}")
  first = next(iter(sources))
  for name, tree in sources.items():
    check_same_tree(label_tree, tree, "labels", f"source {name!r}", shapes=False)
    check_same_tree(sources[first], tree, f"source {first!r}", f"source {name!r}")
  treedef = jax.tree.structure(label_tree)
  leaves = {name: treedef.flatten_up_to(tree) for name, tree in sources.items()}
  return treedef.unflatten([leaves[l][i] for i, l in enumerate(jax.tree.leaves(label_tree))])
