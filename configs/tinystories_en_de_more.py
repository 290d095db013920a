"""Table 4's English–German proxy with ten times more English: is too little English why mixing
made German worse (results/tinystories_en_de.json: 68.51 → 78.15, −14.1%)?

  python -m xlt.main --config=configs/tinystories_en_de_more.py --workdir=runs/tinystories_en_de_more

The reference mixed 10% of its Czech with all of English TinyStories (Czech 28.67 → 8.72,
+69.6%). configs/tinystories_en_de.py mixes 78 German stories with 800 English ones. This config
adds the English of the other ~9,000 stories of the same collection
(simple_stories_10k_en_sentences_UNALIGNED.txt beside the parallel file: one sentence a line, no
story boundaries) as `data.high_extra`: its first 6,666 lines are the 1,000 parallel stories in
order (story 999 ends at line 6,665), so they are skipped and no held-out story's English enters;
the rest are grouped 7 sentences to a document (the parallel stories average 6.7). The extra text
trains only: the tokenizer, split, held-out rows, seeds and step budget are
tinystories_en_de.py's, so token perplexities compare across the two configs.
The collection repeats itself: 30 of the 200 held-out stories have half or more of their
sentences verbatim somewhere in the extra text (mostly stock openings; 2,232 of its 60,112 lines
equal a held-out sentence), so this setting leaks some held-out content by construction;
configs/tinystories_en_de_leak.py measures what the held-out stories' own English does.
xlt's figures: results/tinystories_en_de_more.json, docs/results.md.
"""

from configs import tinystories, tinystories_en_de

EXTRA_FILE = "data/parallel_en_de/simple_stories_10k_en_sentences_UNALIGNED.txt"
PARALLEL_LINES = 6666  # the 1,000 parallel stories' sentences, at the start of EXTRA_FILE


def get_config():
  c = tinystories_en_de.get_config()
  c.name = "tinystories_proxy_en_de_more"
  c.conditions = ("high_only", "low_limited", "mixed")
  c.data.high_extra = tinystories.corpus(path=c.data.get_ref("shared_dir") + "/" + EXTRA_FILE,
                                         format="text", language="en_extra")
  c.data.high_extra.separator = "line"
  c.data.high_extra.lines_per_document = 7
  c.data.high_extra.skip_lines = PARALLEL_LINES
  return c
