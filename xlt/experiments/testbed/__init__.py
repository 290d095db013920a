"""The merge testbed (docs/testbed.md): a base trained on arithmetic in two scripts, experts
fine-tuned from it, their merges, and the scores of every model. Two kinds, each declaring its
name and task, the arithmetic data (xlt.experiments finds them):

  experiment      c.kind "testbed" (configs/merge*.py): base -> experts -> merges -> scores
  regimes         c.kind "testbed.regimes" (configs/merge_regimes.py): the same per fine-tuning
                  regime (learning rate x steps) from one base, the regime map

and what they are built of:

  plan            every recipe each stage trains (recipes of xlt.experiments.recipes), the
                  fine-tuning data with replay of the base's
  peft            the LoRA and trained-neuron (MAET) stages and their compositions
  text            the task as text in a pretrained model's tokenizer (c.text)
  report          scores -> rows, table.md, the change heatmaps
  regimes_report  the regime map's table and figures
"""
