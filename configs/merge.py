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

Obtained (2026-11-25, commit bc80f42, an AMD EPYC with 2 cores and AVX-512, nothing else
running; 3 seeds, 918 s of training and scoring, 15.4 min wall with `/usr/bin/time`: base
170 s, 48 full fine-tunes + 21 LoRA + 6 trained-neuron runs 709 s, merges and scoring 39 s;
test exact match on 200 problems per set, mean ± std over seeds; `language` is the mean over
the five other operations in letters):

| model | goal: add_digit/letter | goal, any script | task: add_digit/standard | language: max/letter, min/letter, double/letter, add_one/letter, copy/letter |
|---|---|---|---|---|
| base | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 93.57% ± 2.35 |
| task expert | 11.83% ± 13.16 | 17.67% ± 8.25 | 100.00% ± 0.00 | 6.53% ± 9.32 |
| language expert | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.00% ± 0.00 | 97.93% ± 0.90 |
| source-language expert | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.50% ± 0.87 | 78.23% ± 8.76 |
| data mixing | 4.17% ± 4.62 | 4.17% ± 4.62 | 99.83% ± 0.29 | 98.33% ± 0.75 |
| partial task expert [A] | 6.33% ± 5.69 | 6.83% ± 4.86 | 64.33% ± 23.25 | 24.30% ± 10.66 |
| partial language expert [A] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 97.40% ± 1.04 |
| partial task expert [C] | 4.50% ± 1.32 | 4.50% ± 1.32 | 86.67% ± 20.08 | 42.67% ± 16.27 |
| partial language expert [C] | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.50% ± 0.50 | 97.17% ± 0.74 |
| partial task expert [A_inv] | 19.83% ± 21.39 | 25.33% ± 14.87 | 99.67% ± 0.58 | 12.03% ± 12.05 |
| partial language expert [A_inv] | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.17% ± 0.29 | 98.10% ± 0.82 |
| partial task expert [C_inv] | 5.67% ± 9.81 | 25.67% ± 18.58 | 99.50% ± 0.87 | 4.20% ± 7.27 |
| partial language expert [C_inv] | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.17% ± 0.29 | 98.27% ± 0.84 |
| simultaneous [A] k=1 | 0.17% ± 0.29 | 0.17% ± 0.29 | 8.00% ± 12.13 | 97.23% ± 2.46 |
| simultaneous [A] k=10 | 0.00% ± 0.00 | 0.00% ± 0.00 | 14.17% ± 11.02 | 97.90% ± 0.87 |
| simultaneous [C] k=1 | 0.00% ± 0.00 | 0.00% ± 0.00 | 47.67% ± 27.25 | 97.47% ± 0.67 |
| simultaneous [C] k=10 | 0.00% ± 0.00 | 0.00% ± 0.00 | 47.17% ± 26.63 | 97.17% ± 0.60 |
| freeze-then-train [A] | 3.83% ± 3.75 | 5.50% ± 1.80 | 26.67% ± 7.09 | 22.93% ± 10.87 |
| train-then-revert [A] | 0.50% ± 0.50 | 0.50% ± 0.50 | 0.33% ± 0.58 | 97.50% ± 1.21 |
| task expert, language partition reverted [A] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.00% ± 0.00 | 93.17% ± 2.80 |
| freeze-then-train [C] | 8.50% ± 5.41 | 8.50% ± 5.41 | 64.33% ± 23.80 | 48.63% ± 10.45 |
| train-then-revert [C] | 0.67% ± 0.58 | 0.67% ± 0.58 | 1.00% ± 0.50 | 94.97% ± 2.14 |
| task expert, language partition reverted [C] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.83% ± 1.04 | 88.37% ± 5.50 |
| freeze-then-train [A_inv] | 31.17% ± 26.35 | 34.17% ± 22.94 | 78.67% ± 24.83 | 11.90% ± 10.62 |
| train-then-revert [A_inv] | 28.33% ± 20.59 | 28.33% ± 20.59 | 56.83% ± 36.85 | 13.90% ± 7.11 |
| task expert, language partition reverted [A_inv] | 20.67% ± 18.15 | 22.50% ± 15.02 | 56.33% ± 39.84 | 9.70% ± 11.16 |
| freeze-then-train [C_inv] | 8.50% ± 9.04 | 28.67% ± 20.68 | 65.83% ± 28.94 | 3.97% ± 6.61 |
| train-then-revert [C_inv] | 22.33% ± 15.09 | 22.33% ± 15.09 | 33.00% ± 21.79 | 21.20% ± 11.16 |
| task expert, language partition reverted [C_inv] | 13.83% ± 12.19 | 14.67% ± 10.77 | 37.50% ± 25.53 | 10.30% ± 10.12 |
| layer swap b=1 u=0 t=0 | 1.33% ± 1.89 | 1.83% ± 1.53 | 6.67% ± 5.11 | 33.77% ± 29.27 |
| layer swap b=2 u=0 t=0 | 0.33% ± 0.58 | 0.33% ± 0.58 | 1.50% ± 0.87 | 73.73% ± 25.53 |
| layer swap b=1 u=1 t=0 | 3.67% ± 4.04 | 4.33% ± 3.21 | 6.50% ± 5.29 | 44.63% ± 37.75 |
| layer swap b=2 u=1 t=0 | 0.33% ± 0.58 | 0.50% ± 0.50 | 1.33% ± 0.58 | 87.07% ± 14.93 |
| layer swap b=1 u=1 t=1 | 0.83% ± 0.76 | 1.00% ± 0.50 | 1.67% ± 0.76 | 79.67% ± 18.67 |
| layer swap b=2 u=1 t=1 | 0.33% ± 0.58 | 0.33% ± 0.58 | 1.00% ± 0.50 | 94.23% ± 6.03 |
| soup | 8.17% ± 8.02 | 8.17% ± 8.02 | 10.00% ± 8.67 | 72.47% ± 14.87 |
| soup (magnitude) | 2.33% ± 1.89 | 2.33% ± 1.89 | 5.00% ± 4.33 | 89.17% ± 8.05 |
| task arithmetic λ=0.5 | 8.17% ± 8.02 | 8.17% ± 8.02 | 10.00% ± 8.67 | 72.47% ± 14.87 |
| task arithmetic λ=1.0 | 33.00% ± 10.69 | 33.50% ± 10.11 | 57.17% ± 2.75 | 11.17% ± 13.02 |
| TIES density=0.2 | 4.50% ± 0.50 | 4.67% ± 0.58 | 11.17% ± 7.51 | 49.67% ± 22.03 |
| DARE drop=0.5 | 25.17% ± 7.29 | 25.50% ± 6.73 | 45.83% ± 3.88 | 8.63% ± 9.16 |
| MAET | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.00% ± 0.00 | 97.97% ± 0.95 |
| LoRA task expert | 15.67% ± 14.46 | 19.33% ± 9.00 | 100.00% ± 0.00 | 4.87% ± 6.52 |
| LoRA language expert | 0.33% ± 0.29 | 0.33% ± 0.29 | 0.50% ± 0.87 | 98.23% ± 0.72 |
| partial LoRA task expert [C] | 2.17% ± 2.93 | 5.00% ± 0.87 | 93.50% ± 9.96 | 13.87% ± 17.79 |
| partial LoRA language expert [C] | 0.00% ± 0.00 | 0.00% ± 0.00 | 0.17% ± 0.29 | 98.40% ± 0.70 |
| partial LoRA task expert [A_inv] | 25.33% ± 9.39 | 25.33% ± 9.39 | 99.00% ± 1.73 | 6.67% ± 5.77 |
| partial LoRA language expert [A_inv] | 0.17% ± 0.29 | 0.17% ± 0.29 | 0.00% ± 0.00 | 96.00% ± 1.75 |
| simultaneous LoRA [C] k=1 | 0.17% ± 0.29 | 0.17% ± 0.29 | 40.50% ± 33.65 | 85.73% ± 6.86 |
| LoRA layer swap b=2 u=1 t=0 | 0.33% ± 0.29 | 0.33% ± 0.29 | 0.50% ± 0.87 | 93.40% ± 3.56 |
| LoRA layer swap b=1 u=1 t=0 | 3.33% ± 4.54 | 3.33% ± 4.54 | 2.83% ± 3.01 | 45.50% ± 36.61 |
| LoRA freeze-then-train [C] | 4.00% ± 4.09 | 5.17% ± 3.82 | 60.67% ± 13.55 | 19.33% ± 19.03 |
| LoRA freeze-then-train [A_inv] | 29.33% ± 10.20 | 29.33% ± 10.20 | 93.33% ± 6.79 | 8.57% ± 4.31 |
| MAET ability model (trained neurons) | 2.33% ± 3.21 | 3.17% ± 3.01 | 46.83% ± 9.29 | 18.90% ± 10.11 |
| MAET (trained neurons) | 0.33% ± 0.58 | 0.33% ± 0.58 | 0.17% ± 0.29 | 97.87% ± 0.91 |

What it shows, against the papers:
  * No recipe's rank survives a rerun (last bullet). In this run the highest goal scores
    are task arithmetic λ=1.0 33.00% ± 10.69, freeze-then-train [A_inv] 31.17% ± 26.35,
    LoRA freeze-then-train [A_inv] 29.33% ± 10.20, train-then-revert [A_inv] 28.33% ±
    20.59 and DARE 25.17% ± 7.29, against the task expert alone at 11.83% ± 13.16; in the
    run before (13851aa) the same recipes gave 6.50, 8.50, 3.17, 9.17 and 7.50 against
    3.83. Three seeds cannot rank these methods.
  * The "any script" column (a right sum in either script) is 0-20 points above the goal
    column here, most for [C_inv] (partial task expert 5.67% vs 25.67%, freeze-then-train
    8.50% vs 28.67%): the sum computed in the target language's context but written in the
    source script. In 13851aa's run the recipes keeping the task expert's outer blocks
    ([A_inv], [C_inv]) were 20-40 points above their goal scores.
  * Layer swapping is among the worst (goal <= 3.67%): the swaps keep the language (up to
    94.23%) and lose the task (<= 6.67%). The heatmaps (delta_task_expert.png,
    delta_language_expert.png) show why: the language expert changed the top blocks and
    the head, as in the layer-swapping paper's figure 2, but the task expert changed every
    block and the head too; a 6-block model trained from scratch does not keep the task in
    its middle blocks.
  * Simultaneous partition training learns the task partly in 800 steps (task <= 47.67%)
    and transfers nothing (goal <= 0.17%); 3 of its 12 runs had their best validation score
    at the last step.
  * Train-then-revert >= freeze-then-train holds only for [C_inv] (22.33% vs 8.50%) and
    fails for A, C and A_inv (0.50 vs 3.83, 0.67 vs 8.50, 28.33 vs 31.17); in 13851aa's run
    it held only for [A_inv].
  * LoRA (rank 8) learns as much as full fine-tuning on its own ability (task 100.00% vs
    100.00%, language 98.23% vs 97.93%); the LoRA layer swap b=2 u=1 keeps 93.40% of the
    language against the full swap's 87.07%.
  * MAET with trained neurons: the ability model, trained on its key entries, learns the
    task to 46.83%; the merged model keeps the language (97.87%) and, like MAET on whole
    tensors, has neither the task nor the goal.
  * Reproducibility: three runs of this config (same data, recipes and seeds) gave the
    task expert 19.00% ± 2.29 on the goal (2026-11-22), 3.83% ± 6.64 (13851aa, 2026-11-23)
    and 11.83% ± 13.16 (here). Between them only the float rounding of training changed
    (ensemble members stepped with lax.map instead of vmapped, attention normalised after
    the value product; here xlt/matmul.py's backward passes and 2 CPU devices on another
    machine's kernels). The goal scores of this testbed are that sensitive: read
    differences smaller than the spread between these runs as noise.
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
