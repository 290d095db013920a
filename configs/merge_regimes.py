"""The merge testbed's regime map (issue 33): the goal score of every recipe as a function of how
far fine-tuning moved the experts from the base.

  python -m xlt.main --config=configs/merge_regimes.py --workdir=runs/merge_regimes

configs/merge.py's testbed (its data, model, base, partition presets and merge settings, read
from its get_config(), at the first 5 of its seeds), with the fine-tuning stage run once per
regime of `regimes`, each from the same base (c.kind "testbed.regimes" on the testbed's data,
xlt.experiments.testbed.regimes): the experts, data mixing, the partial experts and simultaneous training
of each partition preset, and every merge built from them (freeze-then-train,
train-then-revert, layer swaps, soups, task arithmetic, TIES, DARE, MAET). The LoRA and
trained-neuron recipes are off, to keep a run affordable: per regime the default's full
fine-tunes (recipes x seeds in one ensemble), so (400 + 3 x 800) / 800 = 3.5 times the
default's fine-tuning steps. Writes table.md (one row per recipe, one column per regime),
regime_map.png (goal exact match against the task expert's relative delta, a line per recipe
family), results rows with a `regime` field, and per regime table_r<i>.md,
predictions_r<i>.jsonl and delta_<expert>_r<i>.png (where each expert changed).

Regimes, fixed by rule before any result: a geometric learning-rate grid around the default's
3e-4 in half-decades (1e-4, 3e-4, 1e-3, 3e-3), each at the default's 800 steps, except the
smallest at the default's min_steps (400), which extends the range of movement downward; the
default's warm-up, schedule and early stopping (min_steps and warm-up capped at a regime's steps).
Not a table of the papers: no reference numbers. xlt's figures: results/merge_regimes.json,
docs/results.md, docs/testbed.md (the map).
"""

from configs import merge

# (fine-tuning peak learning rate, steps)
REGIMES = ((1e-4, 400), (3e-4, 800), (1e-3, 800), (3e-3, 800))


def get_config():
  c = merge.get_config()
  c.name = "merge_regimes"
  c.kind = "testbed.regimes"  # the testbed per fine-tuning regime, on the same data
  c.regimes = REGIMES
  c.num_seeds = 5  # the default's first 5 bases: 3.5 default fine-tune stages (~47 min recorded)
  c.lora.enabled = False
  c.maet_neurons.enabled = False
  return c
