"""Greedy generation and perplexity with a Hugging Face model directory (xlt.pretrained) and
its tokenizer (xlt.hf_tokenizer):

  python -m xlt.generate --model=DIR --prompts=prompts.jsonl --output=out.jsonl \
      [--chat] [--max_new=256] [--batch=32] [--answers=answers.jsonl] [--dtype=bfloat16]
  python -m xlt.generate --model=DIR --perplexity=text.txt [--output=ppl.json] [--block=1024]

Each prompt line is {"prompt": "..."} or {"messages": [{"role": ..., "content": ...}, ...]};
messages (and, with --chat, prompts as one user message) go through the model's chat
template, with the assistant's turn opened. Each output line is the prompt's record with
"continuation" (the text up to the first stop id: the tokenizer's EOS and generation_config's
eos_token_id) and "ids" added; the file is rewritten atomically after every batch, so it holds
the finished prompts and is never torn. With --answers (one {"answer": ...} line per prompt),
each record gets "answer", "predicted" and "correct", and the accuracy is printed and
written beside the output (out.jsonl -> out.accuracy.json).
Scoring is MGSM's: the last number in the continuation, commas removed (`final_number`),
equal to the answer's.

--perplexity scores a text file as one document: its tokens (with the BOS the tokenizer adds)
cut into rows of `block` + 1 tokens that overlap by one, so every token after the first is
predicted once, each row from its own start (no context carried across rows); the padding of
the last row is not scored. Prints and writes {"nll_sum", "tokens", "ppl_token"}.

From Python: `greedy_ids(cfg, params, prompt_ids, ...)`, `decode(cfg, params, tokenizer,
prompts, ...)`, `final_number(text)`, `perplexity(cfg, params, tokenizer, text, ...)`.

A user error (a missing file, a bad JSON line, named by its number; a prompt longer than the
model's context) is one line `xlt.generate: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys

import jax
import numpy as np

from xlt import distributed
from xlt import evaluate
from xlt import hf_tokenizer
from xlt import lm
from xlt import sharding
from xlt.data import sft
from xlt.io import fileio

# Padded prompt lengths and prefill lengths are rounded to this, so a run over prompts of many
# lengths compiles a few programs, not one per length (a shorter prefill is exact: the decoding
# loop copies the rest of each prompt in, one position per step).
LENGTH_BUCKET = 32


class UserError(ValueError):
  """A bad command line or input file: reported as one line, exit status 2."""


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_number(text) -> str | None:
  """The last number in `text` with commas removed, as a canonical string ("1,234.50" ->
  "1234.5", "18.0" -> "18"), or None. MGSM's scoring compares these for exact match."""
  found = _NUMBER.findall(str(text).replace(",", ""))
  if not found:
    return None
  n = found[-1]
  if "." in n:
    n = n.rstrip("0").rstrip(".")
  return "0" if n in ("-0", "") else n


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "min_prompt", "eos_id"))
def _greedy(cfg, params, prompts_BxP, prompt_len_B, *, max_new, min_prompt, eos_id):
  return evaluate.greedy_decode(cfg, params, prompts_BxP, prompt_len_B, max_new=max_new, min_prompt=min_prompt,
                                eos_id=eos_id)


def _cut(ids: list[int], stop_ids) -> list[int]:
  stops = [k for k, t in enumerate(ids) if t in stop_ids]
  return ids[:stops[0]] if stops else ids



def _buckets(cfg, lens: list[int], max_new: int) -> tuple[int, int, int]:
  """(padded prompt length, new tokens, prefill length) of a batch of prompt lengths `lens`."""
  longest, shortest = max(lens), min(lens)
  p, new = sharding.round_up(longest, LENGTH_BUCKET), max_new
  if p + new > cfg.block_size:  # the bucket's rounding must not cost new tokens
    p, new = longest, min(max_new, cfg.block_size - longest)
  # the prefill: a multiple of the bucket, or below it a power of two
  prefill = shortest // LENGTH_BUCKET * LENGTH_BUCKET if shortest >= LENGTH_BUCKET else 1 << (shortest.bit_length() - 1)
  return p, new, prefill


def greedy_ids(cfg, params, prompt_ids: list[list[int]], *, max_new: int = 256, batch: int = 32,
               stop_ids=(), on_batch=None) -> list[list[int]]:
  """Greedy continuations of one model's prompts (token id lists of any lengths): each up to,
  not including, its first id in `stop_ids`, at most `max_new` ids (fewer where the prompt
  leaves less of the model's block_size).

  Prompts are decoded in batches of similar length (xlt.evaluate.greedy_decode: a batch's
  shorter prompts wait while the longer are prefilled one position per step, which gives the
  same ids as decoding each alone); a batch stops once each row has written the first stop
  id. `on_batch(indices, continuations)` is called after each batch with that batch's."""
  lens = [len(p) for p in prompt_ids]
  if 0 in lens:
    raise UserError(f"prompt {lens.index(0)} has no tokens")
  if lens and max(lens) >= cfg.block_size:
    raise UserError(f"prompt {lens.index(max(lens))} has {max(lens)} tokens; the model's context is "
                    f"{cfg.block_size}")
  stop_ids = [int(s) for s in stop_ids]
  n = len(prompt_ids)
  batch = sharding.round_up(max(1, min(batch, n)), sharding.devices_of(params))
  order = sorted(range(n), key=lambda i: lens[i])
  out: list = [None] * n
  for start in range(0, n, batch):
    rows = order[start:start + batch]
    p, new, min_prompt = _buckets(cfg, [lens[i] for i in rows], max_new)
    prompts, plen = np.zeros((batch, p), np.int32), np.zeros((batch,), np.int32)
    for r in range(batch):  # the last batch repeats its rows: one shape, one program
      i = rows[r % len(rows)]
      prompts[r, :lens[i]], plen[r] = prompt_ids[i], lens[i]
    toks = _greedy(cfg, params, sharding.spread(prompts, params, 0), sharding.spread(plen, params, 0),
                   max_new=int(new), min_prompt=int(min_prompt), eos_id=stop_ids[0] if stop_ids else None)
    toks = np.asarray(distributed.to_host(toks))  # with several processes, rows live on all of them
    for r, i in enumerate(rows):
      out[i] = _cut(toks[r, lens[i]:lens[i] + new].tolist(), stop_ids)
    if on_batch is not None:
      on_batch(rows, [out[i] for i in rows])
  return out


def encode_prompts(tokenizer, prompts, chat: bool = False) -> list[list[int]]:
  """Token ids of prompts: strings (chat=True: each as one user message through the chat
  template) or message lists (always through the chat template, which writes BOS itself)."""
  out = []
  for p in prompts:
    if isinstance(p, str) and not chat:
      out.append(tokenizer.encode(p))
    else:
      messages = [{"role": "user", "content": p}] if isinstance(p, str) else p
      out.append(tokenizer.encode_chat(messages, add_generation_prompt=True))
  return out


def decode(cfg, params, tokenizer, prompts, *, chat: bool = False, max_new: int = 256, batch: int = 32,
           on_batch=None) -> list[dict]:
  """[{"continuation": text, "ids": [...]}] per prompt (strings or message lists: `encode_prompts`),
  greedy, stopped at the tokenizer's stop ids. `on_batch(indices, records)` after each batch."""
  def records(ids):
    return [{"continuation": tokenizer.decode(c), "ids": c} for c in ids]

  hook = None if on_batch is None else (lambda rows, ids: on_batch(rows, records(ids)))
  return records(greedy_ids(cfg, params, encode_prompts(tokenizer, prompts, chat), max_new=max_new, batch=batch,
                            stop_ids=tokenizer.stop_ids, on_batch=hook))


def packed_rows(ids, block: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [N, block + 1], loss_mask [N, block]) of one token sequence: rows overlapping
  by one token, so each token after the first is a target once; the last row's padding is
  masked."""
  ids = np.asarray(ids, np.int32)
  if len(ids) < 2:
    raise UserError(f"the text has {len(ids)} token(s); perplexity needs at least 2")
  n = -(-(len(ids) - 1) // block)
  tokens, mask = np.zeros((n, block + 1), np.int32), np.zeros((n, block), np.float32)
  for r in range(n):
    row = ids[r * block: r * block + block + 1]
    tokens[r, :len(row)], mask[r, :len(row) - 1] = row, 1.0
  return tokens, mask


def perplexity(cfg, params, tokenizer, text: str, *, block: int | None = None, batch: int = 8) -> dict:
  """{"nll_sum", "tokens", "ppl_token"} of `text` as one document (see the module docstring);
  rows of `block` targets (default: the model's block_size, at most 2048)."""
  block = min(block or 2048, cfg.block_size)
  tokens, mask = packed_rows(tokenizer.encode(text), block)
  return lm.perplexity(cfg, params, tokens, mask, batch, ensemble=False)


# ------------------------------------------------------------------------------ command line


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise UserError(message)


def _parser() -> argparse.ArgumentParser:
  p = _Parser(prog="python -m xlt.generate", description=__doc__.split("\n\n")[0])
  p.add_argument("--model", required=True, help="a Hugging Face model directory")
  p.add_argument("--prompts", help="JSON lines: {\"prompt\": ...} or {\"messages\": [...]}")
  p.add_argument("--perplexity", help="a text file to score instead of prompts")
  p.add_argument("--output", help="the JSON lines written (with --perplexity: a JSON file; optional)")
  p.add_argument("--chat", action="store_true", help="apply the chat template to plain prompts too")
  p.add_argument("--max_new", type=int, default=256, help="new tokens at most per prompt")
  p.add_argument("--batch", type=int, default=32, help="prompts (or perplexity rows) per batch")
  p.add_argument("--answers", help="JSON lines {\"answer\": ...}, one per prompt: score the final numbers")
  p.add_argument("--block", type=int, default=None, help="perplexity: targets per row (default: the context)")
  p.add_argument("--dtype", default=None, help="the parameters' dtype (xlt.pretrained.load)")
  p.add_argument("--traceback", action="store_true", help="on an error, the full trace instead of one line")
  return p


def read_jsonl(path: str, what: str) -> list[dict]:
  """The JSON objects of a JSON-lines file (blank lines skipped); a bad line is a UserError
  naming its number."""
  if not os.path.isfile(path):
    raise UserError(f"no {what} file {path}")
  fileio.check_size(path, sft.MAX_FILE_BYTES, UserError)  # a file the user brings
  out = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"{path} line {number} is not JSON: {e.msg}") from None
      if not isinstance(record, dict):
        raise UserError(f"{path} line {number} is not a JSON object")
      out.append((number, record))
  return out


def read_prompts(path: str) -> tuple[list[dict], list]:
  """(records, prompts): each prompt a string or a message list."""
  records, prompts = [], []
  for number, r in read_jsonl(path, "prompts"):
    if isinstance(r.get("messages"), list) and r["messages"]:
      prompts.append(r["messages"])
    elif isinstance(r.get("prompt"), str):
      prompts.append(r["prompt"])
    else:
      raise UserError(f"{path} line {number} has neither a \"prompt\" string nor a \"messages\" list")
    records.append(r)
  if not records:
    raise UserError(f"{path} holds no prompts")
  return records, prompts


def _accuracy_path(output: str) -> str:
  return (output[:-len(".jsonl")] if output.endswith(".jsonl") else output) + ".accuracy.json"


def score(records: list[dict], answers: list) -> dict:
  """Adds "answer", "predicted" and "correct" to each record; {"correct", "total", "accuracy"}."""
  for r, a in zip(records, answers):
    r["answer"], r["predicted"] = a, final_number(r["continuation"])
    r["correct"] = r["predicted"] is not None and r["predicted"] == final_number(a)
  correct = sum(r["correct"] for r in records)
  return {"correct": correct, "total": len(records), "accuracy": correct / max(len(records), 1)}


def read_answers(path: str, n: int) -> list:
  lines = read_jsonl(path, "answers")
  if len(lines) != n:
    raise UserError(f"{path} has {len(lines)} answers for {n} prompts")
  if missing := [number for number, r in lines if "answer" not in r]:
    raise UserError(f"{path} line {missing[0]} has no \"answer\"")
  return [r["answer"] for _, r in lines]


def run_prompts(args, cfg, params, tokenizer, records, prompts, answers) -> dict | None:
  done: dict[int, dict] = {}

  def write(rows, results):  # every finished record so far, in prompt order, atomically
    done.update({i: {**records[i], **res} for i, res in zip(rows, results)})
    fileio.write_text(args.output, "".join(json.dumps(done[i], ensure_ascii=False) + "\n" for i in sorted(done)))

  results = decode(cfg, params, tokenizer, prompts, chat=args.chat, max_new=args.max_new, batch=args.batch,
                   on_batch=write)
  out = [{**r, **res} for r, res in zip(records, results)]
  summary = None
  if answers is not None:
    summary = score(out, answers)
    fileio.write_text(_accuracy_path(args.output), json.dumps(summary, indent=1) + "\n")
    print(f"accuracy {summary['accuracy']:.4f} ({summary['correct']}/{summary['total']})")
  fileio.write_text(args.output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
  print(f"{len(out)} continuations in {args.output}")
  return summary


def load_model(path: str, dtype: str | None):
  """(cfg, params) of a Hugging Face model directory (xlt.pretrained; imported here, so the
  inputs are checked before the model loader and its dependencies load)."""
  from xlt import pretrained

  return pretrained.load(path, dtype=dtype)


def run(argv: list[str]) -> dict | None:
  """The command on `argv` (without the program name); returns the accuracy or perplexity summary."""
  args = _parser().parse_args(argv)
  if (args.prompts is None) == (args.perplexity is None):
    raise UserError("give --prompts (with --output) or --perplexity")
  if args.prompts is not None and not args.output:
    raise UserError("--prompts needs --output")
  if args.max_new < 1 or args.batch < 1 or (args.block is not None and args.block < 1):
    raise UserError(f"--max_new, --batch and --block must be positive, got {args.max_new}, {args.batch}, {args.block}")
  if not os.path.isdir(args.model):
    raise UserError(f"no model directory {args.model}")
  if args.perplexity is not None and not os.path.isfile(args.perplexity):
    raise UserError(f"no text file {args.perplexity}")
  if args.prompts is not None:  # every input checked before the model loads
    records, prompts = read_prompts(args.prompts)
    answers = None if args.answers is None else read_answers(args.answers, len(records))
  tokenizer = hf_tokenizer.load(args.model)
  cfg, params = load_model(args.model, args.dtype)
  if args.prompts is not None:
    return run_prompts(args, cfg, params, tokenizer, records, prompts, answers)
  with open(args.perplexity, encoding="utf-8") as f:
    result = perplexity(cfg, params, tokenizer, f.read(), block=args.block, batch=args.batch)
  print(f"perplexity {result['ppl_token']:.4f} per token over {int(result['tokens'])} tokens")
  if args.output:
    fileio.write_text(args.output, json.dumps(result, indent=1) + "\n")
  return result


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  try:
    run(argv)
  except (ValueError, OSError) as e:  # UserError, TokenizerError, a model the loader refuses
    if "--traceback" in argv:
      raise
    print(f"xlt.generate: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
