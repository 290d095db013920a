"""What used to hang or end in a traceback: a FIFO (or anything not a regular file) named
model.safetensors or config.json is refused before it is opened (xlt.io.fileio.check_regular,
used by every reader of a file a user brings); a config.json that holds a JSON list is one line;
an lm-eval --model_args key that the xlt model does not take is one line (exit 2 from
`python -m xlt.eval.harness`)."""

import contextlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from xlt.io import fileio

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "llama")
LLAMA_B = os.path.join(REPO, "tests", "fixtures", "hf", "llama_b")


def _model(tmp_path, replace: str, how: str) -> str:
  model = tmp_path / "model"
  shutil.copytree(LLAMA, model)
  (model / replace).unlink()
  if how == "fifo":
    os.mkfifo(model / replace)
  elif how == "device":
    os.symlink("/dev/zero", model / replace)
  else:
    (model / replace).write_text(how)
  return str(model)


def _run(args, timeout=120):
  """A command in a child process, so a hang fails the test instead of stopping the suite."""
  from conftest import child_env
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=child_env(PYTHONPATH=REPO),
                        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("how, kind", [("fifo", "a FIFO"), ("device", "a character device")])
def test_a_non_regular_safetensors_is_refused_by_generate(tmp_path, how, kind):
  model = _model(tmp_path, "model.safetensors", how)
  prompts = tmp_path / "p.jsonl"
  prompts.write_text(json.dumps({"prompt": "w1"}) + "\n")
  out = _run(["xlt.generate", f"--model={model}", f"--prompts={prompts}", f"--output={tmp_path / 'o.jsonl'}"])
  assert out.returncode == 2 and out.stderr == (f"xlt.generate: error: {model}/model.safetensors is {kind}, "
                                                "not a regular file\n"), out.stderr[-2000:]


def test_a_fifo_is_refused_by_the_loader_and_the_merge(tmp_path):
  """In-process (both read through xlt.io): the loader (fine-tuning's base, xlt.eval) and a merge."""
  code = ("import sys\nfrom xlt import pretrained\n"
          "try:\n  pretrained.load(sys.argv[1])\nexcept ValueError as e:\n  print(e)\n"
          "from configs import merge_files\nfrom xlt.merge.__main__ import merge_config\n"
          "c = merge_files.get_config()\n"
          "c.method, c.output, c.heatmaps = 'linear', sys.argv[2], False\n"
          f"c.inputs = {{'experts': '{LLAMA_B},' + sys.argv[1]}}\n"
          "try:\n  merge_config(c)\nexcept ValueError as e:\n  print(e)\n")
  model = _model(tmp_path, "model.safetensors", "fifo")
  from conftest import child_env
  out = subprocess.run([sys.executable, "-c", code, model, str(tmp_path / "out")], cwd=REPO,
                       env=child_env(PYTHONPATH=REPO), capture_output=True, text=True, timeout=120)
  assert out.stdout.splitlines() == [f"{model}/model.safetensors is a FIFO, not a regular file"] * 2, out.stderr
  assert not (tmp_path / "out").exists()


def test_check_size_refuses_a_fifo(tmp_path):
  os.mkfifo(tmp_path / "prompts.jsonl")
  with pytest.raises(ValueError, match="prompts.jsonl is a FIFO, not a regular file$"):
    fileio.check_size(str(tmp_path / "prompts.jsonl"), 1 << 20)
  (tmp_path / "ok.txt").write_text("x")
  assert fileio.check_size(str(tmp_path / "ok.txt"), 1 << 20) == 1


@pytest.mark.parametrize("text, what", [("[1, 2]", "list"), ('"llama"', "str"), ("3", "int")])
def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path, text, what):
  from xlt import generate, pretrained
  model = _model(tmp_path, "config.json", text)
  with pytest.raises(ValueError, match=f"config.json holds a JSON {what}, not an object"):
    pretrained.load(model)
  prompts = tmp_path / "p.jsonl"
  prompts.write_text(json.dumps({"prompt": "w1"}) + "\n")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    status = generate.main(["--model", model, "--prompts", str(prompts), "--output", str(tmp_path / "o.jsonl")])
  assert status == 2 and err.getvalue().startswith(f"xlt.generate: error: {model}/config.json holds a JSON {what}")
  assert err.getvalue().count("\n") == 1


@pytest.fixture
def harness_with_a_stub_lm_eval(monkeypatch):
  """xlt.eval.harness imported over a stand-in for lm-eval's two names it uses (lm-eval is an
  optional dependency): its LM base constructs the class from model_args as lm-eval's does."""
  class TemplateLM:
    def __init__(self):
      pass

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
      args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
      return cls(**args, **(additional_config or {}))

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
      return cls(**arg_dict, **(additional_config or {}))

  stub = {"lm_eval": types.ModuleType("lm_eval"), "lm_eval.api": types.ModuleType("lm_eval.api"),
          "lm_eval.api.model": types.ModuleType("lm_eval.api.model"),
          "lm_eval.api.registry": types.ModuleType("lm_eval.api.registry")}
  stub["lm_eval.api.model"].TemplateLM = TemplateLM
  stub["lm_eval.api.registry"].register_model = lambda name: (lambda cls: cls)
  for name, module in stub.items():
    monkeypatch.setitem(sys.modules, name, module)
  monkeypatch.delitem(sys.modules, "xlt.eval.harness", raising=False)
  harness = importlib.import_module("xlt.eval.harness")
  yield harness
  sys.modules.pop("xlt.eval.harness", None)
  import xlt.eval
  if getattr(xlt.eval, "harness", None) is harness:  # `from xlt.eval import harness` would find it
    delattr(xlt.eval, "harness")


def test_an_unknown_model_args_key_is_one_line(harness_with_a_stub_lm_eval):
  harness = harness_with_a_stub_lm_eval
  with pytest.raises(harness.ModelArgsError, match=r"^model_args: unknown key 'trust_remote_code'; the xlt model "
                                                   r"takes pretrained, dtype, batch_size"):
    harness.XltLM.create_from_arg_string(f"pretrained={LLAMA},trust_remote_code=True", {"batch_size": 4})
  with pytest.raises(harness.ModelArgsError, match="unknown key 'revision'"):
    harness.XltLM.create_from_arg_obj({"pretrained": LLAMA, "revision": "main"})


def test_the_lm_eval_command_line_exits_2(tmp_path):
  pytest.importorskip("lm_eval")
  out = _run(["xlt.eval.harness", "--model", "xlt", "--model_args", f"pretrained={LLAMA},bogus=1",
              "--tasks", "arc_easy"], timeout=300)
  lines = [ln for ln in out.stderr.splitlines() if ln.startswith("xlt.eval.harness: error:")]
  assert out.returncode == 2 and lines == ["xlt.eval.harness: error: model_args: unknown key 'bogus'; the xlt model "
                                           "takes " + lines[0].split("takes ", 1)[1]], out.stderr[-2000:]
