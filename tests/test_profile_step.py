"""benchmarks/profile_step.py's reading of compiled HLO: the FLOPs of each op's products."""

import jax
import jax.numpy as jnp

from benchmarks import profile_step

HAND_MADE = """HloModule m

%fused_computation.1 (param_0: f32[8,16], param_1: f32[16,4], param_2: f32[4,6]) -> f32[8,6] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  %param_1 = f32[16,4]{1,0} parameter(1)
  %dot.1 = f32[8,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %param_2 = f32[4,6]{1,0} parameter(2)
  ROOT %dot.2 = f32[8,6]{1,0} dot(%dot.1, %param_2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[8,16], b: f32[16,4], c: f32[4,6], d: f32[3,5,7]) -> f32[8,6] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,4]{1,0} parameter(1)
  %c = f32[4,6]{1,0} parameter(2)
  %d = f32[3,5,7]{2,1,0} parameter(3)
  %e = f32[3,7,7]{2,1,0} dot(%d, %d), lhs_batch_dims={0}, lhs_contracting_dims={1}, rhs_batch_dims={0}, rhs_contracting_dims={1}, metadata={op_name="jit(f)/jvp(GPT)/block_0/attn/dot_general"}
  %copy.3 = f32[3,5,7]{2,1,0} copy(%d)
  ROOT %ynn_fusion.4 = f32[8,6]{1,0} fusion(%a, %b, %c), kind=kCustom, calls=%fused_computation.1, metadata={op_name="jit(f)/transpose(jvp(GPT))/lm_head/dot_general"}
}
"""


def test_hand_made_module_counts_each_ops_products():
  ops = profile_step.hlo_ops(HAND_MADE)
  # two chained products in one fusion: 2*8*4*16 + 2*8*6*4
  assert ops["ynn_fusion.4"]["flops"] == 1024 + 384
  # a batched product: batch 3, out 7x7, contracting 5
  assert ops["e"]["flops"] == 2 * 3 * 7 * 7 * 5
  assert ops["copy.3"]["flops"] == 0
  assert profile_step._short(ops["ynn_fusion.4"]["where"]) == "backward lm_head"
  assert profile_step._short(ops["e"]["where"]) == "block_0/attn"


def test_compiled_matmul_is_found_with_its_flops():
  f = jax.jit(lambda a, b: jnp.tanh(a @ b))
  hlo = f.lower(jnp.ones((32, 64)), jnp.ones((64, 16))).compile().as_text()
  ops = profile_step.hlo_ops(hlo)
  # the product appears once at the top level (fused or not); inside a fusion its dot too
  assert max(op["flops"] for op in ops.values()) == 2 * 32 * 16 * 64


def test_report_divides_by_steps_and_devices_and_skips_runtime_events():
  ops = {"ynn_fusion.4": {"flops": 4e9, "where": "jit(f)/jvp(GPT)/block_1/mlp/fc/dot_general"},
         "copy.3": {"flops": 0, "where": ""}}
  times = {"ynn_fusion.4": 40000.0, "copy.3": 10000.0, "ThunkExecutor::Execute": 9e9}  # microseconds
  out = profile_step.report(times, ops, per=2, top=5)  # e.g. 1 step on 2 devices
  assert "| ynn_fusion.4 | 20.00 | 80.0% | 4.000 | 200.0 | block_1/mlp/fc |" in out
  assert "ops: 25.0 ms per step and device; with products 20.0 ms (4.000 GFLOP, 200.0 GFLOP/s)" in out
  assert "by kind: ops with products 20.00, copy 5.00" in out
  assert "ThunkExecutor" not in out


LONG_HEAD = """HloModule m2

%fused_computation.2 (param_0: f32[4,4]) -> (f32[4,4], f32[4,4]) {
  %param_0 = f32[4,4]{1,0} parameter(0)
  %negate.1 = f32[4,4]{1,0} negate(%param_0)
  ROOT %tuple.1 = (f32[4,4]{1,0}, f32[4,4]{1,0}) tuple(%param_0, %negate.1)
}

ENTRY %main (a: f32[8,16], /*index=1*/b: f32[16,4]) -> f32[8,4] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,4]{1,0} parameter(1)
  %custom-call.1 = (f32[8,4]{1,0}, s8[64]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/jvp(GPT)/block_0/mlp/fc/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}
  %fusion.2 = (f32[4,4]{1,0}, f32[4,4]{1,0}) fusion(%b), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(f)/jvp(GPT)/block_0/ln_1/mul"}
  %while.3 = (s32[], f32[8,4]{1,0}) while(%t), condition=%c, body=%w
  ROOT %gte.4 = f32[8,4]{1,0} get-tuple-element(%custom-call.1), index=0
}
"""


def test_tuple_typed_kernels_cublas_calls_and_a_long_entry_head():
  ops = profile_step.hlo_ops(LONG_HEAD)
  # the entry's head holds '=' in a /*index=1*/ comment: its instructions are still its own
  assert ops["custom-call.1"] == {"flops": 2 * 8 * 4 * 16, "where": "jit(f)/jvp(GPT)/block_0/mlp/fc/dot_general",
                                  "cublas": True, "type": "(f32[8,4], s8[64])"}  # its type without layouts
  assert ops["fusion.2"]["flops"] == 0 and not ops["fusion.2"]["cublas"]  # a multi-output fusion is listed
  assert "while.3" not in ops and ops["gte.4"]["flops"] == 0  # a tuple-typed non-kernel is not
