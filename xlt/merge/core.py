"""The plumbing every merge shares: checking that trees can be merged, mapping a
function over the leaves of several trees with their paths, deltas to a base, row
magnitudes, and the argument checks that give the same error for the same mistake.

Arithmetic runs in float32 (float64 leaves stay float64) and reductions (means, norms,
dot products) accumulate in float64; every merge returns numpy leaves with the input
dtype, in a tree of the input's structure. Inputs are never written to, but a leaf a
merge takes whole from an input (a swapped block, a soup of one) may be that input's
array rather than a copy.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from xlt.param_paths import XLT, Naming, Path, path_names, path_str


def dtype_of(x) -> np.dtype:
  """A leaf's dtype without copying a device array to the host."""
  return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def as_compute(x) -> np.ndarray:
  """`x` as a numpy array in the dtype merges compute in: float32, or float64 for
  float64 leaves (bfloat16 / float16 checkpoints are upcast, never summed in 16 bits)."""
  x = np.asarray(x)
  return x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)


def leaves_with_paths(tree) -> list[tuple[Path, Any]]:
  """[(path as a tuple of names, leaf)] in jax's flattening order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(path_names(p), x) for p, x in flat]


def check_compatible(trees: Sequence, names: Sequence[str] | None = None) -> None:
  """Raises ValueError at the first difference between `trees` (the first is the
  reference): a path missing from one of them, a shape or a dtype that differs, or
  containers of other types. `names` label the trees in the message ("task expert")."""
  trees = list(trees)
  if not trees:
    raise ValueError("no parameter trees to merge")
  names = [f"tree {i}" for i in range(len(trees))] if names is None else list(names)
  if len(names) != len(trees):
    raise ValueError(f"{len(names)} names for {len(trees)} trees")
  ref_name, ref = names[0], dict(leaves_with_paths(trees[0]))
  for name, tree in zip(names[1:], trees[1:]):
    other = dict(leaves_with_paths(tree))
    for missing_from, has, a, b in ((name, ref_name, ref, other), (ref_name, name, other, ref)):
      gone = next((p for p in a if p not in b), None)
      if gone is not None:
        raise ValueError(f"{path_str(gone)}: in {has} but missing from {missing_from}")
    for p, x in ref.items():
      y = other[p]
      if np.shape(x) != np.shape(y):
        raise ValueError(f"{path_str(p)}: shape {np.shape(x)} in {ref_name} vs {np.shape(y)} in {name}")
      if dtype_of(x) != dtype_of(y):
        raise ValueError(f"{path_str(p)}: dtype {dtype_of(x)} in {ref_name} vs {dtype_of(y)} in {name}")
    # Same paths but e.g. a list where the other has a tuple: tree_map would refuse.
    if jax.tree_util.tree_structure(tree) != jax.tree_util.tree_structure(trees[0]):
      raise ValueError(f"the containers of {name} differ from those of {ref_name}: "
                       f"{jax.tree_util.tree_structure(tree)} vs {jax.tree_util.tree_structure(trees[0])}")


def map_leaves(fn: Callable[..., Any], *trees, keep_dtype: bool = True):
  """The tree of `fn(path, *leaves)` over trees of one structure (check first). The
  result takes the dtype of the first tree's leaf unless keep_dtype=False."""

  def leaf(key_path, *xs):
    out = np.asarray(fn(path_names(key_path), *xs))
    return out.astype(dtype_of(xs[0]), copy=False) if keep_dtype else out

  return jax.tree_util.tree_map_with_path(leaf, trees[0], *trees[1:])


def _input_name(role: str, i: int | None = None) -> str:
  """How errors name an input: "base", "task expert", or "expert 1" in a list role."""
  name = role.replace("_", " ")
  return name if i is None else f"{name[:-1] if name.endswith('s') else name} {i}"


def over_leaves(fn: Callable[..., Any], inputs: dict, *, lists: Sequence[str] = (), masks=None,
                naming: Naming = XLT):
  """The tree of `fn(path, *leaves)` over a method's inputs ({role: tree, list of trees or
  None}, in role order): the inputs named in `lists` are checked non-empty and passed as lists of leaves, a
  None input (an optional base) as None; every tree is checked compatible with the others
  (errors name the inputs: "base", "expert 1"). `masks` (neuron masks, `leaf_mask`: one tree
  for every member of the list input or one per member) restricts each member to its mask:
  its own value there, the base's elsewhere. The preamble every merge method shares."""
  inputs = {r: expert_list(v, r) if r in lists else v for r, v in inputs.items()}
  trees, names = [], []
  for role, value in inputs.items():
    if role in lists:
      trees += value
      names += [_input_name(role, i) for i in range(len(value))]
    elif value is not None:
      trees.append(value)
      names.append(_input_name(role))
  check_compatible(trees, names)
  many = list(lists)
  restrict = [None] * (len(inputs[many[0]]) if many else 0)
  if masks is not None:
    if "base" not in inputs or not many:
      raise ValueError("neuron masks restrict experts to a base: this method has no base and experts")
    n = len(inputs[many[0]])
    restrict = [None if (m := mask_for(masks, i, n, "neuron")) is None else masked_leaves(m, inputs["base"])
                for i in range(n)]
  sizes = [len(v) if r in lists else (0 if v is None else 1) for r, v in inputs.items()]

  def leaf(key_path, *xs):
    path, first, xs, args = path_names(key_path), xs[0], list(xs), []
    for role, size in zip(inputs, sizes):
      args.append(None if size == 0 else xs[:size] if role in lists else xs[0])
      xs = xs[size:]
    if masks is not None:
      base, members = args[list(inputs).index("base")], args[list(inputs).index(many[0])]
      args[list(inputs).index(many[0])] = [
          x if flat is None else np.where(leaf_mask(path, flat[path], np.shape(x), naming), x, base)
          for x, flat in zip(members, restrict)]
    return np.asarray(fn(path, *args)).astype(dtype_of(first), copy=False)  # the first input's dtype

  return jax.tree_util.tree_map_with_path(leaf, trees[0], *trees[1:])


def delta(expert, base):
  """expert - base, leaf by leaf, in the compute dtype (a task vector: kept at full
  precision even for bfloat16 checkpoints)."""
  check_compatible([expert, base], ["expert", "base"])
  return map_leaves(lambda _, e, b: as_compute(e) - as_compute(b), expert, base, keep_dtype=False)


def mean_abs_rows(x, path, naming: Naming = XLT) -> np.ndarray:
  """The mean absolute value (MAV) of every row of leaf `x` (rows: `naming.rows`), as
  float64 [num_rows]. On a delta this is the layer-swapping paper's measure of change."""
  return np.mean(np.abs(naming.rows(path, as_compute(x))), axis=1, dtype=np.float64)


def row_mavs(expert, base, naming: Naming = XLT) -> list[tuple[Path, np.ndarray]]:
  """[(path, row MAVs of expert - base)] for every leaf, one leaf's delta at a time."""
  check_compatible([expert, base], ["expert", "base"])
  return [(p, mean_abs_rows(as_compute(e) - as_compute(b), p, naming))
          for (p, e), (_, b) in zip(leaves_with_paths(expert), leaves_with_paths(base))]


def row_mask_to_leaf(path, keep_rows, shape, naming: Naming = XLT) -> np.ndarray:
  """A bool mask of leaf `shape` that is True on the rows where `keep_rows` is."""
  keep_rows = np.asarray(keep_rows, bool)
  row_len = int(np.prod(shape)) // max(len(keep_rows), 1)
  return naming.from_rows(path, np.broadcast_to(keep_rows[:, None], (len(keep_rows), row_len)), shape)


def leaf_mask(path, mask, shape, naming: Naming = XLT) -> np.ndarray:
  """A neuron mask of one leaf as a bool array of the leaf's `shape`. `mask` may be a
  bool (the whole tensor or none of it), a bool per row ([num_rows]: neurons, i.e. output
  units, as `naming.rows` lays them out), or a bool per entry (the leaf's own shape: any
  rows or columns). Anything else is a ValueError naming the path."""
  shape = tuple(shape)
  m = np.asarray(mask)
  if m.dtype != bool and not np.isin(m, (0, 1)).all():
    raise ValueError(f"{path_str(path)}: a mask must be boolean (or 0/1), got values {np.unique(m)[:5]}")
  m = m.astype(bool)
  if m.ndim == 0:
    return np.full(shape, bool(m))
  if m.shape == shape:
    return m
  num_rows = naming.num_rows(path, shape)
  if m.shape == (num_rows,):
    return row_mask_to_leaf(path, m, shape, naming)
  raise ValueError(f"{path_str(path)}: mask of shape {m.shape} fits neither the tensor {shape} nor its "
                   f"{num_rows} rows (neurons)")


def mask_for(masks, i: int, n: int, what: str):
  """Expert i's mask tree from `masks`: None (no mask), one tree for every expert, or a
  list of one tree (or None) per expert."""
  if masks is None:
    return None
  if isinstance(masks, (list, tuple)):
    if len(masks) != n:
      raise ValueError(f"{what} masks: {len(masks)} mask trees for {n} experts")
    return masks[i]
  return masks


def masked_leaves(masks, tree) -> dict:
  """{path: mask leaf} of a mask tree with the structure of `tree` (leaves: see
  `leaf_mask`); a ValueError names a path the trees do not share."""
  flat = dict(leaves_with_paths(masks))
  paths = [p for p, _ in leaves_with_paths(tree)]
  extra, missing = set(flat) - set(paths), [p for p in paths if p not in flat]
  if extra or missing:
    p = next(iter(extra)) if extra else missing[0]
    raise ValueError(f"mask tree and parameters differ at {path_str(p)} "
                     f"({'only in the mask' if extra else 'missing from the mask'})")
  return flat


def fraction_count(fraction: float, n: int) -> int:
  """How many of n items a fraction selects: round(fraction * n), halves up, and at
  least 1 when fraction > 0 (so a small tensor, a bias or a norm scale, keeps one entry
  rather than none)."""
  if fraction <= 0 or n == 0:
    return 0
  return min(n, max(1, int(np.floor(fraction * n + 0.5))))


def top_fraction_mask(values, fraction: float) -> np.ndarray:
  """True where `values` is among the largest `fraction` of its entries (k =
  `fraction_count(fraction, size)`). Entries equal to the k-th largest are all kept, so
  the mask never depends on memory order (a tie can keep a few more than k)."""
  values = np.asarray(values)
  n, k = values.size, fraction_count(fraction, values.size)
  if k == n:
    return np.ones(values.shape, bool)
  if k == 0:
    return np.zeros(values.shape, bool)
  kth_largest = np.partition(values.ravel(), n - k)[n - k]
  return values >= kth_largest


# ---- argument checks shared by the merges


def expert_list(experts, what: str = "experts") -> list:
  """`experts` as a list; an empty one is an error (there is nothing to merge)."""
  if isinstance(experts, dict) or hasattr(experts, "shape"):
    raise TypeError(f"{what} must be a sequence of parameter trees, not one tree")
  experts = list(experts)
  if not experts:
    raise ValueError(f"{what} is empty: a merge needs at least one model")
  return experts


def per_expert(values, n: int, what: str) -> list[float]:
  """A float (the same for every expert) or one float per expert, as a list of n."""
  if np.ndim(values) == 0:
    return [float(values)] * n
  values = [float(v) for v in values]
  if len(values) != n:
    raise ValueError(f"{what} has {len(values)} values for {n} experts")
  return values


def check_range(what: str, value: float, low: float, high: float, *, low_open=False, high_open=False):
  """Raises ValueError unless low <(=) value <(=) high."""
  ok_low = value > low if low_open else value >= low
  ok_high = value < high if high_open else value <= high
  if not (ok_low and ok_high):
    lo, hi = "(" if low_open else "[", ")" if high_open else "]"
    raise ValueError(f"{what} must be in {lo}{low}, {high}{hi}, got {value}")
