"""The merge testbed's second config: the recipes the default run (configs/merge.py) leaves out
to stay within ~30 minutes on a 2-core CPU: the inverted partition presets [A_inv] and [C_inv],
the LoRA versions of the recipes (rsLoRA rank 8 on every attention / MLP projection) and MAET
with trained neurons, on the same base and data, at the first 5 of its seeds.

  python -m xlt.main --config=configs/merge_peft.py --workdir=runs/merge_peft

No reference numbers: a testbed of known answers, not a table of the papers (docs/testbed.md).
xlt's figures, where recorded: results/merge_peft.json, docs/results.md.
"""

from configs import merge


def get_config():
  c = merge.get_config()
  c.name = "merge_testbed_peft"
  c.num_seeds = 5  # the default's first 5 bases: its recorded run's cost (~38 min on 1 device)
  c.partition.presets = ("A", "C", "A_inv", "C_inv")
  c.simultaneous.presets = ("A", "C")
  c.simultaneous.steps_per_switch = (1, 10)
  c.lora.enabled = True
  c.maet_neurons.enabled = True
  return c
