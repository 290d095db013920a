"""`python -m xlt.merge_data` against fusion-bench on plain-text JSON lines: RegMean, RegMean++ and Fisher in
fusion-bench's convention (one text per row, no EOS, the head measured, the model's own Fisher)
equal fusion-bench's own merges (tests/fixtures/make_fusion_data_fixtures.py wrote them; run
live where fusion-bench is installed); padding never enters a statistic; the conventions and
statistics are named options."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import merge_data as merge_data_config
from xlt import hf_tokenizer, merge_data, merge_statistics, pretrained

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "fusion", "lm")
EXPERTS = [os.path.join(REPO, "tests", "fixtures", "hf", name) for name in ("llama", "llama_b")]
TEXTS = [os.path.join(FIXTURES, f"texts_{i}.jsonl") for i in range(2)]
FLAGS = {"regmean": ["--config.options.alpha=0.9"], "regmean_plusplus": ["--config.options.alpha=0.9"],
         "fisher": ["--config.statistics.fisher=model", "--config.options.normalize=True"]}


def _cli(method, out, *flags, cwd=REPO, config="configs/merge_data.py"):
  return subprocess.run([sys.executable, "-m", "xlt.merge_data", f"--config={config}", f"--config.method={method}",
                         f"--config.inputs.experts={','.join(EXPERTS)}", f"--config.data.experts={','.join(TEXTS)}",
                         "--config.block_size=16", "--config.batch_size=2", f"--config.output={out}", *flags],
                        cwd=cwd, capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO})


def _max_diff(got: dict, want: dict) -> float:
  assert set(got) == set(want)
  return max(float(np.abs(np.asarray(got[k], np.float64) - want[k]).max()) for k in want)


@pytest.mark.parametrize("method", ["regmean", "regmean_plusplus", "fisher"])
def test_the_command_line_in_fusion_benchs_convention_is_fusion_benchs_merge(method, tmp_path):
  # rows of 17 tokens hold texts of 3 to 9: padded, so this holds only if padding is left out
  r = _cli(method, tmp_path / "out", "--config.data.convention=fusion_bench", *FLAGS[method])
  assert r.returncode == 0, r.stderr
  got = load_file(str(tmp_path / "out" / "model.safetensors"))
  want = load_file(os.path.join(FIXTURES, f"{method}.safetensors"))
  # before: text lines refused; with pads counted, the head averaged, the empirical Fisher: 0.65 / 1.04;
  # RegMean++ 1.8e-5 (fusion-bench inverts in float32), 0.80 from RegMean's fixture
  assert _max_diff(got, want) < (2e-5 if method == "fisher" else 5e-5)
  if method == "regmean_plusplus":
    assert _max_diff(got, load_file(os.path.join(FIXTURES, "regmean.safetensors"))) > 0.1
  ran = json.loads((tmp_path / "out" / "merge_config.json").read_text())
  assert ran["convention"] == "fusion_bench" and ran["statistics"]["head"] is True


def test_padding_never_counts_and_the_conventions_differ(tmp_path):
  tok = hf_tokenizer.load(EXPERTS[0])
  c = merge_data_config.get_config()
  c.block_size, c.batch_size = 16, 4
  packed = merge_data.batches(TEXTS[0], tok, c, "regmean")
  c.data.convention = "fusion_bench"
  rows = merge_data.batches(TEXTS[0], tok, c, "regmean")
  texts = [tok.encode(json.loads(line)["text"]) for line in open(TEXTS[0])]
  # fusion-bench's: one text per row, no EOS, the mask its tokens exactly
  tokens = np.concatenate([t for t, _ in rows])
  mask = np.concatenate([m for _, m in rows])
  assert mask.sum(1).tolist() == [len(t) for t in texts]
  assert all(tokens[i, :len(t)].tolist() == t for i, t in enumerate(texts))
  # xlt's: packed, each text ended with the EOS; the mask stops at the last one
  tokens, mask = np.concatenate([t for t, _ in packed]), np.concatenate([m for _, m in packed])
  assert mask.sum() == sum(len(t) + 1 for t in texts) and len(tokens) < len(texts)
  assert all(tokens[r, int(mask[r].sum()) - 1] == tok.eos_id for r in range(len(tokens)))
  # a Fisher counts the targets: every token after a row's first, within the texts
  fisher = merge_data.batches(TEXTS[0], tok, c, "fisher")
  assert np.concatenate([m for _, m in fisher]).sum(1).tolist() == [len(t) - 1 for t in texts]


def test_the_head_is_measured_unless_asked_otherwise(tmp_path):
  cfg, params = pretrained.load(EXPERTS[0])
  batch = [np.array([[4, 5, 6, 7]], np.int32)]
  assert "lm_head/weight" in merge_statistics.grams(cfg, params, batch)
  assert "lm_head/weight" not in merge_statistics.grams(cfg, params, batch, head=False)
  r = _cli("regmean", tmp_path / "mean", "--config.statistics.head=False")
  assert r.returncode == 0, r.stderr
  merged = load_file(str(tmp_path / "mean" / "model.safetensors"))
  experts = [load_file(os.path.join(e, "model.safetensors")) for e in EXPERTS]
  np.testing.assert_allclose(merged["lm_head.weight"], (experts[0]["lm_head.weight"] + experts[1]["lm_head.weight"]) / 2,
                             atol=1e-6)


def test_bad_conventions_and_statistics_are_one_line(tmp_path):
  for flag, message in (("--config.data.convention=hf", "data.convention 'hf': one of xlt, fusion_bench"),
                        ("--config.statistics.fisher=sampled", "statistics.fisher 'sampled': one of empirical, model"),
                        ("--config.statistics.heads=True", "statistics has no field heads")):
    r = _cli("fisher", tmp_path / "o", flag)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "w1 w2"}\n{"text": 3}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2: 'text' must be a string"):
    merge_data.read_examples(str(bad), hf_tokenizer.load(EXPERTS[0]), add_eos=False)


@pytest.mark.skipif(importlib.util.find_spec("fusion_bench") is None, reason="fusion-bench is not installed")
def test_the_fixtures_are_fusion_benchs_own(tmp_path, monkeypatch):
  spec = importlib.util.spec_from_file_location("make_fusion_data_fixtures",
                                                os.path.join(REPO, "tests", "fixtures", "make_fusion_data_fixtures.py"))
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  monkeypatch.setattr(script, "OUT", str(tmp_path))
  script.main()
  # fusion-bench's float32 statistics are not bit-stable across machines and thread counts: its
  # rerun on another 2-core machine moved RegMean by 7.2e-6 and Fisher by 2.9e-6 from the stored
  # fixtures, so the bar sits above that drift and below the xlt-against-peer bars above
  for name in ("regmean", "regmean_plusplus", "fisher"):
    assert _max_diff(load_file(str(tmp_path / f"{name}.safetensors")),
                     load_file(os.path.join(FIXTURES, f"{name}.safetensors"))) < 1.5e-5
