"""NaN and infinity never pass silently: an input checkpoint holding one is refused in one line
naming the tensor, by the model loader (xlt.pretrained.load: fine-tuning, xlt.generate, xlt.eval)
and by the safetensors reader every merge reads through (xlt.io.tensor_files); a training loss
that becomes NaN stops the stage with a line that says so (xlt.loop.Diverged), checked only where
the loss is on the host already, so a healthy run is unchanged."""

import contextlib
import io
import json
import math
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from xlt import loop
from xlt.io import tensor_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "llama")
LLAMA_B = os.path.join(REPO, "tests", "fixtures", "hf", "llama_b")
BAD = "model.layers.1.self_attn.k_proj.weight"


def _poisoned(tmp_path, value=math.nan, name=BAD) -> str:
  model = tmp_path / f"poisoned_{value}"
  shutil.copytree(LLAMA, model)
  tensors = tensor_files.load(str(model / "model.safetensors"), lazy=False)
  tensors[name] = tensors[name].copy()
  tensors[name][3, 5] = value
  save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
  return str(model)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_the_loader_names_the_tensor(tmp_path, value):
  from xlt import pretrained
  model = _poisoned(tmp_path, value)
  with pytest.raises(ValueError) as e:
    pretrained.load(model)
  assert str(e.value) == f"{model}: tensor {BAD} holds NaN or infinite values"
  import jax
  cfg, params = pretrained.load(LLAMA)  # a healthy model loads as before
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_generate_refuses_a_poisoned_model_in_one_line(tmp_path):
  from xlt import generate
  model = _poisoned(tmp_path)
  prompts = tmp_path / "p.jsonl"
  prompts.write_text(json.dumps({"prompt": "w1"}) + "\n")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    status = generate.main(["--model", model, "--prompts", str(prompts), "--output", str(tmp_path / "o.jsonl")])
  assert status == 2 and err.getvalue() == f"xlt.generate: error: {model}: tensor {BAD} holds NaN or infinite values\n"
  assert not (tmp_path / "o.jsonl").exists()


def test_a_merge_refuses_a_poisoned_input(tmp_path):
  from configs import merge_files
  from xlt.merge.__main__ import merge_config
  model = _poisoned(tmp_path)
  c = merge_files.get_config()
  c.method, c.output, c.heatmaps = "linear", str(tmp_path / "out"), False
  c.inputs = {"experts": f"{LLAMA_B},{model}"}
  with pytest.raises(ValueError, match=f"model.safetensors: tensor {BAD} holds NaN or infinite values$"):
    merge_config(c)
  assert not (tmp_path / "out").exists()


def test_finite_reads_in_chunks(monkeypatch):
  monkeypatch.setattr(tensor_files, "_FINITE_CHUNK", 7)
  x = np.zeros((5, 9), np.float32)
  assert tensor_files.finite(x) and tensor_files.finite(np.zeros(0, np.float16))
  x[4, 8] = np.nan  # the last chunk's last element
  assert not tensor_files.finite(x)
  import ml_dtypes
  assert not tensor_files.finite(np.array([1.0, np.inf], ml_dtypes.bfloat16))
  assert tensor_files.finite(np.array([1, 2], np.int32))


def _members(c):
  from xlt.data import common
  from xlt.experiments import synthetic
  task = synthetic.get_task(c)
  enc = common.encode_examples(task.train[c.mixture.source], task.tokenizer, task.seq_len)
  arrays = {"tokens": enc.tokens, "loss_mask": enc.loss_mask}
  return synthetic.model_config(c, task), [loop.Member(f"m{s}", s, arrays) for s in (0, 1)]


@pytest.mark.parametrize("where", ["log", "eval", "end"])
def test_a_nan_loss_stops_the_stage_saying_so(graph_config, tmp_path, where):
  """A learning rate of 1e30 (past the config checks, as a diverging run is) makes the loss
  NaN: the stage stops at the first point the loss reaches the host, a log line, an
  evaluation or the end, never with a score of NaN parameters."""
  c = graph_config
  c.opt.peak_lr, c.opt.clip, c.opt.warmup_steps = 1e30, 0.0, 0
  c.train.steps = 6
  c.train.log_every, c.train.eval_every = {"log": (2, 100), "eval": (100, 4), "end": (100, 100)}[where]
  cfg, members = _members(c)
  scored = []
  with pytest.raises(loop.Diverged, match=r"training diverged: m0's loss is nan at step \d"):
    loop.train_ensemble(c, cfg, members, lambda params, ids: scored.append(ids) or np.zeros(len(ids)),
                        str(tmp_path), progress=False)
  assert not scored  # no evaluation of NaN parameters
