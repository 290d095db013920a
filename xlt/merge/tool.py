"""Merging checkpoint files into a model directory: what `python -m xlt.merge` runs.

Inputs are read lazily (xlt.io.tensor_files), merged by a registry method tensor by tensor, and
written by xlt.io.hf_dir as a Hugging Face model directory: when an input is a Hugging Face
model directory (config.json beside its safetensors), its config and tokenizer files come
along, so transformers loads the merge as it loads the input; otherwise (xlt's own
checkpoints, bare .safetensors files) the directory holds the weights and the model card.
Memory of a file merge: the merged model (its leaves are computed one by one and kept until
written) plus a few tensors of the inputs.
"""

from __future__ import annotations

import json
import os

import numpy as np

from xlt import param_paths as naming_lib
from xlt.io import hf_dir as hf
from xlt.io.tensor_files import load
from xlt.merge import analysis, lora_adapters, registry, vocabulary


def _adapter_of(path: str) -> tuple[str, str | None]:
  """(model, PEFT adapter directory or None) of an input: mergekit's "model+adapter" reference
  when the part after "+" is an adapter directory, else the path itself."""
  model, sep, adapter = str(path).partition("+")
  if sep and os.path.isfile(os.path.join(adapter, lora_adapters.PEFT_CONFIG)):
    return model, adapter
  return str(path), None


def load_input(path: str) -> dict:
  """An input's tensors: a checkpoint (lazy), or "model+adapter": the model with the PEFT LoRA
  adapter merged in (its adapted weights read and summed; lora_adapters.with_peft)."""
  model, adapter = _adapter_of(path)
  return load(model) if adapter is None else lora_adapters.with_peft(load(model), adapter)


def source_model(inputs: dict, roles: list[str], config_from: str | None = None) -> str | None:
  """The input whose config.json and tokenizer files the merge takes: `config_from` (a role),
  else the base, else the first input (in the method's role order) that is a Hugging Face
  model directory; None when no input is one."""
  if config_from:
    if config_from not in inputs:
      raise ValueError(f"config_from={config_from!r} is not one of the inputs {sorted(inputs)}")
    path = inputs[config_from]
    path = _adapter_of(path[0] if isinstance(path, (list, tuple)) else path)[0]
    if not os.path.isfile(os.path.join(path, hf.CONFIG)):
      raise ValueError(f"config_from={config_from!r}: {path} has no {hf.CONFIG}")
    return path
  for role in ["base"] + roles:
    paths = inputs.get(role, [])
    for path in paths if isinstance(paths, (list, tuple)) else [paths]:
      model = _adapter_of(path)[0]  # "model+adapter": the model's config and tokenizer
      if os.path.isfile(os.path.join(model, hf.CONFIG)):
        return model
  return None


def input_paths(inputs: dict) -> list[str]:
  """Every file or directory the inputs ({role: path or list}) read: a "model+adapter" input's
  model and its adapter."""
  out = []
  for v in inputs.values():
    for p in v if isinstance(v, (list, tuple)) else [v]:
      model, adapter = _adapter_of(p)
      out += [model] + ([adapter] if adapter else [])
  return out


def check_output(output: str, overwrite: bool, inputs: list[str] = ()) -> None:
  """Refuses an output that is an input, lies inside one or holds one (replacing it would delete
  what the merge reads: never, even with overwrite), and an existing non-empty directory unless
  `overwrite` (a user's earlier merge or fine-tuned expert is as precious as a directory xlt did
  not write). Checked once the inputs are (hf.write_model_dir checks again as it renames), so no
  merge work is lost to it; the old directory is deleted only once the new one is in place."""
  out = os.path.realpath(output)
  for p in inputs:
    real = os.path.realpath(p)
    if out == real or out.startswith(real.rstrip(os.sep) + os.sep) or real.startswith(out.rstrip(os.sep) + os.sep):
      what = "is" if out == real else "is inside" if len(out) > len(real) else "holds"
      raise ValueError(f"the output {output} {what} the input {p}: writing it would destroy the input; "
                       "choose another output directory")
  if not overwrite and os.path.isdir(output) and not os.path.islink(output) and os.listdir(output):
    raise ValueError(f"{output} is a non-empty directory; replace it with --overwrite (overwrite=True from Python), "
                     "or choose another output directory")


def merge_files(inputs: dict, method: str, output: str, options: dict | None = None, *,
                naming: str | naming_lib.Naming = "auto", heatmaps: bool = True, config_from: str | None = None,
                max_shard_bytes: int | str = hf.DEFAULT_MAX_SHARD_BYTES, dtype: str | None = None,
                vocab: str | None = None, tokenizer: dict | None = None, overwrite: bool = False) -> dict:
  """Merges checkpoint files with one of the registry's methods and writes `output` as a model
  directory (xlt.io.hf_dir: model.safetensors or shards with their index, config.json and
  tokenizer files from `source_model`, README.md naming inputs, method and options), plus
  delta_<role>.png heatmaps of where each fine-tune changed the base when a base is among the
  inputs; returns a summary dict.

  inputs: {role: checkpoint path or list of paths}: the method's roles
    (`registry.describe(method)`; e.g. layer_swap: task_expert, language_expert) and
    optionally `base` for the heatmaps.
  options: the method's options (layer_swap: bottom, top, ...); not those that take trees.
  naming: "auto", "hf", "xlt", a block prefix pattern ("gpt_neox.layers.{i}.") or a Naming;
    only methods that read blocks or rows need one (`registry.naming_for_method`).
  max_shard_bytes, dtype: as `hf.write_model_dir` takes them.
  overwrite: replace `output` when it is a non-empty directory (never an input, nor one holding one).
  vocab: what to do when the inputs' vocabularies differ (more rows in the embedding and
    head tensors of one input, e.g. a language expert with an extended tokenizer): None (an
    error naming the tensor), "base" or "union". When every input has tokenizer.json this is
    `tokenizer={"source": vocab}` (token by token, as mergekit); else by row number (`fit_vocab`)
    where rows are unambiguous (vocabulary.by_rows), a one-line error where they are not.
  tokenizer: mergekit's tokenizer block ({source: base|union|<model dir>, tokens: {...},
    pad_to_multiple_of}) instead of `vocab`: the inputs' embeddings and heads re-indexed token by
    token to the output's vocabulary (xlt.merge.vocabulary), the tokenizer written with it (the
    chat template the source's). `{source: base|union}` alone where an input has no tokenizer.json
    goes by row number where rows are unambiguous (equal rows, one vocabulary among the
    tokenizers present), else a one-line error.
  The summary's vocab_alignment says which ran ("tokens" or "rows").
  Every check (method, roles, options, file headers, names, shapes and dtypes across the
  inputs) runs before any tensor is read, each failure a one-line ValueError naming the
  file and the tensor, and the output directory is replaced only once the new one is complete.
  """
  options = dict(options or {})
  m = registry.get(method)
  roles = [r.name for r in m.roles]
  registry.check(method, {r: v for r, v in inputs.items() if r in roles or r != "base"}, options,
                 trees_allowed=False)
  trees = {r: [load_input(p) for p in v] if isinstance(v, (list, tuple)) else load_input(v)
           for r, v in inputs.items()}
  labelled = _labelled(inputs, trees, ["base"] + roles)
  first = labelled[0][1]
  nm = registry.naming_for_method(m, options, list(first), naming)
  source = source_model(inputs, roles, config_from)
  vocab, tokenizer = _alignment(labelled, vocab, tokenizer, nm)
  trees, source, config, files = _fitted(inputs, trees, labelled, roles, nm, source, config_from, vocab, tokenizer)
  labelled = _labelled(inputs, trees, ["base"] + roles)
  check_inputs(labelled, nm)
  check_output(output, overwrite, input_paths(inputs))
  merged = registry.merge(method, {r: trees[r] for r in roles}, options, naming=nm)
  card = {"title": f"{method} merge", "method": method, "inputs": inputs, "options": options}
  if vocab:
    card["vocab"] = vocab
  if tokenizer:
    card["tokenizer"] = tokenizer
  written = hf.write_model_dir(merged, output, source_dir=source, config=config, card=card,
                               max_shard_bytes=max_shard_bytes, dtype=dtype,
                               metadata={"merge_method": method, "options": json.dumps(options, sort_keys=True)},
                               weights_only=source is None, overwrite=overwrite, files=files)
  del merged
  summary = {"output": written["dir"], "files": written["files"], "config_from": source, "naming": nm.name,
             "tensors": len(first), "bytes": int(sum(x.nbytes for x in first.values())), "heatmaps": []}
  if vocab or tokenizer:
    summary["vocab_alignment"] = "rows" if vocab else "tokens"
  if heatmaps and "base" in trees and nm is not naming_lib.UNNAMED:
    summary["heatmaps"] = _heatmaps(trees, [r for r in roles if r != "base"], output, nm)
  elif heatmaps and "base" in trees:
    summary["heatmaps_skipped"] = "no naming places these tensors in blocks (pass naming=... to draw them)"
  return summary


def _alignment(labelled: list[tuple[str, dict]], vocab: str | None, tokenizer: dict | None, nm) -> tuple:
  """(vocab, tokenizer): how the inputs' vocabularies are aligned, one of them set. A source
  base|union alone (xlt's `vocab`, or mergekit's `tokenizer: {source: base|union}` /
  `tokenizer_source`) goes token by token (the tokenizer option) when every input has
  tokenizer.json, by row number (the vocab option) only where rows are unambiguous
  (vocabulary.by_rows)."""
  if vocab is not None and tokenizer is not None:
    raise ValueError("vocab / tokenizer: give one of them")
  if vocab is not None and vocab not in VOCAB_MODES:
    raise ValueError(f"vocab must be one of {', '.join(VOCAB_MODES)} (or unset), got {vocab!r}")
  if vocab is None and tokenizer is None:
    return None, None
  mode = vocab or tokenizer.get("source", "union")
  if tokenizer is not None and (set(tokenizer) - {"source"} or mode not in VOCAB_MODES):
    return None, tokenizer  # a model's tokenizer, tokens: rules or padding: token by token only
  models = [_adapter_of(p)[0] for p, _ in labelled]
  rows_differ = fit_vocab(labelled, mode, nm)[1] is not None
  what = f"vocab={mode}" if vocab else f"tokenizer.source: {mode}"
  if vocabulary.by_rows(models, [_vocab_size(m) for m in models], what, rows_differ, rows_asserted=vocab is not None):
    return mode, None
  return None, {"source": mode}


def _fitted(inputs: dict, trees: dict, labelled: list, roles: list[str], nm, source: str | None,
            config_from: str | None, vocab: str | None, tokenizer: dict | None) -> tuple:
  """(trees, source, config, files): the inputs' trees with their vocabularies aligned (token by
  token for `tokenizer`, by row number for `vocab`), the model whose config and tokenizer the
  output takes, its config.json when the rows changed and the tokenizer files written for it."""
  if tokenizer is not None:
    fitted, p = vocabulary.align(labelled, 0 if "base" in inputs else None, tokenizer,
                                 lambda name: _vocab_kind(name, nm), [_vocab_size(path) for path, _ in labelled])
    trees = _refit(inputs, trees, dict(zip((path for path, _ in labelled), fitted)))
    source = source if config_from else _adapter_of(labelled[0][0])[0]  # mergekit's: the base, else the first
    return trees, source, _with_vocab_size(source, p.rows), vocabulary.tokenizer_files(p, source)
  if vocab is not None:
    reference = 0 if "base" in inputs else next((i for i, (p, _) in enumerate(labelled) if p == source), 0)
    fitted, rows, largest = fit_vocab(labelled, vocab, nm, reference)
    trees = _refit(inputs, trees, dict(zip((p for p, _ in labelled), fitted)))
    if vocab == "union" and not config_from and rows is not None:
      source = next((p for p in largest if os.path.isfile(os.path.join(p, hf.CONFIG))), source)
    return trees, source, _with_vocab_size(source, rows), None
  return trees, source, None, None


def _labelled(inputs: dict, trees: dict, order: list[str]) -> list[tuple[str, dict]]:
  """[(checkpoint path, flat tree)] of every input, each path once, in `order` of roles:
  what the checks name in their messages."""
  out, seen = [], set()
  for role in [r for r in order if r in trees]:
    paths = inputs[role] if isinstance(inputs[role], (list, tuple)) else [inputs[role]]
    tree_list = trees[role] if isinstance(trees[role], list) else [trees[role]]
    for path, tree in zip(paths, tree_list):
      if path not in seen:
        seen.add(path)
        out.append((path, tree))
  return out


def check_inputs(labelled: list[tuple[str, dict]], nm: naming_lib.Naming | None = None) -> None:
  """One-line ValueError at the first difference between the inputs (flat trees, labelled by
  their paths; the first is the reference): a tensor missing from one of them, a shape or a
  dtype that differs, each naming both files and the tensor."""
  ref_path, ref = labelled[0]
  for path, tree in labelled[1:]:
    for a, a_path, b, b_path in ((ref, ref_path, tree, path), (tree, path, ref, ref_path)):
      if missing := next((name for name in a if name not in b), None):
        raise ValueError(f"tensor {missing} is in {a_path} but missing from {b_path} "
                         f"({len(a)} vs {len(b)} tensors)")
    for name, x in ref.items():
      y = tree[name]
      if tuple(x.shape) != tuple(y.shape):
        hint = ""
        if x.shape[1:] == y.shape[1:] and _vocab_kind(name, nm):
          hint = ": the vocabularies differ; pass vocab='base' or 'union' (--config.vocab=base|union)"
        raise ValueError(f"tensor {name}: shape {tuple(x.shape)} in {ref_path} vs {tuple(y.shape)} in {path}{hint}")
      if x.dtype != y.dtype:
        raise ValueError(f"tensor {name}: dtype {x.dtype} in {ref_path} vs {y.dtype} in {path} "
                         "(convert one checkpoint first: the inputs must share dtypes)")


VOCAB_MODES = ("base", "union")


def _vocab_kind(name: str, nm: naming_lib.Naming | None) -> bool:
  """Whether tensor `name` is an embedding or head tensor: by the naming, or by the words in
  its name when the naming does not place it (GPT-J's lm_head.bias under "hf")."""
  try:
    block, kind = nm.block_kind(name) if nm is not None else naming_lib.UNNAMED.block_kind(name)
  except ValueError:
    block, kind = None, naming_lib.outside_kind(name)
  return block is None and kind in ("embedding", "head")


def _vocab_size(path: str) -> int | None:
  try:
    with open(os.path.join(_adapter_of(path)[0], hf.CONFIG)) as f:
      cfg = json.load(f)
  except (OSError, ValueError):
    return None
  return cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")


def fit_vocab(labelled: list[tuple[str, dict]], mode: str, nm: naming_lib.Naming | None, reference: int = 0):
  """The inputs' trees with their vocabulary tensors brought to one number of rows, for
  inputs whose tokenizers differ (a language expert with an extended vocabulary).

  A vocabulary tensor is one whose shape differs between the inputs in its leading
  dimension only and that is an embedding or head tensor (by the naming, or by its name:
  embed_tokens, wte, lm_head, embed_out, ..., biases included) or whose leading dimension
  is, in every input, that input's config.json vocab_size.
  mode "base": every input is cut to the rows of input `reference` (the base; the merge
    keeps the base's tokenizer, and tokens only an expert has are dropped).
  mode "union": every input is padded to the largest input's rows; a row an input lacks is
    the mean of that row over the inputs that have it, so a merge of a row present in one
    input only gives that input's row (a token only the language expert knows keeps the
    language expert's embedding), and the tokenizer and config come from the largest input.
  Returns (trees, rows, largest): the fitted trees (lazy: rows are cut or padded as each
  tensor is read), the output's rows (None when no vocabulary tensor differs), and the
  paths of the inputs that have the most rows.
  """
  if mode not in VOCAB_MODES:
    raise ValueError(f"vocab must be one of {', '.join(VOCAB_MODES)} (or unset), got {mode!r}")
  sizes = [_vocab_size(p) for p, _ in labelled]
  trees = [dict(t) for _, t in labelled]
  rows, largest = None, []
  for name, x in labelled[reference][1].items():
    xs = [t.get(name) for _, t in labelled]
    if any(y is None for y in xs) or len({tuple(y.shape) for y in xs}) == 1:
      continue
    if len({tuple(y.shape[1:]) for y in xs}) > 1 or not xs[0].shape:
      continue  # not a vocabulary difference: check_inputs names it
    if not (_vocab_kind(name, nm) or all(y.shape[0] == n for y, n in zip(xs, sizes))):
      continue
    target = x.shape[0] if mode == "base" else max(y.shape[0] for y in xs)
    for t, y in zip(trees, xs):
      if y.shape[0] != target:
        t[name] = _Fitted(y, target, [z for z in xs if z.shape[0] > y.shape[0]])
    if rows is None or _vocab_kind(name, nm) and naming_lib.outside_kind(name) == "embedding":
      rows = target
      largest = [p for (p, _), y in zip(labelled, xs) if y.shape[0] == max(z.shape[0] for z in xs)]
  return trees, rows, largest


class _Fitted:
  """A vocabulary tensor cut or padded to `rows` rows as it is read (`fit_vocab`): padded
  rows are the mean of those rows over `donors` (the inputs that have them)."""

  def __init__(self, x, rows: int, donors: list):
    self.x, self.donors = x, donors
    self.shape, self.dtype = (rows,) + tuple(x.shape[1:]), x.dtype
    self.ndim, self.size = len(self.shape), int(np.prod(self.shape, dtype=np.int64))
    self.nbytes = self.size * np.dtype(self.dtype).itemsize

  def __array__(self, dtype=None, copy=None):
    a = np.asarray(self.x)
    n, rows = a.shape[0], self.shape[0]
    if rows <= n:
      out = a[:rows]
    else:
      total = np.zeros((rows - n,) + a.shape[1:], np.float64)
      count = np.zeros((rows - n,) + (1,) * (a.ndim - 1))
      for donor in self.donors:
        d = np.asarray(donor)[n:rows]
        total[:len(d)] += d
        count[:len(d)] += 1
      out = np.concatenate([a, (total / np.maximum(count, 1)).astype(a.dtype)])
    return out if dtype is None else out.astype(dtype)


def _refit(inputs: dict, trees: dict, by_path: dict) -> dict:
  """`trees` ({role: tree or list}) with each input's tree replaced by by_path[its path]."""
  return {r: [by_path[p] for p in v] if isinstance(v, (list, tuple)) else by_path[v] for r, v in inputs.items()
          if r in trees}


def _with_vocab_size(source: str | None, rows: int | None) -> dict | None:
  """source's config.json with vocab_size set to `rows`, when the merge changed it; None
  (take the config as it is) otherwise."""
  if source is None or rows is None or _vocab_size(source) in (None, rows):
    return None
  with open(os.path.join(source, hf.CONFIG)) as f:
    cfg = json.load(f)
  (cfg if "vocab_size" in cfg else cfg["text_config"])["vocab_size"] = rows
  return cfg


def _heatmaps(trees: dict, roles: list[str], output: str, nm: naming_lib.Naming) -> list[str]:
  """delta_<role>.png (delta_<role>_<i>.png in a list) for every model of `roles`: where
  it changed trees["base"]."""
  pngs = []
  for role in roles:
    experts = trees[role] if isinstance(trees[role], list) else [trees[role]]
    for i, expert in enumerate(experts):
      name = role if len(experts) == 1 else f"{role}_{i}"
      change = analysis.row_change(expert, trees["base"], naming=nm,
                                   threshold=analysis.default_threshold(expert, trees["base"], naming=nm))
      png = os.path.join(output, f"delta_{name}.png")
      analysis.plot_row_change(change, png, title=f"where {name} changed the base")
      pngs.append(png)
  return pngs
