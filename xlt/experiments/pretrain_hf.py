"""A small Llama-shaped model pretrained by xlt on its own synthetic data and written as a
Hugging Face directory with its tokenizer, so the open-model path (xlt.experiments.finetune,
xlt.generate, transformers) runs end to end with nothing downloaded (configs/llama_base.py).

  1. prepare   a word-piece tokenizer of the merge testbed's vocabulary (xlt.data.arithmetic),
               written as tokenizer.json + tokenizer_config.json (BOS, EOS, pad, a minimal chat
               template) + generation_config.json in workdir/tokenizer; the testbed's problem
               sets as prompt/completion jsonl in workdir/data:
                 base.jsonl      the base mixture (non-task operations, both languages)
                 task.jsonl      the task (add_digit) in the source language
                 language.jsonl  the other operations in the target language
                 prompts.jsonl, task_prompts.jsonl, language_prompts.jsonl
                                 held-out test prompts with their "answer": the goal (the
                                 task in the target language), the task, the language
               and base.jsonl encoded through that tokenizer (xlt.data.sft: the loss on the
               completion + EOS), with a validation split;
  2. stages    one model trained from scratch (early stopping on the validation loss, the
               best parameters kept);
  3. outputs   the model saved with pretrained.save as model_type llama in workdir/hf (the
               tokenizer files copied in), its validation loss and greedy exact match on the
               three prompt sets.

Text. The testbed's examples are word-level ("[std] 3 2 7 + 1 0 4 =" -> "1 3 4", answers
least significant digit first); here a run of digits or letters is written as one word
("[std] 327 + 104 =" -> "134"), which the WordPiece model cuts into one token per character
("1", "##3", "##4") and its decoder glues back, so a number reads as a number and an answer
as a string ("GCJ"; xlt.generate's --answers --match=exact or --match=task scores it). The model learns from the ids of this tokenizer, the same
ids transformers' AutoTokenizer gives for the same text.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections
import numpy as np

from xlt import hf_tokenizer, pretrained
from xlt import perplexity as perplexity_lib
from xlt import generate as generate_lib
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt.data import addition, arithmetic, sft
from xlt.experiments import common as kind_lib
from xlt.io import fileio

# what this kind is called (c.kind) and runs: its data task (no headline metric: its results are not recorded in results/)
KIND = kind_lib.Kind(name="pretrain_hf", tasks={"pretrain_hf": None})

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
ROLES = ("[system]", "[user]", "[assistant]")
# One turn per message, role word first; the assistant's turn ends with EOS. Prefix-stable
# (xlt.data.sft finds the assistant turns by rendering prefixes).
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
                 "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %} {% endfor %}"
                 "{% if add_generation_prompt %}[assistant] {% endif %}")
PROMPT_SETS = ("prompts", "task_prompts", "language_prompts")  # the goal, the task, the language


def glued() -> list[str]:
  """The one-character symbols written run together in a word: digits and the letter digits."""
  return [str(d) for d in range(10)] + [addition.encode_number(d, "letter")[0] for d in range(10)]


def vocabulary() -> list[str]:
  """Every token, by id: the specials, the testbed's symbols, the continuing pieces of the
  glued symbols ("##3"), the chat roles."""
  return list(dict.fromkeys([*SPECIALS, *arithmetic.symbols(), *(f"##{s}" for s in glued()), *ROLES]))


def text(tokens) -> str:
  """The testbed's word-level tokens as text: runs of glued symbols as one word."""
  words, glue = [], set(glued())
  for t in tokens:
    if words and t in glue and words[-1][-1] in glue:
      words[-1] += t
    else:
      words.append(t)
  return " ".join(words)


def build_tokenizer():
  """The `tokenizers.Tokenizer`: WordPiece over whitespace-split words, BOS prepended."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors

  vocab = {t: i for i, t in enumerate(vocabulary())}
  tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=UNK, continuing_subword_prefix="##",
                                              max_input_chars_per_word=100))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                     special_tokens=[(BOS, vocab[BOS])])
  tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
  tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in SPECIALS])
  return tok


def write_tokenizer(out_dir: str, block_size: int) -> dict:
  """tokenizer.json, tokenizer_config.json and generation_config.json in `out_dir`; returns
  the special token ids {"bos_token_id", "eos_token_id", "pad_token_id"}."""
  tok = build_tokenizer()
  ids = {f"{s}_token_id": tok.token_to_id(t) for s, t in (("bos", BOS), ("eos", EOS), ("pad", PAD))}
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
            "unk_token": UNK, "model_max_length": block_size, "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE}
  fileio.write_text(os.path.join(out_dir, "tokenizer.json"), tok.to_str(pretty=True))
  fileio.write_text(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(config, indent=1) + "\n")
  fileio.write_text(os.path.join(out_dir, "generation_config.json"), json.dumps(ids, indent=1) + "\n")
  return ids


def _write_jsonl(path: str, records) -> str:
  fileio.write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
  return path


def _records(examples) -> list[dict]:
  return [{"prompt": text(e.prompt), "completion": text(e.answer)} for e in examples]


def _prompts(names, ac) -> list[dict]:
  """Held-out test prompts of the sets "operation/language" with their answers."""
  out = []
  for name in names:
    op, _, language = name.partition("/")
    test, _ = arithmetic.held_out(op, ac)
    out += [{"prompt": text(e.prompt), "answer": text(e.answer), "set": name}
            for e in (arithmetic.make_example(op, a, b, language) for a, b in test)]
  return out


def write_data(c, data_dir: str) -> dict:
  """The jsonl files of the module doc in `data_dir`; returns {name: path}."""
  ac, src, tgt, op = c.arithmetic, c.languages.source, c.languages.target, c.task_op
  out = {name: _write_jsonl(os.path.join(data_dir, f"{name}.jsonl"), _records(arithmetic.mixture(c.data[name], ac)))
         for name in ("base", "task", "language")}
  sets = {"prompts": [f"{op}/{tgt}"], "task_prompts": [f"{op}/{src}"],
          "language_prompts": [f"{o}/{tgt}" for o in c.other_ops]}
  for name in PROMPT_SETS:
    out[name] = _write_jsonl(os.path.join(data_dir, f"{name}.jsonl"), _prompts(sets[name], ac))
  return out


@dataclasses.dataclass(frozen=True)
class Prep:
  """What `prepare` built: the model config, the tokenizer (its directory and special ids),
  the encoded base data (sft.Data) and the data files by name."""

  cfg: model_lib.Config
  tok: object
  tok_dir: str
  ids: dict
  data: sft.Data
  files: dict


def check(c):
  if any(op == c.task_op for op, _, _ in c.data.base):
    raise ValueError(f"data.base holds the task operation {c.task_op!r}: the base must not learn it")
  if not 0 < c.data.val_fraction < 1:
    raise ValueError(f"data.val_fraction must be in (0, 1), got {c.data.val_fraction}")
  if c.data.block_size > c.model.block_size:
    raise ValueError(f"data.block_size={c.data.block_size} is over model.block_size={c.model.block_size}")


def prepare(c, workdir: str) -> Prep:
  """Writes the tokenizer and the data files, encodes the base data."""
  check(c)
  tok_dir = os.path.join(workdir, "tokenizer")
  ids = write_tokenizer(tok_dir, c.model.block_size)
  files = write_data(c, os.path.join(workdir, "data"))
  tok = hf_tokenizer.load(tok_dir)
  cfg = model_lib.config_from(c.model.to_dict(), tok.vocab_size)
  if pretrained.guess_family(cfg) != "llama":
    raise ValueError(f"model is a {pretrained.guess_family(cfg)} config, not a Llama one (rmsnorm, swiglu, rope, "
                     "bias=False)")
  data = sft.load(files["base"], tok, block_size=c.data.block_size, val_fraction=c.data.val_fraction,
                  seed=c.data.seed, packing=False)
  print(f"pretrain_hf: {cfg.num_layers} layers, vocabulary {tok.vocab_size} (table {cfg.vocab_size}); "
        f"base data {data.counts}", flush=True)
  return Prep(cfg, tok, tok_dir, ids, data, files)


def stages(c, prep: Prep, trained: dict):
  """The one model, from scratch, stopping early on its validation loss."""
  del trained
  loop_c = ml_collections.ConfigDict({"train": c.train.to_dict(), "opt": c.opt.to_dict(), "mesh": c.mesh.to_dict()})
  val = prep.data.val

  def score(params, ids):
    r = perplexity_lib.perplexity(prep.cfg, params, val["tokens"], val["loss_mask"], c.eval.batch_size, ensemble=True,
                                  members=list(range(len(ids))))
    return [-float(nll / n) for nll, n in zip(r["nll_sum"], r["tokens"])]

  member = loop_lib.Member(f"base/seed_{c.seed}", c.seed, prep.data.train)
  yield kind_lib.Stage("base", prep.cfg, [member], score, config=loop_c)


def exact_match(c, cfg, params, tok, path: str) -> float:
  """Share of the first `c.eval.num_prompts` prompts of `path` whose greedy continuation is
  the answer."""
  records, prompts = generate_lib.read_prompts(path)
  records, prompts = records[:c.eval.num_prompts], prompts[:c.eval.num_prompts]
  got = generate_lib.decode(cfg, params, tok, prompts, max_new=c.eval.max_new, batch=c.eval.batch_size)
  return float(np.mean([g["continuation"].strip() == r["answer"] for g, r in zip(got, records)]))


def scored_prompts(c, path: str) -> str:
  """Which prompts of `path` `exact_match` scores, in words: the finetune kind's table scores
  every prompt, this one the first `c.eval.num_prompts`, which may be one operation's alone."""
  records, _ = generate_lib.read_prompts(path)
  n = min(c.eval.num_prompts, len(records))
  sets = list(dict.fromkeys(str(r.get("set")) for r in records[:n]))
  part = f"all {n} prompts" if n == len(records) else f"the first {n} of {len(records)} prompts"
  return f"{part}, {sets[0]} only" if len(sets) == 1 and n < len(records) else f"{part} ({', '.join(sets)})"


def outputs(c, prep: Prep, trained: dict, workdir: str):
  """Saves the model in workdir/hf (model_type llama) and scores it."""
  t = trained["base"]
  params = jax.tree.map(np.asarray, jax.tree.map(lambda x: x[0], t.params))
  hf_dir = os.path.join(workdir, "hf")
  hf_config = {"model_type": "llama", "architectures": [pretrained.ARCHITECTURES["llama"]], **prep.ids}
  pretrained.save(prep.cfg, params, hf_dir, hf_config=hf_config, source_dir=prep.tok_dir,
                  card={"method": "xlt.experiments.pretrain_hf", "config": c.name, "data": "xlt.data.arithmetic"})
  best = t.out["best_val"][0]
  scores = {"val_loss": float("nan") if best is None else -float(best)}
  if c.eval.num_prompts > 0:
    device = jax.tree.map(jax.numpy.asarray, params)
    scores |= {f"exact_match/{name}": exact_match(c, prep.cfg, device, prep.tok, prep.files[name])
               for name in PROMPT_SETS}
  rows = [results_lib.make_row(experiment=c.name, task=c.task, language="both", role=k.partition("/")[2] or "base",
                               condition="base", metric=k.partition("/")[0], values=[v], samples=None)
          for k, v in scores.items()]
  scored = {f"exact_match/{name}": scored_prompts(c, prep.files[name]) for name in PROMPT_SETS if c.eval.num_prompts}
  lines = [f"{c.name}: a Llama-shaped base pretrained on the merge testbed's base mixture, saved in {hf_dir}", "",
           "| metric | value | scored on |", "|---|---|---|"] + [
      f"| {k} | {v:.4f} | {scored.get(k, 'the validation split')} |" for k, v in scores.items()]
  summary = {"hf": hf_dir, "data": prep.files, "params": model_lib.count_params(params), "scores": scores,
             "best_step": t.out["best_steps"][0], "base_data": prep.data.counts}
  return rows, "\n".join(lines) + "\n", summary
