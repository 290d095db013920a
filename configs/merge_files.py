"""Merges checkpoint files: layer swapping two fine-tunes of one base, as the
layer-swapping paper does (Bandarkar et al., Algorithm 1), on Hugging Face safetensors.

  python -m xlt.merge --config=configs/merge_files.py \
    --config.inputs.base=ckpt/base --config.inputs.task_expert=ckpt/math \
    --config.inputs.language_expert=ckpt/swahili --config.output=runs/swapped

Each input is a .safetensors file or a directory of shards. The output directory gets
model.safetensors (the merge), delta_task_expert.png / delta_language_expert.png (the
share of rows each expert changed, per block and tensor: the paper's figure 2) and
summary.json. Tensors are read one at a time: peak memory is about one model (the merge)
plus a few tensors. Measured on this project's 2-core CPU (3 synthetic Llama-style
checkpoints of 960 MiB, 14 blocks, float32): this config with bottom=5 top=2 and heatmaps,
10 s and 1,138 MiB max RSS, of which 173 MiB is the interpreter and imports (growth 1.0x one
checkpoint); TIES of two experts, 16 s, growth 1.3x. Other methods: soup, task_arithmetic, ties, dare, maet,
sparsify_rows (inputs in xlt.merge.files.METHODS; options are the method's keywords).
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "layer_swap"
  c.inputs = ml_collections.ConfigDict(dict(base="ckpt/base", task_expert="ckpt/task",
                                            language_expert="ckpt/language"))
  # the paper's defaults for the 32-block LLAMA 3.1 8B
  c.options = ml_collections.ConfigDict(dict(bottom=5, top=2, lower_transition=0, upper_transition=0,
                                             non_block="average"))
  c.naming = "auto"  # hf (model.layers.{i}..., transformer.h.{i}...) or xlt, found from the names
  c.heatmaps = True
  c.output = "runs/merged"
  return c
