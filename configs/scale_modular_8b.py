"""The modular-methods paper's recipes on Llama 3.1 8B: the partition [C] (its bottom 6 and
top 2 of 32 blocks, the embeddings and the head for the language, the middle for the task),
the partial experts each training its own part (freeze-then-train composes them), simultaneous
alternation between the two datasets (k=1 step each, each training its label), and
train-then-revert (the full experts' parts recombined: no further training). With the
argument "lora" the same in LoRA (rank-16 adapters on every projection, the base frozen), as
well as the full recipes. The finetune kind (xlt.experiments.finetune); bfloat16 weights with
float32 Adam moments, remat per block, everything sharded over fsdp:

  python -m xlt.main --config=configs/scale_modular_8b.py --workdir=runs/modular8b \\
      --config.base=path/to/Llama-3.1-8B \\
      --config.data.task=math_en.jsonl --config.data.language=instructions_sw.jsonl
  python -m xlt.main --config=configs/scale_modular_8b.py:lora --workdir=runs/modular8b_lora ...

Planned before booking (docs/scale.md, results/plans/; configs/hf_shapes holds the base's
config.json alone):

  python -m xlt.plan --config=configs/scale_modular_8b.py --topology=v5e:4x4
  python -m xlt.plan --config=configs/scale_modular_8b.py:lora --topology=v5e:4x4 --stages=lora

No reference numbers: they depend on your data.
"""

from configs import common
from configs import scale_layer_swap_8b


def get_config(arg: str = "full"):
  if arg not in ("full", "lora"):
    raise ValueError(f"configs/scale_modular_8b.py takes full or lora, got {arg!r}")
  c = scale_layer_swap_8b.get_config()
  c.name = f"scale_modular_8b_{arg}"
  c.partition.presets = ("C",)  # bottom / top -1: the paper's 6 and 2 of 32 blocks
  c.simultaneous.presets, c.simultaneous.steps_per_switch = ("C",), (1,)
  c.merges = ()
  if arg == "lora":
    c.lora.enabled, c.lora.rank, c.lora.alpha = True, 16, 32.0
    c.lora.presets, c.lora.simultaneous_presets = ("C",), ("C",)
    c.lora.train = common.train(batch_size=32, steps=1000, eval_every=100, patience=3, min_delta=0.0,
                                checkpoint_every=200, log_every=10, update="auto")
    c.lora.opt = common.opt(c.lora.train, peak_lr=2e-4, warmup_steps=50, weight_decay=0.0, state_dtype="float32")
  return c
