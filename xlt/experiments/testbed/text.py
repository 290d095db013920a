"""A base the user brings: the merge testbed run from a Hugging Face model directory that
xlt.pretrained loads (Llama, Mistral, Qwen, Gemma, GPT-2), with the task and the languages
rendered as text in that model's tokenizer (docs/testbed.md, "A base you bring").

  python -m xlt.main --config=configs/merge.py --workdir=runs/merge_hf --config.base_model=DIR

With `c.base_model` set, testbed.prepare hands over to `prepare` here; everything after the
data (the recipes, compositions, merges and reports) is the testbed's own, unchanged.

  model     xlt.pretrained.load(base_model): its config replaces c.model (partition presets
            and layer swaps are checked against its depth before the weights are read);
  text      each arithmetic example as a (prompt, completion) pair of strings (`render`),
            encoded as xlt.data.sft encodes one: the prompt with the BOS the tokenizer adds,
            the completion without special tokens, then EOS; the loss on the completion and
            EOS only; one example per row, every row as long as the longest example;
  scoring   a `TextTokenizer` stands in for the testbed's word tokenizer: it encodes a
            prompt's symbols as rendered text and decodes generated ids to text and back to
            symbols (`parse`), so xlt.ensemble_decode's greedy decoding (the greedy_decode
            xlt.generate runs, stopped at EOS) and arithmetic.score work unchanged;
  base      `base_stage`: with `c.base_fluency` (default) a short fine-tune of the loaded
            model on c.data.base, else the loaded model itself, copied per seed;
  lm-eval   with `c.eval.tasks`, every model of every seed scored on those lm-eval tasks too
            (`lm_eval_rows`, xlt.eval.scores in-process): rows beside the testbed's.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from xlt import hf_tokenizer, pretrained, stats
from xlt import results as results_lib
from xlt.data import arithmetic, common, sft
from xlt.eval import scores as eval_scores
from xlt.experiments import common as kind_lib
from xlt.experiments import pretrain_hf

RENDERS = ("spaced", "glued")


def _words(symbols, style: str) -> str:
  return " ".join(symbols) if style == "spaced" else pretrain_hf.text(symbols)


def render(example: common.Example, style: str = "spaced") -> tuple[str, str]:
  """(prompt, completion) text of one arithmetic example.

  spaced: every symbol a word, ("[let] 3 2 7 + 8 =", " F D D"): a digit or letter is its own
    token in most tokenizers;
  glued:  a run of digits or letters one word, ("[let] 327 + 8 =", " FDD"): the text
    configs/llama_base.py's model is pretrained on (xlt.experiments.pretrain_hf.text).
  The completion starts with a space: it continues the prompt's text. Answers are written
  least significant digit first, as the testbed writes them."""
  if style not in RENDERS:
    raise ValueError(f"base_render must be one of {RENDERS}, got {style!r}")
  return _words(example.prompt, style), " " + _words(example.answer, style)


def parse(text: str) -> list[str]:
  """Generated text back to the testbed's symbols, for either rendering: a word that is a
  symbol stays one; a run of digits or letters ("FDD") becomes one symbol per character;
  anything else stays as it is (and scores wrong)."""
  known, glue = set(arithmetic.symbols()), set(pretrain_hf.glued())
  out = []
  for w in text.split():
    out += list(w) if w not in known and all(ch in glue for ch in w) else [w]
  return out


class TextTokenizer:
  """The word tokenizer's interface (encode symbols, decode ids to symbols, eos_id, pad_id,
  vocab_size) over a Hugging Face tokenizer: what xlt.ensemble_decode.score_members needs to decode
  and score a loaded model. `hf` is the xlt.hf_tokenizer.Tokenizer, `style` the rendering."""

  def __init__(self, hf: hf_tokenizer.Tokenizer, style: str, where: str = "the model"):
    if style not in RENDERS:
      raise ValueError(f"base_render must be one of {RENDERS}, got {style!r}")
    if hf.eos_id is None:
      raise ValueError(f"{where}'s tokenizer has no EOS token: answers would have no end")
    self.hf, self.style = hf, style
    self.eos_id, self.vocab_size = hf.eos_id, hf.vocab_size
    self.pad_id = hf.pad_id if hf.pad_id is not None else hf.eos_id
    self.stop_ids = set(hf.stop_ids) | {hf.eos_id}

  def encode(self, symbols) -> list[int]:
    """A prompt's ids: its text as `render` writes it, with the BOS the tokenizer adds."""
    return self.hf.encode(_words(tuple(symbols), self.style))

  def decode(self, ids) -> list[str]:
    """Generated ids, up to the first stop id, as text, then as symbols (`parse`)."""
    ids = [int(i) for i in ids]
    stop = next((k for k, i in enumerate(ids) if i in self.stop_ids), len(ids))
    return parse(self.hf.decode(ids[:stop]))

  def max_new(self, symbols: int) -> int:
    """New tokens that hold an answer of `symbols` symbols and its EOS: the most tokens any
    symbol takes after a space, per symbol."""
    per = max(len(self.hf.encode(" " + s, add_special_tokens=False)) for s in arithmetic.symbols())
    return symbols * per + 1


def _not_a_model(path: str, why: str) -> ValueError:
  return ValueError(f"base_model={path!r}: {why} (a Hugging Face model directory xlt.pretrained loads holds "
                    "config.json, model.safetensors or its shards, and tokenizer.json or tokenizer.model)")


def _read(path: str):
  """(model.Config from config.json alone, the tokenizer); one ValueError naming base_model
  for a path that is not such a directory."""
  if not os.path.isdir(path):
    raise _not_a_model(path, "no such directory")
  try:
    with open(os.path.join(path, "config.json")) as f:
      cfg = pretrained.config_from_hf(json.load(f))
    tok = hf_tokenizer.load(path)
  except (OSError, KeyError, json.JSONDecodeError, ValueError) as e:
    raise _not_a_model(path, f"{type(e).__name__}: {e}") from None
  return cfg, tok


def encode_sets(sets: dict[str, list[common.Example]], tok: TextTokenizer) -> tuple[dict, int]:
  """({name: {"tokens" [N, L], "loss_mask" [N, L - 1]}}, L): each set's examples rendered and
  encoded (xlt.data.sft.encode), one per row, right-padded with the pad id (or EOS); L is the
  longest example's length, the same for every set (one ensemble trains on them all)."""
  cache: dict = {}

  def one(e):
    if e not in cache:
      prompt, completion = render(e, tok.style)
      cache[e] = sft.encode(tok.hf, {"prompt": prompt, "completion": completion})
    return cache[e]

  encoded = {name: [one(e) for e in examples] for name, examples in sets.items()}
  length = max(len(ids) for v in encoded.values() for ids, _ in v)
  return {name: sft.pack(v, length - 1, tok.pad_id, packing=False)[0] for name, v in encoded.items()}, length


def eval_sets(sets: dict[str, common.EvalSet], tok: TextTokenizer, block_size: int) -> dict[str, common.EvalSet]:
  """The evaluation sets with max_new counted in the model's tokens (`TextTokenizer.max_new`);
  fails if a prompt and its answer do not fit the model's context."""
  out = {}
  for name, es in sets.items():
    new = tok.max_new(es.max_new - 1)  # es.max_new counts the answer's symbols and EOS
    longest = max(len(tok.encode(p)) for p in es.prompts)
    if longest + new > block_size:
      raise ValueError(f"{name}: prompts of up to {longest} tokens and answers of up to {new} do not fit the "
                       f"base model's context of {block_size}")
    out[name] = dataclasses.replace(es, max_new=new)
  return out


def prepare(c, check, sets: dict[str, list[common.Example]], val_sets: dict, test_sets: dict):
  """(model config, common.Task, encoded training sets, the loaded params on the host) of the
  model in `c.base_model`. `check(num_layers)` checks the testbed's config against the
  model's depth: it runs after config.json is read and before the weights are."""
  path = str(c.base_model)
  cfg, hf = _read(path)
  check(cfg.num_layers)
  eval_scores.check(c.eval.get("tasks", ()), eval_scores.kind_options(c))
  tok = TextTokenizer(hf, str(c.get("base_render", "spaced")), f"base_model={path!r}")
  data, length = encode_sets(sets, tok)
  if length - 1 > cfg.block_size:
    raise ValueError(f"examples of {length} tokens do not fit base_model={path!r}'s context of {cfg.block_size}")
  val, test = eval_sets(val_sets, tok, cfg.block_size), eval_sets(test_sets, tok, cfg.block_size)
  try:
    cfg, params = pretrained.load(path)
  except OSError as e:
    raise _not_a_model(path, f"{type(e).__name__}: {e}") from None
  params = jax.tree.map(np.asarray, params)
  print(f"testbed: base {path} ({cfg.num_layers} layers, vocabulary {tok.vocab_size}); text rendered "
        f"{tok.style}, rows of {length} tokens", flush=True)
  task = common.Task(tokenizer=tok, seq_len=length, train={}, val=val, test=test, info={"base_model": path})
  return cfg, task, data, params


def base_stage(c, cfg, loaded, members, val_score, config):
  """The base of a loaded model, one copy per seed (`members`, c.base's members):

  base_fluency True (the default): a kind_lib.Stage that fine-tunes the loaded model on
    c.data.base (the non-task operations, both languages, the target low-resource) with
    c.base's train and opt, stopping early on the base's validation sets. The default
    because the testbed's known answer rests on a base that reads and writes both languages
    and cannot do the task (docs/testbed.md, "How the design was reached"); a model that was
    never shown the tags and the letter script is not yet such a base. Pass a lower
    --config.base.opt.peak_lr and fewer steps than from scratch.
  base_fluency False: a kind_lib.Trained holding the loaded model itself (nothing trains;
    per-seed copies are identical): for a model already trained on c.data.base
    (configs/llama_base.py's) or to ask the model exactly as it is."""
  n = len(members)
  init = jax.tree.map(lambda x: np.stack([np.asarray(x)] * n), loaded)
  if c.get("base_fluency", True):
    return kind_lib.Stage("base", cfg, members, val_score, config=config, init_params=init)
  out = {"step": 0, "best_steps": [0] * n, "best_val": [None] * n, "stopped_at": [0] * n,
         "history": [[] for _ in range(n)], "finished": True, "tokens_per_s": float("nan")}
  return kind_lib.Trained(init, out, kind_lib.Stage("base", cfg, members, None, config=config), 0.0)


def lm_eval_rows(c, cfg, tok: TextTokenizer, per_seed: list[dict], seeds: list[int]) -> list[dict]:
  """With `c.eval.tasks`: every model of every seed (`per_seed`: [{model: params}]) scored on
  the lm-eval tasks in-process (xlt.eval.scores), one row per model x task metric over the
  seeds (values per seed, a 95% interval as the testbed's rows have); [] without tasks."""
  tasks = list(c.eval.get("tasks", ()))
  if not tasks:
    return []
  options, scores = eval_scores.kind_options(c), {}
  manager = eval_scores.check(tasks, options)  # the task index, built once
  for i, models in enumerate(per_seed):
    for name, params in models.items():
      print(f"testbed: lm-eval {','.join(tasks)} on {name} (seed {seeds[i]})", flush=True)
      for task, metrics in eval_scores.score(cfg, params, tok.hf, tasks, options, name=name,
                                                     manager=manager).items():
        for metric, value in metrics.items():
          scores.setdefault(name, {}).setdefault(task, {}).setdefault(metric, [None] * len(per_seed))[i] = value
  out = eval_scores.rows(scores, results_lib.make_row, experiment=c.name, task=c.task, seeds_used=seeds)
  for row in out:
    row["ci95"] = stats.interval(row["values"])["half"]
  return out
