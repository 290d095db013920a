"""xlt.merge_data: RegMean and Fisher merging of Hugging Face model directories with statistics
from each expert's own JSON-lines data (the command line's route), equal to merging with the
statistics computed directly."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import merge_data as merge_data_config
from xlt import merge_data, merge_statistics, pretrained
from xlt.data import sft
from xlt import hf_tokenizer
from xlt.merge import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(REPO, "tests", "fixtures", "hf")
EXPERTS = [os.path.join(HF, "llama"), os.path.join(HF, "llama_b")]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
  tok = hf_tokenizer.load(EXPERTS[0])
  words = [f"w{i}" for i in range(30)]  # the fixture's word-level vocabulary
  assert all(tok.token_id(w) is not None for w in words)
  rng = np.random.default_rng(0)
  paths = []
  for i in range(2):
    path = tmp_path_factory.mktemp("data") / f"expert{i}.jsonl"
    with open(path, "w") as f:
      for _ in range(6):
        f.write(json.dumps({"prompt": " ".join(rng.choice(words, 3)), "completion": " " + " ".join(
            rng.choice(words, 2))}) + "\n")
    paths.append(str(path))
  return paths


def _config(method, data_files, out):
  c = merge_data_config.get_config()
  c.method, c.inputs.experts, c.data.experts = method, ",".join(EXPERTS), ",".join(data_files)
  c.block_size, c.batch_size, c.max_examples, c.output = 8, 2, 4, str(out)
  return c


@pytest.mark.parametrize("method", ["regmean", "fisher"])
def test_a_data_aware_merge_from_files_is_the_merge_of_the_statistics(method, data_files, tmp_path):
  c = _config(method, data_files, tmp_path / "out")
  c.options = {"alpha": 0.5} if method == "regmean" else {"normalize": True}
  lines = []
  merge_data.run(c, log=lines.append)
  assert lines[0].startswith(f"xlt.merge_data: {method} statistics take ~") and "MiB per expert" in lines[0]
  cfg, got = pretrained.load(str(tmp_path / "out"))
  # the same statistics computed here
  tok = hf_tokenizer.load(EXPERTS[0])
  models, stats = [], []
  for path, file in zip(EXPERTS, data_files):
    _, params = pretrained.load(path)
    rows = sft.load(file, tok, block_size=8).train
    tokens, targets = rows["tokens"][:4], rows["loss_mask"][:4]
    # padding never counts: a Gram matrix over the positions up to a row's last target, a Fisher its targets
    mask = merge_statistics.input_mask(targets) if method == "regmean" else targets
    assert (mask == 0).any()  # the data has padding
    batches = [(tokens[i:i + 2], mask[i:i + 2]) for i in range(0, len(tokens), 2)]
    stat = merge_statistics.grams if method == "regmean" else merge_statistics.diagonal_fisher
    stats.append(stat(cfg, params, batches))
    models.append(jax.tree.map(np.asarray, params))
  key = "grams" if method == "regmean" else "fishers"
  want = registry.merge(method, {"experts": models}, {**c.options.to_dict(), key: stats})
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  assert json.loads((tmp_path / "out" / "merge_config.json").read_text())["data"]["experts"] == data_files
  assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
             for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(models[0]))) > 1e-3


def test_user_errors_are_one_line(data_files, tmp_path):
  c = _config("ties", data_files, tmp_path / "out")
  with pytest.raises(ValueError, match="the data-aware methods are regmean, regmean_plusplus, fisher"):
    merge_data.run(c)
  c = _config("regmean", data_files[:1], tmp_path / "out")
  with pytest.raises(ValueError, match="one data file per expert"):
    merge_data.run(c)
  r = subprocess.run([sys.executable, "-m", "xlt.merge_data", "--config=configs/merge_data.py",
                      "--config.method=fisher", f"--config.inputs.experts={EXPERTS[0]}",
                      "--config.data.experts=missing.jsonl", f"--config.output={tmp_path / 'o'}"],
                     cwd=REPO, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 2 and r.stderr.startswith("xlt.merge_data: error: ") and r.stderr.count("\n") == 1, r.stderr
