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
    ft.pick("tiny,huge", ft.SHAPES, "shapes")


def test_product_ceiling_counts_a_steps_flops():
  """benchmarks/product_ceiling.py's products of one step: full fine-tuning multiplies each
  matrix three times (forward, input gradient, weight gradient), 6 x tokens x its size; the
  frozen partition twice, plus the MLPs' weight gradients; LoRA adds its rank-r products."""
  from benchmarks import product_ceiling as pc

  spec = ft.SHAPES["small"]
  c, tokens = spec["config"], spec["batch"] * spec["seq"]
  h, m, v, n = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
  kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
  mlp, attn = 3 * h * m, 2 * h * h + 2 * h * kv
  total = lambda mode: sum(pc.flops(p) for p in pc.products("small", mode))
  assert total("full") == 6 * tokens * (n * (attn + mlp) + h * v)
  assert total("static") == 4 * tokens * (n * (attn + mlp) + h * v) + 2 * tokens * n * mlp
  r, fans = ft.LORA["rank"], 2 * h + 2 * h + 2 * (h + kv) + 3 * (h + m)  # sum of in + out over q, o, k, v, MLPs
  assert total("lora") == 4 * tokens * (n * (attn + mlp) + h * v) + 6 * tokens * r * n * fans
  assert len(pc.products("small", "full")) == n * 7 * 3 + 3


def test_product_ceiling_table_ends_with_the_reference_gemm():
  """The table's rows sum each job's products' median times; its last row is the 4096^3
  product alone, whatever jobs ran."""
  import json

  from benchmarks import product_ceiling as pc

  jobs = [("tiny", "full")]
  keys = {(k, d) for k, d in pc.products("tiny", "full")} | {pc.REFERENCE}
  fake = lambda s: {"seconds": {json.dumps([k, list(d)]): s for k, d in keys}}
  rows = pc.table_rows(jobs, [{"xlt": fake(1e-3), "torch": fake(2e-3)}])
  assert [r[:2] for r in rows] == [["tiny", "full"], ["4096^3 GEMM", "-"]]
  assert rows[0][2] == len(pc.products("tiny", "full")) and rows[0][4] == round(rows[0][2] * 1.0, 1)
  assert rows[1][2:7] == [1, round(2 * 4096**3 / 1e9, 2), 1.0, 2.0, 2.0]


def test_product_ceiling_steps_beside_the_products():
  """With the steps timed in the same rounds, each job's row adds both steps' medians, the
  median of the rounds' paired step ratios, and PyTorch's step over xlt's products in the same
  round; the reference GEMM's row gets dashes."""
  import json

  from benchmarks import product_ceiling as pc

  jobs = [("tiny", "full")]
  keys = {(k, d) for k, d in pc.products("tiny", "full")} | {pc.REFERENCE}
  n = len(pc.products("tiny", "full"))
  fake = lambda s: {"seconds": {json.dumps([k, list(d)]): s for k, d in keys}}
  step = lambda x, t: {"tiny/full": {"xlt": {"step_s": x}, "torch": {"step_s": t}}}
  rounds = [{"xlt": fake(1e-3), "torch": fake(1e-3), "steps": step(0.1, 0.2)},   # ratio 2, torch / products 2/n*1e3
            {"xlt": fake(2e-3), "torch": fake(2e-3), "steps": step(0.4, 0.2)},   # ratio 0.5
            {"xlt": fake(4e-3), "torch": fake(4e-3), "steps": step(0.2, 0.3)}]   # ratio 1.5
  rows = pc.table_rows(jobs, rounds)
  assert len(rows[0]) == len(pc.COLUMNS) + len(pc.STEP_COLUMNS) == len(rows[1])
  assert rows[0][-4:] == [200.0, 200.0, 1.5, round(0.2 / (n * 2e-3), 3)]
  assert rows[1][-4:] == ["-"] * 4
  assert len(pc.table_rows(jobs, [{k: v for k, v in r.items() if k != "steps"} for r in rounds])[0]) == len(pc.COLUMNS)


def test_update_default_is_the_fine_tuning_kinds():
  """--update=config times the step as configs/finetune.py trains (a value ensemble_step takes:
  a ConfigDict's `.update` would be its method); any other value is itself."""
  from configs import finetune

  assert ft.update_of("config") == finetune.get_config().train["update"]
  assert ft.update_of("config") in ("auto", "map", "vmap")
  assert ft.update_of("map") == "map"
