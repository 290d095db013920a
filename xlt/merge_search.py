r"""A search over a merge method's options, as mergekit-evolve does: each trial merges the input
models in memory with options a sampler picks, scores the merge on a validation split, and the
best trial and each input model are scored once on the held-out split, with bootstrap
intervals over its items:

  python -m xlt.merge_search --method=ties --input=base=B --input=experts=A,C \
      --space=density=float:0.1:0.9 --space=lambda_=float:0.5:1.5 [--option=k=v ...] \
      --prompts=prompts.jsonl [--answers=answers.jsonl] [--match=exact|number|task] \
      --trials=20 [--sampler=tpe|random] [--seed=0] [--val_fraction=0.5] --output=DIR
  python -m xlt.merge_search ... --tasks=xlt_mgsm_direct_de [--include_path=DIR] [--metadata=JSON]
      [--metric=exact_match/flexible-extract]          # the objective: lm-eval tasks instead

The objective is any scorer of items: xlt.generate's greedy answers matched as
`python -m xlt.generate --match` does (a prompts JSONL with "answer", or --answers), or
lm-eval's tasks run in-process (xlt.eval.scores; an item is a task's document). The items are
split once (`--val_fraction`, `--split_seed`): the sampler sees the validation items' mean
only; the held-out items reach nothing but the final report. A space dimension is
`name=float:LOW:HIGH`, `name=int:LOW:HIGH` or `name=choice:A,B,...` over an option of the
method (python -m xlt.merge --list_methods); --option fixes one.

Written to --output: search.json (the search's arguments and split), trials.jsonl (one line
per finished trial, the whole file replaced atomically after each), report.json (the best
trial, its validation score, its and each input's held-out score with the interval) and best/ (the best
merge as a Hugging Face model directory). Killed and started again with the same command,
the search resumes after its last finished trial and ends with the same trials: each trial's
options depend only on the seed, its number and the trials before it (the random sampler
draws from (seed, number); TPE, optuna's, is rebuilt from the journal each trial with seed +
number; optuna must be installed: pip install -e '.[search]', or --sampler=random). Another
command on the same --output is refused. A user error is one line and
exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys

import jax
import numpy as np

from xlt import cli
from xlt.cli import UserError
from xlt import generate as generate_lib
from xlt import hf_tokenizer, merge, pretrained
from xlt import results as results_lib

SAMPLERS = ("tpe", "random")
KINDS = ("float", "int", "choice")


# --------------------------------------------------------------------------- the space


@dataclasses.dataclass(frozen=True)
class Dim:
  """One option searched: float / int in [low, high], or one of `choices`."""

  name: str
  kind: str
  low: float = 0.0
  high: float = 0.0
  choices: tuple = ()


def _literal(text: str):
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return text


def parse_dim(spec: str) -> Dim:
  """"density=float:0.1:0.9", "k=int:1:4", "sign=choice:sum,count" -> Dim."""
  name, eq, rest = spec.partition("=")
  kind, _, bounds = rest.partition(":")
  if not eq or not name or kind not in KINDS or not bounds:
    raise UserError(f"--space {spec!r}: expected name=float:LOW:HIGH, name=int:LOW:HIGH or name=choice:A,B")
  if kind == "choice":
    choices = tuple(_literal(v) for v in bounds.split(","))
    if len(choices) < 2:
      raise UserError(f"--space {spec!r}: a choice needs at least two values")
    return Dim(name, kind, choices=choices)
  try:
    low, high = (float(v) if kind == "float" else int(v) for v in bounds.split(":"))
  except ValueError:
    raise UserError(f"--space {spec!r}: LOW:HIGH must be two {kind} numbers") from None
  if not low < high:
    raise UserError(f"--space {spec!r}: LOW must be below HIGH")
  return Dim(name, kind, low, high)


def sample_random(space: list[Dim], seed: int, number: int) -> dict:
  """Trial `number`'s options, drawn from (seed, number) alone."""
  rng = np.random.default_rng([seed, number])
  out = {}
  for d in space:
    if d.kind == "float":
      out[d.name] = float(rng.uniform(d.low, d.high))
    elif d.kind == "int":
      out[d.name] = int(rng.integers(d.low, d.high + 1))
    else:
      out[d.name] = d.choices[int(rng.integers(len(d.choices)))]
  return out


def sample_tpe(space: list[Dim], seed: int, number: int, done: list[dict]) -> dict:
  """Trial `number`'s options from optuna's TPE sampler over the finished trials `done`
  (rebuilt from them, so a resumed search asks what the uninterrupted one asked)."""
  import optuna

  optuna.logging.set_verbosity(optuna.logging.WARNING)
  dist = {}
  for d in space:
    if d.kind == "float":
      dist[d.name] = optuna.distributions.FloatDistribution(d.low, d.high)
    elif d.kind == "int":
      dist[d.name] = optuna.distributions.IntDistribution(int(d.low), int(d.high))
    else:
      dist[d.name] = optuna.distributions.CategoricalDistribution(list(d.choices))
  study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed + number))
  for t in done:
    study.add_trial(optuna.trial.create_trial(params=t["params"], distributions=dist, value=t["value"]))
  return dict(study.ask(dist).params)


# --------------------------------------------------------------------------- objectives


class PromptObjective:
  """Items: the prompts of a JSONL file; an item scores 1 when the model's greedy answer
  matches its answer (xlt.generate.match under `match`), else 0."""

  def __init__(self, args, tok):
    records, self.prompts = generate_lib.read_prompts(args.prompts)
    self.answers = (generate_lib.read_answers(args.answers, len(records)) if args.answers else
                    [r.get("answer") for r in records])
    if missing := [i for i, a in enumerate(self.answers) if a is None]:
      raise UserError(f"{args.prompts}: prompt {missing[0]} has no \"answer\" (or give --answers)")
    self.records, self.tok, self.args = records, tok, args
    self.items = [str(i) for i in range(len(records))]

  def __call__(self, cfg, params, items: list[str]) -> np.ndarray:
    idx = [int(i) for i in items]
    got = generate_lib.decode(cfg, params, self.tok, [self.prompts[i] for i in idx], chat=self.args.chat,
                              max_new=self.args.max_new, batch=self.args.batch)
    return np.asarray([float(generate_lib.match(g["continuation"], self.answers[i], self.args.match,
                                                self.records[i])["correct"]) for g, i in zip(got, idx)])


class TaskObjective:
  """Items: "task/doc" of lm-eval tasks (xlt.eval.scores, in-process); an item's score is
  its document's `metric` (e.g. acc, exact_match/flexible-extract: metric/filter)."""

  def __init__(self, args, tok):
    from xlt.eval import scores

    self.scores, self.tok, self.args = scores, tok, args
    metadata = json.loads(args.metadata) if args.metadata else None
    self.options = scores.Options(batch=args.batch, include_path=args.include_path, metadata=metadata,
                                  max_gen_toks=args.max_new)
    try:
      self.manager = scores.check(self.tasks, self.options, where="--tasks")
    except ValueError as e:
      raise UserError(str(e)) from None
    from lm_eval.tasks import get_task_dict

    docs = {name: len(list(task.eval_docs)) for name, task in get_task_dict(self.tasks, self.manager).items()}
    self.items = [f"{name}/{k}" for name in self.tasks for k in range(docs[name])]

  @property
  def tasks(self) -> list[str]:
    return [t for t in self.args.tasks.split(",") if t]

  def __call__(self, cfg, params, items: list[str]) -> np.ndarray:
    samples = {}
    for item in items:
      task, _, k = item.rpartition("/")
      samples.setdefault(task, []).append(int(k))
    lm = self.scores.model(cfg, params, self.tok, self.options)
    out = self.scores.evaluate(lm, list(samples), self.options, self.manager, log_samples=True, samples=samples)
    metric, _, filt = self.args.metric.partition("/")
    value = {}
    for task, logged in out["samples"].items():
      for s in logged:
        if s.get("filter", "none") == (filt or "none"):
          value[f"{task}/{s['doc_id']}"] = float(s[metric])
    if missing := [i for i in items if i not in value]:
      raise UserError(f"--metric={self.args.metric}: no such score for {missing[0]}")
    return np.asarray([value[i] for i in items])


# --------------------------------------------------------------------------- the search


def split(items: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
  """(validation items, held-out items): a seeded permutation cut at `val_fraction`."""
  order = np.random.default_rng(seed).permutation(len(items))
  n_val = int(round(len(items) * val_fraction))
  if n_val < 1 or n_val >= len(items):
    raise UserError(f"--val_fraction={val_fraction} of {len(items)} items leaves an empty split")
  return [items[i] for i in sorted(order[:n_val])], [items[i] for i in sorted(order[n_val:])]


def bootstrap(values: np.ndarray, resamples: int, seed: int, level: float = 0.95) -> dict:
  """The mean of per-item `values` and its percentile bootstrap interval over items."""
  values = np.asarray(values, np.float64)
  rng = np.random.default_rng(seed)
  means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
  low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
  return {"mean": float(values.mean()), "low": float(low), "high": float(high), "level": level, "n": len(values),
          "resamples": resamples}


def _journal(output: str) -> list[dict]:
  path = os.path.join(output, "trials.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _write_trials(output: str, trials: list[dict]):
  results_lib.atomic_write(os.path.join(output, "trials.jsonl"), "".join(json.dumps(t) + "\n" for t in trials))


def _claim(output: str, record: dict):
  """Records the search's arguments and split in output/search.json, or checks them against
  the ones recorded there (a resumed search must be the same search)."""
  path = os.path.join(output, "search.json")
  if os.path.exists(path):
    with open(path) as f:
      recorded = json.load(f)
    if recorded != record:
      differ = sorted(k for k in record.keys() | recorded.keys() if record.get(k) != recorded.get(k))
      raise UserError(f"{output} holds another search ({', '.join(differ)} differ): use a fresh --output")
    return
  os.makedirs(output, exist_ok=True)
  results_lib.atomic_write(path, json.dumps(record, indent=1))


def search(args, objective_cls=None) -> dict:
  """Runs (or resumes) the search of `args` (the command line's namespace); returns the report."""
  space = [parse_dim(s) for s in args.space]
  fixed = dict(kv.split("=", 1) for kv in args.option)
  fixed = {k: _literal(v) for k, v in fixed.items()}
  paths = _check_method(args.method, _inputs(args.input), fixed, space)
  source = next(iter(paths.values()))
  source = source[0] if isinstance(source, list) else source
  tok = hf_tokenizer.load(source)
  objective = (objective_cls or (TaskObjective if args.tasks else PromptObjective))(args, tok)
  val, held_out = split(objective.items, args.val_fraction, args.split_seed)
  record = {k: v for k, v in vars(args).items() if k not in ("trials", "traceback")}
  cfg, trees = _load(paths)  # (before the claim: inputs that fail to load leave no search behind)
  _claim(args.output, {**record, "val_items": val, "held_out_items": held_out})
  trials = _journal(args.output)
  for number in range(len(trials), args.trials):
    params = (sample_random(space, args.seed, number) if args.sampler == "random" else
              sample_tpe(space, args.seed, number, trials))
    merged = _merge(args.method, trees, {**fixed, **params})
    value = float(np.mean(objective(cfg, merged, val)))
    trials.append({"number": number, "params": params, "value": value, "val_items": len(val)})
    _write_trials(args.output, trials)
    print(f"xlt.merge_search: trial {number}: {params} -> validation {value:.4f}", flush=True)
  return _report(args, cfg, trees, paths, fixed, trials, objective, held_out, source)


def _report(args, cfg, trees, paths, fixed, trials, objective, held_out, source) -> dict:
  """The best trial (the highest validation mean, the earliest on a tie) and every input
  model scored on the held-out items, each with its bootstrap interval; best/ written."""
  best = max(trials[:args.trials], key=lambda t: (t["value"], -t["number"]))
  merged = _merge(args.method, trees, {**fixed, **best["params"]})
  scored = bootstrap(objective(cfg, merged, held_out), args.bootstrap, args.split_seed)
  inputs = {}  # what the merge is for: does it beat the models it merges?
  for role, tree in trees.items():
    for path, params in zip(paths[role] if isinstance(tree, list) else [paths[role]],
                            tree if isinstance(tree, list) else [tree]):
      inputs[path] = {"role": role, **bootstrap(objective(cfg, params, held_out), args.bootstrap, args.split_seed)}
  report = {"method": args.method, "fixed_options": fixed, "trials": len(trials[:args.trials]),
            "best": {"number": best["number"], "params": best["params"], "validation": best["value"]},
            "held_out": scored, "inputs_held_out": inputs, "model": "best"}
  pretrained.save(cfg, merged, os.path.join(args.output, "best"), source_dir=source,
                  card={"title": f"the best {args.method} merge of an xlt.merge_search", "method": args.method,
                        "options": {**fixed, **best["params"]}, "made by": "xlt.merge_search"})
  results_lib.atomic_write(os.path.join(args.output, "report.json"), json.dumps(report, indent=1))
  print(f"xlt.merge_search: best trial {best['number']} {best['params']}: validation {best['value']:.4f}, "
        f"held-out {scored['mean']:.4f} [{scored['low']:.4f}, {scored['high']:.4f}] ({scored['n']} items)",
        flush=True)
  return report


def _inputs(specs: list[str]) -> dict:
  """{role: [paths]} of --input role=path[,path...]; every path a directory."""
  out = {}
  for spec in specs:
    role, eq, value = spec.partition("=")
    if not eq or not role or not value:
      raise UserError(f"--input {spec!r}: expected role=path (a list role: role=a,b)")
    out[role] = [p for p in value.split(",") if p]
    for p in out[role]:
      if not os.path.isdir(p):
        raise UserError(f"--input {role}: no model directory {p}")
  return out


def _check_method(method: str, paths: dict, fixed: dict, space: list[Dim]) -> dict:
  """{role: path or [paths]} (a list for the method's list roles), after checking the method,
  its inputs and options (the searched ones at a sample of the space)."""
  try:
    m = merge.registry.get(method)
  except ValueError as e:
    raise UserError(str(e)) from None
  known = {o.name for o in m.options}
  if unknown := [d.name for d in space if d.name not in known] + [k for k in fixed if k not in known]:
    raise UserError(f"{method} has no option {unknown[0]!r} (it has {', '.join(sorted(known)) or 'none'})")
  if both := [d.name for d in space if d.name in fixed]:
    raise UserError(f"option {both[0]!r} is both searched (--space) and fixed (--option)")
  many = {r.name for r in m.roles if r.many}
  if bad := [r for r, v in paths.items() if r not in many and len(v) > 1]:
    raise UserError(f"--input {bad[0]}: {method} takes one model there")
  paths = {r: v if r in many else v[0] for r, v in paths.items()}
  try:
    merge.registry.check(method, paths, {**fixed, **sample_random(space, 0, 0)}, trees_allowed=False)
  except ValueError as e:
    raise UserError(str(e).splitlines()[0]) from None
  return paths


def _load(paths: dict):
  """(model config, {role: params or [params]}) of the input directories (host arrays)."""
  cfg, trees = None, {}
  for role, p in paths.items():
    loaded = [pretrained.load(q) for q in (p if isinstance(p, list) else [p])]
    for c, _ in loaded:
      if cfg is not None and c != cfg:
        raise UserError(f"--input {role}: a model of another architecture than the first input's")
      cfg = c
    host = [jax.tree.map(np.asarray, params) for _, params in loaded]
    trees[role] = host if isinstance(p, list) else host[0]
  return cfg, trees


def _merge(method: str, trees: dict, options: dict):
  try:
    return merge.registry.merge_among(method, trees, options)
  except ValueError as e:
    raise UserError(f"{method} {options}: {str(e).splitlines()[0]}") from None


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
  p = cli.Parser(prog="python -m xlt.merge_search", description=__doc__.split("\n\n")[0])
  p.add_argument("--method", required=True, help="a merge method (python -m xlt.merge --list_methods)")
  p.add_argument("--input", action="append", default=[], help="role=DIR (a list role: role=A,B); repeat per role")
  p.add_argument("--space", action="append", default=[], help="name=float:LOW:HIGH | int:LOW:HIGH | choice:A,B")
  p.add_argument("--option", action="append", default=[], help="name=value: an option fixed (a JSON literal)")
  p.add_argument("--output", required=True, help="the search's folder (resumed when it holds this search)")
  p.add_argument("--trials", type=int, default=20)
  p.add_argument("--sampler", default="tpe", choices=SAMPLERS, help="tpe: optuna's (the `search` extra); random")
  p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
  p.add_argument("--val_fraction", type=float, default=0.5, help="the items the search picks on; the rest held out")
  p.add_argument("--split_seed", type=int, default=0, help="the split's (and the bootstrap's) seed")
  p.add_argument("--bootstrap", type=int, default=1000, help="resamples of the held-out interval")
  p.add_argument("--prompts", help="JSONL of {\"prompt\" or \"messages\", \"answer\"}: the objective")
  p.add_argument("--answers", help="JSONL of {\"answer\"}, one per prompt (else the prompts' own)")
  p.add_argument("--match", default="exact", choices=generate_lib.MATCHES, help="as python -m xlt.generate's")
  p.add_argument("--chat", action="store_true", help="prompts through the model's chat template")
  p.add_argument("--tasks", help="lm-eval tasks (comma-separated): the objective instead of --prompts")
  p.add_argument("--metric", default="acc", help="the tasks' per-document score: metric or metric/filter")
  p.add_argument("--include_path", default=None, help="a folder of more lm-eval task configs")
  p.add_argument("--metadata", default=None, help="JSON passed to the task configs")
  p.add_argument("--max_new", type=int, default=64, help="new tokens at most per answer")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--traceback", action="store_true", help="on an error, the full trace instead of one line")
  return p


def parse(argv: list[str]):
  """The command line, checked: one UserError for what could not run."""
  args = _parser().parse_args(argv)
  if bool(args.prompts) == bool(args.tasks):
    raise UserError("give one objective: --prompts=FILE or --tasks=NAMES")
  if not args.input:
    raise UserError("no --input: give role=DIR for each input of the method")
  if not args.space:
    raise UserError("no --space: nothing to search")
  if args.trials < 1 or args.bootstrap < 1 or args.batch < 1 or args.max_new < 1:
    raise UserError("--trials, --bootstrap, --batch and --max_new must be positive")
  if not 0 < args.val_fraction < 1:
    raise UserError(f"--val_fraction must be in (0, 1), got {args.val_fraction}")
  if args.sampler == "tpe" and importlib.util.find_spec("optuna") is None:
    raise UserError("--sampler=tpe needs optuna, which is not installed (pip install 'xlt[search]'; or "
                    "--sampler=random)")
  if args.metadata:
    try:
      json.loads(args.metadata)
    except json.JSONDecodeError as e:
      raise UserError(f"--metadata is not JSON: {e.msg}") from None
  for kv in args.option:
    if "=" not in kv:
      raise UserError(f"--option {kv!r}: expected name=value")
  return args


def main(argv=None) -> int:
  return cli.run_command("xlt.merge_search", lambda a: search(parse(a)), argv)


if __name__ == "__main__":
  sys.exit(main())
