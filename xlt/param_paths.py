"""The parameter-path vocabulary every part of xlt shares (the model, partitions, LoRA, neuron
masks and the merge library): how a checkpoint format names its parameters, which block a
path belongs to, what kind of module it is, and which axes of a tensor index its *rows*
(neurons). It imports nothing of xlt, so the merge library stays pure.

Every merge in xlt.merge reads paths only through a `Naming`, so another format (say
Hugging Face's flat `model.layers.{i}.self_attn.q_proj.weight` keys) is one more small
`Naming` object, with no change to the merges.

A path is a tuple of strings: the dict keys from the root to a leaf. `path_names` turns
a jax key path (from `jax.tree_util.tree_flatten_with_path`) into one.

Rows. The layer-swapping paper (Bandarkar et al.) measures change per row of the
Hugging Face [out, in] weights, i.e. per output unit (neuron), and calls the MAV of a
1-D tensor "the MAV across the vector": one row. MAET's key neurons are the same rows.
`Naming.rows` gives that [num_rows, row_len] view of any leaf; `Naming.from_rows` undoes
it, so a per-row decision (keep / revert) is a per-row mask broadcast back to the leaf.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable

import numpy as np

Path = tuple[str, ...]


def path_names(path) -> Path:
  """A tuple of strings from a jax key path (dict keys, attribute names, sequence
  indices), a tuple of names, or a "a/b/c" string; idempotent."""
  if isinstance(path, str):
    return tuple(path.split("/"))
  names = []
  for p in path:
    for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
      if hasattr(p, attr):
        p = getattr(p, attr)
        break
    names.append(str(p))
  return tuple(names)


def path_str(path) -> str:
  """The path as "block_3/attn/qkv/kernel": how errors, logs and plots name a leaf."""
  return "/".join(path_names(path))


@dataclasses.dataclass(frozen=True)
class Naming:
  """The three path rules of one checkpoint format.

  block_kind(path) -> (block index or None, kind): kind is one of embedding, attn, mlp,
    norm, head. Parameters outside the repeated blocks have block None.
  row_axes(path, shape) -> the axes that index rows (output units); () = one row.
  local_name(path) -> a block parameter's name within its block ("attn/qkv/kernel"), so
    the same parameter of different blocks shares a column in `analysis.row_change`.

  Each accepts a jax key path or a tuple of names: a new Naming's functions start with
  `path_names(path)`, as XLT's do.
  """

  name: str
  block_kind: Callable[[Path], tuple[int | None, str]]
  row_axes: Callable[[Path, tuple[int, ...]], tuple[int, ...]]
  local_name: Callable[[Path], str]

  def rows(self, path, x) -> np.ndarray:
    """The [num_rows, row_len] view of leaf `x`: row axes first, flattened."""
    x = np.asarray(x)
    axes, rest = self._split(path, x.shape)
    num_rows = math.prod(x.shape[a] for a in axes)
    row_len = math.prod(x.shape[a] for a in rest)
    return np.transpose(x, axes + rest).reshape(num_rows, row_len)

  def from_rows(self, path, rows_2d, shape) -> np.ndarray:
    """Inverse of `rows`: a [num_rows, row_len] array back to a leaf of `shape`."""
    shape = tuple(shape)
    axes, rest = self._split(path, shape)
    order = axes + rest
    x = np.asarray(rows_2d).reshape([shape[a] for a in order])
    return np.transpose(x, np.argsort(order))

  def num_rows(self, path, shape) -> int:
    return math.prod(shape[a] for a in self._split(path, tuple(shape))[0])

  def _split(self, path, shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    axes = tuple(self.row_axes(path_names(path), tuple(shape)))
    return axes, tuple(a for a in range(len(shape)) if a not in axes)


# ---- xlt's GPT (xlt.model): wte, wpe, ln_f, lm_head, block_{i}/{ln_1, attn, ln_2, mlp}

_BLOCK = re.compile(r"block_(\d+)$")


def xlt_block_kind(path) -> tuple[int | None, str]:
  """(block index or None, kind) of an xlt GPT parameter path (`path_info`).

  kinds: embedding (wte, wpe), head (ln_f, lm_head), and inside block_{i}: attn (qkv or
  q, k, v, proj, q_norm, k_norm), mlp (fc or gate, up; proj), or norm (ln_1, ln_2, and
  Gemma 2's ln_1_post, ln_2_post: every other block parameter outside attn and mlp).
  """
  names = path_names(path)
  if not names:
    return None, "norm"
  block = next((int(m.group(1)) for n in names if (m := _BLOCK.match(n))), None)
  if names[0] in ("wte", "wpe"):
    return None, "embedding"
  if names[0] in ("ln_f", "lm_head"):
    return None, "head"
  return block, next((n for n in names[1:] if n in ("attn", "mlp")), "norm")


# the names of a dense layer's weight leaf, one per layout (xlt.model.Config.dense_layout)
DENSE_LEAVES = ("kernel", "weight")


def xlt_row_axes(path, shape) -> tuple[int, ...]:
  """Rows = output units. A dense leaf named "kernel" (flax's layout) is [in..., out...], one
  named "weight" (torch Linear's: xlt.model.Config.dense_layout) [out..., in...]. attn/proj
  has two input axes (H, K), every other dense leaf (qkv, q, k, v, mlp fc / gate / up / proj,
  lm_head) one (D, or F for mlp proj), so a kernel's rows are its trailing axes (for a [D, F]
  kernel: its F columns) and a weight's its leading ones. Embedding tables (wte [V, D],
  wpe [T, D]) have one row per token / position. Biases (qkv's [3, H, K], q's [H, K] too),
  norms (q_norm / k_norm [K] included) and other 1-D leaves: one row.
  """
  names = path_names(path)
  if names and names[-1] in DENSE_LEAVES:
    num_in = 2 if names[-3:-1] == ("attn", "proj") else 1
    if len(shape) <= num_in:
      return ()
    return tuple(range(num_in, len(shape))) if names[-1] == "kernel" else tuple(range(len(shape) - num_in))
  if xlt_block_kind(names)[1] == "embedding" and len(shape) >= 2:
    return (0,)
  return ()


def dense_leaf(module_path, leaves):
  """The path of the dense leaf ("kernel" or "weight") of the module at `module_path` among
  `leaves` (a collection of paths), or None: what a method interceptor adapts or measures."""
  return next((p for n in DENSE_LEAVES if (p := tuple(module_path) + (n,)) in leaves), None)


def xlt_local_name(path) -> str:
  """The path below the block key: block_3/attn/qkv/kernel -> attn/qkv/kernel."""
  names = path_names(path)
  at = next((i for i, n in enumerate(names) if _BLOCK.match(n)), -1)
  return "/".join(names[at + 1:])


XLT = Naming("xlt", xlt_block_kind, xlt_row_axes, xlt_local_name)

# what model.py, partition.py and the merges call a path's (block, kind)
path_info = xlt_block_kind


# ---- Hugging Face checkpoints: flat dotted keys, torch layouts
#
# Llama / Mistral / Qwen: model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
#   model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}.{input,post_attention}_layernorm
#   .weight, model.norm.weight, lm_head.weight.
# GPT-2: transformer.{wte,wpe}.weight, transformer.h.{i}.attn.{c_attn,c_proj}.{weight,bias},
#   transformer.h.{i}.mlp.{c_fc,c_proj}.{weight,bias}, transformer.h.{i}.ln_{1,2}.{weight,bias},
#   transformer.ln_f.{weight,bias}, lm_head.weight.
# The "model." / "transformer." prefix is optional (a bare GPT2Model saves h.{i}...).

_HF_BLOCK = re.compile(r"^(?:model\.|transformer\.)?(?:layers|h)\.(\d+)\.(.+)$")
_HF_IN_BLOCK = (  # (regex on the name inside the block, kind); first match wins
    (re.compile(r"^(self_attn|attn|attention)\."), "attn"),
    (re.compile(r"^(mlp|feed_forward|block_sparse_moe)\."), "mlp"),
    (re.compile(r"^(input_layernorm|post_attention_layernorm|pre_feedforward_layernorm|"
                r"post_feedforward_layernorm|ln_\d)\."), "norm"),
)
_HF_OUTSIDE = (
    (re.compile(r"^(?:model\.|transformer\.)?(embed_tokens|wte|wpe)\.weight$"), "embedding"),
    (re.compile(r"^(?:model\.|transformer\.)?(norm|ln_f)\.(weight|bias)$"), "head"),
    (re.compile(r"^lm_head\.weight$"), "head"),
)
# GPT-2's Conv1D keeps [in, out] (the transpose of torch.nn.Linear's [out, in]).
_HF_CONV1D = re.compile(r"^(?:transformer\.)?h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


def _hf_name(path) -> str:
  return ".".join(path_names(path))


def hf_block_kind(path) -> tuple[int | None, str]:
  """(block index or None, kind) of a Hugging Face parameter name; ValueError for a name
  no rule recognises (a merge must not guess which block a tensor belongs to)."""
  name = _hf_name(path)
  if m := _HF_BLOCK.match(name):
    for rule, kind in _HF_IN_BLOCK:
      if rule.match(m.group(2)):
        return int(m.group(1)), kind
  else:
    for rule, kind in _HF_OUTSIDE:
      if rule.match(name):
        return None, kind
  raise ValueError(f"{name}: no rule of the 'hf' naming recognises this parameter name (known: "
                   "model.layers.{i}.{self_attn,mlp,*_layernorm}.*, transformer.h.{i}.{attn,mlp,ln_1,ln_2}.*, "
                   "embed_tokens / wte / wpe, norm / ln_f, lm_head)")


def hf_row_axes(path, shape) -> tuple[int, ...]:
  """Rows = output units: axis 0 of a torch Linear weight [out, in] and of embedding
  tables [V, D] (lm_head [V, D] too); axis 1 of GPT-2's Conv1D weights [in, out]; 1-D
  tensors (biases, norms) are one row."""
  if len(shape) < 2:
    return ()
  return (1,) if _HF_CONV1D.match(_hf_name(path)) else (0,)


def hf_local_name(path) -> str:
  """model.layers.3.self_attn.q_proj.weight -> self_attn.q_proj.weight."""
  name = _hf_name(path)
  m = _HF_BLOCK.match(name)
  return m.group(2) if m else name


HF = Naming("hf", hf_block_kind, hf_row_axes, hf_local_name)


def from_rule(block_kind: Callable[[Path], tuple[int | None, str]], name: str = "custom") -> Naming:
  """A Naming from a path -> (block, kind) rule alone, for a format neither XLT nor HF
  knows: rows on axis 0 (torch's [out, in] weights and [V, D] tables; 1-D tensors are
  one row), and a block parameter's local name is its path with the block index
  replaced by "{i}", so block 3's "layers.3.attn.w" and block 5's "layers.5.attn.w" share
  a heatmap column."""

  def local_name(path) -> str:
    text = ".".join(path_names(path))
    block = block_kind(path)[0]
    return text if block is None else re.sub(rf"(?<![0-9]){block}(?![0-9])", "{i}", text, count=1)

  return Naming(name, lambda p: block_kind(path_names(p)), lambda p, shape: (0,) if len(shape) >= 2 else (),
                local_name)
NAMINGS = {"xlt": XLT, "hf": HF}


def recognises(naming: Naming, path) -> bool:
  """Whether `naming` places `path`: a block of its own or one of its outside kinds."""
  try:
    block, kind = naming.block_kind(path)
  except ValueError:
    return False
  if naming is XLT:  # xlt's rule never raises: check the names it reads
    names = path_names(path)
    return bool(names) and (names[0] in ("wte", "wpe", "ln_f", "lm_head") or
                            any(_BLOCK.match(n) for n in names))
  return True


def naming_for(paths, naming: str | Naming = "auto") -> Naming:
  """The Naming of a checkpoint: `naming` itself, a name in NAMINGS, or "auto": the
  first naming that recognises every path. ValueError naming the first unrecognised
  path otherwise."""
  paths = [path_names(p) for p in paths]
  candidates = ([naming] if isinstance(naming, Naming) else list(NAMINGS.values()) if naming == "auto"
                else [NAMINGS[naming]] if naming in NAMINGS else None)
  if candidates is None:
    raise ValueError(f"unknown naming {naming!r}; known: auto, {', '.join(NAMINGS)}")
  if not paths:
    raise ValueError("the checkpoint has no parameters")
  for n in candidates:
    if all(recognises(n, p) for p in paths):
      return n
  worst = next(p for p in paths if not any(recognises(n, p) for n in candidates))
  raise ValueError(f"parameter {path_str(worst)!r}: no naming rule recognises it "
                   f"(tried {', '.join(n.name for n in candidates)}); pass a Naming for this format")


# ---- formats neither rule knows (GPT-NeoX, Falcon, Bloom, OPT, ...): a block prefix pattern
#
# Only merges that read blocks or rows need to place a tensor; the others merge any tensor by
# name (xlt.merge.registry: `Method.layer_aware`). For those that do, a pattern names where a
# format keeps its blocks ("gpt_neox.layers.{i}.") and the kinds come from the usual words.

_HEAD_WORDS = re.compile(r"(^|[._/])(lm_head|embed_out|output|score|classifier)([._/]|$)")
_EMBEDDING_WORDS = re.compile(r"(^|[._/])(embed_tokens|embed_in|embeddings?|word_embeddings\w*|wte|wpe|"
                              r"embed_positions|tok_embeddings|position_embeddings)([._/]|$)")
_IN_BLOCK_WORDS = ((re.compile(r"norm|(^|[._/])ln(_?\d+)?([._/]|$)"), "norm"),  # before attn: post_attention_layernorm
                   (re.compile(r"attn|attention"), "attn"),
                   (re.compile(r"mlp|ffn|feed_forward|fc_?\d|dense_h_to_4h|dense_4h_to_h|experts"), "mlp"))


def outside_kind(name: str) -> str:
  """The kind of a parameter outside the blocks, from the words in its name: "head" (lm_head,
  embed_out, output, score, and final norms), "embedding" (embed_tokens, embed_in,
  word_embeddings, wte, wpe, ...), else "other"."""
  if _HEAD_WORDS.search(name):
    return "head"
  if _EMBEDDING_WORDS.search(name):
    return "embedding"
  return "head" if re.search(r"norm|(^|[._/])ln_f([._/]|$)", name) else "other"


def from_pattern(pattern: str) -> Naming:
  """A Naming from where a format keeps its blocks: `pattern` is a tensor-name prefix with
  "{i}" for the block index, e.g. "gpt_neox.layers.{i}." (GPT-NeoX), "transformer.h.{i}."
  (Falcon, Bloom, GPT-J), "model.decoder.layers.{i}." (OPT), "block_{i}/" (xlt).

  A name that starts with the prefix is in block i; its kind is norm, attn or mlp by the
  words in the rest of the name (norms first: "post_attention_layernorm" is a norm), else
  "other". Every other name is outside the blocks (`outside_kind`). Rows are axis 0 (torch's
  [out, in] Linear weights and [V, D] tables; 1-D tensors are one row): wrong only for
  GPT-2-style Conv1D weights, which the "hf" naming knows.
  """
  if pattern.count("{i}") != 1:
    raise ValueError(f"naming pattern {pattern!r} must hold {{i}} once, where the block index goes "
                     "(e.g. 'gpt_neox.layers.{i}.')")
  before, after = pattern.split("{i}")
  rule = re.compile("^" + re.escape(before) + r"(\d+)" + re.escape(after) + "(.+)$")

  def block_kind(path) -> tuple[int | None, str]:
    name = path_str(path)
    if m := rule.match(name):
      return int(m.group(1)), next((k for r, k in _IN_BLOCK_WORDS if r.search(m.group(2))), "other")
    return None, outside_kind(name)

  def local_name(path) -> str:
    name = path_str(path)
    m = rule.match(name)
    return m.group(2) if m else name

  return Naming(pattern, block_kind, lambda p, shape: (0,) if len(shape) >= 2 else (), local_name)


def _unplaced(path):
  raise ValueError(f"{path_str(path)}: no naming places this tensor in a block (the merge was set up for a "
                   "method that reads no blocks or rows)")


# What a merge that reads neither blocks nor rows gets when no naming recognises every name
# (GPT-J's lm_head.bias, GPT-NeoX, Falcon, ...): asking it for a block is an error, never a guess.
UNNAMED = Naming("unnamed", _unplaced, lambda p, shape: _unplaced(p), lambda p: path_str(p))
