"""Table 4 (TinyStories language mixing), scaled-down proxy for a 2-core CPU.

  python -m xlt.main --config=configs/tinystories.py --workdir=runs/tinystories

Reference (Table 4, Czech test perplexity, GPT-Neo 4 layers x 768, vocab 30k, full TinyStories):
English-only 3.94 (English ppl); Czech-only limited (10%) 28.67 ± 1.3; Czech-only full 5.65;
mixed (10% Czech + English) 8.72 ± 1.2: +69.6% = (28.67 - 8.72) / 28.67. The full setup is
configs/tinystories_reference.py; a translated pair, configs/tinystories_en_de.py.

Proxy (xlt/data/corpus.py, "Proxy corpora"): high = TinyStories stories (English, lowercased),
low = Russian TinyStories-style stories, both capped at their first 1,600 stories; limited =
10% of the ~1,280 Russian train stories. The paths come from `data.shared_dir` ("../shared")
unless `data.high.path` / `data.low.path` are set. Scale: 2 layers, width 128, 4 heads, block
128, one BPE vocab of 1,024 over both languages; batch 16; 1,000 steps for every condition;
validation every 40 steps, patience 4. Token perplexities are not comparable to the reference's.
Why the cap and the proxy: docs/experiments.md.
xlt's latest figures: results/tinystories.json, docs/results.md.
"""

import ml_collections

from configs import common
from ml_collections import config_dict


def corpus(path=None, format="jsonl", field="text", language="", max_documents=0):
  """`xlt.data.corpus.CorpusSpec` fields as plain config values (every one overridable)."""
  return ml_collections.ConfigDict(dict(
      path=config_dict.placeholder(str) if path is None else path, format=format, field=field,
      separator="eot", eot_marker="<|endoftext|>", on_error="raise",
      max_documents=max_documents, language=language))


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "tinystories_proxy_en_ru"
  c.kind, c.task = "text", "text"  # the experiment (xlt.experiments), its data
  c.seed = 0  # first seed; seeds are seed .. seed + num_seeds - 1 (init and data order)
  c.num_seeds = 1
  # overrides num_seeds per condition. As the reference: the mixed models 3 times; the limited
  # baseline too (its ± is the yardstick of the gain); English-only and Russian-full once
  c.seeds_per_condition = ml_collections.ConfigDict({"mixed": 3, "low_limited": 3})
  c.conditions = ("high_only", "low_limited", "low_full", "mixed")
  c.reference = ("cs (TinyStories Czech, GPT-Neo 33M): English-only 3.94 (en), Czech limited "
                 "28.67 ± 1.3, Czech full 5.65, mixed 8.72 ± 1.2, improvement +69.6%")

  c.data = ml_collections.ConfigDict()
  # Where the proxy corpora live (shared/data/...); used for a role whose path is unset.
  c.data.shared_dir = "../shared"
  # path None -> the proxy file under shared_dir. Both capped at the first 1,600 stories (of
  # 5,478 English ones) so that the mixed model sees its limited Russian several times within
  # the CPU budget; equal story counts, as in a translated pair.
  c.data.high = corpus(language="en", max_documents=1600)
  c.data.low = corpus(language="ru", max_documents=1600)
  # 20% held out (~320 stories: 64 validation + ~256 test), limited = 10% of train (~128).
  c.data.split = ml_collections.ConfigDict(dict(seed=0, held_out_fraction=0.2,
                                                limited_fraction=0.1))
  c.data.num_val_documents = 64  # held-out stories for early stopping (not test)
  c.data.max_test_documents = 0  # 0 = the rest of the held-out stories

  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.vocab_size = 1024
  c.tokenizer.max_sentences_per_language = 300_000

  c.model = common.model(num_layers=2, num_heads=4, d_model=128, block_size=128)
  # the same step budget for every condition; the score is -(NLL per token), so there is
  # no target to stop at (target_score 0 is never reached); min_delta in nats per token
  c.train = common.train(batch_size=16, steps=1000, eval_every=40, patience=4, min_delta=0.002,
                         target_score=0.0, log_every=25, checkpoint_every=250)
  c.opt = common.opt(c.train, schedule="cosine", peak_lr=3e-3, warmup_steps=50)

  c.eval = common.eval_(batch_size=32)  # rows per perplexity call (x members)

  c.samples = ml_collections.ConfigDict()
  c.samples.temperature = 0.8
  c.samples.top_k = 40
  c.samples.max_new = 80
  c.samples.num_prompts = 2  # prompts = first words of the first test stories of each language
  c.samples.prompt_words = 4
  c.samples.prompts_high = ()  # or explicit prompts
  c.samples.prompts_low = ()

  c.mesh = common.mesh()
  return c
