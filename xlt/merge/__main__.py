r"""Merges checkpoint files with any method of the registry (xlt/merge/registry.py):

  python -m xlt.merge --config=configs/merge_files.py --config.method=ties \
    --config.inputs.base=B --config.inputs.experts=a,b --config.options.density=0.3 \
    --config.output=out
  python -m xlt.merge --list_methods     # every method: its inputs, options and paper
  python -m xlt.merge --mergekit_yaml=merge.yml --config.output=out   # a mergekit config
  python -m xlt.merge --config=merge.yml --config.output=out          # the same
  python -m xlt.merge ... --evaluate=xlt_mgsm_direct_de,xlt_mgsm_direct_sw \
    [--evaluate_args="--limit=50 --metadata={\"mgsm_dir\": \"data/mgsm\"}"]   # then score it

`inputs` and `options` take any name on the command line; the registry checks them
against the method. A list input is comma-separated (or a Python list); option values
are Python literals (0.3, true, "(0.5, 0.5)") or strings. The output directory is a Hugging
Face model directory (xlt.merge.tool: config and tokenizer from an input that has them,
safetensors shards above `max_shard_size`, a model card), with the delta heatmaps (with a
base among the inputs) and summary.json.
A mergekit YAML maps onto the same config (xlt.merge.from_mergekit: its methods, models,
parameters, dtype, tokenizer_source / tokenizer, chat_template, slices (layer swaps, layer stacks,
merges over slices); any other key is refused by name);
--config.<field> flags given beside it override what it sets.
A user error (method, inputs, options, files: a truncated file, a tensor missing from one
input, shapes or dtypes that differ, an architecture a layer-aware method does not know) is one
line `xlt.merge: error: ...` on stderr and exit status 2, the output directory untouched;
--traceback shows the full trace instead. An existing non-empty output (an earlier merge's
included) is replaced only with --overwrite, and never when it is an input, lies inside one or
holds one; the new directory is built beside it and renamed into place once complete.
--evaluate scores the merged directory on lm-eval tasks with `python -m xlt.eval` (xlt's backend,
docs/evaluate.md; lm-eval must be installed) in a child process, so the merge library loads no
model code, and writes the scores beside the model (out/eval.json); --evaluate_args are more
flags of that command. A failed evaluation leaves the merged model and exits with status 2.
"""

import json
import os
import re
import shlex
import subprocess
import sys

from absl import app, flags
from ml_collections import config_flags

from xlt.io import config_files, fileio
from xlt.io import hf_dir as hf
from xlt.merge import chat, from_mergekit, registry, sliced, stack, tool

# the config a mergekit YAML is laid over (so --config.output=... works beside it), found in a
# checkout or in the installed package alike (xlt.io.config_files)
_DEFAULT_CONFIG = "merge_files.py"

# mergekit's `lambda` (a Python keyword) as a flag name ml_collections parses: it reads the
# --config.<path> flags of sys.argv as the config flag is defined, so before that
sys.argv[1:] = [from_mergekit.keyword_flag(a) for a in sys.argv[1:]]
# unlocked, accepting new fields: inputs.<role> and options.<name> are whatever the method
# takes, checked by the registry; the top-level fields are checked in `merge_config`
_CONFIG = config_flags.DEFINE_config_file("config", None, "merge config file (configs/merge_files.py)",
                                          lock_config=False, accept_new_attributes=True)
_LIST = flags.DEFINE_bool("list_methods", False, "print every merge method (inputs, options, paper) and exit")
_YAML = flags.DEFINE_string("mergekit_yaml", None, "a mergekit config (merge.yml) to run; --config.<field> "
                            "flags beside it override what it sets")
_TRACEBACK = flags.DEFINE_bool("traceback", False, "on an error, show the full trace instead of one line")
_EVALUATE = flags.DEFINE_string("evaluate", None, "lm-eval tasks (comma-separated) to score the merged model on, "
                                "written to <output>/eval.json")
_EVALUATE_ARGS = flags.DEFINE_string("evaluate_args", "", "more flags of python -m xlt.eval (e.g. --limit=50)")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace a non-empty output directory (the old one is deleted "
                               "once the new one is in place; never an input or a directory holding one)")
FIELDS = ("method", "inputs", "options", "naming", "heatmaps", "output", "config_from", "max_shard_size", "dtype",
          "vocab", "tokenizer", "chat_template")


def inputs_of(method: str, inputs: dict) -> dict:
  """{role: path or list of paths} of a config's inputs: a list role's "a,b" is split on
  commas; other values are paths as given (a list for a single role is kept: layer_swap
  soups it)."""
  many = {r.name for r in registry.get(method).roles if r.many}
  out = {}
  for role, v in inputs.items():
    if isinstance(v, (list, tuple)):
      out[role] = [str(p) for p in v]
    elif role in many:
      out[role] = [p for p in str(v).split(",") if p]
    else:
      out[role] = str(v)
  return out


def merge_config(c, *, overwrite: bool = False) -> dict:
  """Runs the merge a config describes (mergekit's names accepted: from_mergekit.flags_aliases)
  and writes `c.output` with summary.json and merge_config.json (the config as run); returns
  the summary. overwrite: replace a non-empty output directory (never an input)."""
  if unknown := sorted(set(c.keys()) - set(FIELDS)):
    raise ValueError(f"unknown config field {', '.join(unknown)}; the fields: {', '.join(FIELDS)}")
  c = c.to_dict() if hasattr(c, "to_dict") else dict(c)
  options = {k: list(v) if isinstance(v, tuple) else v for k, v in (c.get("options") or {}).items()}
  raw_inputs = c.get("inputs") or {}
  template = _chat_template(c, raw_inputs, options)
  if c["method"] in ("layer_stack", "layer_slices"):  # mergekit's passthrough stacks, merges over slices
    summary = _stack(c, options, overwrite) if c["method"] == "layer_stack" else _sliced(c, options, overwrite)
    if template:
      chat.write(summary["output"], template)
    fileio.write_text(os.path.join(c["output"], "summary.json"), json.dumps(summary, indent=1) + "\n")
    fileio.write_text(os.path.join(c["output"], "merge_config.json"), json.dumps(c, indent=1, default=str) + "\n")
    return summary
  c["method"], options = from_mergekit.flags_aliases(c["method"], raw_inputs, options)
  if any(o.tree and o.required for o in registry.get(c["method"]).options):  # RegMean, Fisher: statistics
    raise ValueError(f"{c['method']} weighs the experts by statistics of their data: run python -m xlt.merge_data "
                     "--config=configs/merge_data.py (docs/merge.md)")
  summary = tool.merge_files(inputs_of(c["method"], raw_inputs), c["method"], c["output"], options,
                             naming=c.get("naming", "auto"), heatmaps=c.get("heatmaps", True),
                             config_from=c.get("config_from") or None,
                             max_shard_bytes=c.get("max_shard_size") or hf.DEFAULT_MAX_SHARD_BYTES,
                             dtype=c.get("dtype") or None, vocab=c.get("vocab") or None,
                             tokenizer=c.get("tokenizer") or None, overwrite=overwrite)
  if template:
    chat.write(summary["output"], template)
  fileio.write_text(os.path.join(c["output"], "summary.json"), json.dumps(summary, indent=1) + "\n")
  ran = {**c, "options": options}
  fileio.write_text(os.path.join(c["output"], "merge_config.json"), json.dumps(ran, indent=1, default=str) + "\n")
  return summary


def _chat_template(c: dict, inputs: dict, options: dict) -> str | None:
  """The chat template the output gets (mergekit's chat_template: Jinja text or "auto"), checked
  before the merge; None to keep the copied tokenizer's."""
  if not c.get("chat_template"):
    return None
  paths = [p for v in inputs.values() for p in (v.split(",") if isinstance(v, str) else v)]
  paths += [s[0] for s in options.get("slices") or []] + list(options.get("models") or [])
  models = list(dict.fromkeys(str(p).partition("+")[0] for p in paths if p))
  return chat.resolve(str(c["chat_template"]), models)


def _stack(c: dict, options: dict, overwrite: bool) -> dict:
  """The layer stack (xlt.merge.stack) of options["slices"], written to c["output"]."""
  if unknown := sorted(set(options) - {"slices", "scale"}):
    raise ValueError(f"layer_stack takes the options slices and scale only, got {', '.join(unknown)}")
  if c.get("vocab") or c.get("tokenizer"):
    raise ValueError("vocab: a layer stack takes its embedding and head as they are (no vocab or tokenizer option)")
  return stack.stack_files(options.get("slices") or [], c["output"], scale=options.get("scale"),
                           naming=c.get("naming", "auto"),
                           dtype=c.get("dtype") or None, overwrite=overwrite,
                           max_shard_bytes=c.get("max_shard_size") or hf.DEFAULT_MAX_SHARD_BYTES)


def _sliced(c: dict, options: dict, overwrite: bool) -> dict:
  """The merge over slices (xlt.merge.sliced) a mergekit YAML's slices map to."""
  if c.get("vocab") or c.get("tokenizer"):
    raise ValueError("vocab: a merge over slices takes the inputs' vocabularies as they are (no vocab or tokenizer "
                     "option)")
  return sliced.merge_sliced(options["merge_method"], c.get("inputs") or {}, options["ranges"], options["models"],
                             options["per_slice"], c["output"], naming=c.get("naming", "auto"),
                             dtype=c.get("dtype") or None, overwrite=overwrite,
                             max_shard_bytes=c.get("max_shard_size") or hf.DEFAULT_MAX_SHARD_BYTES)


def with_yaml(c, path: str) -> dict:
  """The config of mergekit YAML `path` (from_mergekit.load_yaml) laid over the default config,
  with every field of `c` that differs from the default (the command line's) on top: inputs
  and options key by key."""
  default = config_files.get_config(_DEFAULT_CONFIG).to_dict()
  c = c.to_dict() if hasattr(c, "to_dict") else dict(c)
  out = default | {k: v for k, v in from_mergekit.load_yaml(path).items() if v is not None}
  for k, v in c.items():
    if k in ("inputs", "options"):
      out[k] = dict(out.get(k) or {}) | dict(v or {})
    elif k not in default or v != default[k]:
      out[k] = v
  return out


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, after turning --config=<file>.yml into --mergekit_yaml=<file>.yml beside
  the default config, so that --config.output=... applies to a YAML too."""
  out = []
  for a in map(from_mergekit.keyword_flag, argv):  # (what sys.argv was given, renamed alike)
    if a.startswith("--config=") and a.endswith((".yml", ".yaml")):
      out += ["--config=" + config_files.path(_DEFAULT_CONFIG), "--mergekit_yaml=" + a.split("=", 1)[1]]
    else:
      out.append(a)
  if any(a.startswith("--mergekit_yaml") for a in out) and not any(a.startswith("--config=") for a in out):
    out.insert(1, "--config=" + config_files.path(_DEFAULT_CONFIG))
  out = config_files.config_argv(out)  # --config=configs/merge_files.py from any directory
  if any(a in ("--help", "-h", "--helpshort", "-?") for a in out[1:]):
    # once, exit 0: the methods first (what a user looks for), then this module's flags
    print(__doc__ + "\nMethods (--list_methods prints only these):\n\n" + registry.describe() + "\n\nFlags:\n"
          + flags.FLAGS.module_help(sys.modules[__name__]))
    sys.exit(0)
  return flags.FLAGS(out)


def _fail(error) -> int:
  print("xlt.merge: error: " + " ".join(str(error).split()), file=sys.stderr)
  return 2


def main(argv):
  if len(argv) > 1:
    return _fail(f"unexpected arguments {argv[1:]}")
  if _LIST.value:
    print(registry.describe())
    return 0
  if _CONFIG.value is None:
    return _fail("--config=configs/merge_files.py is required (or --mergekit_yaml=merge.yml, or --list_methods)")
  try:
    c = with_yaml(_CONFIG.value, _YAML.value) if _YAML.value else _CONFIG.value
    summary = merge_config(c, overwrite=_OVERWRITE.value)
    if _YAML.value:  # the YAML as given, beside the config it mapped to (as mergekit writes its own)
      fileio.check_size(_YAML.value, 1 << 20)
      with open(_YAML.value) as f:
        fileio.write_text(os.path.join(summary["output"], "mergekit_config.yml"), f.read())
  except (ValueError, TypeError, OSError) as e:  # the user's: a config, a file
    if _TRACEBACK.value:
      raise
    return _fail(e)
  print(json.dumps(summary, indent=1))
  if _EVALUATE.value:
    return evaluate(summary["output"], _EVALUATE.value, _EVALUATE_ARGS.value)
  return 0


def evaluate_argv(extra: str) -> list[str]:
  """The flags of --evaluate_args: split where a flag starts (whitespace before "--"), each piece
  shell-unquoted when that leaves one word; a --flag=value whose value holds spaces (a --metadata
  JSON, as the docs write it) is kept whole rather than split at them."""
  out = []
  for piece in re.split(r"\s+(?=--)", extra.strip()) if extra.strip() else []:
    words = shlex.split(piece)
    out += [piece] if len(words) > 1 and "=" in words[0] and piece.startswith("--") else words
  return out


def evaluate(model_dir: str, tasks: str, extra: str = "") -> int:
  """`python -m xlt.eval` on the merged directory in a child process (its error line passed on)."""
  out = os.path.join(model_dir, "eval.json")
  try:
    args = evaluate_argv(extra)
  except ValueError as e:
    return _fail(f"--evaluate_args: {e}")
  child = subprocess.run([sys.executable, "-m", "xlt.eval", f"--model={model_dir}", f"--tasks={tasks}",
                          f"--output={out}", *args], stderr=subprocess.PIPE, text=True)
  if child.returncode:
    lines = [x for x in child.stderr.splitlines() if x.strip()]
    return _fail(f"the merged model is in {model_dir}; evaluating it failed: {lines[-1] if lines else child.returncode}")
  print(f"scores in {out}")
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
