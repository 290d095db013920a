"""docs/evaluate.md's commands and `xlt.merge --help`'s work as written (issue 69): read the way
bash reads them, the merge-then-score example hands xlt.eval one --metadata JSON, and no
command is cut short by an unquoted `;`."""

import json
import os
import re
import shlex
import subprocess

import pytest

from xlt.eval import __main__ as eval_main
from xlt.merge import __main__ as merge_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "evaluate.md")


def bash_commands(path: str) -> list[str]:
  """Every command of the doc's ```bash blocks, continuation lines joined, comments dropped."""
  text = open(path, encoding="utf-8").read()
  out = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    for command in block.replace("\\\n", " ").splitlines():
      if command.strip() and not command.lstrip().startswith("#"):
        out.append(command)
  return out


def child_args(monkeypatch, extra: str) -> list[str]:
  """The flags the merge's --evaluate hands `python -m xlt.eval`, for --evaluate_args=`extra`."""
  seen = []

  def run(cmd, **kwargs):
    seen.append(cmd)
    return subprocess.CompletedProcess(cmd, 0, "", "")

  monkeypatch.setattr(merge_main.subprocess, "run", run)
  assert merge_main.evaluate("out", "xlt_mgsm_direct_de", extra) == 0
  return seen[0][6:]  # after python -m xlt.eval --model --tasks --output


def evaluate_args(command: str) -> str:
  return next(w.split("=", 1)[1] for w in shlex.split(command) if w.startswith("--evaluate_args="))


def test_the_merge_then_score_example_passes_its_metadata_whole(monkeypatch):
  command = next(c for c in bash_commands(DOC) if "--evaluate_args" in c)
  args = child_args(monkeypatch, evaluate_args(command))
  assert args == ['--metadata={"mgsm_dir": "data/mgsm"}']
  parsed = eval_main._parser().parse_args(["--model=out", "--tasks=t", *args])
  assert json.loads(parsed.metadata) == {"mgsm_dir": "data/mgsm"}


def test_the_help_example_passes_limit_and_metadata(monkeypatch):
  line = next(x for x in merge_main.__doc__.splitlines() if "--evaluate_args=" in x)
  # the docstring's bracketed (optional) flag, as a user types it without the brackets
  typed = line.split("[", 1)[1].rsplit("]", 1)[0]
  args = child_args(monkeypatch, evaluate_args(typed))
  assert args == ["--limit=50", '--metadata={"mgsm_dir": "data/mgsm"}']
  assert child_args(monkeypatch, "--limit 50 --metadata='{\"a\": 1}'") == ["--limit", "50", '--metadata={"a": 1}']


@pytest.mark.parametrize("doc", ["evaluate.md", "merge.md", "pretrained.md"])
def test_no_documented_command_is_cut_at_an_unquoted_semicolon(doc):
  for command in bash_commands(os.path.join(REPO, "docs", doc)):
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    assert ";" not in list(lexer), command


def test_the_docs_say_what_needs_the_internet_and_optuna():
  text = open(DOC, encoding="utf-8").read()
  assert "need the internet" in text and "arc_easy" in text
  assert "without it, add --sampler=random" in text
