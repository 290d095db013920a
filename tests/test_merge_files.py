"""Checkpoint files: safetensors read and written one tensor at a time, Hugging Face names,
merges of files equal to the same merges in memory, the command, and peak memory."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file

from xlt import merge
from xlt import param_paths as naming
from xlt.io import tensor_files as files
from xlt.merge import tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}


def llama(seed: int, layers: int = 4, d: int = 8, f: int = 12, v: int = 16, scale: float = 1.0) -> dict:
  """A tiny Llama-style checkpoint with Hugging Face names ([out, in] weights)."""
  rng = np.random.default_rng(seed)
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
  for i in range(layers):
    p = f"model.layers.{i}."
    shapes |= {p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (d, d),
               p + "self_attn.v_proj.weight": (d, d), p + "self_attn.o_proj.weight": (d, d),
               p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
               p + "mlp.down_proj.weight": (d, f), p + "input_layernorm.weight": (d,),
               p + "post_attention_layernorm.weight": (d,)}
  return {k: (scale * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


def finetunes(tmp_path):
  base = llama(0)
  task = {k: x + 0.1 * np.random.default_rng(1).standard_normal(x.shape).astype(np.float32) for k, x in base.items()}
  lang = {k: x + 0.1 * np.random.default_rng(2).standard_normal(x.shape).astype(np.float32) for k, x in base.items()}
  paths = {}
  for name, tree in (("base", base), ("task", task), ("lang", lang)):
    paths[name] = str(tmp_path / f"{name}.safetensors")
    files.save(tree, paths[name])
  return (base, task, lang), paths


def test_save_and_load_round_trip_lazily(tmp_path):
  import ml_dtypes
  tree = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, ml_dtypes.bfloat16),
          "c": np.zeros((0, 2), np.int64), "d": np.array([True, False])}
  files.save(tree, str(tmp_path / "x.safetensors"), {"note": "hi"})
  for k, x in load_file(str(tmp_path / "x.safetensors")).items():  # the safetensors package reads it
    np.testing.assert_array_equal(x, tree[k])
    assert x.dtype == tree[k].dtype
  lazy = files.load(str(tmp_path / "x.safetensors"))
  assert lazy["a"].shape == (2, 3) and lazy["b"].dtype == np.dtype(ml_dtypes.bfloat16)
  np.testing.assert_array_equal(np.asarray(lazy["a"]), tree["a"])
  nested = {"block_0": {"mlp": {"fc": {"kernel": np.ones((2, 3), np.float32)}}}, "wte": {"embedding": np.zeros((4, 2))}}
  files.save(nested, str(tmp_path / "n.safetensors"))
  back = files.load(str(tmp_path / "n.safetensors"), lazy=False, nested=True)
  np.testing.assert_array_equal(back["block_0"]["mlp"]["fc"]["kernel"], nested["block_0"]["mlp"]["fc"]["kernel"])
  os.makedirs(tmp_path / "sharded")  # a directory of shards is one checkpoint
  files.save({"a": tree["a"]}, str(tmp_path / "sharded" / "model-00001-of-00002.safetensors"))
  files.save({"d": tree["d"]}, str(tmp_path / "sharded" / "model-00002-of-00002.safetensors"))
  assert sorted(files.load(str(tmp_path / "sharded"))) == ["a", "d"]


def test_file_merges_equal_in_memory_merges(tmp_path):
  (base, task, lang), paths = finetunes(tmp_path)
  lazy = {k: files.load(p) for k, p in paths.items()}
  cases = [
      (merge.layer_swap, (task, lang), (lazy["task"], lazy["lang"]), dict(bottom=1, top=1, lower_transition=1)),
      (merge.soup, ([task, lang],), ([lazy["task"], lazy["lang"]],), {}),
      (merge.task_arithmetic, (base, [task, lang]), (lazy["base"], [lazy["task"], lazy["lang"]]), {}),
      (merge.ties, (base, [task, lang]), (lazy["base"], [lazy["task"], lazy["lang"]]), dict(density=0.3)),
      (merge.dare, (base, [task, lang]), (lazy["base"], [lazy["task"], lazy["lang"]]), dict(drop=0.5, seed=3)),
      (merge.maet, (base, task, lang, [lang]), (lazy["base"], lazy["task"], lazy["lang"], [lazy["lang"]]), {}),
  ]
  for fn, mem_args, lazy_args, kw in cases:
    want = fn(*mem_args, **kw, naming=merge.HF)
    got = fn(*lazy_args, **kw, naming=merge.HF)
    for k in want:
      np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=f"{fn.__name__} {k}")
  # the swap took blocks 0 and 3 from the language expert, 2 from the task expert
  swapped = merge.layer_swap(lazy["task"], lazy["lang"], bottom=1, top=1, naming=merge.HF)
  for i, src in ((0, lang), (1, task), (2, task), (3, lang)):
    k = f"model.layers.{i}.mlp.up_proj.weight"
    np.testing.assert_array_equal(swapped[k], src[k])


def test_merge_command_writes_swap_and_heatmaps(tmp_path):
  (base, task, lang), paths = finetunes(tmp_path)
  out = tmp_path / "out"
  subprocess.run([sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py",
                  f"--config.inputs.base={paths['base']}", f"--config.inputs.task_expert={paths['task']}",
                  f"--config.inputs.language_expert={paths['lang']}", "--config.options.bottom=1",
                  "--config.options.top=1", f"--config.output={out}"], cwd=REPO, env=ENV, check=True,
                 capture_output=True)
  got = load_file(str(out / "model.safetensors"))
  want = merge.layer_swap(task, lang, bottom=1, top=1, naming=merge.HF)
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])
  assert (out / "delta_task_expert.png").exists() and (out / "delta_language_expert.png").exists()
  assert json.load(open(out / "summary.json"))["naming"] == "hf"


def test_unrecognised_checkpoint_and_bad_inputs_fail_clearly(tmp_path):
  files.save({"encoder.blocks.0.weight": np.ones((2, 2), np.float32)}, str(tmp_path / "odd.safetensors"))
  # a soup reads no blocks, so it merges any name; a layer swap needs a naming rule
  assert tool.merge_files({"experts": [str(tmp_path / "odd.safetensors")]}, "soup", str(tmp_path / "o"))["naming"] \
      == "unnamed"
  with pytest.raises(ValueError, match="'encoder.blocks.0.weight': no naming rule recognises it.*naming="):
    tool.merge_files({"task_expert": str(tmp_path / "odd.safetensors"),
                      "language_expert": str(tmp_path / "odd.safetensors")}, "layer_swap", str(tmp_path / "o"),
                     {"bottom": 0, "top": 0})
  with pytest.raises(ValueError, match="missing \\['language_expert'\\]"):
    tool.merge_files({"task_expert": "x"}, "layer_swap", str(tmp_path / "o"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    files.load(str(tmp_path / "nothing.safetensors"))


PEAK = textwrap.dedent("""
  import json, sys
  import numpy as np
  import safetensors
  from xlt.merge import tool
  directory, method = sys.argv[1], sys.argv[2]

  def kib(field):
    return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1])

  with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to the current RSS:
    f.write("5")                                  # the imports' own peak does not count
  before = kib("VmRSS")
  inputs = ({"task_expert": directory + "/a.safetensors", "language_expert": directory + "/b.safetensors"}
            if method == "layer_swap" else
            {"base": directory + "/a.safetensors", "experts": [directory + "/b.safetensors"] * 2})
  options = {"bottom": 2, "top": 1, "lower_transition": 1} if method == "layer_swap" else {}
  tool.merge_files(inputs, method, directory + "/out_" + method, options, heatmaps=False)
  print(json.dumps({"grew_kib": kib("VmHWM") - before}))
""")


def test_file_merge_peak_memory_is_about_one_model(tmp_path):
  # two 48 MiB checkpoints (8 blocks of 1.5M float32 parameters); a merge grows the process
  # by about one model (the merged tree) plus a few tensors, never by all the inputs
  rng = np.random.default_rng(0)
  for name in ("a", "b"):
    tree = {}
    for i in range(8):
      for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tree[f"model.layers.{i}.self_attn.{proj}.weight"] = rng.standard_normal((384, 384), np.float32)
      tree[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal((1536, 384), np.float32)
      tree[f"model.layers.{i}.mlp.down_proj.weight"] = rng.standard_normal((384, 1536), np.float32)
    files.save(tree, str(tmp_path / f"{name}.safetensors"))
  size_kib = os.path.getsize(tmp_path / "a.safetensors") / 1024
  assert 40_000 < size_kib < 60_000
  for method in ("layer_swap", "task_arithmetic"):
    out = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path), method], env=ENV, check=True,
                         capture_output=True, text=True).stdout
    grew = json.loads(out.strip().splitlines()[-1])["grew_kib"]
    # the merged model is held until saved: at least ~one model, never the inputs as well
    assert 0.8 * size_kib < grew < 1.5 * size_kib, (method, grew, size_kib)


def test_a_path_rule_is_a_naming_for_every_merge():
  import re

  def rule(path):  # a made-up format: enc.blk{i}.{attn,ffn}.w, emb, out
    name = ".".join(path)
    if m := re.match(r"enc\.blk(\d+)\.(attn|ffn)\.", name):
      return int(m.group(1)), {"attn": "attn", "ffn": "mlp"}[m.group(2)]
    return None, "embedding" if name == "emb" else "head"

  custom = naming.from_rule(rule)
  tree = lambda v: {"emb": np.full((4, 2), v, np.float32), "out": np.full((2, 4), v, np.float32),
                    **{f"enc.blk{i}.{k}.w": np.full((3, 2), v, np.float32) for i in range(3) for k in ("attn", "ffn")}}
  swapped = merge.layer_swap(tree(1.0), tree(2.0), bottom=1, top=1, non_block="task", naming=custom)
  assert [float(swapped[f"enc.blk{i}.ffn.w"][0, 0]) for i in range(3)] == [2.0, 1.0, 2.0]
  assert custom.local_name(("enc.blk2.attn.w",)) == "enc.blk{i}.attn.w"
  change = merge.row_change(tree(1.0), tree(0.0), threshold=0.5, naming=custom)
  assert change["columns"] == ["enc.blk{i}.attn.w", "enc.blk{i}.ffn.w"] and change["blocks"] == [0, 1, 2]
