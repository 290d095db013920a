"""xlt.hf_sizes: a config.json that does not belong to its weights is refused in one line,
within a second, before any shape is built from it (xlt.pretrained.load, xlt.generate)."""

import contextlib
import io
import json
import os
import shutil
import time

import pytest

from xlt import generate, hf_sizes, pretrained
from xlt.io import hf_dir as hf

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


@pytest.mark.parametrize("family", sorted(os.listdir(FIXTURES)))
def test_every_fixture_config_is_within_its_weights(family):
  config, tensors = hf.read_model_dir(os.path.join(FIXTURES, family))
  held = hf_sizes.check(config, tensors, family)
  assert 0.75 * held <= hf_sizes.parameters(config) <= held


def test_parameters_by_hand():
  # llama fixture: 64 x 32 embedding; per block q, o 32 x 32, k, v 32 x 16, gate, up, down 32 x 48
  config = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48}
  assert hf_sizes.parameters(config) == 64 * 32 + 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 48)


@pytest.mark.parametrize("change, says", [
    ({"vocab_size": 10**12}, "must be a positive integer below"),
    ({"vocab_size": 10**9}, "describes at least 32,000,015,360 parameters, but its safetensors files hold 19,616"),
    ({"num_hidden_layers": 10**6, "hidden_size": 10**6}, "describes at least"),
    ({"hidden_size": 1e3}, "hidden_size must be a positive integer"),
])
def test_an_absurd_config_is_refused_in_one_line_within_a_second(tmp_path, change, says):
  model = tmp_path / "model"
  shutil.copytree(os.path.join(FIXTURES, "llama"), model)
  config = json.loads((model / "config.json").read_text())
  (model / "config.json").write_text(json.dumps({**config, **change}))
  start = time.perf_counter()
  with pytest.raises(ValueError, match=says) as e:
    pretrained.load(str(model))
  assert time.perf_counter() - start < 1.0 and "\n" not in str(e.value)
  with pytest.raises(ValueError, match=says):
    pretrained.abstract(str(model))
  prompts = tmp_path / "p.jsonl"
  prompts.write_text('{"prompt": "w1"}\n')
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    status = generate.main([f"--model={model}", f"--prompts={prompts}", f"--output={tmp_path / 'o.jsonl'}"])
  assert status == 2 and len(err.getvalue().splitlines()) == 1 and says.split(",")[0] in err.getvalue()
