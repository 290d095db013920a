"""Hugging Face model directories (xlt.io.hf_dir): written bit-exact, sharded like
save_pretrained, never half written, read back with one-line errors; and, where torch and
transformers are installed, loaded by transformers with the logits of the same weights.

The models are tests/fixtures/hf/ (tiny, random, saved by transformers itself:
tests/fixtures/make_hf_fixtures.py)."""

import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open

from xlt.io import hf_dir as hf
from xlt.io import tensor_files as files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")
FAMILIES = ("llama", "llama_b", "qwen2", "gpt2")


def fixture(family: str) -> str:
  return os.path.join(FIXTURES, family)


def assert_same_tensors(a: dict, b: dict):
  assert list(sorted(a)) == list(sorted(b))
  for k in a:
    x, y = np.asarray(a[k]), np.asarray(b[k])
    assert x.dtype == y.dtype and x.shape == y.shape, k
    assert x.tobytes() == y.tobytes(), k  # bit-exact, NaN payloads and -0.0 included


def header(file: str) -> dict:
  with open(file, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    return json.loads(f.read(n))


def error_of(fn, *args, **kwargs) -> str:
  """The message of the one-line error `fn` raises."""
  with pytest.raises((ValueError, FileNotFoundError)) as e:
    fn(*args, **kwargs)
  message = str(e.value)
  assert "\n" not in message, message
  return message


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_bit_exact_and_copies_config_and_tokenizer(tmp_path, family):
  config, tensors = hf.read_model_dir(fixture(family))
  assert config["model_type"] and isinstance(tensors[next(iter(tensors))], files.LazyTensor)
  out = str(tmp_path / "out")
  summary = hf.write_model_dir(tensors, out, source_dir=fixture(family), metadata={"merge_method": "none"})
  assert summary["tensors"] == len(tensors) and summary["total_size"] == sum(x.nbytes for x in tensors.values())
  config2, tensors2 = hf.read_model_dir(out)
  assert config2 == config  # float32 in, float32 out: even the dtype entry is unchanged
  assert_same_tensors(tensors, tensors2)
  assert_same_tensors(tensors, files.load(os.path.join(fixture(family), "model.safetensors"), lazy=False))
  meta = header(os.path.join(out, "model.safetensors"))["__metadata__"]
  assert meta == {"format": "pt", "merge_method": "none"}
  with safe_open(os.path.join(out, "model.safetensors"), framework="numpy") as f:  # the reference reader agrees
    assert f.metadata()["format"] == "pt" and sorted(f.keys()) == sorted(tensors)
  for name in hf.TOKENIZER_FILES:
    src = os.path.join(fixture(family), name)
    assert os.path.exists(os.path.join(out, name)) == os.path.exists(src), name
    if os.path.exists(src):
      with open(src, "rb") as a, open(os.path.join(out, name), "rb") as b:
        assert a.read() == b.read(), name
  if family == "llama":  # the fixture with a tokenizer and a chat template
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(os.listdir(out))
  assert "generation_config.json" in os.listdir(out)
  assert not any(f.endswith(".npy") for f in os.listdir(out))  # only a model's files are copied
  assert os.listdir(tmp_path) == ["out"]  # no temporary left beside it
  umask = os.umask(0o022)
  os.umask(umask)
  assert os.stat(out).st_mode & 0o777 == 0o777 & ~umask  # as os.makedirs and save_pretrained make them
  assert {os.stat(os.path.join(out, f)).st_mode & 0o777 for f in os.listdir(out)} == {0o666 & ~umask}


def test_sharding_writes_an_index_and_reads_back_equal(tmp_path):
  _, tensors = hf.read_model_dir(fixture("qwen2"))
  total = sum(x.nbytes for x in tensors.values())
  out = str(tmp_path / "out")
  hf.write_model_dir(tensors, out, source_dir=fixture("qwen2"), max_shard_bytes=10_000)
  index = json.load(open(os.path.join(out, hf.INDEX)))
  shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
  n = len(shards)
  assert n > 3 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
  assert "model.safetensors" not in os.listdir(out)
  assert index["metadata"] == {"total_size": total}
  assert sorted(index["weight_map"]) == sorted(tensors)
  for shard in shards:
    h = header(os.path.join(out, shard))
    assert h.pop("__metadata__") == {"format": "pt"}
    assert sorted(h) == sorted(k for k, f in index["weight_map"].items() if f == shard)
    size = sum(tensors[k].nbytes for k in h)
    assert size <= 10_000 or len(h) == 1  # a tensor above the limit has a shard of its own
  _, back = hf.read_model_dir(out)
  assert_same_tensors(tensors, back)
  # below the limit: one file, no index; a size as text means the same as its number
  hf.write_model_dir(tensors, out, source_dir=fixture("qwen2"), max_shard_bytes="1MB")
  assert sorted(f for f in os.listdir(out) if "safetensors" in f) == ["model.safetensors"]
  hf.write_model_dir(tensors, out, source_dir=fixture("qwen2"), max_shard_bytes="10KB")
  assert len([f for f in os.listdir(out) if f.endswith(".safetensors")]) == n
  assert "max_shard_bytes" in error_of(hf.write_model_dir, tensors, out, config={}, max_shard_bytes="lots")


def test_model_card_names_inputs_method_and_options(tmp_path):
  _, tensors = hf.read_model_dir(fixture("llama"))
  out = str(tmp_path / "out")
  hf.write_model_dir(tensors, out, source_dir=fixture("llama"),
                     card={"method": "soup", "inputs": {"experts": ["org/llama-a", "org/llama-b"]},
                           "options": {"weights": [0.25, 0.75]}, "naming": "hf"})
  text = open(os.path.join(out, "README.md")).read()
  assert text.startswith("---\nlibrary_name: transformers\ntags:\n- xlt\n- merge\n---\n")
  for part in ("- method: `soup`", "experts: `org/llama-a`, `org/llama-b`", "weights: `[0.25, 0.75]`",
               "- naming: `hf`", "LlamaForCausalLM"):
    assert part in text, part
  assert hf.is_xlt_output(out) and not hf.is_xlt_output(fixture("llama"))


def test_cast_dtype_and_config_follow_the_tensors(tmp_path):
  import ml_dtypes
  _, tensors = hf.read_model_dir(fixture("llama"))
  tensors = dict(tensors, step=np.array([7], np.int64))  # integers are never cast
  out = str(tmp_path / "out")
  hf.write_model_dir(tensors, out, source_dir=fixture("llama"), dtype="bfloat16")
  config, back = hf.read_model_dir(out)
  assert config["dtype"] == "bfloat16"
  assert back["step"].dtype == np.int64 and np.asarray(back["step"])[0] == 7
  for k, x in tensors.items():
    if k != "step":
      np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(x).astype(ml_dtypes.bfloat16))
  assert "only a floating dtype" in error_of(hf.write_model_dir, tensors, out, source_dir=fixture("llama"),
                                             dtype="int8")


def test_each_tensor_is_read_once_when_written(tmp_path):
  """Leaves are read one at a time as they are written (files.save), never gathered first."""
  reads = []

  class Leaf:
    def __init__(self, name, x):
      self.name, self.x, self.shape, self.dtype = name, x, x.shape, x.dtype

    def __array__(self, dtype=None, copy=None):
      reads.append(self.name)
      return self.x

  _, tensors = hf.read_model_dir(fixture("gpt2"))
  leaves = {k: Leaf(k, np.asarray(x)) for k, x in tensors.items()}
  hf.write_model_dir(leaves, str(tmp_path / "out"), source_dir=fixture("gpt2"), max_shard_bytes=20_000)
  assert sorted(reads) == sorted(tensors)


def test_a_failure_mid_write_leaves_the_previous_output_untouched(tmp_path):
  _, tensors = hf.read_model_dir(fixture("llama"))
  out = tmp_path / "out"
  hf.write_model_dir(tensors, str(out), source_dir=fixture("llama"), card={"method": "first"})
  before = {f: (out / f).read_bytes() for f in os.listdir(out)}

  class Boom:
    shape, dtype = (3,), np.dtype(np.float32)

    def __array__(self, dtype=None, copy=None):
      raise RuntimeError("disk on fire")

  second = sorted(tensors)[1]  # the second tensor written
  broken = dict(tensors, **{second: Boom()})
  for shard_bytes in (hf.DEFAULT_MAX_SHARD_BYTES, 10_000):
    with pytest.raises(RuntimeError, match="disk on fire"):
      hf.write_model_dir(broken, str(out), source_dir=fixture("llama"), max_shard_bytes=shard_bytes)
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    assert os.listdir(tmp_path) == ["out"]
  with pytest.raises(RuntimeError, match="disk on fire"):  # a first write that fails leaves nothing
    hf.write_model_dir(broken, str(tmp_path / "new"), source_dir=fixture("llama"))
  assert os.listdir(tmp_path) == ["out"]


def test_replaces_only_its_own_outputs(tmp_path):
  _, tensors = hf.read_model_dir(fixture("gpt2"))
  out = tmp_path / "out"
  out.mkdir()  # an empty directory is fine
  hf.write_model_dir(tensors, str(out), source_dir=fixture("gpt2"), max_shard_bytes=10_000)
  hf.write_model_dir(tensors, str(out), source_dir=fixture("gpt2"))  # its own output is replaced whole
  assert sorted(f for f in os.listdir(out) if "safetensors" in f) == ["model.safetensors"]
  theirs = tmp_path / "theirs"
  theirs.mkdir()
  (theirs / "notes.txt").write_text("mine")
  message = error_of(hf.write_model_dir, tensors, str(theirs), source_dir=fixture("gpt2"))
  assert "theirs" in message and "overwrite=True" in message
  assert os.listdir(theirs) == ["notes.txt"]
  # a transformers model directory is not an xlt output either
  shutil.copytree(fixture("gpt2"), tmp_path / "gpt2")
  assert "overwrite=True" in error_of(hf.write_model_dir, tensors, str(tmp_path / "gpt2"), source_dir=fixture("gpt2"))
  hf.write_model_dir(tensors, str(theirs), source_dir=fixture("gpt2"), overwrite=True)
  assert "notes.txt" not in os.listdir(theirs) and hf.is_xlt_output(str(theirs))
  (tmp_path / "file").write_text("x")
  assert "not a directory" in error_of(hf.write_model_dir, tensors, str(tmp_path / "file"), source_dir=fixture("gpt2"))
  assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]


def test_config_errors_are_one_line(tmp_path):
  _, tensors = hf.read_model_dir(fixture("llama"))
  out = str(tmp_path / "out")
  config = json.load(open(os.path.join(fixture("llama"), "config.json")))
  no_type = {k: v for k, v in config.items() if k != "model_type"}
  assert "'model_type'" in error_of(hf.write_model_dir, tensors, out, config=no_type)
  assert "'architectures'" in error_of(hf.write_model_dir, tensors, out, config={"model_type": "llama"})
  os.makedirs(tmp_path / "src")
  json.dump(no_type, open(tmp_path / "src" / "config.json", "w"))
  message = error_of(hf.write_model_dir, tensors, out, source_dir=str(tmp_path / "src"))
  assert "config.json" in message and "'model_type'" in message
  assert "source_dir" in error_of(hf.write_model_dir, tensors, out)
  assert "flat dict" in error_of(hf.write_model_dir, {"model": {"w": np.zeros(2)}}, out, config=config)
  assert "non-empty" in error_of(hf.write_model_dir, {}, out, config=config)
  # the given dict wins over source_dir's config.json and is not changed
  mine = dict(config, dtype="float16", architectures=["MyLlama"])
  hf.write_model_dir(tensors, out, source_dir=fixture("llama"), config=mine)
  written = json.load(open(os.path.join(out, "config.json")))
  assert written["architectures"] == ["MyLlama"] and written["dtype"] == "float32" and mine["dtype"] == "float16"
  assert sorted(os.listdir(tmp_path)) == ["out", "src"]


def sharded_copy(tmp_path) -> tuple[str, list[str]]:
  """A sharded llama (in a fresh directory) and its shards' names."""
  _, tensors = hf.read_model_dir(fixture("llama"))
  out = str(tmp_path / "sharded")
  hf.write_model_dir(tensors, out, source_dir=fixture("llama"), max_shard_bytes=20_000)
  shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
  assert len(shards) >= 3
  return out, shards


def test_read_errors_name_the_file(tmp_path):
  assert "not a directory" in error_of(hf.read_model_dir, str(tmp_path / "nowhere"))
  os.makedirs(tmp_path / "empty")
  assert "config.json" in error_of(hf.read_model_dir, str(tmp_path / "empty"))
  shutil.copy(os.path.join(fixture("llama"), "config.json"), tmp_path / "empty")
  assert "neither model.safetensors" in error_of(hf.read_model_dir, str(tmp_path / "empty"))
  (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"")
  assert ".bin" in error_of(hf.read_model_dir, str(tmp_path / "empty"))

  # a shard the index names is missing
  out, shards = sharded_copy(tmp_path)
  os.remove(os.path.join(out, shards[1]))
  message = error_of(hf.read_model_dir, out)
  assert shards[1] in message and hf.INDEX in message

  # truncated data and a corrupt header, in a shard and in a single file
  out, shards = sharded_copy(tmp_path)
  shard = os.path.join(out, shards[2])
  data = open(shard, "rb").read()
  open(shard, "wb").write(data[: len(data) - 100])
  assert shards[2] in error_of(hf.read_model_dir, out)
  open(shard, "wb").write(data[:5])
  assert shards[2] in error_of(hf.read_model_dir, out)
  open(shard, "wb").write(struct.pack("<Q", 12) + b"{not json!!}")
  assert shards[2] in error_of(hf.read_model_dir, out)
  shutil.copytree(fixture("llama"), tmp_path / "single")
  single = tmp_path / "single" / "model.safetensors"
  single.write_bytes(single.read_bytes()[:-4])
  assert "model.safetensors" in error_of(hf.read_model_dir, str(tmp_path / "single"))

  # an index that names a tensor twice, or places it in a shard that does not hold it
  out, shards = sharded_copy(tmp_path)
  index_file = os.path.join(out, hf.INDEX)
  text = open(index_file).read()
  twice = text.replace('"weight_map": {', f'"weight_map": {{\n    "lm_head.weight": "{shards[1]}",')
  open(index_file, "w").write(twice)
  message = error_of(hf.read_model_dir, out)
  assert "lm_head.weight" in message and "twice" in message and hf.INDEX in message
  index = json.loads(text)
  index["weight_map"]["lm_head.weight"] = shards[1]
  open(index_file, "w").write(json.dumps(index))
  message = error_of(hf.read_model_dir, out)
  assert "lm_head.weight" in message and shards[0] in message
  index = json.loads(text)
  index["weight_map"]["extra.weight"] = shards[0]
  open(index_file, "w").write(json.dumps(index))
  assert "extra.weight" in error_of(hf.read_model_dir, out)
  open(index_file, "w").write("{")
  assert hf.INDEX in error_of(hf.read_model_dir, out)


# ---- transformers loads what was written (skipped where torch / transformers are missing)


def load_hf(path: str):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model, info = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                   output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  return model.eval()


def logits(model, family: str) -> np.ndarray:
  import torch
  ids = torch.from_numpy(np.load(os.path.join(fixture(family), "input_ids.npy")))
  with torch.no_grad():
    return model(ids).logits.float().numpy()


@pytest.mark.parametrize("family", ("llama", "qwen2", "gpt2"))
def test_transformers_loads_a_rewritten_fixture_with_its_logits(tmp_path, family):
  pytest.importorskip("transformers")
  _, tensors = hf.read_model_dir(fixture(family))
  out = str(tmp_path / "out")
  hf.write_model_dir(tensors, out, source_dir=fixture(family))
  np.testing.assert_allclose(logits(load_hf(out), family), np.load(os.path.join(fixture(family), "logits.npy")),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shard_bytes", (hf.DEFAULT_MAX_SHARD_BYTES, 12_000))
def test_transformers_loads_a_merge_with_the_merged_weights(tmp_path, shard_bytes):
  """The mean of two Llamas, written by xlt, is the model torch builds from that mean."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  _, a = hf.read_model_dir(fixture("llama"))
  _, b = hf.read_model_dir(fixture("llama_b"))
  mean = {k: ((np.asarray(a[k]) + np.asarray(b[k])) / 2).astype(np.float32) for k in a}
  out = str(tmp_path / "merged")
  # xlt's own metadata: transformers 4.x refuses a header with metadata but no format: pt
  hf.write_model_dir(mean, out, source_dir=fixture("llama"), max_shard_bytes=shard_bytes,
                     card={"method": "mean", "inputs": {"experts": ["llama", "llama_b"]}},
                     metadata={"merge_method": "mean"})
  assert os.path.exists(os.path.join(out, hf.INDEX)) == (shard_bytes < 10**6)
  loaded = load_hf(out)
  state = loaded.state_dict()
  for k, x in mean.items():
    assert np.array_equal(state[k].numpy(), x), k
  config = transformers.AutoConfig.from_pretrained(fixture("llama"))
  reference = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
  reference.load_state_dict({k: torch.from_numpy(x) for k, x in mean.items()}, strict=True)
  got, want = logits(loaded, "llama"), logits(reference, "llama")
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # and it is neither input: the merge changed the model
  assert np.abs(want - np.load(os.path.join(fixture("llama"), "logits.npy"))).max() > 0.1
  tok = transformers.AutoTokenizer.from_pretrained(out)  # the copied tokenizer loads too
  assert tok("w1 w2")["input_ids"][-2:] == [5, 6]


# ---- a file merge writes such a directory (xlt.merge.tool, python -m xlt.merge)


def test_file_merge_writes_a_model_directory_from_its_hf_input(tmp_path):
  from xlt.merge import registry, tool
  out = str(tmp_path / "ties")
  inputs = {"base": fixture("llama"), "experts": [fixture("llama_b"), fixture("llama")]}
  summary = tool.merge_files(inputs, "ties", out, {"density": 0.5}, heatmaps=False, max_shard_bytes=12_000)
  assert summary["config_from"] == fixture("llama")
  cfg, got = hf.read_model_dir(out)
  assert cfg["model_type"] == "llama" and os.path.exists(os.path.join(out, "tokenizer.json"))
  assert all(header(os.path.join(out, f))["__metadata__"]["format"] == "pt"
             for f in os.listdir(out) if f.endswith(".safetensors"))
  trees = {"base": hf.read_model_dir(fixture("llama"))[1],
           "experts": [hf.read_model_dir(fixture("llama_b"))[1], hf.read_model_dir(fixture("llama"))[1]]}
  want = registry.merge("ties", trees, {"density": 0.5}, naming="hf")
  assert_same_tensors(got, {k: np.asarray(v) for k, v in want.items()})
  assert "ties" in open(os.path.join(out, hf.CARD)).read()


def test_file_merge_of_bare_files_writes_weights_and_card_only(tmp_path):
  from xlt.merge import tool
  _, a = hf.read_model_dir(fixture("gpt2"))
  files.save({k: np.asarray(v) for k, v in a.items()}, str(tmp_path / "a.safetensors"))
  out = str(tmp_path / "soup")
  summary = tool.merge_files({"experts": [str(tmp_path / "a.safetensors")] * 2}, "soup", out, heatmaps=False)
  assert summary["config_from"] is None and not os.path.exists(os.path.join(out, hf.CONFIG))
  assert header(os.path.join(out, hf.SINGLE))["__metadata__"]["format"] == "pt"
  assert_same_tensors(files.load(os.path.join(out, hf.SINGLE)), {k: np.asarray(v) for k, v in a.items()})


def test_transformers_loads_a_command_line_merge_with_the_in_memory_logits(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from xlt.merge import registry
  out = str(tmp_path / "ta")
  cmd = [sys.executable, "-m", "xlt.merge", "--config=" + os.path.join(ROOT, "configs", "merge_files.py"),
         "--config.method=task_arithmetic", f"--config.inputs.base={fixture('llama')}",
         f"--config.inputs.experts={fixture('llama_b')}", "--config.options.lambdas=0.5",
         f"--config.output={out}", "--config.heatmaps=false"]
  run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
  assert run.returncode == 0, run.stderr
  trees = {"base": hf.read_model_dir(fixture("llama"))[1], "experts": [hf.read_model_dir(fixture("llama_b"))[1]]}
  want = registry.merge("task_arithmetic", trees, {"lambdas": 0.5}, naming="hf")
  config = transformers.AutoConfig.from_pretrained(fixture("llama"))
  reference = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
  reference.load_state_dict({k: torch.from_numpy(np.asarray(x)) for k, x in want.items()}, strict=True)
  np.testing.assert_allclose(logits(load_hf(out), "llama"), logits(reference, "llama"), rtol=1e-6, atol=1e-6)


def test_a_killed_writes_temporaries_are_removed_by_the_next_write(tmp_path, capsys):
  """A write killed mid-way leaves hidden siblings the size of the model: the next write of
  the same directory removes those whose process is gone and names those it cannot tell."""
  _, tensors = hf.read_model_dir(fixture("llama"))
  out = str(tmp_path / "out")
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  dead = int(gone.stdout)
  stale = [tmp_path / f".tmp_out_{dead}_0123456789ab", tmp_path / f".old_out_{dead}_ba9876543210"]
  unknown, alive, other = (tmp_path / ".tmp_out_a1b2c3d4e5f6", tmp_path / f".tmp_out_{os.getppid()}_a1b2c3d4e5f6",
                           tmp_path / f".tmp_other_{dead}_0123456789ab")
  for d in (*stale, unknown, alive, other):
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"x" * 1000)
  hf.write_model_dir(tensors, out, source_dir=fixture("llama"))
  assert not any(d.exists() for d in stale)
  assert unknown.exists() and alive.exists() and other.exists()  # another output's, or maybe not stale
  err = capsys.readouterr().err
  assert all(f"xlt: removed {d}, left by an interrupted write of {out}" in err for d in stale)
  assert f"xlt: {unknown} may be left by an interrupted write" in err and str(alive) not in err
  assert sorted(os.listdir(tmp_path)) == sorted(["out", *(d.name for d in (unknown, alive, other))])
