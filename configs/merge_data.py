"""A data-aware merge (RegMean, Fisher merging: xlt/merge/data_aware.py) of Hugging Face model
directories, each expert's statistics from forward / backward passes over its own data:

  python -m xlt.merge_data --config=configs/merge_data.py --config.method=regmean \
    --config.inputs.experts=ckpt/math,ckpt/swahili \
    --config.data.experts=math.jsonl,swahili.jsonl --config.output=runs/regmean

Data files are JSON lines in the SFT reader's formats (xlt/data/sft.py: prompt / completion or
messages), one per expert in the experts' order, tokenized with the first expert's tokenizer
(the experts share one) and packed into rows of block_size + 1 tokens; the first max_examples
rows of each are measured, batch_size at a time, each batch split over the mesh's data axes
(`mesh`, as training's: the parameters replicated on each device). No reference numbers: it
writes a model.
"""

import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "regmean"  # regmean or fisher
  c.inputs = ml_collections.ConfigDict({"experts": ""})  # model directories, comma-separated
  c.data = ml_collections.ConfigDict({"experts": ""})  # one .jsonl per expert, comma-separated
  c.options = ml_collections.ConfigDict()  # the method's options (alpha, weights, normalize, ...)
  c.block_size = 128
  c.batch_size = 8
  c.max_examples = 256  # rows of each data file measured
  c.output = "runs/merged_data"
  c.mesh = common.mesh()  # data=-1: every device takes a share of each batch
  return c
