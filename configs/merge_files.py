"""Merges checkpoint files with any method of xlt.merge's registry; by default layer
swapping two fine-tunes of one base (Bandarkar et al. 2024, Algorithm 1):

  python -m xlt.merge --config=configs/merge_files.py \
    --config.inputs.base=ckpt/base --config.inputs.task_expert=ckpt/math \
    --config.inputs.language_expert=ckpt/swahili \
    --config.options.bottom=5 --config.options.top=2 --config.output=runs/swapped

Other methods: --config.method=ties --config.inputs.experts=a,b --config.options.density=0.3
(`python -m xlt.merge --list_methods` lists every method's inputs and options). Each
input is a .safetensors file or a directory of shards; `base` is optional where the
method does not take it, and then only draws the heatmaps. The output directory is a
Hugging Face model directory (config.json and tokenizer files from an input that has them,
safetensors with an index above max_shard_size, README.md), with delta_<input>.png (the
share of rows each fine-tune changed, per block and tensor: the paper's figure 2) and
summary.json. A mergekit YAML runs as --config=merge.yml (or --mergekit_yaml=merge.yml)
with --config.output=...; see docs/merge.md.
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "layer_swap"
  c.inputs = ml_collections.ConfigDict()  # {role: path}, a list role as "a,b"; any role the method takes
  c.options = ml_collections.ConfigDict()  # the method's options (paper defaults for 32 blocks: bottom=5, top=2)
  # hf (model.layers.{i}..., transformer.h.{i}...), xlt, or a block prefix ("gpt_neox.layers.{i}."); only
  # methods that read blocks or rows need one: "auto" finds it, the others merge any tensor by name
  c.naming = "auto"
  c.heatmaps = True
  c.output = "runs/merged"  # a Hugging Face model directory, replaced only once the new one is complete
  c.config_from = ""  # the input (role) whose config.json and tokenizer to copy; default: base, else the first
  c.max_shard_size = "5GB"  # safetensors shards above this, with model.safetensors.index.json
  c.dtype = ""  # e.g. bfloat16: cast floating tensors as they are written; default: keep each tensor's
  # inputs whose vocabularies differ (embedding / head rows): "base" cuts every input to the base's rows,
  # "union" pads to the largest (a missing row = the mean of the inputs that have it); "" = an error
  c.vocab = ""
  return c
