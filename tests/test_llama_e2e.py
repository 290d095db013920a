"""The open-model path end to end with no download (configs/llama_base.py's docstring): xlt
pretrains a tiny Llama-shaped base on the testbed's data and saves it as a Hugging Face
directory, xlt.experiments.finetune trains experts from it and layer-swaps them, xlt.generate
decodes the merge; and transformers (when installed) computes the same logits and answers."""

import contextlib
import io
import json
import os

import jax
import numpy as np
import pytest

from conftest import built_once
from configs import finetune as finetune_config
from configs import llama_base
from configs import merge as merge_config
from xlt import generate, hf_tokenizer, model, pretrained, runner
from xlt.experiments import finetune, pretrain_hf
from xlt.param_paths import path_names

SWAP = "layer_swap bottom=1 top=1"


def _base_config():
  c = llama_base.get_config()
  src, tgt, ops = merge_config.SOURCE, merge_config.TARGET, merge_config.OTHER_OPS
  c.data.base = merge_config.parts(ops, src, 40, 20) + merge_config.parts(ops, tgt, 10, 10)
  c.data.task = (("add_digit", src, 40),)
  c.data.language = merge_config.parts(ops, tgt, 20, 10)
  c.data.val_fraction = 0.1
  c.arithmetic.num_test, c.arithmetic.num_val = 8, 4
  c.arithmetic.num_test_by_op = {"add_digit": 8}
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.mlp_dim, c.model.block_size = 3, 32, 4, 64, 64
  c.train.steps, c.train.eval_every, c.train.batch_size, c.train.checkpoint_every = 6, 3, 16, 3
  c.opt.warmup_steps = 1
  c.eval.num_prompts, c.eval.batch_size, c.eval.max_new = 4, 8, 5
  c.mesh.devices = 1
  return c


def _finetune_config(base_dir):
  c = finetune_config.get_config()
  c.base = os.path.join(base_dir, "hf")
  c.data.task, c.data.language = (os.path.join(base_dir, "data", f"{n}.jsonl") for n in ("task", "language"))
  c.merges = (SWAP,)
  c.data.block_size, c.data.val_fraction = 24, 0.2
  c.train.steps, c.train.eval_every, c.train.batch_size, c.train.checkpoint_every = 4, 2, 4, 2
  c.opt.peak_lr, c.opt.warmup_steps = 1e-2, 1
  c.together = True  # one compiled step for the four recipes
  c.eval.prompts, c.eval.max_new, c.eval.batch_size = (os.path.join(base_dir, "data", "prompts.jsonl"),), 5, 8
  c.mesh.devices = 1
  return c


def _run_sequence(tmp):
  base_dir, ft_dir, out = str(tmp / "base"), str(tmp / "ft"), str(tmp / "out.jsonl")
  with contextlib.redirect_stdout(io.StringIO()):
    runner.run(_base_config(), base_dir, progress=False)
    runner.run(_finetune_config(base_dir), ft_dir, progress=False)
    prompts = os.path.join(base_dir, "data", "task_prompts.jsonl")
    accuracy = generate.run([f"--model={os.path.join(ft_dir, 'models', finetune.slug(SWAP))}",
                             f"--prompts={prompts}", f"--output={out}", f"--answers={prompts}", "--max_new=5"])
  (tmp / "accuracy.json").write_text(json.dumps(accuracy))


@pytest.fixture(scope="module")
def sequence(tmp_path_factory):
  """The documented sequence, each step a few steps long, run once per session
  (conftest.built_once): {"base", "ft", "out", "accuracy", ...}."""
  tmp = built_once(tmp_path_factory, "llama_e2e", _run_sequence)
  base_dir, ft_dir = str(tmp / "base"), str(tmp / "ft")
  rows = {}
  for name, workdir in (("base_rows", base_dir), ("ft_rows", ft_dir)):  # the rows runner.run returned
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
      rows[name] = json.load(f)
  return {"base": base_dir, "ft": ft_dir, "out": str(tmp / "out.jsonl"), "accuracy": json.loads(
      (tmp / "accuracy.json").read_text()), "prompts": os.path.join(base_dir, "data", "task_prompts.jsonl"), **rows}


def _leaves(tree):
  return {path_names(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_tokenizer_text_round_trip(tmp_path):
  """Runs of digits or letters are one word of one token per character, decoded back."""
  assert pretrain_hf.text(("[let]", "3", "2", "7", "max", "1", "0", "4", "=")) == "[let] 327 max 104 ="
  pretrain_hf.write_tokenizer(str(tmp_path), 64)
  tok = hf_tokenizer.load(str(tmp_path))
  ids = tok.encode("[std] 327 + 104 = 134")
  assert ids[0] == tok.bos_id and len(ids) == 1 + 9 + 3 and tok.decode(ids) == "[std] 327 + 104 = 134"
  assert tok.decode(tok.encode("BDE", add_special_tokens=False)) == "BDE" and tok.stop_ids == [tok.eos_id]
  chat = tok.apply_chat_template([{"role": "user", "content": "[std] 1 copy ="}])
  assert chat == "<bos>[user] [std] 1 copy = [assistant] "
  unk = pretrain_hf.vocabulary().index(pretrain_hf.UNK)
  assert unk not in tok.encode_chat([{"role": "user", "content": "12 +"}], add_generation_prompt=False)


def test_base_is_a_llama_directory(sequence):
  base = sequence["base"]
  hf_dir = os.path.join(base, "hf")
  with open(os.path.join(hf_dir, "config.json")) as f:
    hf = json.load(f)
  assert (hf["model_type"], hf["num_key_value_heads"], hf["num_attention_heads"]) == ("llama", 2, 4)
  assert hf["hidden_act"] == "silu" and not hf["attention_bias"] and hf["eos_token_id"] == 2
  # the saved model is the trained one, bit for bit: the base's best-validation parameters (as
  # xlt's own kernels; loaded as the family's weights, the same tensors transposed)
  assert pretrained.load(hf_dir)[0].dense_layout == "weight"
  cfg, params = pretrained.load(hf_dir, dense_layout="kernel")
  assert (cfg.norm, cfg.mlp, cfg.pos_embedding, cfg.kv_heads) == ("rmsnorm", "swiglu", "rope", 2)
  with np.load(os.path.join(base, "base", "best_params.npz")) as f:
    best = [f[f"leaf_{k}"][0] for k in range(len(f.files) - 1)]
  trained = _leaves(jax.tree.unflatten(jax.tree.structure(params), best))
  got = _leaves(params)
  assert set(got) == set(trained) and all(np.array_equal(got[p], trained[p]) for p in trained)
  tok = hf_tokenizer.load(hf_dir)
  assert tok.template is not None and tok.bos_id == 1 and tok.decode(tok.encode("[let] 327 + 104 =")) == (
      "[let] 327 + 104 =")
  for name in ("task", "language", "prompts", "task_prompts", "language_prompts"):
    with open(os.path.join(base, "data", f"{name}.jsonl")) as f:
      first = json.loads(f.readline())
    assert set(first) >= ({"prompt", "answer"} if "prompts" in name else {"prompt", "completion"}), name
  assert {r["metric"] for r in sequence["base_rows"]} == {"val_loss", "exact_match"}


def test_finetune_and_generate_outputs(sequence):
  ft = sequence["ft"]
  for name in ("task expert", "language expert", "partial task expert [C]", SWAP):
    d = os.path.join(ft, "models", finetune.slug(name))
    assert all(os.path.isfile(os.path.join(d, f)) for f in ("config.json", "tokenizer.json", "model.safetensors")), d
  assert {r["condition"] for r in sequence["ft_rows"]} >= {"base", "task expert", "language expert", SWAP}
  with open(sequence["out"]) as f:
    out = [json.loads(line) for line in f]
  assert len(out) == 8 and all(isinstance(r["continuation"], str) and "correct" in r for r in out)
  assert sequence["accuracy"]["total"] == 8 and os.path.isfile(sequence["out"].replace(".jsonl", ".accuracy.json"))


def test_transformers_reads_the_merged_model(sequence):
  """Live: transformers loads the merged model and its tokenizer, computes xlt's logits and
  decodes xlt's greedy answers."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  path = os.path.join(sequence["ft"], "models", finetune.slug(SWAP))
  cfg, params = pretrained.load(path)
  hf_tok = transformers.AutoTokenizer.from_pretrained(path)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  with open(sequence["out"]) as f:
    records = [json.loads(line) for line in f]
  tok = hf_tokenizer.load(path)
  for r in records:
    ids = tok.encode(r["prompt"])
    assert hf_tok(r["prompt"])["input_ids"] == ids
    with torch.no_grad():
      want = hf_model(torch.tensor([ids])).logits.numpy()
      new = hf_model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False, eos_token_id=tok.eos_id,
                              pad_token_id=tok.pad_id)[0, len(ids):].tolist()
    logits, _ = model.apply(cfg, params, np.asarray([ids], np.int32))
    assert np.abs(np.asarray(logits) - want).max() <= 1e-4
    assert hf_tok.decode(new, skip_special_tokens=True) == r["continuation"], r
