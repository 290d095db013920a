"""The merge testbed: modular training and model merging where the answer is known by
construction (papers: modular fine-tuning and merging, layer swapping, MAET).

  python -m xlt.main --config=configs/merge.py --workdir=runs/merge

A base reads and writes two languages (`standard` digits, the source; `letter` A-J, the
low-resource target); a task expert learns a new operation (add_digit) in the source only; a
language expert learns the other operations in the target only; both replay the base's data
(`finetune.replay`), so each keeps the abilities it was not trained on, as a fine-tune of a
pretrained model does; the goal is the task in the target, which no model trains on. From the
same base, 10 seeds: data mixing, freeze-then-train and train-then-revert for [A] and [C],
simultaneous [C], layer swaps, soups, task arithmetic, TIES, DARE, MAET; each row a mean with
its 95% interval and, on the goal, the paired difference to the best expert.
configs/merge_peft.py adds the inverted presets, LoRA and trained-neuron recipes;
configs/merge_regimes.py maps the goal against how far the experts moved.
Not a table of the papers: no reference numbers; by construction the base and the language
expert score ~0% on the goal. Design, the probes behind it and what it shows: docs/testbed.md.
xlt's latest figures: results/merge.json, docs/results.md.
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
  c.kind, c.task = "testbed", "arithmetic"  # the experiment (xlt.experiments), its data
  c.seed = 0
  # 10 seeds (bases), 1,000 goal problems: sized from the variance of 5-seed runs (docs/testbed.md),
  # as many as fit ~30 minutes on a 2-core CPU; each row reports a 95% interval over seeds
  c.num_seeds = 10

  # the task has 3,240 carrying problems a + d; a one-operand operation has 900 numbers, so the
  # other sets keep 200 each (1,000 per five-operation role)
  c.arithmetic = ml_collections.ConfigDict(dict(min_digits=3, max_digits=3, seed=0, num_test=200, num_val=64,
                                                num_test_by_op={"add_digit": 1000}))
  c.languages = ml_collections.ConfigDict(dict(source=SOURCE, target=TARGET))
  c.task_op = "add_digit"
  c.other_ops = OTHER_OPS
  c.data = ml_collections.ConfigDict(dict(
      base=parts(OTHER_OPS, SOURCE, 2000, 500) + parts(OTHER_OPS, TARGET, 30, 30),
      task=(("add_digit", SOURCE, 2000),),
      language=parts(OTHER_OPS, TARGET, 2000, 500),
      source_language=parts(OTHER_OPS, SOURCE, 2000, 500)))

  c.model = common.model(num_layers=6, num_heads=4, d_model=64, block_size=16, pos_embedding="rope")
  # a base you bring (docs/testbed.md): a Hugging Face model directory xlt.pretrained loads, whose
  # config replaces c.model, the task rendered as text in its tokenizer (xlt.experiments.testbed.text);
  # "": xlt's own base, trained from scratch. base_fluency: first fine-tune it on data.base with
  # c.base's train / opt (False: the loaded model is the base as it is); base_render: "spaced"
  # ("[let] 3 2 7 + 8 =" -> " F D D") or "glued" ("[let] 327 + 8 =" -> " FDD", configs/llama_base.py's text)
  c.base_model = ""
  c.bases_from = ""  # a finished run's workdir: take its bases, do not train (testbed.take_bases)
  c.base_fluency = True
  c.base_render = "spaced"
  c.base = ml_collections.ConfigDict()
  c.base.train = common.train(batch_size=64, steps=2000, eval_every=250, patience=100, checkpoint_every=500)
  c.base.opt = common.opt(c.base.train, peak_lr=2e-3, warmup_steps=200)
  c.finetune = ml_collections.ConfigDict()
  c.finetune.train = common.train(batch_size=32, steps=800, eval_every=100, patience=3, min_steps=400,
                                  checkpoint_every=200)
  c.finetune.opt = common.opt(c.finetune.train, peak_lr=3e-4, warmup_steps=50)
  # replay: each fine-tuning set of n examples gets round(replay * n) examples of the base's data
  # (drawn once, seeded) so experts keep the base's abilities; applies to the full, LoRA and
  # trained-neuron fine-tunes alike. 0: none. By rule on retention alone (docs/testbed.md):
  # 0.5, the smallest probed level whose task expert kept >= 95% on one seed, kept 89.4% over
  # the 5 seeds of a full run, under the 90% line; 1.0 is the next probed level
  c.finetune.replay = 1.0

  # presets of the modular-training paper (section 3.3), [C] bottom 6 / top 2 of 32 layers
  # scaled to 6 blocks; embeddings and head belong to the language partition. The default runs
  # [A] and [C] and simultaneous [C] switching every step; configs/merge_peft.py adds [A_inv],
  # [C_inv], simultaneous [A], k=10, the LoRA and trained-neuron recipes
  c.partition = ml_collections.ConfigDict(dict(presets=("A", "C"), bottom=2, top=1,
                                               embeddings="language", head="language"))
  c.simultaneous = ml_collections.ConfigDict(dict(presets=("C",), steps_per_switch=(1,)))
  c.merge = ml_collections.ConfigDict(dict(
      swaps=("1,0,0", "2,0,0", "1,1,0", "2,1,0", "1,1,1", "2,1,1"),  # bottom,top,transition (each side)
      non_block="average",  # the layer-swapping paper: embeddings and head averaged
      swap_modules=(),  # each swap again with only these kinds swapped ("attn", "mlp", "attn,norm": modules)
      task_arithmetic=(0.5, 1.0), ties_density=0.2, dare_drop=0.5,
      maet=dict(alpha=0.8, beta=0.2, key_ratio=0.05, tensor_ratio=0.8, gamma=0.2, eta=1.0),
      heatmap_threshold=0.0,  # 0: merge.default_threshold (median row change)
      extra=()))  # more registry merges, "method option=value ..." (xlt.merge --list_methods): ("ties density=0.5",)
  # LoRA versions of the recipes (xlt.experiments.testbed.peft): rsLoRA rank 8, alpha 16 (scale 5.7) on every
  # attn / mlp projection. Learning rate from a 1-seed probe (base 1200 steps, fine-tunes 400):
  # at 2e-3 simultaneous LoRA diverged (loss 0.6 -> 2.7, every score ~0) while the other LoRA
  # recipes learned; at 5e-4 all are stable (LoRA task expert: task 100%, goal 0% / 20.5% any script)
  c.lora = ml_collections.ConfigDict(dict(enabled=False, rank=8, alpha=16.0, presets=("C", "A_inv"),
                                          simultaneous_presets=("C",), steps_per_switch=(1,), swaps=("2,1,0", "1,1,0")))
  c.lora.train = common.train(batch_size=32, steps=800, eval_every=100, patience=3, min_steps=400,
                              checkpoint_every=200)
  c.lora.opt = common.opt(c.lora.train, peak_lr=5e-4, warmup_steps=50)
  # MAET with trained neurons: short runs locate the top 5% rows (the paper's key neurons), then the
  # ability and source-language models train on them only (c.finetune's budget)
  c.maet_neurons = ml_collections.ConfigDict(dict(enabled=False, key_ratio=0.05))
  c.maet_neurons.short = ml_collections.ConfigDict()
  c.maet_neurons.short.train = common.train(batch_size=32, steps=100, eval_every=100, checkpoint_every=100)
  c.maet_neurons.short.opt = common.opt(c.maet_neurons.short.train, peak_lr=3e-4, warmup_steps=10)
  c.eval = common.eval_with_tasks(batch_size=512)  # eval.tasks (with base_model): lm-eval on every model
  c.mesh = common.mesh()
  return c
