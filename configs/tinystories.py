"""Table 4 (TinyStories language mixing), scaled-down proxy for a 2-core CPU.

  python -m xlt.main --config=configs/tinystories.py --workdir=/tmp/xlt_text

Reference (Table 4, Czech test perplexity, GPT-Neo 4 layers x 768, vocab 30k, full TinyStories):
English-only 3.94 (English ppl); Czech-only limited (10%) 28.67 ± 1.3; Czech-only full 5.65;
mixed (10% Czech + English) 8.72 ± 1.2: +69.6% = (28.67 - 8.72) / 28.67. The full setup is
configs/tinystories_reference.py.

Proxy (see xlt/data/text.py's docstring, "Proxy corpora"): neither reference corpus is on this
machine, so high = the first 5,478 real TinyStories stories (English, lowercased) and low =
Russian TinyStories-style stories, capped at the same 5,478 stories (about the same characters:
a translation's size). Russian is, like Czech, a Slavic language (rich inflection, free word
order), same story domain; but it is written natively (not translated) and in Cyrillic, which
shares no letters with English, so transfer through shared subwords is understated.
Split: 5% held out (first 64 held-out stories = validation for early stopping, the rest = test),
limited = 10% of the train stories. The paths come from `data.shared_dir` ("../shared", tried
relative to the working directory, then to the repository root) unless `data.high.path` /
`data.low.path` are set.

Scale: a 2-layer, width-128 GPT (block 128, shared BPE vocab 2,000; ~0.8M parameters), batch 16,
the same 1,000-step budget for every condition, early stopping on validation perplexity.
Measured here (2 shared cores, `nice -n 19`, 1 seed, the four conditions as one ensemble):
see the bottom of this docstring.

Obtained: (filled in below after the run)
"""

import ml_collections
from ml_collections import config_dict


def corpus(path=None, format="jsonl", field="text", language="", max_documents=0):
  """`xlt.data.text.CorpusSpec` fields as plain config values (every one overridable)."""
  return ml_collections.ConfigDict(dict(
      path=config_dict.placeholder(str) if path is None else path, format=format, field=field,
      separator="eot", eot_marker="<|endoftext|>", on_error="raise",
      max_documents=max_documents, language=language))


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "tinystories_proxy_en_ru"
  c.task = "text"
  c.seed = 0  # first seed; seeds are seed .. seed + num_seeds - 1 (init and data order)
  c.num_seeds = 1
  c.seeds_per_condition = ml_collections.ConfigDict()  # e.g. {"mixed": 3} overrides num_seeds
  c.conditions = ("high_only", "low_limited", "low_full", "mixed")
  c.reference = ("cs (TinyStories Czech, GPT-Neo 33M): English-only 3.94 (en), Czech limited "
                 "28.67 ± 1.3, Czech full 5.65, mixed 8.72 ± 1.2, improvement +69.6%")

  c.data = ml_collections.ConfigDict()
  # Where the proxy corpora live (shared/data/...); used for a role whose path is unset.
  c.data.shared_dir = "../shared"
  c.data.high = corpus(language="en")  # path None -> shared/data/en_tinystories/...
  c.data.low = corpus(language="ru", max_documents=5478)  # as many stories as English has
  c.data.split = ml_collections.ConfigDict(dict(seed=0, held_out_fraction=0.05,
                                                limited_fraction=0.1))
  c.data.num_val_documents = 64  # held-out stories for early stopping (not test)
  c.data.max_test_documents = 0  # 0 = the rest of the held-out stories

  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.vocab_size = 2000
  c.tokenizer.max_sentences_per_language = 300_000

  c.model = ml_collections.ConfigDict()
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.d_model = 128
  c.model.block_size = 128
  c.model.mlp_ratio = 4
  c.model.tie_embeddings = False
  c.model.dtype = "float32"

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 16
  c.train.steps = 1000  # the same budget for every condition
  c.train.grad_accum = 1
  c.train.eval_every = 50
  c.train.patience = 3  # evaluations without a gain of min_delta (nats per token)
  c.train.min_delta = 0.002
  c.train.target_score = 0.0  # -(NLL) can never reach 0: no target
  c.train.log_every = 25
  c.train.checkpoint_every = 250

  c.opt = ml_collections.ConfigDict()
  c.opt.name = "adamw"
  c.opt.schedule = "cosine"
  c.opt.peak_lr = 3e-3
  c.opt.warmup_steps = 50
  c.opt.total_steps = c.train.get_ref("steps")
  c.opt.b1 = 0.9
  c.opt.b2 = 0.95
  c.opt.weight_decay = 0.1
  c.opt.clip = 1.0

  c.eval = ml_collections.ConfigDict()
  c.eval.batch_size = 32  # rows per perplexity call (x members)

  c.samples = ml_collections.ConfigDict()
  c.samples.temperature = 0.8
  c.samples.top_k = 40
  c.samples.max_new = 80
  c.samples.num_prompts = 2  # prompts = first words of the first test stories of each language
  c.samples.prompt_words = 4
  c.samples.prompts_high = ()  # or explicit prompts
  c.samples.prompts_low = ()

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  return c
