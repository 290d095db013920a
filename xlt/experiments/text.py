"""Table 4 of the language-mixing paper: language modelling with a high- and a low-resource
language (reference: TinyStories English + its Czech translation; test perplexity of Czech).

Four conditions (`c.conditions`), each trained for `c.num_seeds` seeds (or
`c.seeds_per_condition[cond]`), all as ONE ensemble (`loop.train_ensemble`, one compiled step):

  high_only    all high-resource train documents                 (reference: English only)
  low_limited  the limited low-resource subset (10% of its train)  (Czech only, limited)
  low_full     all low-resource train documents                  (Czech only, full)
  mixed        limited low-resource + all high-resource          (mixed)

Data (`get_task`; corpora and splits `xlt.data.corpus`, tokenizer `xlt.data.spm_tokenizer`, rows
`xlt.data.packing`): one sentencepiece BPE over both languages' train splits, cached in the
workdir; each split packed once to workdir/packed/*.npy (rows of block_size + 1 tokens) and
memory-mapped, so the full corpora never sit in memory; the loss mask is derived from the tokens
when a batch is read (`packing.LossMaskView`), and the mixed set is a view over two arrays
(`packing.RowConcat`). A mixed batch draws rows uniformly from the union, so the mix follows the
sizes (~1:10).

Budget. The conditions see very different amounts of data; every member gets the SAME step
budget (`c.train.steps` batches of `c.train.batch_size` rows) and stops early on its own
validation score, so a small training set is not penalised for overfitting past its best point:
  score = -(mean NLL per token) on validation rows of the member's *target* language (the
  low-resource language for low_limited, low_full and mixed; the high-resource one for
  high_only). Validation rows are the first `c.data.num_val_documents` held-out documents of
  that language; the TEST rows are the remaining held-out documents (at most
  `c.data.max_test_documents`, 0 = all). Validation and test share no document, held-out
  documents are in no training set (and, for a translated pair in the same order, neither is
  their translation), and the early-stopping number is never reported as a test number.
A member stops `c.train.patience` evaluations after its best; the parameters tested are those
of its best validation score (`runner.train_and_select`, saved in the workdir so a resumed run
agrees). Run again on a finished workdir, it returns the results it wrote, as every kind does.

Results. Every member is scored on both languages' test rows: ppl_token = exp(NLL / scored
targets) (shared tokenizer, so comparable across conditions), ppl_char and ppl_byte =
exp(NLL / characters or UTF-8 bytes of the test documents) (comparable across tokenizers; use
characters across languages). Rows (`results.make_row`): language, role "target" (low) or
"source" (high), condition, metric, values per seed, samples = training documents of that
language in the condition. The table has Table 4's shape, with the relative improvement of
mixed over limited, (limited - mixed) / limited. Writes curves.png (validation perplexity),
train_loss.png and samples.txt (sampled continuations of test-document prompts); the runner
writes table.md, summary.json and, last, results.json/.csv.

A kind of xlt.runner: `prepare` builds the data (`get_task`), `stages` is the one ensemble,
`outputs` tests it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import jax
import numpy as np
import sentencepiece as spm

from xlt import decode, distributed
from xlt import perplexity as perplexity_lib
from xlt import loop as loop_lib
from xlt import model as model_lib
from xlt import results as results_lib
from xlt.data import corpus
from xlt.data import packing
from xlt.data import spm_tokenizer
from xlt.experiments import common as kind_lib

# what this kind is called (c.kind) and runs (data tasks, each with its headline metric) and how xlt.report reads its rows
KIND = kind_lib.Kind(name="text", tasks={"text": "ppl_token"}, measurements="transfer")

CONDITIONS = ("high_only", "low_limited", "low_full", "mixed")
ROLES = ("high", "low")
METRICS = ("ppl_token", "ppl_char", "ppl_byte")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------- data


def _resolve_shared_dir(shared_dir: str) -> str:
  candidates = ([shared_dir] if os.path.isabs(shared_dir) else
                [os.path.abspath(shared_dir), os.path.join(_REPO_ROOT, shared_dir)])
  for d in candidates:
    if os.path.isdir(os.path.join(d, "data")) or (
        os.path.isdir(d) and os.path.basename(os.path.normpath(d)) == "data"):
      return os.path.normpath(d)
  raise FileNotFoundError(
      f"config.data.shared_dir={shared_dir!r}: no shared data directory at "
      f"{' or '.join(candidates)}. Set --config.data.shared_dir=/path/to/shared (the folder with "
      f"data/en_tinystories and data/ru_tinystories_nonparallel), or point at your own corpora "
      f"with --config.data.high.path=... --config.data.low.path=...")


def corpus_specs(c) -> dict[str, corpus.CorpusSpec]:
  """{"high": spec, "low": spec} from `c.data.{high,low}` (CorpusSpec fields), and "high_extra"
  from `c.data.high_extra` when its path is set.

  A spec whose path is unset takes the proxy file of its role under `c.data.shared_dir`
  (`corpus.proxy_corpora`); every other field stays as the config says. A missing file or an
  unset path without a shared_dir is a FileNotFoundError / ValueError that names the flag. Two
  specs over the same file(s) must be line-aligned (`corpus.check_parallel`).
  """
  shared = c.data.get("shared_dir")
  specs = {}
  for role in ROLES:
    fields = {k: v for k, v in c.data[role].to_dict().items()}
    if not fields.get("path"):
      if not shared:
        raise ValueError(
            f"config.data.{role}.path is not set: point it at the {role}-resource corpus, e.g. "
            f"--config.data.high.path=data/tinystories_en.txt "
            f"--config.data.low.path=data/tinystories_cs.txt")
      proxy = corpus.proxy_corpora(_resolve_shared_dir(shared))
      fields["path"] = proxy[f"{role}_resource"].path
    specs[role] = _existing(corpus.CorpusSpec(**fields), role)
  # One parallel file read twice (a field per language): the split is keyed by document index,
  # so index i must be the same story on both sides, or held-out text leaks in translation.
  if corpus.corpus_files(specs["high"]) == corpus.corpus_files(specs["low"]):
    corpus.check_parallel(specs["high"], specs["low"])
  extra = _extra_fields(c)
  if extra:  # training text only: not in the tokenizer, the split or the held-out rows
    specs["high_extra"] = _existing(corpus.CorpusSpec(**extra), "high_extra")
  return specs


def _existing(spec: corpus.CorpusSpec, role: str) -> corpus.CorpusSpec:
  """`spec`, once its files are found; else a FileNotFoundError naming the flag to set."""
  try:
    corpus.corpus_files(spec)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"config.data.{role}.path: {e}. Set --config.data.{role}.path= to "
                            f"an existing file or glob") from None
  return spec


def split_spec(c) -> corpus.SplitSpec:
  return corpus.SplitSpec(**c.data.split.to_dict())


def language(specs, role: str) -> str:
  return specs[role].language or role


def held_out_rows(spec, split, sp, block_size, num_val: int, max_test: int):
  """Validation and test rows ({"tokens", "loss_mask"}) and test TextStats, from the held-out
  documents: the first num_val are validation, the next max_test (0 = all) test."""
  docs = corpus.iter_split(corpus.iter_documents(spec), "held_out", split)
  val_docs = corpus.take_documents(docs, num_val)
  test_docs = corpus.take_documents(docs, max_test) if max_test else list(docs)
  if len(val_docs) < num_val or not test_docs:
    raise ValueError(f"{spec.path}: {len(val_docs) + len(test_docs)} held-out documents, need more "
                     f"than data.num_val_documents={num_val}; raise data.split.held_out_fraction")
  out = {}
  for name, d in (("val", val_docs), ("test", test_docs)):
    rows = packing.packed_arrays(packing.pack_documents(
        spm_tokenizer.encode_documents(sp, d), block_size=block_size, bos_id=sp.bos_id(),
        eos_id=sp.eos_id(), pad_id=sp.pad_id()))
    out[name] = {"tokens": rows["tokens"], "loss_mask": rows["loss_mask"]}
  stats = corpus.text_stats(test_docs, sp)
  scored = int(out["test"]["loss_mask"].sum())
  assert scored == stats.tokens + stats.documents, (scored, stats)
  return out["val"], out["test"], stats


def condition_parts(cond: str, c=None) -> list[tuple[str, str]]:
  """The (role, split) arrays a condition trains on. With the config `c`, also its additions:
  `data.high_extra` (a corpus of more high-resource text, all of it training) joins every
  condition that trains on the high language; `data.mixed_high_held_out` adds the held-out
  documents' high-resource side (for a translated pair: the originals of the test stories) to
  mixed, to measure how much of its gain is content leaking through translation."""
  try:
    parts = {"high_only": [("high", "train")], "low_limited": [("low", "limited")],
             "low_full": [("low", "train")],
             "mixed": [("low", "limited"), ("high", "train")]}[cond]
  except KeyError:
    raise ValueError(f"unknown condition {cond!r}; known: {', '.join(CONDITIONS)}") from None
  if c is not None and ("high", "train") in parts:
    if _extra_fields(c):
      parts.append(("high_extra", "all"))
    if cond == "mixed" and c.data.get("mixed_high_held_out"):
      parts.append(("high", "held_out"))
  return parts


def _extra_fields(c) -> dict | None:
  extra = c.data.get("high_extra")
  return extra.to_dict() if extra is not None and extra.get("path") else None


def _language_of(role: str) -> str:
  return "high" if role == "high_extra" else role


# ------------------------------------------------------------------------------- samples


def _prompts(c, sp, test_docs_by_role) -> dict[str, list[str]]:
  s = c.samples
  out = {}
  for role in ROLES:
    given = list(s.get(f"prompts_{role}", ()) or ())
    out[role] = given or [" ".join(d.split()[: s.prompt_words])
                          for d in test_docs_by_role[role][: s.num_prompts]]
  return out


def write_samples(path, c, cfg, params, sp, names, member_ids, prompts, specs):
  """Samples continuations of every prompt from each listed member; writes them to `path`."""
  s = c.samples
  lines = [f"# temperature {s.temperature}, top-k {s.top_k}, up to {s.max_new} new tokens, "
           f"stops at eos\n"]
  rng = jax.random.key(c.seed)
  host = distributed.to_host(params)  # slice on the host: no per-leaf device ops
  for name, i in zip(names, member_ids):
    one = jax.tree.map(lambda x, i=i: x[i], host)
    for role in ROLES:
      encoded = [[sp.bos_id()] + spm_tokenizer.encode(sp, p) for p in prompts[role]]
      by_len = {}
      for k, ids in enumerate(encoded):
        by_len.setdefault(len(ids), []).append(k)
      outs = [None] * len(encoded)
      for plen, ks in by_len.items():
        max_new = min(s.max_new, cfg.block_size - plen)
        if max_new < 1:
          continue
        rng, key = jax.random.split(rng)
        toks = decode.sample(cfg, one, np.asarray([encoded[k] for k in ks]), max_new=max_new,
                             temperature=s.temperature, top_k=s.top_k, rng=key)
        for k, row in zip(ks, toks):
          gen = row[plen:].tolist()
          gen = gen[: gen.index(sp.eos_id())] if sp.eos_id() in gen else gen
          outs[k] = spm_tokenizer.decode(sp, encoded[k][1:] + gen)
      for p, o in zip(prompts[role], outs):
        lines.append(f"== {name} | {language(specs, role)} | prompt: {p!r}\n{o}\n")
  results_lib.atomic_write(path, "\n".join(lines))


# --------------------------------------------------------------------------------- table


def _num(x: float) -> str:
  return f"{x:.2f}" if abs(x) < 1e4 else f"{x:.3g}"  # a language never trained on: huge


def _pm(row) -> str:
  if row is None:
    return "–"
  return _num(row["mean"]) if row["seeds"] == 1 else f"{_num(row['mean'])} ± {_num(row['std'])}"


def table_markdown(rows, specs, composition, title: str) -> str:
  """Table 4's shape: condition, data composition, low-resource test perplexity, improvement."""
  lo, hi = language(specs, "low"), language(specs, "high")
  find = lambda cond, lang, metric: next(
      (r for r in rows if r["condition"] == cond and r["language"] == lang
       and r["metric"] == metric), None)
  lines = [title, "",
           f"| condition | {lo} data | {hi} data | {lo} share of train tokens | "
           f"{lo} test ppl/token | {lo} test ppl/char | {hi} test ppl/token | "
           f"transfer improvement |",
           "|---|---|---|---|---|---|---|---|"]
  conds = list(dict.fromkeys(r["condition"] for r in rows))
  limited = find("low_limited", lo, "ppl_token")
  for cond in conds:
    comp = composition[cond]
    improvement = "–"
    if cond == "mixed" and limited is not None:
      mixed = find("mixed", lo, "ppl_token")
      improvement = f"{(limited['mean'] - mixed['mean']) / limited['mean'] * 100:+.1f}%"
    lines.append(
        f"| {cond} | {comp['low_fraction'] * 100:.0f}% ({comp['low_documents']:,} docs) | "
        f"{comp['high_fraction'] * 100:.0f}% ({comp['high_documents']:,} docs) | "
        f"{comp['low_token_share'] * 100:.1f}% | {_pm(find(cond, lo, 'ppl_token'))} | "
        f"{_pm(find(cond, lo, 'ppl_char'))} | {_pm(find(cond, hi, 'ppl_token'))} | {improvement} |")
  lines.append("")
  lines.append(f"Data: % of each language's train split used (documents). Improvement: "
               f"(limited - mixed) / limited of {lo} ppl/token.")
  return "\n".join(lines) + "\n"


def _train_loss_curves(workdir: str) -> dict[str, list[tuple[int, float]]]:
  curves: dict[str, dict[int, float]] = {}
  path = os.path.join(workdir, "metrics.jsonl")
  if os.path.isfile(path):
    with open(path) as f:
      for line in f:
        r = json.loads(line)
        if "loss" in r:
          curves.setdefault(r["run"], {})[r["step"]] = r["loss"]  # resumed: the last one wins
  return {k: sorted(v.items()) for k, v in curves.items()}


# ---------------------------------------------------------------------------------- task


def plan(c) -> list[tuple[str, int]]:
  """The cells of the ensemble: (condition, seed) for every condition and its seeds."""
  conditions = list(c.conditions)
  for cond in conditions:
    condition_parts(cond, c)
  return [(cond, seed) for cond in conditions for seed in kind_lib.condition_seeds(c, cond)]


@dataclasses.dataclass(frozen=True)
class TextTask:
  """The data of a Table 4 run, built once for all its conditions (`get_task`)."""

  specs: dict[str, corpus.CorpusSpec]  # per role
  split: corpus.SplitSpec
  sp: spm.SentencePieceProcessor
  packed: dict[tuple[str, str], np.ndarray]  # (role, split) -> memory-mapped token rows
  counts: dict[tuple[str, str], dict[str, int]]  # (role, split) -> packing.packed_counts
  composition: dict[str, dict]  # condition -> documents, tokens and shares of each language
  val: dict[str, dict[str, np.ndarray]]  # role -> {"tokens", "loss_mask"}
  test: dict[str, dict[str, np.ndarray]]  # role -> {"tokens", "loss_mask"}
  test_stats: dict[str, corpus.TextStats]  # role -> sizes of the test documents
  test_docs: dict[str, list[str]]  # role -> the test documents that sample prompts come from


def get_task(c, workdir: str, conditions: list[str]) -> TextTask:
  """Reads the corpora, trains (or loads) the tokenizer, packs the training splits the
  `conditions` need into workdir/packed/ and the held-out documents into validation and test
  rows."""
  specs = corpus_specs(c)
  split = split_spec(c)
  block = int(c.model.block_size)
  sp = spm_tokenizer.train_or_load_tokenizer(
      workdir, [specs["high"], specs["low"]], vocab_size=c.tokenizer.vocab_size, split=split,
      max_sentences_per_language=c.tokenizer.max_sentences_per_language)

  needed = {p for cond in conditions for p in condition_parts(cond, c)}
  packed, counts = {}, {}
  for role, split_name in sorted(needed):
    path = packing.pack_split_to_npy(workdir, specs[role], split_name, split, sp, block_size=block)
    packed[role, split_name] = packing.open_packed_tokens(path)
    counts[role, split_name] = packing.packed_counts(packed[role, split_name])
  val, test, test_stats, test_docs = {}, {}, {}, {}
  for role in ROLES:
    val[role], test[role], test_stats[role] = held_out_rows(
        specs[role], split, sp, block, c.data.num_val_documents, c.data.max_test_documents)
    docs = corpus.iter_split(corpus.iter_documents(specs[role]), "held_out", split)
    test_docs[role] = corpus.take_documents(
        docs, c.data.num_val_documents + c.samples.num_prompts)[c.data.num_val_documents:]
  composition = {}
  for cond in conditions:
    parts = condition_parts(cond, c)
    docs = {role: sum(counts[p]["documents"] for p in parts if _language_of(p[0]) == role) for role in ROLES}
    toks = {role: sum(counts[p]["targets"] for p in parts if _language_of(p[0]) == role) for role in ROLES}
    composition[cond] = {
        "low_documents": docs["low"], "high_documents": docs["high"],
        "low_tokens": toks["low"], "high_tokens": toks["high"],
        "low_fraction": (1.0 if ("low", "train") in parts else
                         split.limited_fraction if ("low", "limited") in parts else 0.0),
        "high_fraction": 1.0 if ("high", "train") in parts else 0.0,
        "low_token_share": toks["low"] / max(1, toks["low"] + toks["high"])}
  return TextTask(specs, split, sp, packed, counts, composition, val, test, test_stats, test_docs)


def model_config(c, task: TextTask) -> model_lib.Config:
  return model_lib.config_from(c.model.to_dict(), task.sp.get_piece_size())


# ------------------------------------------------------------------------- runner parts


@dataclasses.dataclass(frozen=True)
class Prep:
  """What `prepare` built: the cells (condition, seed), the data and the model."""

  cells: list[tuple[str, int]]
  task: TextTask
  cfg: model_lib.Config


def prepare(c, workdir: str) -> Prep:
  """Plans the cells and builds the data: the tokenizer and packed rows go in the workdir."""
  cells = plan(c)
  task = get_task(c, workdir, list(c.conditions))
  cfg = model_config(c, task)
  logging.info("text: vocab %d; train rows %s; test docs %s", cfg.vocab_size,
               {f"{r}/{s}": len(a) for (r, s), a in task.packed.items()},
               {r: s.documents for r, s in task.test_stats.items()})
  return Prep(cells, task, cfg)


def stages(c, prep: Prep, trained: dict):
  """One ensemble of every condition x seed, trained in the workdir itself; each member stops
  on -(validation NLL per token) of its target language."""
  del trained
  task, cfg = prep.task, prep.cfg
  members = []
  for cond, seed in prep.cells:
    arrays = [task.packed[p] for p in condition_parts(cond, c)]
    rows = arrays[0] if len(arrays) == 1 else packing.RowConcat(arrays)
    members.append(loop_lib.Member(f"{cond}/seed_{seed}", seed,
                                   {"tokens": rows, "loss_mask": packing.LossMaskView(rows)}))
  targets = ["high" if cond == "high_only" else "low" for cond, _ in prep.cells]
  eval_batch = int(c.eval.batch_size)

  def val_score(params, ids):
    scores = np.zeros(len(ids))
    for role in ROLES:
      idx = np.asarray([j for j, i in enumerate(ids) if targets[i] == role])
      if idx.size:
        r = perplexity_lib.perplexity(cfg, params, task.val[role]["tokens"], task.val[role]["loss_mask"],
                                      eval_batch, ensemble=True,
                                      members=None if idx.size == len(ids) else idx)
        scores[idx] = -r["nll_sum"] / r["tokens"]
    return scores

  yield kind_lib.Stage("ensemble", cfg, members, val_score, subdir="")


def outputs(c, prep: Prep, trained: dict, workdir: str):
  """Test perplexities as results rows, Table 4, the curves, sampled continuations and the
  summary."""
  done = trained["ensemble"]
  params, out, members = done.params, done.out, done.stage.members
  task, specs = prep.task, prep.task.specs
  rows = _test_rows(c, prep, params, out)
  seeds = sorted({len(kind_lib.condition_seeds(c, cond)) for cond in c.conditions})
  title = (f"{c.name}: {language(specs, 'high')} (high) + {language(specs, 'low')} (low), "
           f"test perplexity (mean ± std over {'/'.join(map(str, seeds))} seed(s))")
  table = table_markdown(rows, specs, task.composition, title)
  if c.get("reference"):
    table += f"\nReference: {c.reference}\n"
  results_lib.plot_curves(
      os.path.join(workdir, "curves.png"),
      {m.name: [(s, float(np.exp(-v))) for s, v in h] for m, h in zip(members, out["history"])},
      "validation perplexity per token (target language)")
  results_lib.plot_curves(os.path.join(workdir, "train_loss.png"), _train_loss_curves(workdir),
                          "training loss (nats per token)")
  first = [[cd for cd, _ in prep.cells].index(cond) for cond in c.conditions]
  write_samples(os.path.join(workdir, "samples.txt"), c, prep.cfg, params, task.sp,
                [members[i].name for i in first], first, _prompts(c, task.sp, task.test_docs), specs)
  return rows, table, _summary(c, prep, done, workdir)


def _test_rows(c, prep: Prep, params, out) -> list[dict]:
  """Every member's test perplexities on both languages, one row per condition, language and
  metric."""
  task, specs = prep.task, prep.task.specs
  scored = {}
  for role in ROLES:
    r = perplexity_lib.perplexity(prep.cfg, params, task.test[role]["tokens"], task.test[role]["loss_mask"],
                                  int(c.eval.batch_size), ensemble=True)
    st = task.test_stats[role]
    scored[role] = {"ppl_token": r["ppl_token"], "ppl_char": np.exp(r["nll_sum"] / st.chars),
                    "ppl_byte": np.exp(r["nll_sum"] / st.bytes)}
  rows = []
  for cond in c.conditions:
    idx = [i for i, (cd, _) in enumerate(prep.cells) if cd == cond]
    for role in ("low", "high"):
      for metric in METRICS:
        rows.append(results_lib.make_row(
            experiment=c.name, task="text", language=language(specs, role),
            role="target" if role == "low" else "source", condition=cond, metric=metric,
            values=[scored[role][metric][i] for i in idx],
            samples=task.composition[cond][f"{role}_documents"],
            train_tokens=task.composition[cond][f"{role}_tokens"],
            test_documents=task.test_stats[role].documents,
            test_tokens=task.test_stats[role].tokens + task.test_stats[role].documents,
            best_steps=[out["best_steps"][i] for i in idx],
            steps=[out["stopped_at"][i] for i in idx]))
  return rows


def _summary(c, prep: Prep, done, workdir: str) -> dict:
  task, specs, out, members = prep.task, prep.task.specs, done.out, done.stage.members
  summary = {
      "languages": {role: language(specs, role) for role in ROLES},
      "corpora": {role: specs[role].path for role in ROLES},
      "vocab_size": prep.cfg.vocab_size, "block_size": int(c.model.block_size),
      "params_per_model": model_lib.count_params(done.params, stacked=True),
      "members": len(members), "steps": out["step"],
      "stopped_at": {m.name: s for m, s in zip(members, out["stopped_at"])},
      "best_step": {m.name: s for m, s in zip(members, out["best_steps"])},
      "train_rows": {f"{r}/{s}": len(a) for (r, s), a in task.packed.items()},
      "train_counts": {f"{r}/{s}": v for (r, s), v in task.counts.items()},
      "composition": task.composition,
      "val_rows": {role: len(task.val[role]["tokens"]) for role in ROLES},
      "test": {role: vars(task.test_stats[role]) for role in ROLES},
      "train_tokens_per_s": out["tokens_per_s"], "train_wall_s": done.done_s}
  path = os.path.join(workdir, "summary.json")
  if os.path.isfile(path) and not np.isfinite(out["tokens_per_s"]):
    # training had finished before this call (which then only tested): keep its speed and time
    with open(path) as f:
      previous = json.load(f)
    summary["train_tokens_per_s"] = previous.get("train_tokens_per_s")
    summary["train_wall_s"] = previous.get("train_wall_s", previous.get("wall_s"))
  return summary
