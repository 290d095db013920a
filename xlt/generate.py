"""Greedy generation and perplexity with a Hugging Face model directory (xlt.pretrained) and
its tokenizer (xlt.hf_tokenizer):

  python -m xlt.generate --model=DIR --prompts=prompts.jsonl --output=out.jsonl \
      [--chat] [--max_new=256] [--batch=32] [--answers=answers.jsonl] [--dtype=bfloat16] \
      [--mesh=data=4,tensor=2]
  python -m xlt.generate --model=DIR --perplexity=text.txt [--output=ppl.json] [--block=1024]

Each prompt line is {"prompt": "..."} or {"messages": [{"role": ..., "content": ...}, ...]};
messages (and, with --chat, prompts as one user message) go through the model's chat
template, with the assistant's turn opened. Each output line is the prompt's record with
"continuation" (the text up to the first stop id: the tokenizer's EOS and generation_config's
eos_token_id) and "ids" added. The output is written once, atomically, when every prompt is done: an interrupted
run leaves it as it was, the prompts it finished in <output>.partial (rewritten atomically after
every batch, removed at the end). With --answers (one {"answer": ...} line per prompt),
each record gets "answer", "predicted" and "correct", and the accuracy is printed and
written beside the output (out.jsonl -> out.accuracy.json). --match says what counts as
correct (`MATCHES`):
  exact   the continuation equals the answer, leading and trailing spaces ignored (the
          default; what xlt.experiments.finetune's table reports as exact match);
  number  MGSM's: the last number in the continuation, commas removed (`final_number`),
          equal to the answer's;
  task    the scorer of the record's own task: a record whose "set" is an xlt arithmetic set
          ("add_digit/letter", the prompt files of configs/llama_base.py) is scored by
          xlt.data.arithmetic (exact match in the language's script, and "any_script").

--perplexity scores a text file as one document: its tokens (with the BOS the tokenizer adds)
cut into rows of `block` + 1 tokens that overlap by one, so every token after the first is
predicted once, each row from its own start (no context carried across rows); the padding of
the last row is not scored. Prints and writes {"nll_sum", "tokens", "ppl_token"}.

From Python: `greedy_ids(cfg, params, prompt_ids, ..., mesh=None)`, `decode(cfg, params,
tokenizer, prompts, ...)`, `final_number(text)`, `perplexity(cfg, params, tokenizer, text, ...)`;
the batched scoring and decoding under them: xlt.decode and xlt.perplexity (xlt.ensemble_decode
is the experiments' decoding of an ensemble's answers, not used here). --mesh (e.g. data=4,tensor=2) lays the
model out over the devices as training does and splits the prompts over the data axes.

A user error (a missing file, a bad JSON line, named by its number; a prompt longer than the
model's context) is one line `xlt.generate: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys

import numpy as np

from xlt import cli
from xlt.cli import UserError
from xlt import decode as decode_lib
from xlt import hf_tokenizer
from xlt import perplexity as perplexity_lib
from xlt import sharding
from xlt.data import sft
from xlt.io import fileio

# Padded prompt lengths are rounded to this, so a run over prompts of many lengths compiles a
# few programs, not one per length (left padding changes no value: xlt.decode).
LENGTH_BUCKET = 32


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
MATCHES = ("exact", "number", "task")


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


def greedy_ids(cfg, params, prompt_ids: list[list[int]], *, max_new: int = 256, batch: int = 32,
               stop_ids=(), on_batch=None, mesh=None) -> list[list[int]]:
  """Greedy continuations of one model's prompts (token id lists of any lengths): each up to,
  not including, its first id in `stop_ids`, at most `max_new` ids (fewer where the prompt
  leaves less of the model's block_size).

  Prompts are decoded in batches of similar length, left-padded (xlt.decode.greedy: each row
  gets its own positions, so it decodes as it would alone, and the KV cache); a batch stops
  once each row has written a stop id. With `mesh` (xlt.decode.make_mesh; params laid out on
  it, e.g. pretrained.load(..., mesh=mesh)) the rows split over its data axes and the model
  over its tensor axis; without one, rows split over the devices the params are replicated on.
  `on_batch(indices, continuations)` is called after each batch with that batch's."""
  lens = [len(p) for p in prompt_ids]
  if 0 in lens:
    raise UserError(f"prompt {lens.index(0)} has no tokens")
  if lens and max(lens) >= cfg.block_size:
    raise UserError(f"prompt {lens.index(max(lens))} has {max(lens)} tokens; the model's context is "
                    f"{cfg.block_size}")
  mesh = mesh if mesh is not None else sharding.replicated_mesh(params)
  n = len(prompt_ids)
  batch = sharding.round_up(max(1, min(batch, n)), decode_lib.rows_multiple(mesh))
  order = sorted(range(n), key=lambda i: lens[i])
  out: list = [None] * n
  for start in range(0, n, batch):
    rows = order[start:start + batch]
    longest = lens[rows[-1]]
    # one padded length per bucket, so a run over many lengths compiles a few programs
    new = min(max_new, cfg.block_size - longest)
    result = decode_lib.greedy(cfg, params, [prompt_ids[i] for i in rows], max_new=new, stop_ids=stop_ids,
                               mesh=mesh, length=sharding.round_up(longest, LENGTH_BUCKET), batch=batch)
    for r, i in enumerate(rows):
      out[i] = result.ids[r]
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
           on_batch=None, mesh=None) -> list[dict]:
  """[{"continuation": text, "ids": [...]}] per prompt (strings or message lists: `encode_prompts`),
  greedy, stopped at the tokenizer's stop ids. `on_batch(indices, records)` after each batch."""
  def records(ids):
    return [{"continuation": tokenizer.decode(c), "ids": c} for c in ids]

  hook = None if on_batch is None else (lambda rows, ids: on_batch(rows, records(ids)))
  return records(greedy_ids(cfg, params, encode_prompts(tokenizer, prompts, chat), max_new=max_new, batch=batch,
                            stop_ids=tokenizer.stop_ids, on_batch=hook, mesh=mesh))


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
  return perplexity_lib.perplexity(cfg, params, tokens, mask, batch, ensemble=False)


# ------------------------------------------------------------------------------ command line


def _parser() -> argparse.ArgumentParser:
  p = cli.Parser(prog="python -m xlt.generate", description=__doc__.split("\n\n")[0])
  p.add_argument("--model", required=True, help="a Hugging Face model directory")
  p.add_argument("--prompts", help="JSON lines: {\"prompt\": ...} or {\"messages\": [...]}")
  p.add_argument("--perplexity", help="a text file to score instead of prompts")
  p.add_argument("--output", help="the JSON lines written (with --perplexity: a JSON file; optional)")
  p.add_argument("--chat", action="store_true", help="apply the chat template to plain prompts too")
  p.add_argument("--max_new", type=int, default=256, help="new tokens at most per prompt")
  p.add_argument("--batch", type=int, default=32, help="prompts (or perplexity rows) per batch")
  p.add_argument("--answers", help="JSON lines {\"answer\": ...}, one per prompt: score the continuations")
  p.add_argument("--match", default="exact", choices=MATCHES,
                 help="what counts as correct: the exact string (as the finetune table), the final number "
                      "(MGSM), or the task's own scorer")
  p.add_argument("--block", type=int, default=None, help="perplexity: targets per row (default: the context)")
  p.add_argument("--dtype", default=None, help="the parameters' dtype (xlt.pretrained.load)")
  p.add_argument("--dense_layout", default=decode_lib.DENSE_LAYOUT, choices=("kernel", "weight"),
                 help="the dense layers' layout (xlt.model.Config.dense_layout): kernel decodes faster on a CPU, "
                      "weight loads faster")
  p.add_argument("--mesh", default=None, help="devices as data=4,tensor=2 (xlt.decode.make_mesh; default one)")
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
        what, _, column = fileio.json_fault(e)
        raise UserError(f"{path} line {number} is not JSON: {what} at column {column}") from None
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


def match(continuation: str, answer, mode: str = "exact", record: dict | None = None) -> dict:
  """{"predicted", "correct"} (and the task's own fields) of one continuation under `mode`
  (module doc); `record` is the prompt's line, which a task scorer reads ("set", "prompt")."""
  if mode == "exact":
    predicted = str(continuation).strip()
    return {"predicted": predicted, "correct": predicted == str(answer).strip()}
  if mode == "number":
    predicted = final_number(continuation)
    return {"predicted": predicted, "correct": predicted is not None and predicted == final_number(answer)}
  if mode == "task":
    from xlt.data import arithmetic

    record = record or {}
    if not isinstance(record.get("set"), str) or not isinstance(record.get("prompt"), str):
      raise UserError("--match=task needs each prompt's \"set\" (an xlt arithmetic set such as add_digit/letter) "
                      "and \"prompt\"")
    try:
      s = arithmetic.score_text(record["set"], record["prompt"], continuation)
    except ValueError as e:
      raise UserError(f"--match=task: {e}") from None
    return {"predicted": str(continuation).strip(), "correct": bool(s["exact_match"]), "any_script": bool(s["any_script"])}
  raise UserError(f"--match must be one of {', '.join(MATCHES)}, got {mode!r}")


def score(records: list[dict], answers: list, mode: str = "exact") -> dict:
  """Adds "answer", "predicted" and "correct" (`match`) to each record; {"correct", "total",
  "accuracy", "match"} (and "any_script" under a task scorer that gives it)."""
  for r, a in zip(records, answers):
    r.update(answer=a, **match(r["continuation"], a, mode, r))
  correct = sum(r["correct"] for r in records)
  out = {"correct": correct, "total": len(records), "accuracy": correct / max(len(records), 1), "match": mode}
  if records and all("any_script" in r for r in records):
    out["any_script"] = sum(r["any_script"] for r in records) / len(records)
  return out


def read_answers(path: str, n: int) -> list:
  lines = read_jsonl(path, "answers")
  if len(lines) != n:
    raise UserError(f"{path} has {len(lines)} answers for {n} prompts")
  if missing := [number for number, r in lines if "answer" not in r]:
    raise UserError(f"{path} line {missing[0]} has no \"answer\"")
  return [r["answer"] for _, r in lines]


def run_prompts(args, cfg, params, tokenizer, records, prompts, answers, mesh=None) -> dict | None:
  done: dict[int, dict] = {}
  partial = args.output + ".partial"  # the output itself only ever holds every prompt's

  def write(rows, results):  # every finished record so far, in prompt order, atomically
    done.update({i: {**records[i], **res} for i, res in zip(rows, results)})
    fileio.write_text(partial, "".join(json.dumps(done[i], ensure_ascii=False) + "\n" for i in sorted(done)))

  try:
    results = decode(cfg, params, tokenizer, prompts, chat=args.chat, max_new=args.max_new, batch=args.batch,
                     on_batch=write, mesh=mesh)
  except BaseException:
    if done:
      print(f"xlt.generate: stopped after {len(done)} of {len(records)} prompts: those are in {partial}; "
            f"{args.output} is as it was", file=sys.stderr, flush=True)
    raise
  out = [{**r, **res} for r, res in zip(records, results)]
  summary = None
  if answers is not None:
    summary = score(out, answers, args.match)
    fileio.write_text(_accuracy_path(args.output), json.dumps(summary, indent=1) + "\n")
    print(f"accuracy {summary['accuracy']:.4f} ({summary['correct']}/{summary['total']}, {args.match} match"
          + (f"; right value in either script {summary['any_script']:.4f}" if "any_script" in summary else "") + ")")
  fileio.write_text(args.output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
  with contextlib.suppress(FileNotFoundError):
    os.remove(partial)
  print(f"{len(out)} continuations in {args.output}")
  return summary


def load_model(path: str, dtype: str | None, mesh=None, dense_layout: str = decode_lib.DENSE_LAYOUT):
  """(cfg, params) of a Hugging Face model directory (xlt.pretrained; imported here, so the
  inputs are checked before the model loader and its dependencies load), laid out on `mesh`,
  its dense layers as `dense_layout` (default: decoding's, xlt.decode.DENSE_LAYOUT)."""
  from xlt import pretrained

  return pretrained.load(path, dtype=dtype, mesh=mesh, dense_layout=dense_layout)


def run(argv: list[str]) -> dict | None:
  """The command on `argv` (without the program name); returns the accuracy or perplexity summary."""
  args = _parser().parse_args(argv)
  if (args.prompts is None) == (args.perplexity is None):
    raise UserError("give --prompts (with --output) or --perplexity")
  if args.prompts is not None and not args.output:
    raise UserError("--prompts needs --output")
  if args.match != "exact" and args.answers is None:  # else it would score nothing, silently
    raise UserError(f"--match={args.match} scores continuations against --answers: give --answers=FILE")
  if args.max_new < 1 or args.batch < 1 or (args.block is not None and args.block < 1):
    raise UserError(f"--max_new, --batch and --block must be positive, got {args.max_new}, {args.batch}, {args.block}")
  if not os.path.isdir(args.model):
    raise UserError(f"no model directory {args.model}")
  if args.perplexity is not None and not os.path.isfile(args.perplexity):
    raise UserError(f"no text file {args.perplexity}")
  if args.prompts is not None:  # every input checked before the model loads
    records, prompts = read_prompts(args.prompts)
    answers = None if args.answers is None else read_answers(args.answers, len(records))
    if answers is not None and args.match == "task":
      for r in records:  # each prompt names a task that xlt can score
        match("", None, "task", r)
  mesh = decode_lib.make_mesh(args.mesh)
  tokenizer = hf_tokenizer.load(args.model)
  cfg, params = load_model(args.model, args.dtype, mesh, args.dense_layout)
  if args.prompts is not None:
    return run_prompts(args, cfg, params, tokenizer, records, prompts, answers, mesh)
  with open(args.perplexity, encoding="utf-8") as f:
    result = perplexity(cfg, params, tokenizer, f.read(), block=args.block, batch=args.batch)
  print(f"perplexity {result['ppl_token']:.4f} per token over {int(result['tokens'])} tokens")
  if args.output:
    fileio.write_text(args.output, json.dumps(result, indent=1) + "\n")
  return result


def main(argv=None) -> int:
  return cli.run_command("xlt.generate", run, argv)


if __name__ == "__main__":
  sys.exit(main())
