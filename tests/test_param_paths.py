"""xlt.param_paths: how xlt's and Hugging Face's parameter names place a tensor (block, kind),
which axes are its rows (output units), and naming rules made from a pattern or a function."""

import numpy as np
import pytest

from xlt import param_paths
from xlt.param_paths import HF, XLT

# Shapes of a tiny xlt GPT: D=2, H=1, K=2, F=4, V=3.
D, H, K, F, V = 2, 1, 2, 4, 3


def test_path_names_and_path_str_round_trip():
  import jax

  tree = {"block_0": {"mlp": {"fc": {"kernel": np.ones(2)}}}, "wte": [np.ones(1)]}
  got = [param_paths.path_names(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  assert got == [("block_0", "mlp", "fc", "kernel"), ("wte", "0")]
  assert param_paths.path_str(got[0]) == "block_0/mlp/fc/kernel"
  assert param_paths.path_names("block_0/mlp/fc/kernel") == got[0]
  assert param_paths.path_names(got[0]) == got[0]  # idempotent


def test_rows_are_output_units():
  x = np.arange(D * F).reshape(D, F)  # a flax [in, out] kernel: rows are its columns
  rows = XLT.rows(("block_0", "mlp", "fc", "kernel"), x)
  np.testing.assert_array_equal(rows, x.T)
  proj = np.arange(H * K * D).reshape(H, K, D)  # attn proj: two input axes
  np.testing.assert_array_equal(XLT.rows(("block_0", "attn", "proj", "kernel"), proj), proj.reshape(H * K, D).T)
  qkv = np.arange(D * 3 * H * K).reshape(D, 3, H, K)
  np.testing.assert_array_equal(XLT.rows(("block_0", "attn", "qkv", "kernel"), qkv), qkv.reshape(D, -1).T)
  emb = np.arange(V * D).reshape(V, D)
  np.testing.assert_array_equal(XLT.rows(("wte", "embedding"), emb), emb)
  np.testing.assert_array_equal(XLT.rows(("wpe",), emb), emb)
  np.testing.assert_array_equal(XLT.rows(("block_0", "attn", "qkv", "bias"), np.ones((3, H, K))),
                                np.ones((1, 3 * H * K)))
  assert XLT.rows(("ln_f", "scale"), np.ones(D)).shape == (1, D)
  for path, a in ((("block_0", "mlp", "fc", "kernel"), x), (("block_0", "attn", "proj", "kernel"), proj),
                  (("block_0", "attn", "qkv", "kernel"), qkv)):
    np.testing.assert_array_equal(XLT.from_rows(path, XLT.rows(path, a), a.shape), a)
  assert XLT.local_name(("block_12", "attn", "qkv", "kernel")) == "attn/qkv/kernel"


def test_hf_naming_places_llama_and_gpt2_names():
  assert HF.block_kind(("model.layers.3.self_attn.q_proj.weight",)) == (3, "attn")
  assert HF.block_kind(("model.layers.12.mlp.down_proj.weight",)) == (12, "mlp")
  assert HF.block_kind(("model.layers.0.post_attention_layernorm.weight",)) == (0, "norm")
  assert HF.block_kind(("model.embed_tokens.weight",)) == (None, "embedding")
  assert HF.block_kind(("model.norm.weight",)) == (None, "head")
  assert HF.block_kind(("lm_head.weight",)) == (None, "head")
  assert HF.block_kind(("transformer.h.5.mlp.c_fc.weight",)) == (5, "mlp")
  assert HF.block_kind(("transformer.h.1.ln_2.bias",)) == (1, "norm")
  assert HF.block_kind(("transformer.wpe.weight",)) == (None, "embedding")
  assert HF.local_name(("model.layers.3.self_attn.q_proj.weight",)) == "self_attn.q_proj.weight"
  # rows = output units: axis 0 of torch Linear [out, in], axis 1 of GPT-2 Conv1D [in, out]
  assert HF.rows(("model.layers.0.mlp.up_proj.weight",), np.zeros((12, 8))).shape == (12, 8)
  assert HF.rows(("transformer.h.0.mlp.c_fc.weight",), np.zeros((8, 32))).shape == (32, 8)
  assert HF.rows(("model.norm.weight",), np.zeros(8)).shape == (1, 8)
  with pytest.raises(ValueError, match="no rule of the 'hf' naming"):
    HF.block_kind(("model.vision_tower.patch_embed.weight",))
  llama = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
           "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight",
           "model.layers.0.input_layernorm.weight"]
  assert param_paths.naming_for(llama) is HF
  assert param_paths.naming_for(["wte/embedding", "block_0/attn/qkv/kernel"]) is XLT
  with pytest.raises(ValueError, match="'model.rotary.inv_freq': no naming rule recognises it"):
    param_paths.naming_for(["model.layers.0.mlp.up_proj.weight", "model.rotary.inv_freq"])


def test_from_pattern_places_blocks_and_kinds():
  nm = param_paths.from_pattern("gpt_neox.layers.{i}.")
  assert nm.block_kind("gpt_neox.layers.12.attention.dense.weight") == (12, "attn")
  assert nm.block_kind("gpt_neox.layers.0.post_attention_layernorm.weight") == (0, "norm")
  assert nm.block_kind("gpt_neox.layers.3.mlp.dense_h_to_4h.weight") == (3, "mlp")
  assert nm.block_kind("gpt_neox.embed_in.weight") == (None, "embedding")
  assert nm.block_kind("embed_out.weight") == (None, "head")
  assert nm.local_name("gpt_neox.layers.3.mlp.dense_h_to_4h.weight") == "mlp.dense_h_to_4h.weight"
  with pytest.raises(ValueError, match="must hold"):
    param_paths.from_pattern("gpt_neox.layers.")
