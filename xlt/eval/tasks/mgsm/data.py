"""MGSM's files, which the user supplies, as lm-eval's `custom_dataset` for the configs beside
this file (no download). The folder is the task metadata's `mgsm_dir`
(`python -m xlt.eval --metadata='{"mgsm_dir": "data/mgsm"}'`) or $XLT_MGSM_DIR, and holds:

  mgsm_<lang>.tsv          the 250 test problems: question <TAB> answer number (MGSM's release,
                           github.com/google-research/url-nlp/tree/main/mgsm)
  exemplars_<lang>.tsv     the few-shot exemplars in their order: question <TAB> step-by-step
                           answer <TAB> answer number, as the juletxara/mgsm train split that
                           lm-eval's own MGSM tasks read (question and answer with their prefixes,
                           e.g. "Frage: ..." and "Schritt-für-Schritt-Antwort: ...")

Rows are read as tab-separated text (no quoting); a file over MAX_BYTES is refused."""

import csv
import os

import datasets

MAX_BYTES = 16 << 20


def _rows(path: str) -> list[list[str]]:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"MGSM file {path} is missing (see xlt/eval/tasks/mgsm/data.py)")
  if os.path.getsize(path) > MAX_BYTES:
    raise ValueError(f"{path} is over {MAX_BYTES} bytes; MGSM's files are far smaller")
  with open(path, encoding="utf-8", newline="") as f:
    return [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r]


def _number(text: str, path: str):
  try:
    value = float(text.replace(",", ""))
  except ValueError:
    raise ValueError(f"{path}: answer {text!r} is not a number") from None
  return int(value) if value.is_integer() else value


def load(lang: str, mgsm_dir: str | None = None, **_) -> datasets.DatasetDict:
  folder = mgsm_dir or os.environ.get("XLT_MGSM_DIR")
  if not folder:
    raise ValueError("MGSM needs its files: --metadata='{\"mgsm_dir\": DIR}' or XLT_MGSM_DIR=DIR")
  test_path, train_path = os.path.join(folder, f"mgsm_{lang}.tsv"), os.path.join(folder, f"exemplars_{lang}.tsv")
  test = [{"question": r[0], "answer": None, "answer_number": _number(r[-1], test_path), "equation_solution": None}
          for r in _rows(test_path)]
  train = [{"question": r[0], "answer": r[1], "answer_number": _number(r[2], train_path),
            "equation_solution": r[3] if len(r) > 3 else None} for r in _rows(train_path)]
  return datasets.DatasetDict({"train": datasets.Dataset.from_list(train),
                               "test": datasets.Dataset.from_list(test)})
