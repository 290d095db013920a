"""A data-aware merge (RegMean, RegMean++, Fisher merging: xlt/merge/data_aware.py) of Hugging
Face model directories, each expert's statistics from forward / backward passes over its own data:

  python -m xlt.merge_data --config=configs/merge_data.py --config.method=regmean \
    --config.inputs.experts=ckpt/math,ckpt/swahili \
    --config.data.experts=math.jsonl,swahili.jsonl --config.output=runs/regmean

Data files are JSON lines, one per expert: {"text": ...} or the SFT reader's kinds
(xlt/data/sft.py), tokenized with the first expert's tokenizer; padding never counts. Fusion-bench's
RegMean and Fisher, in its conventions (one text per row, no EOS, the model's own Fisher; each
field's meaning and default: docs/merge.md, "RegMean and Fisher from data"):

  python -m xlt.merge_data --config=configs/merge_data.py --config.method=fisher \
    --config.data.convention=fusion_bench --config.statistics.fisher=model \
    --config.options.normalize=True --config.inputs.experts=a,b --config.data.experts=a.jsonl,b.jsonl

No reference numbers: it writes a model.
"""

import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "regmean"  # regmean, regmean_plusplus or fisher
  c.inputs = ml_collections.ConfigDict({"experts": ""})  # model directories, comma-separated
  c.data = ml_collections.ConfigDict({"experts": "",  # one .jsonl per expert, comma-separated
                                      "convention": "xlt"})  # xlt (packed + EOS) or fusion_bench
  c.statistics = ml_collections.ConfigDict({"fisher": "empirical",  # or model (fusion-bench's)
                                            "head": True})  # RegMean measures the untied head
  c.options = ml_collections.ConfigDict()  # the method's options (alpha, weights, normalize, ...)
  c.block_size = 128
  c.batch_size = 8
  c.max_examples = 256  # rows of each data file measured
  c.output = "runs/merged_data"
  c.mesh = common.mesh()  # data=-1: every device takes a share of each batch
  return c
