"""benchmarks/gpu_trace.py's attribution of a GPU trace's kernels to a compiled module's ops:
cuBLAS's kernels in order to its cuBLAS calls, XLA's fusions (and Triton's products) by name."""

import pytest

from benchmarks import gpu_trace, profile_step

HAND_MADE = """HloModule jit_step, is_scheduled=true

%gemm_fusion_dot.7_computation (parameter_0: bf16[64,32], parameter_1: bf16[32,16]) -> bf16[64,16] {
  %parameter_0 = bf16[64,32]{1,0} parameter(0)
  %parameter_1 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,16]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_multiply.3 (param_0: bf16[64,16]) -> bf16[64,16] {
  %param_0 = bf16[64,16]{1,0} parameter(0)
  ROOT %multiply.1 = bf16[64,16]{1,0} multiply(%param_0, %param_0)
}

ENTRY %main (x: bf16[64,32], w: bf16[32,16], v: bf16[16,8]) -> bf16[64,8] {
  %x = bf16[64,32]{1,0} parameter(0)
  %w = bf16[32,16]{1,0} parameter(1)
  %v = bf16[16,8]{1,0} parameter(2)
  %gemm_fusion_dot.7 = bf16[64,16]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion_dot.7_computation, metadata={op_name="jit(step)/jvp(GPT)/block_0/mlp/up/dot_general"}
  %loop_multiply_fusion.3 = bf16[64,16]{1,0} fusion(%gemm_fusion_dot.7), kind=kLoop, calls=%fused_multiply.3, metadata={op_name="jit(step)/jvp(GPT)/block_0/mlp/mul"}
  %custom-call.1 = (bf16[64,8]{1,0}, s8[1024]{0}) custom-call(%loop_multiply_fusion.3, %v), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/jvp(GPT)/block_0/mlp/proj/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}
  %custom-call.2 = (bf16[64,8]{1,0}, s8[1024]{0}) custom-call(%loop_multiply_fusion.3, %v), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/transpose(jvp(GPT))/block_1/mlp/proj/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}
  ROOT %gte = bf16[64,8]{1,0} get-tuple-element(%custom-call.2), index=0
}
"""
KERNELS = [{"name": "gemm_fusion_dot_7", "dur": 2.0}, {"name": "loop_multiply_fusion_3", "dur": 1.0},
           {"name": "nvjet_sm90_tst_128x256", "dur": 4.0},
           {"name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "dur": 3.0},
           {"name": "nvjet_sm90_tst_256x128", "dur": 8.0}]


def test_cublas_calls_in_order_with_their_flops():
  calls = gpu_trace.cublas_calls(profile_step.hlo_ops(HAND_MADE))
  assert [c["name"] for c in calls] == ["custom-call.1", "custom-call.2"]
  assert [c["flops"] for c in calls] == [2 * 64 * 8 * 16] * 2


def test_kernels_are_attributed_by_name_and_in_order():
  rows = gpu_trace.attribute(KERNELS, HAND_MADE)
  assert [(cls, us) for cls, us, _ in rows] == [("Triton product", 2.0), ("other op", 1.0), ("cuBLAS product", 4.0),
                                                ("cuDNN attention", 3.0), ("cuBLAS product", 8.0)]
  assert rows[0][2]["flops"] == 2 * 64 * 16 * 32
  assert rows[4][2]["where"].endswith("transpose(jvp(GPT))/block_1/mlp/proj/dot_general")
  out = gpu_trace.report(rows, top=5, peak_tflops=989, span_us=20.0)
  assert out.startswith("kernels: 0.0 ms in a 0.0 ms span; products")
  assert "by class: cuBLAS product 0.0 ms (67%), cuDNN attention 0.0 ms (17%)" in out
  assert "| backward block_*/mlp/proj | 1 | 0.01 | 0 |" in out
  # an other op: its kernels, time and result type
  assert "| loop_multiply_fusion_3 | block_0/mlp | 1 | 0.00 | bf16[64,16] |" in out


def test_a_trace_of_another_module_is_one_clear_error():
  with pytest.raises(SystemExit, match="3 cuBLAS kernels in the trace, 2 cuBLAS calls in the HLO"):
    gpu_trace.attribute(KERNELS + [{"name": "nvjet_x", "dur": 1.0}], HAND_MADE)
