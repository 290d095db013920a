"""The finetune kind's parameter-efficient recipes (xlt.experiments.finetune_peft) on the tiny
Llama fixture: partial and simultaneous LoRA train only their label's adapters (and moments),
their compositions equal hand-built ones, trained neurons move only the located rows, the
dtype options, config errors, and one run end to end writing every model as a Hugging Face
directory. The tiny config's partition [C]: block_0 language, block_1 task."""

import contextlib
import io
import json
import os

import jax
import numpy as np
import pytest

from test_finetune import _config, _leaves
from safetensors.numpy import load_file

from xlt import lora, neurons, partition, peft_io, pretrained, runner
from xlt import train as train_lib
from xlt.experiments import common as kind_lib
from xlt.experiments import finetune, finetune_peft


@pytest.fixture
def tiny(tmp_path):
  c = _config(tmp_path)
  c.lora.presets, c.lora.simultaneous_presets, c.lora.swaps = ("C",), ("C",), ("1,0,0",)
  c.eval.prompts, c.merges = (), ()
  return c


def _stage(c, name, trained=None):
  prep = finetune.prepare(c, "")
  with contextlib.redirect_stdout(io.StringIO()):
    return prep, next(s for s in finetune.stages(c, prep, trained or {}) if s.name == name)


def _one(stacked, i):
  return jax.tree.map(lambda x: np.asarray(x)[i], stacked)


def _run(prep, stage, i, flags_per_step):
  """Member i of the stage trained one step per entry of `flags_per_step` (its flags):
  the state before the first step and after each."""
  m = stage.members[i]
  state = _one(train_lib.init_state(prep.cfg, stage.tx, [m.seed], jax.tree.map(lambda x: x[i:i + 1],
                                                                                  stage.init_params)), 0)
  step = jax.jit(lambda s, b: train_lib.train_step(s, b, cfg=prep.cfg, tx=stage.tx))
  states = [state]
  for k, flags in enumerate(flags_per_step):
    data = m.phases[k % len(m.phases)] if m.steps_per_phase == 1 else m.phases[0]
    batch = {"tokens": data["tokens"][:4], "loss_mask": data["loss_mask"][:4], "trainable": np.asarray(flags)}
    states.append(jax.device_get(step(states[-1], batch)[0]))
  return states


def _adapter_leaves(state, block):
  """{path: array} of the state's adapters of `block` and of their optimizer-state copies."""
  out = {}
  for tree, what in ((state["params"]["lora"], "adapter"), (state["opt_state"], "opt")):
    for p, x in _leaves(tree).items():
      if block in p and p[-1] in ("a", "b"):
        out[(what, *p)] = x
  return out


def _same(a, b):
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_partial_lora_trains_only_its_labels_adapters(tiny):
  prep, stage = _stage(tiny, "lora")
  names = [m.name for m in stage.members]
  assert names == ["LoRA task expert", "LoRA language expert", "partial LoRA task expert [C]",
                   "partial LoRA language expert [C]", "simultaneous LoRA [C] k=1"]
  for i, trains, rests in ((2, "block_1", "block_0"), (3, "block_0", "block_1")):
    m = stage.members[i]
    before, *_, after = _run(prep, stage, i, [m.trainable[0]] * 2)
    assert _same(_adapter_leaves(before, rests), _adapter_leaves(after, rests)), names[i]  # adapters and moments
    assert not _same(_adapter_leaves(before, trains), _adapter_leaves(after, trains)), names[i]
    assert _same(_leaves(before["params"]["base"]), _leaves(after["params"]["base"]))  # the base bit for bit


def test_simultaneous_lora_rests_the_other_labels_adapters(tiny):
  prep, stage = _stage(tiny, "lora")
  m = stage.members[4]
  assert m.steps_per_phase == 1 and len(m.phases) == 2
  s0, s1, s2 = _run(prep, stage, 4, [m.trainable[0], m.trainable[1]])
  # step 0: the task phase (block_1's adapters) while block_0 rests; step 1 the other way round
  assert _same(_adapter_leaves(s0, "block_0"), _adapter_leaves(s1, "block_0"))
  assert not _same(_adapter_leaves(s0, "block_1"), _adapter_leaves(s1, "block_1"))
  assert _same(_adapter_leaves(s1, "block_1"), _adapter_leaves(s2, "block_1"))
  assert not _same(_adapter_leaves(s1, "block_0"), _adapter_leaves(s2, "block_0"))


def test_lora_compositions_equal_hand_built_ones(tiny):
  prep, stage = _stage(tiny, "lora")
  trained = []
  for i, m in enumerate(stage.members[:4]):
    trained.append(_run(prep, stage, i, [m.trainable[0]])[-1]["params"])
  trained.append(_one(stage.init_params, 4))
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *trained)
  got = finetune_peft.lora_models(tiny, prep, kind_lib.Trained(stacked, {}, stage, 0.0))
  assert list(got) == [m.name for m in stage.members] + ["LoRA layer swap b=1 u=0 t=0", "LoRA freeze-then-train [C]"]
  task, lang, ptask, plang = trained[:4]
  # freeze-then-train: each label from its partial expert (merged into the base)
  want = partition.combine({"task": lora.merged(ptask), "language": lora.merged(plang)}, prep.labels["C"])
  assert _same(_leaves(got["LoRA freeze-then-train [C]"]), _leaves(want))
  # the layer swap: block_0 (the bottom block) adapted by the language expert, block_1 by the task expert
  swapped = {"scale": task["lora"]["scale"], "block_0": lang["lora"]["block_0"], "block_1": task["lora"]["block_1"]}
  assert _same(_leaves(got["LoRA layer swap b=1 u=0 t=0"]), _leaves(lora.merge_into(prep.base, swapped)))
  assert _same(_leaves(got["partial LoRA task expert [C]"]), _leaves(lora.merged(ptask)))


def test_neuron_expert_trains_only_the_located_rows(tiny):
  tiny.lora.enabled = False
  tiny.lora.presets = tiny.lora.simultaneous_presets = tiny.lora.swaps = ()
  tiny.neurons.enabled, tiny.neurons.key_ratio = True, 0.004  # 2 or 3 of the model's 581 rows
  prep = finetune.prepare(tiny, "")
  rng = np.random.default_rng(0)
  ran = jax.tree.map(lambda x: x + 1e-3 * rng.standard_normal(x.shape).astype(x.dtype), prep.base)  # a short run
  ran["block_1"]["mlp"]["up"]["weight"][:3] += 10.0  # three output units ([out, in] rows) moved most
  trained = {"neuron_short": kind_lib.Trained(jax.tree.map(lambda x: x[None], ran), {}, None, 0.0)}
  _, stage = _stage(tiny, "neurons", trained)
  assert [m.name for m in stage.members] == ["neuron task expert"]
  mask = _one(stage.init_params, 0)[neurons.MASK_KEY]
  up = mask["block_1"]["mlp"]["up"]["weight"]
  assert 0 < neurons.count(mask) == up.sum() and not up[3:].any()  # only (some of) the moved rows
  state = _one(train_lib.init_state(prep.cfg, stage.tx, [0], stage.init_params), 0)
  data = prep.data["task"].train
  batch = {"tokens": data["tokens"][:4], "loss_mask": data["loss_mask"][:4]}
  step = jax.jit(lambda s, b: train_lib.train_step(s, b, cfg=prep.cfg, tx=stage.tx))
  new = jax.device_get(step(step(state, batch)[0], batch)[0])  # (step 0's learning rate is 0: warmup)
  before, after, m = _leaves(prep.base), _leaves(new["params"]["params"]), _leaves(mask)
  assert all(np.array_equal(after[p][~m[p]], before[p][~m[p]]) for p in before)
  assert not np.array_equal(after[("block_1", "mlp", "up", "weight")], before[("block_1", "mlp", "up", "weight")])


def test_bf16_compute_fp32_params_and_fp32_moments(tiny):
  tiny.dtype, tiny.param_dtype = "bfloat16", "float32"
  prep = finetune.prepare(tiny, "")
  assert (prep.cfg.dtype, prep.cfg.param_dtype) == ("bfloat16", "float32")
  assert {x.dtype for x in jax.tree.leaves(prep.base)} == {np.dtype("float32")}
  tiny.dtype, tiny.param_dtype, tiny.opt.state_dtype = "bfloat16", "", "float32"
  prep, stage = _stage(tiny, "finetune")
  assert {x.dtype for x in jax.tree.leaves(prep.base)} == {np.dtype(jax.numpy.bfloat16)}
  state = jax.eval_shape(stage.tx.init, prep.base)
  moments = [x for x in jax.tree.leaves(state) if x.shape == (prep.cfg.d_model,) or len(x.shape) > 1]
  assert moments and {x.dtype for x in moments} == {np.dtype("float32")}


@pytest.mark.parametrize("field, value, match", [
    ("lora.presets", ("A",), r"lora.presets \['A'\] are not partitions"),
    ("lora.simultaneous_presets", ("X",), r"lora.simultaneous_presets \['X'\] are not partitions"),
    ("lora.steps_per_switch", (0,), "lora.steps_per_switch must be positive"),
    ("lora.swaps", ("1,0",), "is not 'bottom,top,transition'"),
    ("lora.swaps", ("3,0,0",), "bottom"),
    ("neurons.key_ratio", 0.0, "neurons.key_ratio"),
    ("neurons.experts", ("goal",), "neurons.experts must name datasets"),
    ("opt.state_dtype", "int8", "opt.state_dtype must be a float dtype"),
])
def test_config_errors(tiny, field, value, match):
  tiny.neurons.enabled = field.startswith("neurons")
  part, name = field.split(".")
  tiny[part][name] = value
  with pytest.raises(ValueError, match=match):
    if part == "opt":
      train_lib.make_optimizer(tiny.opt)
    else:
      finetune.check(tiny, 2)


def test_peft_recipes_end_to_end(tiny, tmp_path):
  """Every LoRA recipe, its compositions and a neuron expert written as Hugging Face
  directories; the saved LoRA freeze-then-train is the two saved partial experts combined."""
  tiny.neurons.enabled = True
  tiny.neurons.short.train.steps = tiny.neurons.short.train.eval_every = tiny.neurons.short.train.checkpoint_every = 2
  tiny.train.steps = tiny.lora.train.steps = 2
  workdir = str(tmp_path / "run")
  with contextlib.redirect_stdout(io.StringIO()):
    rows = runner.run(tiny, workdir, progress=False)
  peft = ["LoRA task expert", "LoRA language expert", "partial LoRA task expert [C]", "partial LoRA language expert [C]",
          "simultaneous LoRA [C] k=1", "LoRA layer swap b=1 u=0 t=0", "LoRA freeze-then-train [C]", "neuron task expert"]
  assert set(peft) <= {r["condition"] for r in rows}
  load = lambda name: _leaves(pretrained.load(os.path.join(workdir, "models", finetune.slug(name)))[1])
  got = {n: load(n) for n in peft}
  _, base = pretrained.load(tiny.base)
  labels = partition.labels(base, partition.preset_rules("C", 2, 1, 0))
  both = partition.combine({"task": got["partial LoRA task expert [C]"], "language": got["partial LoRA language expert [C]"]},
                           {p: str(x) for p, x in _leaves(labels).items()})
  assert _same(got["LoRA freeze-then-train [C]"], both)
  assert not _same(got["neuron task expert"], _leaves(base))
  _check_adapters(tiny, workdir, peft[:5], got)


def _check_adapters(c, workdir, names, merged):
  """Each trained LoRA recipe's PEFT adapter beside its merged directory: the base's path
  recorded, the base plus the adapter its merged model, and a partial expert's adapter only
  its label's layers, named in full (so peft adapts those alone)."""
  cfg, base = pretrained.load(c.base)
  for name in names:
    adapter = os.path.join(workdir, "models", finetune.slug(name) + "-peft")
    config = json.load(open(os.path.join(adapter, peft_io.CONFIG)))
    assert config["base_model_name_or_path"] == os.path.abspath(c.base), name
    got = _leaves(peft_io.load(adapter, cfg, base, merged=True))
    assert all(np.abs(got[k] - merged[name][k]).max() < 1e-6 for k in got), name
    modules = {n.removeprefix(peft_io.PREFIX).rsplit(".lora_", 1)[0] for n in load_file(os.path.join(adapter,
                                                                                                   peft_io.WEIGHTS))}
    if name.startswith("partial"):  # [C]: block_0 language, block_1 task
      layer = "layers.1." if "task" in name else "layers.0."
      assert modules and all(layer in m for m in modules) and sorted(config["target_modules"]) == sorted(modules)
    elif name.startswith("LoRA"):  # every layer adapted: the modules' last names
      assert sorted(config["target_modules"]) == sorted({m.rsplit(".", 1)[-1] for m in modules}), name
      assert {m.split(".")[2] for m in modules} == {"0", "1"}


def test_live_peft_loads_the_recipes_adapters_onto_the_base_it_names(tiny, tmp_path):
  """Where peft is installed: AutoPeftModelForCausalLM finds each adapter's base by its recorded
  path, warns of no missing keys, and gives the merged directory's logits."""
  torch = pytest.importorskip("torch")
  peft = pytest.importorskip("peft")
  transformers = pytest.importorskip("transformers")
  import warnings
  tiny.train.steps = tiny.lora.train.steps = 2
  workdir = str(tmp_path / "run")
  with contextlib.redirect_stdout(io.StringIO()):
    runner.run(tiny, workdir, progress=False)
  ids = torch.tensor([[4, 9, 12, 7, 30, 5, 2, 11]])
  for name in ("LoRA task expert", "partial LoRA task expert [C]"):
    d = os.path.join(workdir, "models", finetune.slug(name))
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      model = peft.AutoPeftModelForCausalLM.from_pretrained(d + "-peft")
    assert not [w for w in caught if "missing" in str(w.message).lower()], name
    with torch.no_grad():
      want = transformers.AutoModelForCausalLM.from_pretrained(d)(ids).logits
      assert (model(ids).logits - want).abs().max().item() < 1e-4, name
