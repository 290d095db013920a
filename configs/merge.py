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
train on those rows only, then MAET), in the same table below.

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

Obtained (2026-11-23, commit 13851aa, this 2-core CPU shared with other work while it ran;
3 seeds, 1263 s wall: base 203 s, 48 full fine-tunes + 21 LoRA + 6 trained-neuron runs
1016 s, merges and scoring 44 s; test exact match on 200 problems per set, mean ± std over
seeds; `language` is the mean over the five other operations in letters):

| model | goal: add_digit/letter | goal, any script | task: add_digit/standard | language: max/letter, min/letter, double/letter, add_one/letter, copy/letter |
|---|---|---|---|---|
| base | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.00% ± 0.00 | 95.27% ± 1.02 |
| task expert | 3.83% ± 6.64 | 32.50% ± 40.78 | 99.83% ± 0.29 | 6.33% ± 10.88 |
| language expert | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.00% ± 0.00 | 98.17% ± 0.46 |
| source-language expert | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.33% ± 0.58 | 75.63% ± 22.97 |
| data mixing | 1.50% ± 0.87 | 1.50% ± 0.87 | 100.00% ± 0.00 | 98.63% ± 0.35 |
| partial task expert [A] | 3.00% ± 4.36 | 4.83% ± 3.75 | 56.00% ± 20.81 | 22.87% ± 25.42 |
| partial language expert [A] | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.00% ± 0.00 | 98.40% ± 0.75 |
| partial task expert [C] | 1.67% ± 2.89 | 15.17% ± 22.08 | 91.33% ± 7.65 | 34.83% ± 30.08 |
| partial language expert [C] | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.17% ± 0.29 | 98.43% ± 0.51 |
| partial task expert [A_inv] | 5.17% ± 8.95 | 42.00% ± 45.04 | 99.67% ± 0.29 | 6.10% ± 10.57 |
| partial language expert [A_inv] | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.00% ± 0.00 | 98.60% ± 0.10 |
| partial task expert [C_inv] | 8.33% ± 14.43 | 41.00% ± 26.85 | 99.67% ± 0.58 | 5.07% ± 8.69 |
| partial language expert [C_inv] | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.00% ± 0.00 | 98.43% ± 0.21 |
| simultaneous [A] k=1 | 0.00% ± 0.00 | 0.00% ± 0.00 | 6.17% ± 3.82 | 98.43% ± 0.23 |
| simultaneous [A] k=10 | 0.00% ± 0.00 | 0.00% ± 0.00 | 8.33% ± 5.20 | 98.73% ± 0.15 |
| simultaneous [C] k=1 | 1.00% ± 1.32 | 1.00% ± 1.32 | 31.50% ± 19.98 | 97.27% ± 0.29 |
| simultaneous [C] k=10 | 1.33% ± 1.89 | 1.33% ± 1.89 | 30.33% ± 19.41 | 97.53% ± 0.38 |
| freeze-then-train [A] | 5.00% ± 8.23 | 6.33% ± 7.29 | 36.83% ± 34.34 | 28.87% ± 29.90 |
| train-then-revert [A] | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.17% ± 0.29 | 98.27% ± 0.32 |
| task expert, language partition reverted [A] | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.00% ± 0.00 | 94.83% ± 0.38 |
| freeze-then-train [C] | 1.83% ± 3.18 | 17.17% ± 25.12 | 62.00% ± 26.63 | 39.87% ± 34.41 |
| train-then-revert [C] | 0.33% ± 0.58 | 0.33% ± 0.58 | 1.17% ± 1.04 | 93.63% ± 1.16 |
| task expert, language partition reverted [C] | 0.50% ± 0.87 | 0.50% ± 0.87 | 1.33% ± 0.76 | 87.63% ± 3.65 |
| freeze-then-train [A_inv] | 8.50% ± 14.29 | 40.50% ± 43.85 | 94.50% ± 5.63 | 6.30% ± 10.65 |
| train-then-revert [A_inv] | 9.17% ± 7.94 | 33.17% ± 33.63 | 73.83% ± 20.23 | 13.40% ± 19.04 |
| task expert, language partition reverted [A_inv] | 4.33% ± 5.48 | 25.50% ± 32.69 | 76.83% ± 23.25 | 12.37% ± 19.97 |
| freeze-then-train [C_inv] | 10.33% ± 17.90 | 39.33% ± 10.41 | 87.33% ± 8.25 | 5.57% ± 9.56 |
| train-then-revert [C_inv] | 5.00% ± 4.77 | 9.83% ± 4.25 | 37.33% ± 31.76 | 16.73% ± 22.84 |
| task expert, language partition reverted [C_inv] | 2.00% ± 2.00 | 7.50% ± 5.63 | 36.00% ± 31.18 | 14.13% ± 22.77 |
| layer swap b=1 u=0 t=0 | 1.33% ± 1.53 | 1.33% ± 1.53 | 9.83% ± 0.76 | 58.27% ± 19.33 |
| layer swap b=2 u=0 t=0 | 0.50% ± 0.87 | 0.50% ± 0.87 | 2.17% ± 2.57 | 75.13% ± 12.95 |
| layer swap b=1 u=1 t=0 | 1.17% ± 2.02 | 1.17% ± 2.02 | 5.00% ± 3.04 | 72.17% ± 12.68 |
| layer swap b=2 u=1 t=0 | 0.67% ± 1.15 | 0.67% ± 1.15 | 1.33% ± 1.15 | 90.73% ± 3.57 |
| layer swap b=1 u=1 t=1 | 0.83% ± 1.44 | 0.83% ± 1.44 | 3.00% ± 1.80 | 92.03% ± 2.55 |
| layer swap b=2 u=1 t=1 | 0.50% ± 0.87 | 0.50% ± 0.87 | 0.67% ± 0.76 | 97.33% ± 0.87 |
| soup | 2.00% ± 2.65 | 2.00% ± 2.65 | 8.83% ± 2.89 | 72.47% ± 24.71 |
| soup (magnitude) | 0.67% ± 1.15 | 0.67% ± 1.15 | 2.33% ± 1.04 | 96.90% ± 1.44 |
| task arithmetic λ=0.5 | 2.00% ± 2.65 | 2.00% ± 2.65 | 8.83% ± 2.89 | 72.47% ± 24.71 |
| task arithmetic λ=1.0 | 6.50% ± 10.40 | 29.00% ± 30.15 | 66.67% ± 29.29 | 8.37% ± 12.96 |
| TIES density=0.2 | 3.17% ± 4.25 | 3.17% ± 4.25 | 16.33% ± 2.52 | 58.10% ± 23.05 |
| DARE drop=0.5 | 7.50% ± 10.11 | 19.17% ± 14.75 | 56.50% ± 29.64 | 7.67% ± 10.92 |
| MAET | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.17% ± 0.29 | 98.30% ± 0.46 |
| LoRA task expert | 6.17% ± 6.83 | 33.17% ± 41.64 | 99.50% ± 0.50 | 3.63% ± 4.97 |
| LoRA language expert | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.00% ± 0.00 | 98.90% ± 0.00 |
| partial LoRA task expert [C] | 1.67% ± 2.08 | 17.83% ± 26.60 | 94.33% ± 6.79 | 21.40% ± 18.79 |
| partial LoRA language expert [C] | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.00% ± 0.00 | 98.57% ± 0.06 |
| partial LoRA task expert [A_inv] | 2.67% ± 4.62 | 20.67% ± 29.14 | 99.50% ± 0.87 | 3.20% ± 5.20 |
| partial LoRA language expert [A_inv] | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.00% ± 0.00 | 97.43% ± 0.45 |
| simultaneous LoRA [C] k=1 | 0.00% ± 0.00 | 0.00% ± 0.00 | 23.33% ± 15.31 | 85.63% ± 9.01 |
| LoRA layer swap b=2 u=1 t=0 | 0.33% ± 0.58 | 0.33% ± 0.58 | 1.83% ± 1.26 | 63.50% ± 43.87 |
| LoRA layer swap b=1 u=1 t=0 | 0.33% ± 0.58 | 2.83% ± 4.07 | 9.00% ± 3.04 | 19.70% ± 31.06 |
| LoRA freeze-then-train [C] | 3.67% ± 4.37 | 22.83% ± 30.17 | 70.83% ± 19.04 | 25.77% ± 22.81 |
| LoRA freeze-then-train [A_inv] | 3.17% ± 5.48 | 19.83% ± 26.55 | 94.33% ± 8.10 | 2.83% ± 4.23 |
| MAET ability model (trained neurons) | 3.50% ± 2.78 | 3.67% ± 3.01 | 51.00% ± 9.73 | 24.43% ± 7.97 |
| MAET (trained neurons) | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.17% ± 0.29 | 98.30% ± 0.44 |

What it shows, against the papers:
  * Nothing moves the ability to the target language reliably. The goal means are all
    within about one std of each other and of the task expert alone (3.83% ± 6.64): the
    highest are freeze-then-train [C_inv] 10.33% ± 17.90, train-then-revert [A_inv]
    9.17% ± 7.94, freeze-then-train [A_inv] 8.50% ± 14.29, DARE 7.50% ± 10.11. Three seeds
    cannot rank these methods.
  * The "any script" column separates more: recipes that keep the task expert's outer
    blocks (partial task experts [A_inv] 42.00% and [C_inv] 41.00%, freeze-then-train
    [A_inv] 40.50% and [C_inv] 39.33% ± 10.41) compute the right sum in the target
    language's context but write it in the source script.
  * Layer swapping is among the worst (goal <= 1.33%): the swaps keep the language (up to
    97.33%) and lose the task (<= 9.83%). The heatmaps (delta_task_expert.png,
    delta_language_expert.png) show why: the language expert changed the top blocks and
    the head, as in the layer-swapping paper's figure 2, but the task expert changed every
    block and the head too; a 6-block model trained from scratch does not keep the task in
    its middle blocks.
  * Simultaneous partition training barely learns the task in 800 steps (task <= 31.50%,
    goal <= 1.33%); 8 of its 12 runs (and all 3 partial task experts [A]) had their best
    validation score at the last step: longer budgets would move them.
  * Train-then-revert >= freeze-then-train holds only for [A_inv] (9.17% vs 8.50%, within
    noise) and fails for A, C and C_inv.
  * LoRA (rank 8) learns as much as full fine-tuning on its own ability (task 99.50% vs
    99.83%, language 98.90% vs 98.17%) and transfers as little; the LoRA layer swap keeps
    less of the language than the full one (63.50% ± 43.87 vs 90.73% for b=2 u=1).
  * MAET with trained neurons: the ability model, trained on its 21.9% key entries, learns
    the task to 51.00%; the merged model keeps the language (98.30%) and, like MAET on
    whole tensors, has neither the task nor the goal.
  * Reproducibility: an earlier run of this config (2026-11-22, same data, recipes and
    seeds) gave the task expert 19.00% ± 2.29 on the goal and train-then-revert [A_inv]
    32.67% ± 7.97, here 3.83% ± 6.64 and 9.17% ± 7.94. Between the two runs only the float
    rounding of training changed (ensemble members stepped one after another with lax.map
    instead of vmapped; attention normalised after the value product). The goal scores of
    this testbed are that sensitive: read differences smaller than the spread between
    these two runs as noise.
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
