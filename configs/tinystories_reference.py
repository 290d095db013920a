"""Table 4 (TinyStories language mixing), the full reference setup: needs the corpora and a GPU.

  python -m xlt.main --config=configs/tinystories_reference.py --workdir=runs/ts_ref \
      --config.data.high.path=data/tinystories_en.txt \
      --config.data.low.path=data/tinystories_cs.txt

Reference (Table 4, Czech test perplexity): English-only 3.94 (English ppl); Czech-only limited
(10%) 28.67 ± 1.3; Czech-only full 5.65; mixed (10% Czech + English) 8.72 ± 1.2, +69.6%.
Not run yet (results/tinystories_reference.json holds the reference only).

Data: TinyStories English and its Czech translation (Hyner et al., 2024) as .txt files whose
stories end at <|endoftext|> (jsonl: `--config.data.high.format=jsonl` and `.field`); a story and
its translation at the same index in the two files. Both paths default to None (an error naming
the flags above). Splits are packed once to workdir/packed/ and memory-mapped.

Model and training (paper Table 1, GPT-Neo): 4 layers, 16 heads, width 768, block 512, tied
embeddings, vocab 30,000, lr 5e-4 constant, 1,280 sequences per update (`train.batch_size=1280`,
`train.grad_accum=16`), 3 seeds for mixed, 3,000 updates with early stopping (our choice: the
paper gives no step count). ~52M parameters, not the paper's ~33M: docs/experiments.md.
"""

import importlib.util
import os

import ml_collections


def _proxy_config_module():
  # The proxy config beside this file (config files are loaded by path, not as a package).
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tinystories.py")
  spec = importlib.util.spec_from_file_location("xlt_configs_tinystories", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


tinystories = _proxy_config_module()


def get_config():
  c = tinystories.get_config()
  c.name = "tinystories_reference_en_cs"
  c.num_seeds = 1
  c.seeds_per_condition = ml_collections.ConfigDict({"mixed": 3})
  c.reference = ("English-only 3.94 (en), Czech limited 28.67 ± 1.3, Czech full 5.65, "
                 "mixed 8.72 ± 1.2, improvement +69.6%")

  c.data.shared_dir = ""  # no proxy: both paths must be given
  c.data.high = tinystories.corpus(format="text", language="en")
  c.data.low = tinystories.corpus(format="text", language="cs")
  c.data.split = ml_collections.ConfigDict(dict(seed=0, held_out_fraction=0.01,
                                                limited_fraction=0.1))
  c.data.num_val_documents = 1000
  c.data.max_test_documents = 10_000

  c.tokenizer.vocab_size = 30_000
  c.tokenizer.max_sentences_per_language = 2_000_000

  c.model.num_layers = 4
  c.model.num_heads = 16
  c.model.d_model = 768
  c.model.block_size = 512
  c.model.mlp_ratio = 4
  c.model.tie_embeddings = True
  c.model.dtype = "bfloat16"

  c.train.batch_size = 1280
  c.train.grad_accum = 16
  c.train.steps = 3000
  c.train.eval_every = 100
  c.train.patience = 5
  c.train.min_delta = 0.001
  c.train.log_every = 10
  c.train.checkpoint_every = 200

  c.opt.schedule = "constant"
  c.opt.peak_lr = 5e-4
  c.opt.warmup_steps = 0
  c.opt.b2 = 0.999
  c.opt.weight_decay = 0.0

  c.eval.batch_size = 16
  c.samples.max_new = 200
  return c
