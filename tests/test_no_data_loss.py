"""Nothing a user has is lost (issue 69): a merge never replaces its own input, nor an existing
model directory unless asked with --overwrite; a refusal is one line and exit status 2 with every
pre-existing file byte-identical and nothing left behind."""

import os
import shutil
import subprocess
import sys

import pytest

from xlt.io import hf_dir as hf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "llama")


def snapshot(root) -> dict:
  """{relative path: bytes} of every file under `root` (and the directories, as None)."""
  out = {}
  for d, dirs, names in os.walk(root):
    for name in dirs:
      out[os.path.relpath(os.path.join(d, name), root)] = None
    for name in names:
      with open(os.path.join(d, name), "rb") as f:
        out[os.path.relpath(os.path.join(d, name), root)] = f.read()
  return out


def run(module: str, *args, cwd=REPO):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                        timeout=120)


def merge(*args, cwd=REPO):
  return run("xlt.merge", f"--config={REPO}/configs/merge_files.py", "--config.method=soup",
             "--config.heatmaps=false", *args, cwd=cwd)


def refused(r, *words):
  assert r.returncode == 2, (r.returncode, r.stderr)
  assert r.stderr.count("\n") == 1, r.stderr
  for w in words:
    assert w in r.stderr, r.stderr


@pytest.fixture
def experts(tmp_path):
  """Two model directories of a fine-tune's workdir: runs/ft/models/{task,lang}_expert."""
  models = tmp_path / "runs" / "ft" / "models"
  for name in ("task_expert", "lang_expert"):
    shutil.copytree(LLAMA, models / name)
  return str(models / "task_expert"), str(models / "lang_expert")


@pytest.mark.parametrize("where", ["is", "inside", "holds"])
def test_merge_never_writes_over_its_inputs(tmp_path, experts, where):
  task, lang = experts
  output = {"is": task, "inside": os.path.join(task, "sub"), "holds": os.path.dirname(task)}[where]
  before = snapshot(tmp_path)
  for extra in ([], ["--overwrite"]):  # not even when asked
    r = merge(f"--config.inputs.experts={task},{lang}", f"--config.output={output}", *extra)
    refused(r, "would destroy the input", task)
  assert snapshot(tmp_path) == before


def test_merge_through_a_link_to_an_input_is_refused(tmp_path, experts):
  task, lang = experts
  os.symlink(task, tmp_path / "link")
  before = snapshot(tmp_path)
  refused(merge(f"--config.inputs.experts={task},{lang}", f"--config.output={tmp_path / 'link'}", "--overwrite"),
          "is the input")
  assert snapshot(tmp_path) == before


def test_an_existing_model_is_replaced_only_with_overwrite(tmp_path, experts):
  task, lang = experts
  other = str(tmp_path / "other_expert")  # a fine-tuned expert (xlt wrote it) that is not an input
  hf.write_model_dir(hf.read_model_dir(LLAMA)[1], other, source_dir=LLAMA, card={"method": "xlt.pretrained.save"})
  before = snapshot(tmp_path)
  refused(merge(f"--config.inputs.experts={task},{lang}", f"--config.output={other}"), other, "--overwrite")
  assert snapshot(tmp_path) == before
  r = merge(f"--config.inputs.experts={task},{lang}", f"--config.output={other}", "--overwrite")
  assert r.returncode == 0, r.stderr
  assert "merge_config.json" in os.listdir(other) and sorted(os.listdir(tmp_path)) == ["other_expert", "runs"]


def test_the_default_output_is_not_replaced_a_second_time(tmp_path, experts):
  task, lang = experts
  r = merge(f"--config.inputs.experts={task},{lang}", cwd=tmp_path)
  assert r.returncode == 0, r.stderr
  first = snapshot(tmp_path / "runs" / "merged")
  assert "model.safetensors" in first
  refused(merge(f"--config.inputs.experts={lang},{task}", "--config.options.weights=(1, 3)", cwd=tmp_path),
          "runs/merged", "--overwrite")
  assert snapshot(tmp_path / "runs" / "merged") == first
  assert sorted(os.listdir(tmp_path / "runs")) == ["ft", "merged"]  # no temporary sibling left


def test_merge_data_never_writes_over_an_input_or_an_existing_model(tmp_path, experts):
  task, lang = experts
  data = tmp_path / "d.jsonl"
  data.write_text('{"prompt": "1+1=", "completion": "2"}\n')
  before = snapshot(tmp_path)
  base = ["--config=configs/merge_data.py", f"--config.inputs.experts={task},{lang}",
          f"--config.data.experts={data},{data}"]
  refused(run("xlt.merge_data", *base, f"--config.output={task}", "--overwrite"), "would destroy the input")
  refused(run("xlt.merge_data", *base, f"--config.output={tmp_path / 'runs'}", "--overwrite"), "holds the input")
  other = tmp_path / "merged"
  shutil.copytree(LLAMA, other)
  before = snapshot(tmp_path)
  refused(run("xlt.merge_data", *base, f"--config.output={other}"), "--overwrite")
  assert snapshot(tmp_path) == before


@pytest.mark.parametrize("at", ["_write_into", "_replace"])
def test_a_merge_killed_while_it_writes_leaves_the_old_model_as_it_was(tmp_path, experts, at):
  """SIGKILL while the new model is being written (or just before it is moved into place): the
  model it was to replace is byte-identical, and the next merge clears the dead one's files."""
  out = tmp_path / "merged"
  assert merge(f"--config.inputs.experts={','.join(experts)}", f"--config.output={out}").returncode == 0
  (out / "notes.txt").write_text("mine")
  before = snapshot(out)
  kill = (f"import os, signal, sys, runpy; from xlt.io import hf_dir; real = hf_dir.{at}\n"
          "def dying(*a, **k):\n  real(*a, **k) if '" + at + "' == '_write_into' else None\n"
          "  os.kill(os.getpid(), signal.SIGKILL)\n"
          f"hf_dir.{at} = dying; sys.argv = ['xlt.merge'] + sys.argv[1:]; runpy.run_module('xlt.merge', run_name='__main__')")
  r = subprocess.run([sys.executable, "-c", kill, f"--config={REPO}/configs/merge_files.py", "--config.method=soup",
                      "--config.heatmaps=false", f"--config.inputs.experts={','.join(experts)}",
                      f"--config.output={out}", "--overwrite"], cwd=REPO, env=ENV, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == -9, r.stderr
  assert snapshot(out) == before
  assert merge(f"--config.inputs.experts={','.join(experts)}", f"--config.output={out}", "--overwrite").returncode == 0
  assert "notes.txt" not in snapshot(out)  # replaced, as asked
  assert sorted(os.listdir(tmp_path)) == ["merged", "runs"]  # nothing of the killed merge is left
