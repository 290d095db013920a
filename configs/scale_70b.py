"""A 70B full fine-tune: layer swapping's two full experts (configs/scale_layer_swap_8b.py) on
Llama 3.1 70B, its 80 blocks swapped at the same share (the language expert's bottom 12 and top
5). bfloat16 weights with float32 Adam moments (about 840 GB of state before activations: a pod
slice's worth), remat per block, everything sharded over fsdp:

  python -m xlt.main --config=configs/scale_70b.py --workdir=runs/swap70b \\
      --config.base=path/to/Llama-3.1-70B \\
      --config.data.task=math_en.jsonl --config.data.language=instructions_sw.jsonl

Planned before booking (docs/scale.md, results/plans/; configs/hf_shapes holds the base's
config.json alone):

  python -m xlt.plan --config=configs/scale_70b.py --topology=v5p:4x4x4

No reference numbers: they depend on your data.
"""

from configs import scale_layer_swap_8b


def get_config():
  c = scale_layer_swap_8b.get_config()
  c.name = "scale_70b"
  c.base = "configs/hf_shapes/Llama-3.1-70B"
  c.train.batch_size = 64
  c.merges = ("layer_swap bottom=12 top=5",)
  return c
