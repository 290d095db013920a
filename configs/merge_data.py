"""A data-aware merge (RegMean, RegMean++, Fisher merging: xlt/merge/data_aware.py) of Hugging Face model
directories, each expert's statistics from forward / backward passes over its own data:

  python -m xlt.merge_data --config=configs/merge_data.py --config.method=regmean \
    --config.inputs.experts=ckpt/math,ckpt/swahili \
    --config.data.experts=math.jsonl,swahili.jsonl --config.output=runs/regmean

Data files are JSON lines, one per expert in the experts' order: {"text": ...} (plain text,
every token after the first a target) or the SFT reader's kinds (xlt/data/sft.py: prompt /
completion or messages), tokenized with the first expert's tokenizer (the experts share one).
`data.convention` says how they become rows of block_size + 1 tokens (docs/merge.md, the
conventions against fusion-bench):

  xlt            (default) examples packed into rows, each ended with the EOS, as fine-tuning
                 reads them
  fusion_bench   one text per row, no EOS (truncated to block_size + 1), right-padded

Padding never counts: a Gram matrix counts each row's positions up to its last target, a Fisher
its targets. The first max_examples rows of each file are measured, batch_size at a time, each
batch split over the mesh's data axes (`mesh`, as training's: the parameters replicated on each
device). `statistics.fisher` is "empirical" (default: the gradient of the data's own next
tokens' loss) or "model" (fusion-bench's: the model's own next-token distribution);
`statistics.head` (default True) measures the untied head's inputs for RegMean as it does every
attn / mlp kernel's (False: the head is the experts' mean). Fusion-bench's RegMean and Fisher,
from the command line:

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
