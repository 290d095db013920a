"""xlt's recipes on a pretrained model (xlt.experiments.finetune): from a Hugging Face base
directory (Llama, Mistral, Qwen, Gemma, GPT-2; configs/llama_base.py makes one with no
download), a task expert and a language expert fine-tuned on your jsonl files
(prompt/completion or chat messages, each with a validation split and early stopping on its
loss), the partial experts of a frozen partition
([A] / [C] scaled to the depth, or declared rules), optionally simultaneous alternation,
LoRA (full, partial, simultaneous; LoRA freeze-then-train and layer swaps) and trained
neurons (xlt.experiments.finetune_peft), then freeze-then-train, train-then-revert and the
merges of `merges`:

  python -m xlt.main --config=configs/finetune.py --workdir=runs/ft \\
      --config.base=path/to/Llama-3.2-1B \\
      --config.data.task=task.jsonl --config.data.language=language.jsonl \\
      --config.partition.presets="('C',)" \\
      --config.merges="('layer_swap bottom=1 top=1', 'ties density=0.5')"
  python -m xlt.generate --model="runs/ft/models/layer_swap_bottom_1_top_1" \\
      --prompts=prompts.jsonl --output=out.jsonl [--answers=answers.jsonl --match=exact]

Every trained or merged model is a Hugging Face directory runs/ft/models/<name> (transformers
loads it; the base's tokenizer is copied in); runs/ft/table.md, results.json and summary.json
hold each model's validation loss on both datasets (and exact match on `eval.prompts`, and the
lm-eval scores of `eval.tasks`: docs/evaluate.md). The
same command again resumes a killed run, or reuses a finished one. No reference numbers: the
result depends on your base and data.
"""

import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "finetune"
  c.kind, c.task = "finetune", "finetune"  # the experiment (xlt.experiments), its data
  c.seed = 0
  c.base = ""  # a Hugging Face model directory (config.json, safetensors, tokenizer)
  c.dtype = ""  # the computation's dtype (and the parameters', unless param_dtype): "" = the checkpoint's
  # the parameters' dtype: "" = dtype's (set alone, both); dtype=bfloat16 param_dtype=float32: bf16 compute
  c.param_dtype = ""
  # jsonl files of {"prompt", "completion"} or {"messages"} (xlt.data.sft); loss on the responses
  c.data = ml_collections.ConfigDict(dict(task="", language="", block_size=512, val_fraction=0.05, seed=0,
                                          packing=True))
  # early stopping on minus the validation loss: a gain counts from min_delta = 0. update="auto": the
  # optimizer's update vmapped over the stacked state, each leaf updated in place; in the map
  # XLA:CPU copied a pretrained model's moments every step (benchmarks/finetune_step.py
  # --update=map). Its values differ from the map's by float rounding, and this kind has no
  # committed results to reproduce bit for bit (configs/common.py's train()).
  c.train = common.train(batch_size=8, steps=1000, eval_every=50, patience=3, min_delta=0.0, checkpoint_every=100,
                         log_every=10, update="auto")
  # opt.state_dtype="float32": Adam's moments in float32 for bfloat16 parameters (every stage's optimizer)
  c.opt = common.opt(c.train, peak_lr=1e-5, warmup_steps=20, weight_decay=0.0)
  # True: every weight recipe in one ensemble (one compiled step, E models' memory on the
  # device); False: one recipe after another (one model's memory)
  c.together = False
  # partitions: presets A, C, A_inv, C_inv with bottom / top blocks (-1: the paper's [C], 6 and 2
  # of 32 blocks, scaled to the depth), and/or declared rule sets {name: (rule, ...)}
  # (xlt.partition.labels: label "task" / "language", blocks, kinds, names; `rest` labels the others)
  c.partition = ml_collections.ConfigDict(dict(presets=("C",), bottom=-1, top=-1, embeddings="language",
                                               head="language", rules=ml_collections.ConfigDict(), rest=""))
  # the two datasets take turns (K steps each), each training its label of the partition
  c.simultaneous = ml_collections.ConfigDict(dict(presets=(), steps_per_switch=(1,)))
  # LoRA experts (adapters on every attn / mlp projection, the base frozen); with presets (partitions of
  # c.partition) the partial LoRA experts train only their label's adapters, simultaneous_presets
  # alternate the datasets (steps_per_switch steps each, each its label's adapters); LoRA
  # freeze-then-train per preset; swaps: LoRA layer swaps "bottom,top,transition"
  c.lora = ml_collections.ConfigDict(dict(enabled=False, rank=8, alpha=16.0, presets=(), simultaneous_presets=(),
                                          steps_per_switch=(1,), swaps=()))
  c.lora.train = common.train(batch_size=8, steps=1000, eval_every=50, patience=3, min_delta=0.0,
                              checkpoint_every=100, log_every=10, update="auto")
  c.lora.opt = common.opt(c.lora.train, peak_lr=2e-4, warmup_steps=20, weight_decay=0.0)
  # trained neurons: a short run per dataset of `experts` locates its top key_ratio rows (neurons) by
  # change; "neuron <dataset> expert" then fine-tunes the base on those rows only (c.train, c.opt)
  c.neurons = ml_collections.ConfigDict(dict(enabled=False, key_ratio=0.05, experts=("task",)))
  c.neurons.short = ml_collections.ConfigDict()
  c.neurons.short.train = common.train(batch_size=8, steps=100, eval_every=100, checkpoint_every=100, log_every=10,
                                       update="auto")
  c.neurons.short.opt = common.opt(c.neurons.short.train, peak_lr=1e-5, warmup_steps=10, weight_decay=0.0)
  # any method of xlt.merge.registry over task_expert, language_expert, experts, base
  # (python -m xlt.merge --list_methods), each "method option=value ..."
  c.merges = ("layer_swap bottom=1 top=1", "ties density=0.5")
  # prompts: jsonl files of {"prompt" or "messages", "answer"}, scored by greedy exact match
  # eval.tasks: lm-eval tasks (docs/evaluate.md) scored on every model, e.g. ("xlt_mgsm_direct_de",)
  # with eval.lm_eval.metadata='{"mgsm_dir": "data/mgsm"}'; () = off
  c.eval = common.eval_with_tasks(batch_size=16)
  c.eval.prompts = ()
  c.eval.chat = False
  c.eval.max_new = 64
  c.device_memory_gb = 0.0  # > 0: fail before training when the estimate is over it
  # on a CPU, one device using every core (xlt.cpu_devices splits the cores for small models):
  # a pretrained model's products fill the cores alone, and split over devices its step keeps
  # a copy of the whole training state per device and updates each (benchmarks/finetune_step.py
  # --xlt_mesh=data measures the split; docs/speed.md). Accelerators: every device.
  c.mesh = common.mesh(cpu_devices=1)
  return c
