"""Layer swapping at the paper's size (Bandarkar et al. 2024, "Layer Swapping for Zero-Shot
Cross-Lingual Transfer in Large Language Models"): two full supervised fine-tunes of Llama 3.1
8B from one base, a task expert (math in English) and a language expert (general instructions
in the target language), then the swap: the language expert's bottom 5 and top 2 of 32 blocks
into the task expert (the paper's defaults for 32 blocks). The finetune kind
(xlt.experiments.finetune) on your own jsonl files; bfloat16 weights with float32 Adam
moments, each block rematerialised, the parameters and the optimizer state sharded over
every device (fsdp):

  python -m xlt.main --config=configs/scale_layer_swap_8b.py --workdir=runs/swap8b \\
      --config.base=path/to/Llama-3.1-8B \\
      --config.data.task=math_en.jsonl --config.data.language=instructions_sw.jsonl

Planned before booking (docs/scale.md, results/plans/): configs/hf_shapes/Llama-3.1-8B holds the
base's config.json alone, which is all xlt.plan reads:

  python -m xlt.plan --config=configs/scale_layer_swap_8b.py --topology=v5e:4x4 --remat=block,block:dots

No reference numbers here: the paper's gain (+2.9 / +3.3 MGSM points over the math expert for
Swahili / Telugu...) depends on its data, which is not redistributed (README, configs/claims_study.py).
"""

from configs import common
from configs import finetune


def get_config():
  c = finetune.get_config()
  c.name = "scale_layer_swap_8b"
  c.base = "configs/hf_shapes/Llama-3.1-8B"  # a shape only: point it at the downloaded model to train
  c.dtype = "bfloat16"
  c.remat, c.remat_policy = "block", "nothing"  # model.Config's: the same values, a block's activations recomputed
  c.data.block_size = 1024
  c.train = common.train(batch_size=32, steps=1000, eval_every=100, patience=3, min_delta=0.0, checkpoint_every=200,
                         log_every=10, update="auto")
  c.opt = common.opt(c.train, peak_lr=1e-5, warmup_steps=50, weight_decay=0.0, state_dtype="float32")
  c.partition.presets = ()  # the two full experts only
  c.merges = ("layer_swap bottom=5 top=2",)
  c.mesh = common.mesh(data=1, fsdp=-1, tensor=1)
  return c
