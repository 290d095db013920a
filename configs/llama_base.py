"""A small Llama-shaped base (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases)
pretrained by xlt on the merge testbed's base mixture (configs/merge.py), saved as a Hugging
Face directory with a word-piece tokenizer of the task's vocabulary
(xlt.experiments.pretrain_hf), with the data of a task and a language fine-tune beside it:
the pretrained-model path end to end, nothing downloaded.

  python -m xlt.main --config=configs/llama_base.py --workdir=runs/base

runs/base/hf is a Llama directory that transformers loads; runs/base/data holds task.jsonl
(add_digit in the source language), language.jsonl (the other operations in the target
language), prompts.jsonl (the goal: add_digit in the target language, which nothing trains
on), task_prompts.jsonl and language_prompts.jsonl (held out, each with its "answer"). The
fine-tune and generate commands that follow: docs/pretrained.md; tests/test_llama_e2e.py runs
them at tiny sizes. No reference numbers: it is a path, not a result of the papers.
"""

import ml_collections

from configs import common
from configs import merge as merge_config


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "llama_base"
  c.kind, c.task = "pretrain_hf", "pretrain_hf"  # the experiment (xlt.experiments), its data
  c.seed = 0
  testbed = merge_config.get_config()
  c.arithmetic = testbed.arithmetic
  c.languages = testbed.languages
  c.task_op = testbed.task_op
  c.other_ops = testbed.other_ops
  c.data = testbed.data
  # rows of block_size + 1 tokens, one example each (the longest is 15 with BOS and EOS)
  c.data.block_size = 16
  c.data.val_fraction = 0.05
  c.data.seed = 0
  # Llama-shaped; block_size (max_position_embeddings) covers finetune's default data.block_size
  c.model = ml_collections.ConfigDict({**common.model(num_layers=4, num_heads=4, d_model=64, block_size=512,
                                                      pos_embedding="rope", rope_base=10000.0).to_dict(),
                                       "norm": "rmsnorm", "mlp": "swiglu", "num_kv_heads": 2, "mlp_dim": 192,
                                       "bias": False})
  c.train = common.train(batch_size=64, steps=2000, eval_every=250, patience=100, min_delta=0.0,
                         checkpoint_every=500)
  c.opt = common.opt(c.train, peak_lr=2e-3, warmup_steps=200)
  # num_prompts: greedy exact match on the first n of each prompt set (0: none)
  c.eval = common.eval_(batch_size=256)
  c.eval.num_prompts = 200
  c.eval.max_new = 8
  c.mesh = common.mesh()
  return c
