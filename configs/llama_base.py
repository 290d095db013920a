"""A small Llama-shaped base (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases)
pretrained by xlt on the merge testbed's base mixture (configs/merge.py: the non-task
operations, the target language low-resource), saved as a Hugging Face directory with a
word-piece tokenizer of the task's vocabulary (xlt.experiments.pretrain_hf), and the data of
a task and a language fine-tune beside it: the open-model path end to end, nothing downloaded.

  python -m xlt.main --config=configs/llama_base.py --workdir=runs/base
  python -m xlt.main --config=configs/finetune.py --workdir=runs/ft \\
      --config.base=runs/base/hf \\
      --config.data.task=runs/base/data/task.jsonl \\
      --config.data.language=runs/base/data/language.jsonl \\
      --config.merges="('layer_swap bottom=1 top=1',)" \\
      --config.data.block_size=64 --config.train.batch_size=32 --config.opt.peak_lr=3e-4 \\
      --config.eval.prompts="('runs/base/data/prompts.jsonl',)" --config.eval.max_new=8
  python -m xlt.generate --model=runs/ft/models/layer_swap_bottom_1_top_1 \\
      --prompts=runs/base/data/task_prompts.jsonl --output=out.jsonl \\
      --answers=runs/base/data/task_prompts.jsonl --max_new=8

runs/base/hf is a Llama directory (transformers' AutoModelForCausalLM and AutoTokenizer load
it; tests/test_llama_e2e.py checks the logits and greedy answers at tiny sizes). The data
files (runs/base/data): task.jsonl (add_digit in the source language), language.jsonl (the
other operations in the target language), prompts.jsonl (the goal: add_digit in the target
language, which nothing trains on), task_prompts.jsonl and language_prompts.jsonl (held-out
test prompts, each line with its "answer"). xlt.generate --answers scores final numbers, so it
reads the source language's numeric answers; the target language writes letters, which the
fine-tune's eval.prompts scores by exact match (runs/ft/table.md).

Not a result of the papers: the path. One run of the three commands above on a 2-core CPU
(XLT_CPU_DEVICES=1; 2.4 + 6.5 min): the base (204k parameters) has validation loss 0.046 and
exact match 0.79 on language_prompts, 0 on the goal and the task (by construction); the task
expert 0.895 on task_prompts (xlt.generate --answers); on the goal (runs/ft/table.md)
freeze-then-train [C] 0.105, train-then-revert [C] 0.010, the layer swap 0.000.
"""

import ml_collections

from configs import common
from configs import merge as merge_config


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "llama_base"
  c.task = "pretrain_hf"
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
