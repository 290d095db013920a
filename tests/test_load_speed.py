"""benchmarks/load_speed.py's checkpoint writer and xlt's timed load, on its tiny shape (the
transformers side needs torch: the benchmark's own run)."""

import argparse
import json
import os
import sys

import numpy as np
import pytest

from benchmarks import load_speed


def test_writer_makes_a_checkpoint_xlt_loads_and_reads_every_weight_of(tmp_path):
  # as the benchmark runs them: each worker a fresh process (xlt's may re-execute itself)
  args = argparse.Namespace(cache=str(tmp_path), seed=0)
  load_speed._child(args, sys.executable, "--worker=write:tiny")
  path = str(tmp_path / "tiny")
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  assert hf["hidden_size"] == 128 and hf["num_hidden_layers"] == 2
  result = load_speed._child(args, sys.executable, "--worker=load:xlt:tiny")
  shape = load_speed.SHAPES["tiny"][0]
  d, f, v, layers = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_hidden_layers"]
  kv = d // shape["num_attention_heads"] * shape["num_key_value_heads"]
  per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d  # q, o; k, v; gate, up, down; two norms
  assert result["params"] == layers * per_layer + 2 * v * d + d  # untied embedding and head, final norm
  assert np.isfinite(result["sum"]) and result["sum"] != 0.0
  # a second call finds the stamp and keeps the files
  mtime = os.path.getmtime(os.path.join(path, "config.json"))
  load_speed._child(args, sys.executable, "--worker=write:tiny")
  assert os.path.getmtime(os.path.join(path, "config.json")) == mtime


if __name__ == "__main__":
  pytest.main([__file__])
