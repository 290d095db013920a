"""Table 4 (TinyStories language mixing) on a translated pair: English stories + their German
translations, scaled down for a 2-core CPU.

  python -m xlt.main --config=configs/tinystories_en_de.py --workdir=runs/tinystories_en_de

Reference (Table 4, Czech test perplexity): Czech-only limited (10%) 28.67 ± 1.3 -> mixed (10%
Czech + English) 8.72 ± 1.2: +69.6%; English-only 3.94 (English ppl), Czech-only full 5.65.

Both languages come from ONE story-aligned file, ../shared/data/parallel_en_de/
simple_stories_1000_en_de.jsonl (1,000 lines {"en_title", "en", "de_title", "de"}; licence:
non-commercial research only, see ../shared/data/PROVENANCE.md, so it is read in place and never
copied): high = "en", low = "de". The split is by story index, the same for both languages
(`corpus.check_parallel` refuses a file where a field is empty on one side only): 200 held out
(64 validation, 136 test), 800 train per language, limited = 78 German stories.
`--config.data.shared_dir=...` or `--config.data.parallel_path=...` moves both languages; a
missing file ends the run with "config.data.high.path: corpus file not found: <path>".
Scale as configs/tinystories.py, but validation every 20 steps with patience 8 (the limited set
is ~5 steps an epoch). Design notes: docs/experiments.md.
xlt's latest figures: results/tinystories_en_de.json, docs/results.md.
"""

import os

from configs import tinystories

_FILE = "data/parallel_en_de/simple_stories_1000_en_de.jsonl"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_shared_dir() -> str:
  """../shared from the working directory if it holds the file, else beside the repository
  (absolute, so a missing-file error names the full path)."""
  here = os.path.abspath("../shared")
  if os.path.isfile(os.path.join(here, _FILE)):
    return here
  return os.path.normpath(os.path.join(_REPO, "..", "shared"))


def get_config():
  c = tinystories.get_config()
  c.name = "tinystories_proxy_en_de"
  # as the reference: the mixed models 3 times; the limited baseline too (its ± is the
  # yardstick of the gain); English-only and German-full once
  c.num_seeds = 1
  c.seeds_per_condition = {"mixed": 3, "low_limited": 3}
  c.reference = ("cs (TinyStories Czech translation, GPT-Neo 33M): English-only 3.94 (en), Czech "
                 "limited 28.67 ± 1.3, Czech full 5.65, mixed 8.72 ± 1.2, improvement +69.6%")

  c.data.shared_dir = default_shared_dir()
  # Lazy references: overriding shared_dir or parallel_path moves both languages together.
  c.data.parallel_path = c.data.get_ref("shared_dir") + "/" + _FILE
  c.data.high = tinystories.corpus(path=c.data.get_ref("parallel_path"), field="en",
                                   language="en")
  c.data.low = tinystories.corpus(path=c.data.get_ref("parallel_path"), field="de",
                                  language="de")
  # 1,000 stories: 20% held out (seed 0: 200 = 64 validation + 136 test), 800 train per
  # language, limited = 10% of train (78 German stories).
  c.data.split.update(seed=0, held_out_fraction=0.2, limited_fraction=0.1)
  c.data.num_val_documents = 64
  c.data.max_test_documents = 0  # the other 136

  # ~6 steps per epoch of the limited set: evaluate often enough to catch its best.
  c.train.update(eval_every=20, patience=8)
  return c
