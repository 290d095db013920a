"""The merge testbed: modular training and model merging where the answer is known by
construction (papers: modular fine-tuning and merging, layer swapping, MAET).

  python -m xlt.main --config=configs/merge.py --workdir=runs/merge

Design (xlt/data/arithmetic.py). Two *languages* share their numerals and operator words, as
natural languages share Arabic numerals and mathematical signs; a language is named by a tag
at the start of the prompt and writes its *answers* in its own script, the addition family's
`standard` (0-9, the high-resource source) or `letter` (A-J, the low-resource target):

  [std] 3 2 7 + 8 =  -> 5 3 3        [let] 3 2 7 + 8 =  -> F D D

  base      from scratch on max, min, double, copy and "+ 1" (a + 1) in both languages, the
            target low-resource (30 examples of each operation against 500-2000): it reads
            both, writes both, and can add one but no other digit;
  task      the base fine-tuned on the task, a + d for a digit d >= 2 whose units carry
            (`add_digit`: no other operation's output can match it by chance), in the source
            language only;
  language  the base fine-tuned on the other operations in the target language only;
  goal      the task in the target language: no model ever trains on it.

So by construction the base and the language expert cannot do the goal (0.00% below), the
task expert can do the task in its own language (98.33%), and the goal needs the task's
computation with the target language's script. The `any script` column counts a right sum
written in either script: it separates "the ability reached the language" from "the answer
is in the right language". Every recipe of the papers runs from the same base, per seed:
data mixing (task + language data in one run); partial experts for each partition preset,
combined by partition (freeze-then-train); the full experts combined by partition
(train-then-revert: each expert reset to the base outside its own partition), and the task
expert alone with its language partition reset; simultaneous partition training (1 and 10
steps per switch); layer swapping over a grid; soups; task arithmetic; TIES; DARE; MAET
(its source-language model: the base fine-tuned on the other operations in the source
language). All fine-tunes (16 recipes x 3 seeds) train as one ensemble under one gated
optimizer; each member is tested at its best validation step.

LoRA and trained-neuron rows (xlt/testbed_peft.py; `lora` and `maet_neurons` below, each
with enabled=False to skip it): the LoRA versions of the recipes (rsLoRA rank 8 on every
attn / mlp projection: LoRA task and language experts, LoRA layer swap b=2 u=1 and b=1 u=1
of their adapters, partial LoRA experts and their freeze-then-train for [C] and [A_inv],
simultaneous LoRA [C] k=1), trained as one more ensemble, and MAET with trained neurons
(short runs of 100 steps locate the top 5% rows, the ability and source-language models
train on those rows only, then MAET). Not run at full size yet: the rows of the table below
are the full fine-tuning ones; run the command above to add them (mean +- std over seeds,
beside the full fine-tuning rows).

How the design was reached. The testbed must be discriminative (some method between the
base's 0 and the task expert's own-language score). In one-seed design probes, three
earlier designs left every method near 0 on the goal: target-language operands written in
letters (the task's new circuit never read letter numerals), a target-language delimiter
instead of a tag (the task expert wrote nothing useful after it), and a base with ten
times more target-language data (the fine-tuned task did not fire in the target
language's context). Only with a low-resource target in the base did the task expert's
sums carry over. The operator "+" is in the base (as "+ 1") because a token first seen in
fine-tuning has an untrained embedding, which recipes that freeze the embeddings could not
learn. These choices were made for discrimination, before and independent of which
method wins; hyper-parameters were never tuned on the goal.

Fixed by rule: partition presets scale the modular-training paper's [C] (bottom 6 / top 2
of 32 layers) to 6 blocks: bottom 2, top 1; embeddings and head belong to the language
partition (the task's default). Layer swaps: b in {1, 2}, u in {0, 1} (the paper's
ranges 3-5 / 0-2 of 32, scaled), with and without a 1-block transition zone. Merge
settings are the papers' defaults: non-block parameters averaged, MAET alpha 0.8, beta
0.2, gamma 0.2, eta 1.0, 5% key neurons, 80% tensors; TIES density 0.2; DARE drop 0.5.

Obtained (2026-11-22, this 2-core CPU, 3 seeds, 1166 s wall: base 308 s, 48 fine-tunes
790 s, merges and scoring 68 s; test exact match on 200 problems per set, mean ± std over
seeds; `language` is the mean over the five other operations in letters):

| model | goal: add_digit/letter | goal, any script | task: add_digit/standard | language: max/letter, min/letter, double/letter, add_one/letter, copy/letter |
|---|---|---|---|---|
| base | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 95.20% ± 1.61 |
| task expert | 19.00% ± 2.29 | 21.83% ± 1.61 | 98.33% ± 1.04 | 8.23% ± 8.89 |
| language expert | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 98.73% ± 0.15 |
| source-language expert | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 92.13% ± 4.30 |
| data mixing | 1.67% ± 2.89 | 1.67% ± 2.89 | 99.33% ± 0.29 | 98.63% ± 0.15 |
| partial task expert [A] | 9.33% ± 14.44 | 9.50% ± 14.29 | 47.33% ± 40.11 | 31.23% ± 7.49 |
| partial language expert [A] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 98.40% ± 0.56 |
| partial task expert [C] | 18.50% ± 14.76 | 18.50% ± 14.76 | 82.50% ± 21.93 | 49.27% ± 5.28 |
| partial language expert [C] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 98.60% ± 0.36 |
| partial task expert [A_inv] | 13.67% ± 12.66 | 29.50% ± 14.42 | 98.50% ± 0.87 | 4.47% ± 6.22 |
| partial language expert [A_inv] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 98.13% ± 0.45 |
| partial task expert [C_inv] | 10.50% ± 9.50 | 24.67% ± 12.91 | 99.67% ± 0.58 | 2.63% ± 2.35 |
| partial language expert [C_inv] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 98.40% ± 0.20 |
| simultaneous [A] k=1 | 0.00% ± 0.00 | 0.00% ± 0.00 | 7.50% ± 11.27 | 97.70% ± 1.42 |
| simultaneous [A] k=10 | 0.00% ± 0.00 | 0.00% ± 0.00 | 1.67% ± 1.04 | 97.70% ± 0.78 |
| simultaneous [C] k=1 | 1.17% ± 1.61 | 1.17% ± 1.61 | 39.83% ± 39.55 | 97.50% ± 1.18 |
| simultaneous [C] k=10 | 1.17% ± 1.61 | 1.17% ± 1.61 | 38.83% ± 39.55 | 97.23% ± 1.48 |
| freeze-then-train [A] | 10.17% ± 15.46 | 10.17% ± 15.46 | 25.00% ± 26.87 | 35.03% ± 8.39 |
| train-then-revert [A] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 98.57% ± 0.21 |
| task expert, language partition reverted [A] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 95.07% ± 1.76 |
| freeze-then-train [C] | 17.00% ± 13.76 | 17.00% ± 13.76 | 38.50% ± 40.59 | 57.17% ± 2.40 |
| train-then-revert [C] | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.33% ± 0.58 | 95.20% ± 0.46 |
| task expert, language partition reverted [C] | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.33% ± 0.58 | 92.50% ± 2.79 |
| freeze-then-train [A_inv] | 11.83% ± 18.76 | 28.83% ± 11.25 | 86.67% ± 14.89 | 5.40% ± 8.75 |
| train-then-revert [A_inv] | 32.67% ± 7.97 | 32.67% ± 7.97 | 70.83% ± 5.97 | 17.87% ± 13.92 |
| task expert, language partition reverted [A_inv] | 27.67% ± 8.46 | 28.00% ± 8.05 | 80.00% ± 11.63 | 17.63% ± 12.55 |
| freeze-then-train [C_inv] | 13.00% ± 13.31 | 23.67% ± 3.82 | 60.17% ± 19.37 | 4.23% ± 4.47 |
| train-then-revert [C_inv] | 17.00% ± 12.29 | 18.00% ± 11.27 | 22.83% ± 13.87 | 12.47% ± 10.00 |
| task expert, language partition reverted [C_inv] | 16.83% ± 6.45 | 16.83% ± 6.45 | 28.00% ± 12.76 | 18.63% ± 10.78 |
| layer swap b=1 u=0 t=0 | 0.33% ± 0.58 | 0.83% ± 0.76 | 4.00% ± 5.63 | 37.23% ± 31.70 |
| layer swap b=2 u=0 t=0 | 0.50% ± 0.87 | 0.50% ± 0.87 | 0.83% ± 1.44 | 86.50% ± 3.77 |
| layer swap b=1 u=1 t=0 | 1.33% ± 1.53 | 1.50% ± 1.32 | 4.33% ± 6.66 | 47.33% ± 37.03 |
| layer swap b=2 u=1 t=0 | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.17% ± 0.29 | 93.77% ± 1.55 |
| layer swap b=1 u=1 t=1 | 0.50% ± 0.50 | 0.50% ± 0.50 | 0.83% ± 1.44 | 87.83% ± 2.92 |
| layer swap b=2 u=1 t=1 | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 97.47% ± 1.11 |
| soup | 5.00% ± 3.12 | 5.00% ± 3.12 | 10.67% ± 8.61 | 71.73% ± 13.18 |
| soup (magnitude) | 1.00% ± 1.00 | 1.00% ± 1.00 | 1.33% ± 1.53 | 86.33% ± 3.78 |
| task arithmetic λ=0.5 | 5.00% ± 3.12 | 5.00% ± 3.12 | 10.67% ± 8.61 | 71.73% ± 13.18 |
| task arithmetic λ=1.0 | 12.33% ± 18.01 | 21.50% ± 12.62 | 31.00% ± 27.03 | 6.37% ± 10.59 |
| TIES density=0.2 | 7.33% ± 5.01 | 7.33% ± 5.01 | 11.83% ± 10.50 | 62.57% ± 14.92 |
| DARE drop=0.5 | 9.17% ± 14.18 | 19.67% ± 12.33 | 30.17% ± 25.80 | 4.63% ± 7.85 |
| MAET | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 98.70% ± 0.10 |

Against the papers' findings, in this testbed:
  * Layer swapping is not the best method but among the worst (goal <= 1.33%): the swap
    that keeps the task expert's middle keeps the language but loses the task (task
    <= 4.33%). The heatmaps (delta_task_expert.png, delta_language_expert.png) show why:
    the language expert changed the top blocks and the head, as in the layer-swapping
    paper's figure 2, but the task expert changed blocks 1-5 and the head too; a
    6-block model trained from scratch does not keep the task in the middle blocks.
  * Simultaneous partition training is not second (goal ~1%): with half its steps and
    part of the parameters for the task it barely learns the task in 800 steps
    (task 1.67-39.83%; 2 of its 12 runs, and 2 of the 3 partial task experts [A], had
    their best validation score at the last step: longer budgets would move them).
  * Train-then-revert >= freeze-then-train holds for the inverse presets on the goal
    (A_inv 32.67% vs 11.83%, the best method overall; C_inv 17.00% vs 13.00%) and fails
    for A and C (0.00% vs 10.17%, 0.33% vs 17.00%). On the task ability itself (the
    paper's Table 3.3 measures the math expert) freezing beats reverting for every preset
    (e.g. C: partial task expert 82.50% vs task expert with its language partition reset
    0.33%): the full task expert's change is spread over the whole model, so resetting
    any partition removes it.
  * The task expert alone transfers 19.00% of the goal, and data mixing, which sees "+"
    only with the source tag, transfers almost nothing (1.67%) while keeping both
    abilities (99.33% / 98.63%): trained together, the model learns that "+" is answered
    in standard digits.
"""

import ml_collections

from configs import common

SOURCE, TARGET = "standard", "letter"
OTHER_OPS = ("max", "min", "double", "add_one", "copy")


def parts(ops, language, binary: int, unary: int):
  """Mixture parts (operation, language, count): `binary` examples of each two-operand
  operation and `unary` of each one-operand operation (3-digit operands: 900 exist, fewer
  once the held-out ones are set aside)."""
  return tuple((op, language, binary if op in ("add", "add_digit", "max", "min") else unary) for op in ops)


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "merge_testbed"
  c.task = "arithmetic"
  c.seed = 0
  c.num_seeds = 3

  c.arithmetic = ml_collections.ConfigDict(dict(min_digits=3, max_digits=3, seed=0, num_test=200, num_val=64))
  c.languages = ml_collections.ConfigDict(dict(source=SOURCE, target=TARGET))
  c.task_op = "add_digit"
  c.other_ops = OTHER_OPS
  c.data = ml_collections.ConfigDict(dict(
      base=parts(OTHER_OPS, SOURCE, 2000, 500) + parts(OTHER_OPS, TARGET, 30, 30),
      task=(("add_digit", SOURCE, 2000),),
      language=parts(OTHER_OPS, TARGET, 2000, 500),
      source_language=parts(OTHER_OPS, SOURCE, 2000, 500)))

  c.model = common.model(num_layers=6, num_heads=4, d_model=64, block_size=16, pos_embedding="rope")
  c.base = ml_collections.ConfigDict()
  c.base.train = common.train(batch_size=64, steps=2000, eval_every=250, patience=100, checkpoint_every=500)
  c.base.opt = common.opt(c.base.train, peak_lr=2e-3, warmup_steps=200)
  c.finetune = ml_collections.ConfigDict()
  c.finetune.train = common.train(batch_size=32, steps=800, eval_every=100, patience=3, min_steps=400,
                                  checkpoint_every=200)
  c.finetune.opt = common.opt(c.finetune.train, peak_lr=3e-4, warmup_steps=50)

  # presets of the modular-training paper (section 3.3), [C] bottom 6 / top 2 of 32 layers
  # scaled to 6 blocks; embeddings and head belong to the language partition
  c.partition = ml_collections.ConfigDict(dict(presets=("A", "C", "A_inv", "C_inv"), bottom=2, top=1,
                                               embeddings="language", head="language"))
  c.simultaneous = ml_collections.ConfigDict(dict(presets=("A", "C"), steps_per_switch=(1, 10)))
  c.merge = ml_collections.ConfigDict(dict(
      swaps=("1,0,0", "2,0,0", "1,1,0", "2,1,0", "1,1,1", "2,1,1"),  # bottom,top,transition (each side)
      non_block="average",  # the layer-swapping paper: embeddings and head averaged
      task_arithmetic=(0.5, 1.0), ties_density=0.2, dare_drop=0.5,
      maet=dict(alpha=0.8, beta=0.2, key_ratio=0.05, tensor_ratio=0.8, gamma=0.2, eta=1.0),
      heatmap_threshold=0.0))  # 0: merge.default_threshold (median row change)
  # LoRA versions of the recipes (xlt.testbed_peft): rsLoRA rank 8, alpha 16 (scale 5.7) on every
  # attn / mlp projection. Learning rate from a 1-seed probe (base 1200 steps, fine-tunes 400):
  # at 2e-3 simultaneous LoRA diverged (loss 0.6 -> 2.7, every score ~0) while the other LoRA
  # recipes learned; at 5e-4 all are stable (LoRA task expert: task 100%, goal 0% / 20.5% any script)
  c.lora = ml_collections.ConfigDict(dict(enabled=True, rank=8, alpha=16.0, presets=("C", "A_inv"),
                                          simultaneous_presets=("C",), steps_per_switch=(1,), swaps=("2,1,0", "1,1,0")))
  c.lora.train = common.train(batch_size=32, steps=800, eval_every=100, patience=3, min_steps=400,
                              checkpoint_every=200)
  c.lora.opt = common.opt(c.lora.train, peak_lr=5e-4, warmup_steps=50)
  # MAET with trained neurons: short runs locate the top 5% rows (the paper's key neurons), then the
  # ability and source-language models train on them only (c.finetune's budget)
  c.maet_neurons = ml_collections.ConfigDict(dict(enabled=True, key_ratio=0.05))
  c.maet_neurons.short = ml_collections.ConfigDict()
  c.maet_neurons.short.train = common.train(batch_size=32, steps=100, eval_every=100, checkpoint_every=100)
  c.maet_neurons.short.opt = common.opt(c.maet_neurons.short.train, peak_lr=3e-4, warmup_steps=10)
  c.eval = common.eval_(batch_size=512)
  c.mesh = common.mesh()
  return c
