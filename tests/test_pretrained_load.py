"""How xlt.pretrained.load reads: mapped files (views, dropped pages), the chunked host copy
(transposes, casts), leaf shapes from one block, untrusted headers, and the vocabulary padding
that lets a tensor axis shard any vocabulary (sharded = unsharded, saved = original)."""

import dataclasses
import json
import os
import struct

import jax
import numpy as np
import pytest

from conftest import compiled
from xlt import model, param_paths, pretrained, sharding
from xlt.io import hf_dir, placement, tensor_files

apply = compiled(model.apply)

HF = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
FAMILIES = sorted(os.listdir(HF))


@pytest.mark.parametrize("family", FAMILIES)
def test_leaf_shapes_from_one_block_equal_the_whole_model(family):
  cfg, _ = pretrained.abstract(os.path.join(HF, family))
  cfg = dataclasses.replace(cfg, num_layers=3, sliding_layers=(0, 2) if cfg.sliding_layers else None)
  whole = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  want = {k: tuple(x.shape) for k, x in jax.tree_util.tree_flatten_with_path(whole)[0]}
  got = pretrained._per_layer(cfg, pretrained._one_block(cfg)[0])
  assert {k: tuple(x.shape) for k, x in jax.tree_util.tree_flatten_with_path(got)[0]} == want
  assert pretrained._leaf_axes(cfg) == model.logical_axes(cfg)


def test_mapped_views_equal_the_read_and_survive_release():
  tensors = hf_dir.read_model_dir(os.path.join(HF, "llama"))[1]
  mapped = tensor_files.Mapped()
  for x in tensors.values():
    view = mapped.view(x)
    want = np.asarray(x)  # read with readinto, not the map
    assert view.shape == want.shape and view.dtype == want.dtype and np.array_equal(view, want)
    mapped.release(x)  # the pages leave the resident set; a later read comes from the file again
    assert np.array_equal(view, want)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_copier_copies_transposes_and_casts_in_chunks(monkeypatch, transpose, dtype):
  monkeypatch.setattr(placement, "CHUNK_BYTES", 100)  # many chunks, some rows split over bands
  src = np.random.default_rng(0).standard_normal((37, 11)).astype(np.float32)
  dst = np.full((11, 37) if transpose else (37, 11), 7, jax.numpy.dtype(dtype))
  released = []
  with placement.Copier(3) as copier:
    copier.run([(dst, src, transpose, lambda b, e: released.append((b, e)))])
  want = np.ascontiguousarray(np.asarray(jax.numpy.asarray(src.T if transpose else src).astype(dtype)))
  assert np.array_equal(dst.view(np.uint8), want.view(np.uint8))  # bit for bit: the same rounding
  assert sorted(released)[0][0] == 0 and sorted(released)[-1][1] == src.nbytes
  assert sum(e - b for b, e in released) == src.nbytes  # every byte released once


@pytest.mark.parametrize("shape", [(3, 5), (1024, 600)])  # below and above the 2 MiB of a mapping
def test_host_buffer_is_aligned_writable_and_exact(shape):
  buf = placement.host_buffer(shape, np.float32)
  assert buf.shape == shape and buf.dtype == np.float32 and buf.flags.c_contiguous and buf.flags.writeable
  assert buf.ctypes.data % placement.ALIGN == 0
  buf[...] = np.arange(buf.size, dtype=np.float32).reshape(shape)
  assert buf[-1, -1] == buf.size - 1


def test_copier_buffers_come_in_order_and_one_ahead(monkeypatch):
  made = []
  monkeypatch.setattr(placement, "host_buffer", lambda shape, dtype: made.append(shape) or np.zeros(shape, dtype))
  specs = [((2,), np.float32), None, ((3,), np.int8), ((4,), np.float32)]
  with placement.Copier(1) as copier:
    got = []
    for buf in copier.buffers(specs):
      copier.allocator.submit(lambda: None).result()  # what was submitted ahead has run
      got.append(None if buf is None else (buf.shape, buf.dtype))
      # the buffers of the specs up to the next non-None one, never further
      assert made == [s[0] for s in specs[:len(got) + 1] if s is not None]
  assert got == [((2,), np.float32), None, ((3,), np.int8), ((4,), np.float32)]


def test_saved_tensors_start_aligned_and_stored_leaves_are_views(tmp_path):
  """xlt's writer starts the tensors' bytes on a 64-byte boundary, so a leaf stored as xlt holds
  it (a norm's scale, a Linear's weight: Llama loads as a dense_layout="weight" model) is a view
  of the file (the parameter on a CPU), with no copy at all; each equals what the file holds.
  The same checkpoint as kernels is transposed on load and save."""
  cfg, params = pretrained.load(os.path.join(HF, "llama"))
  assert cfg.dense_layout == "weight"
  pretrained.save(cfg, params, str(tmp_path / "out"), source_dir=os.path.join(HF, "llama"))
  cfg, params = pretrained.load(str(tmp_path / "out"))
  tensors = hf_dir.read_model_dir(str(tmp_path / "out"))[1]
  assert min(x.offset for x in tensors.values()) % tensor_files.DATA_ALIGN == 0
  shapes = pretrained._leaf_shapes(cfg)
  flat = {param_paths.path_names(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  kinds = set()
  for leaf, m in pretrained.table(cfg, "llama", shapes).items():
    arrays = [pretrained._tensor(tensors, n, "") for n in m.names]
    view = pretrained._is_view(cfg, leaf, m, arrays, shapes[leaf])
    assert not pretrained._transposed(m, leaf[-1])
    assert view and m.stack is None
    kinds.add((m.layout, view))
    if view:
      assert np.array_equal(np.asarray(flat[leaf]), np.asarray(arrays[0]).reshape(shapes[leaf]))
  assert {("linear", True), ("copy", True)} <= kinds
  kernels = dataclasses.replace(cfg, dense_layout="kernel")
  for leaf, m in pretrained.table(kernels, "llama", pretrained._leaf_shapes(kernels)).items():
    assert pretrained._transposed(m, leaf[-1]) == (m.layout == "linear")  # Llama's Linears have no bias


@pytest.mark.parametrize("family", ["llama", "llama_kv4", "qwen2"])
def test_either_dense_layout_loads_the_same_model_and_saves_the_same_files(family, tmp_path):
  """A checkpoint loads in its family's layout (Linear weights as stored) or as kernels
  (transposed on the way; with as many key/value heads as query heads, q, k and v fused): the
  same logits, and either saves the checkpoint's bytes back. GPT-2's fused Conv1D c_attn
  loads as kernels only: asked for weights, one clear line."""
  path, other = os.path.join(HF, family), "kernel"
  cfg, params = pretrained.load(path)
  cfg_o, params_o = pretrained.load(path, dense_layout=other)
  assert cfg.dense_layout == "weight" and cfg_o.dense_layout == other
  assert {param_paths.path_names(p)[-1] for p, _ in jax.tree_util.tree_flatten_with_path(params_o)[0]} >= {other}
  ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 7)).astype(np.int32)
  apply = compiled(model.apply)
  np.testing.assert_allclose(apply(cfg_o, params_o, ids)[0], apply(cfg, params, ids)[0], rtol=1e-5, atol=1e-5)
  source = hf_dir.read_model_dir(path)[1]
  for name, (c, p) in {"own": (cfg, params), "other": (cfg_o, params_o)}.items():
    pretrained.save(c, p, str(tmp_path / name), source_dir=path)
    saved = hf_dir.read_model_dir(str(tmp_path / name))[1]
    assert saved.keys() <= source.keys()
    for k in saved:
      assert np.asarray(saved[k]).tobytes() == np.asarray(source[k]).tobytes(), (name, k)
  if family == "llama_kv4":
    assert "qkv" in params_o["block_0"]["attn"] and "qkv" not in params["block_0"]["attn"]
  with pytest.raises(ValueError, match="gpt2 holds q, k and v in one Conv1D tensor"):
    pretrained.load(os.path.join(HF, "gpt2"), dense_layout="weight")


def test_cast_on_load_equals_jax_cast():
  cfg, params = pretrained.load(os.path.join(HF, "qwen2"))
  cfg16, params16 = pretrained.load(os.path.join(HF, "qwen2"), dtype="bfloat16")
  assert cfg16.param_dtype == "bfloat16"
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(params16)):
    assert y.dtype == np.dtype("bfloat16")
    assert np.array_equal(np.asarray(x.astype("bfloat16")).view(np.uint16), np.asarray(y).view(np.uint16))


def _write_safetensors(path, header: dict, data: bytes):
  raw = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw + data)


def test_header_offsets_must_hold_the_shape(tmp_path):
  good = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
  _write_safetensors(tmp_path / "good.safetensors", good, bytes(24))
  assert tensor_files.load(str(tmp_path / "good.safetensors"))["a"].shape == (2, 3)
  for bad in ([0, 20], [8, 4], [-4, 20]):  # too short for [2, 3] float32; backwards; negative
    _write_safetensors(tmp_path / "bad.safetensors", {"a": good["a"] | {"data_offsets": bad}}, bytes(24))
    with pytest.raises(ValueError, match="data_offsets"):
      tensor_files.load(str(tmp_path / "bad.safetensors"))


def _odd_vocab_model(tmp_path, kind):
  """A tiny random model with a vocabulary of 61 (prime: no tensor axis divides it), saved as
  a Hugging Face directory: GPT-2's tied head, or Llama's own lm_head."""
  common = dict(vocab_size=61, block_size=32, num_layers=2, num_heads=4, d_model=32)
  if kind == "gpt2":
    cfg = model.Config(**common, tie_embeddings=True)
  else:
    cfg = model.Config(**common, num_kv_heads=2, pos_embedding="rope", norm="rmsnorm", mlp="swiglu",
                       bias=False, mlp_dim=48, tie_embeddings=False)
  params = model.init_params(cfg, jax.random.key(1))
  out = str(tmp_path / kind)
  pretrained.save(cfg, params, out)
  return out


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_odd_vocab_tensor_sharded_equals_unsharded_and_saves_the_original(kind, tmp_path):
  path = _odd_vocab_model(tmp_path, kind)
  cfg, single = pretrained.load(path)
  assert cfg.vocab_padding == 0
  ids = np.random.default_rng(0).integers(0, 61, (4, 9)).astype(np.int32)
  want = np.asarray(apply(cfg, single, ids)[0])
  for axes in ({"data": 2, "tensor": 4}, {"fsdp": 4, "tensor": 2}):
    mesh = sharding.make_mesh(axes)
    cfg8, sharded = pretrained.load(path, mesh=mesh)
    assert cfg8.vocab_padding == -61 % axes["tensor"] and cfg8.vocab_size == 61
    wte = np.asarray(sharded["wte"]["embedding"])
    assert wte.shape[0] == 61 + cfg8.vocab_padding and not wte[61:].any()  # zero rows, no token's
    assert np.array_equal(wte[:61], np.asarray(single["wte"]["embedding"]))
    logits = np.asarray(jax.jit(model.apply, static_argnums=0)(cfg8, sharded, ids)[0])
    assert logits.shape == (4, 9, 61)  # the padded ids are cut: argmax, loss, sampling never see them
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    out = str(tmp_path / f"saved_{axes['tensor']}")
    pretrained.save(cfg8, sharded, out)
    assert json.load(open(os.path.join(out, "config.json")))["vocab_size"] == 61
    saved, source = (hf_dir.read_model_dir(p)[1] for p in (out, path))
    assert saved.keys() == source.keys()
    for k in source:
      assert np.asarray(saved[k]).tobytes() == np.asarray(source[k]).tobytes(), k
    assert pretrained.load(out)[0] == cfg


def test_vocab_padding_follows_the_rules():
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  assert pretrained.vocab_padding(50257, mesh) == 3
  assert pretrained.vocab_padding(64, mesh) == 0
  assert pretrained.vocab_padding(50257, mesh, {**dict(sharding.DEFAULT_RULES), "vocab": None}) == 0


def test_pad_vocab_of_loaded_params_equals_a_padded_load(tmp_path):
  path = _odd_vocab_model(tmp_path, "llama")
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  cfg, params = pretrained.pad_vocab(*pretrained.load(path), mesh)
  cfg8, sharded = pretrained.load(path, mesh=mesh)
  assert cfg == cfg8
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(sharded)):
    assert x.shape == y.shape and np.array_equal(np.asarray(x), np.asarray(y))
  assert pretrained.pad_vocab(cfg, params, mesh)[0] == cfg  # padded once
