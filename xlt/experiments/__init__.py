"""The kinds of experiment, by task (`c.task`): each a module with `prepare`, `stages` and
`outputs`, which xlt.runner calls (its docstring describes them).

  synthetic    graph, addition: language mixing on the synthetic tasks (Tables 2, 3)
  text         text: language modelling with a high- and a low-resource language (Table 4)
  testbed      arithmetic: the merge testbed, base -> experts -> merges -> scores
               (its LoRA and trained-neuron stages in testbed_peft)
  testbed_regimes  arithmetic_regimes: the testbed's fine-tunes and merges per fine-tuning
               regime (learning rate x steps) from one base: the regime map
  finetune     finetune: a pretrained Hugging Face model -> task and language experts ->
               partition recipes, LoRA, merges -> Hugging Face directories, scores
  pretrain_hf  pretrain_hf: a small Llama-shaped base on the testbed's data, saved as a Hugging
               Face directory with its tokenizer and fine-tuning data (configs/llama_base.py)
  common       what a kind hands the runner (Stage) and gets back (Trained)
"""

from __future__ import annotations

import types

from xlt.experiments import finetune, pretrain_hf, synthetic, testbed, testbed_regimes, text

KINDS = {"graph": synthetic, "addition": synthetic, "text": text, "arithmetic": testbed,
         "arithmetic_regimes": testbed_regimes, "finetune": finetune, "pretrain_hf": pretrain_hf}


def kind(task: str) -> types.ModuleType:
  """The kind that runs experiments of `task`."""
  if task not in KINDS:
    raise ValueError(f"unknown task {task!r}; known: {', '.join(KINDS)}")
  return KINDS[task]
