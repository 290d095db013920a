"""The merge command lines as a mergekit user types them: mergekit's option names as flags (`lambda`,
a Python keyword, included), a GPT-2 YAML's linear merge over slices, the one-line refusal of
`linear` with `normalize: false`, and the documented --config=configs/... from any directory
(xlt.merge and xlt.merge_data). Values by hand, as mergekit defines them."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(REPO, "tests", "fixtures", "hf")
LLAMA, LLAMA_B, GPT2 = (os.path.join(HF, n) for n in ("llama", "llama_b", "gpt2"))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO}


def _run(module, *flags, cwd=REPO):
  return subprocess.run([sys.executable, "-m", module, *flags], cwd=cwd, capture_output=True, text=True, env=ENV)


def _weights(d) -> dict:
  return {k: v.astype(np.float64) for k, v in load_file(os.path.join(d, "model.safetensors")).items()}


def test_mergekits_lambda_is_a_flag(tmp_path):
  # before: ml_collections' parser read the path as Python and stopped at the keyword
  r = _run("xlt.merge", "--config=configs/merge_files.py", "--config.method=task_arithmetic",
           f"--config.inputs.base={LLAMA}", f"--config.inputs.experts={LLAMA_B}", "--config.options.lambda=0.5",
           "--config.heatmaps=false", f"--config.output={tmp_path / 'out'}")
  assert r.returncode == 0, r.stderr
  got, base, expert = _weights(tmp_path / "out"), _weights(LLAMA), _weights(LLAMA_B)
  assert max(np.abs(got[k] - (base[k] + 0.5 * (expert[k] - base[k]))).max() for k in got) < 1e-6


def _linear_over_slices(slices) -> str:
  """A mergekit YAML: a float32 linear merge over slices, each [(model, lo, hi, weight), ...]
  (weight a number or a YAML list of filtered values)."""
  source = lambda m, lo, hi, w: (f"      - model: {m}\n        layer_range: [{lo}, {hi}]\n"
                                 f"        parameters: {{weight: {w}}}\n")
  return "merge_method: linear\ndtype: float32\nslices:\n" + "".join(
      "  - sources:\n" + "".join(source(*s) for s in sources) for sources in slices)


@pytest.fixture
def gpt2_b(tmp_path):
  """A second GPT-2: the fixture's weights plus seeded noise, its config and tokenizer."""
  out = tmp_path / "gpt2_b"
  shutil.copytree(GPT2, out, ignore=shutil.ignore_patterns("model.safetensors"))
  rng = np.random.default_rng(70)
  weights = load_file(os.path.join(GPT2, "model.safetensors"))
  save_file({k: (v + 0.1 * rng.normal(size=v.shape)).astype(v.dtype) for k, v in weights.items()},
            str(out / "model.safetensors"), {"format": "pt"})
  return str(out)


def test_a_gpt2_yaml_merges_linearly_over_slices(gpt2_b, tmp_path):
  # before: "unknown naming 'transformer.h.{i}.'" (the YAML's GPT-2 naming, a block pattern)
  yaml = _linear_over_slices([[(GPT2, 0, 1, 0.3), (gpt2_b, 0, 1, 0.7)], [(GPT2, 1, 2, 0.6), (gpt2_b, 1, 2, 0.4)]])
  (tmp_path / "merge.yml").write_text(yaml)
  r = _run("xlt.merge", f"--config={tmp_path / 'merge.yml'}", f"--config.output={tmp_path / 'out'}")
  assert r.returncode == 0, r.stderr
  got, a, b = _weights(tmp_path / "out"), _weights(GPT2), _weights(gpt2_b)
  assert set(got) == set(a)
  for k in got:
    # mergekit: block i by its slice's weights, the embeddings by the first slice's, the final norm the last's
    first = k.startswith(("transformer.h.0.", "transformer.wte", "transformer.wpe"))
    w = 0.3 if first else 0.6
    np.testing.assert_allclose(got[k], w * a[k] + (1 - w) * b[k], atol=1e-6, err_msg=k)


def test_linear_without_normalisation_is_refused_in_one_line(tmp_path):
  (tmp_path / "merge.yml").write_text(f"merge_method: linear\nmodels:\n  - model: {LLAMA}\n    parameters: {{weight: 0.3}}"
                                      f"\n  - model: {LLAMA_B}\n    parameters: {{weight: 0.3}}\n"
                                      "parameters:\n  normalize: false\n")
  r = _run("xlt.merge", f"--config={tmp_path / 'merge.yml'}", f"--config.output={tmp_path / 'out'}")
  assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
  assert "normalize: false is not supported for linear" in r.stderr
  assert "`normalize: false`" in open(os.path.join(REPO, "docs", "merge.md")).read()  # and documented


def test_the_documented_configs_run_from_any_directory(tmp_path):
  # before: a traceback (no configs/ in the current directory; configs/merge_data.py's own import)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  r = _run("xlt.merge", "--config=configs/merge_files.py", "--config.method=linear",
           f"--config.inputs.experts={LLAMA},{LLAMA_B}", "--config.heatmaps=false", "--config.output=out", cwd=elsewhere)
  assert r.returncode == 0, r.stderr
  got, a, b = _weights(elsewhere / "out"), _weights(LLAMA), _weights(LLAMA_B)
  assert max(np.abs(got[k] - (a[k] + b[k]) / 2).max() for k in got) < 1e-6
  texts = tmp_path / "texts.jsonl"
  texts.write_text("".join(json.dumps({"text": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(4)))
  r = _run("xlt.merge_data", "--config=configs/merge_data.py", "--config.method=fisher",
           f"--config.inputs.experts={LLAMA},{LLAMA_B}", f"--config.data.experts={texts},{texts}",
           "--config.block_size=8", "--config.output=data_out", cwd=elsewhere)
  assert r.returncode == 0, r.stderr
  assert json.loads((elsewhere / "data_out" / "merge_config.json").read_text())["method"] == "fisher"


def test_a_module_wise_swap_in_mergekit_yaml_equals_layer_swaps_modules(tmp_path):
  """mergekit has no module-wise swap method; its users write one as a linear merge over slices
  whose weights are filtered by tensor name (first matching filter wins, the unfiltered entry is
  the rest). Block 0's attention from the language expert, everything else the task expert's:
  the same model as layer_swap with modules=attn (non_block=task), tensor by tensor."""
  attn = lambda x: f"[{{filter: self_attn, value: {x}}}, {{value: {1 - x}}}]"
  yaml = _linear_over_slices([[(LLAMA, 0, 1, attn(0.0)), (LLAMA_B, 0, 1, attn(1.0))],
                              [(LLAMA, 1, 2, 1.0), (LLAMA_B, 1, 2, 0.0)]])
  (tmp_path / "swap.yml").write_text(yaml)
  r = _run("xlt.merge", f"--config={tmp_path / 'swap.yml'}", f"--config.output={tmp_path / 'yaml'}")
  assert r.returncode == 0, r.stderr
  r = _run("xlt.merge", "--config=configs/merge_files.py", "--config.method=layer_swap",
           f"--config.inputs.task_expert={LLAMA}", f"--config.inputs.language_expert={LLAMA_B}",
           "--config.options.bottom=1", "--config.options.top=0", "--config.options.modules=attn",
           "--config.options.non_block=task", "--config.heatmaps=false", f"--config.output={tmp_path / 'swap'}")
  assert r.returncode == 0, r.stderr
  got, swap, task, lang = (_weights(d) for d in (tmp_path / "yaml", tmp_path / "swap", LLAMA, LLAMA_B))
  assert set(got) == set(swap) == set(task)
  for k in got:
    want = lang[k] if k.startswith("model.layers.0.self_attn.") else task[k]
    np.testing.assert_allclose(got[k], want, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(swap[k], want, atol=1e-6, err_msg=k)
