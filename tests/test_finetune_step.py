"""benchmarks/finetune_step.py's parent side (no jax, no torch): the static step's partition
names the same parameters in both tools, and the rows pair each round's measurements."""

import pytest

from benchmarks import finetune_step as ft


def test_static_partition_trains_the_mlps_in_both_namings():
  assert ft.trained_in_static("block_0/mlp/gate/kernel") and ft.trained_in_static("model.layers.0.mlp.up_proj.weight")
  assert not ft.trained_in_static("block_0/attn/q/kernel") and not ft.trained_in_static("model.embed_tokens.weight")
  assert not ft.trained_in_static("lm_head.weight") and not ft.trained_in_static("block_0/ln_2/scale")


def test_rows_take_medians_and_paired_ratios():
  spec = ft.SHAPES["tiny"]
  tokens = spec["batch"] * spec["seq"]
  one = lambda s, loss: {"step_s": s, "first_loss": loss, "first_step_s": 3.0, "trainable_params": 2_000_000,
                         "other_cores": 0.1}
  # xlt 1 s, 2 s, 4 s; PyTorch 2 s, 2 s, 2 s: ratios 2, 1, 0.5
  rounds = [{"tiny/full": {"xlt": one(x, 9.0), "torch": one(2.0, 9.0)}} for x in (1.0, 2.0, 4.0)]
  report = {"jobs": ["tiny/full"], "rounds": rounds}
  report["summary"] = ft.summary(report)
  (row,) = ft.table_rows(report)
  assert len(row) == len(ft.COLUMNS)
  assert row[:8] == ["tiny (8 x 128)", "full", 2.0, tokens / 2.0, tokens / 2.0, 1.0, 0.5, 2.0]


def test_unknown_shape_is_one_line():
  with pytest.raises(SystemExit, match="unknown --shapes"):
    ft._pick("tiny,huge", ft.SHAPES, "shapes")
