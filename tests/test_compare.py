"""benchmarks/compare.py's arithmetic: the FLOPs it credits a step with, the peaks it divides
by, and the reference-size jobs it reads from the configs (no jax or torch needed)."""

import pytest

from benchmarks import compare, compare_table


def test_flops_per_token_counts_matmuls_and_attention():
  model = dict(num_layers=2, d_model=4, mlp_ratio=4, vocab_size=10)
  # matmul parameters: 2 layers x (qkv 3 + proj 1 + fc 4 + proj 4) x 4 x 4 + head 4 x 10 = 424
  # attention: 12 x 2 layers x 3 positions x width 4 = 288
  assert compare_table.flops_per_token(model, seq=3) == 6 * 424 + 288


def test_peak_is_known_for_datacenter_gpus_or_given():
  assert compare_table.peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4
  assert compare_table.peak_tflops("NVIDIA H100 80GB HBM3", "float32") == 494.7
  assert compare_table.peak_tflops("cpu", "float32") is None
  assert compare_table.peak_tflops("cpu", "float32", override=0.216) == 0.216


def test_reference_jobs_follow_the_configs():
  jobs = {j["name"]: j for j in compare.plan(reference=True)}
  add, text = jobs["addition_ref_full"], jobs["text_ref"]
  assert (add["batch"], add["model"]["num_layers"], add["model"]["d_model"]) == (1024, 12, 128)
  assert (text["batch"], text["seq"], text["accum"]) == (1280, 512, 16)
  assert text["model"]["dtype"] == "bfloat16" and text["model"]["tie_embeddings"]
  assert "addition_ref_full" not in {j["name"] for j in compare.plan()}
  assert compare_table.flops_per_token(text["model"], text["seq"]) == pytest.approx(3.27e8, rel=0.01)


def test_table_shows_the_one_device_column_and_its_ratio():
  job = compare.plan()[0]  # graph_29
  def worker(tps, versions):
    return {"results": {job["name"]: {"tokens_per_s": tps, "step_ms": 1.0}}, "versions": versions,
            "allocator": "mimalloc", "threads": "2", "device": "cpu", "other_cores": 0.0}
  jx = {"jax": "0.10.2"}
  report = {"date": "today", "machine": {"cpu": "test CPU", "cores": 2}, "jobs": [job], "peak_tflops": 0.0,
            "timing": {"steps": 10, "min_seconds": 0.0, "warmup": 3, "decode_steps": 3},
            "rounds": [{"xlt": worker(300.0, jx), "torch": worker(200.0, {"torch": "2"}),
                        compare_table.ONE_DEVICE: worker(150.0, jx)}]}
  out = compare_table.table(report)
  row = next(ln for ln in out.splitlines() if ln.startswith(f"| {job['label']} |"))
  assert row.split(" | ")[1:4] == ["300", "200", "1.50"]
  assert row.rstrip(" |").split(" | ")[-2:] == ["150", "2.00"]
  assert "xlt on 1 device" in out and out.count("jax 0.10.2") == 1
  del report["rounds"][0][compare_table.ONE_DEVICE]
  assert "xlt on 1 device" not in compare_table.table(report)


def test_machine_names_the_widest_vector_isa(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw\n\n"
                  "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw\n")
  m = compare.machine(str(info))
  assert (m["cpu"], m["isa"]) == ("AMD EPYC", "avx512f")
  info.write_text("model name\t: Old CPU\nflags\t\t: fpu sse4_2 avx avx2\n")
  assert compare.machine(str(info))["isa"] == "avx2"
  assert compare.machine(str(tmp_path / "missing"))["isa"] == "unknown"


def test_decode_speed_rows_are_paired_medians():
  """benchmarks/decode_speed.py's table: per batch, each tool's median tokens/s over rounds, the
  median of the rounds' xlt / peer ratios, and the share of each peer's tokens equal to xlt's."""
  from conftest import load_script

  bench = load_script("benchmarks/decode_speed.py")

  def child(seconds, ids):
    return {"batches": {"2": {"s": seconds, "first_s": 5.0, "ids": ids}}}

  xlt_ids = [[1, 2, 3, 4], [5, 6, 7, 8]]
  rounds = [{"xlt": child(1.0, xlt_ids), "eager": child(2.0, [[1, 2, 3, 4], [5, 6, 7, 9]]),
             "compiled": child(1.0, xlt_ids)},
            {"xlt": child(2.0, xlt_ids), "eager": child(2.0, xlt_ids), "compiled": child(4.0, xlt_ids)},
            {"xlt": child(1.0, xlt_ids), "eager": child(3.0, xlt_ids), "compiled": child(1.0, xlt_ids)}]

  class Args:
    batches, new = "2", 4

  columns, rows = bench.summary(rounds, Args)
  row = dict(zip(columns, rows[0]))
  # tokens/s = 2 rows x 4 new / seconds; ratios per round 2, 1, 3 (eager) and 1, 2, 1 (compiled)
  assert row["xlt tok/s"] == 8.0 and row["eager tok/s"] == 4.0 and row["compiled tok/s"] == 8.0
  assert row["xlt / eager"] == 2.0 and row["xlt / compiled"] == 1.0
  assert row["same tokens eager"] == 0.875 and row["same tokens compiled"] == 1.0
  # compilation apart: round 1's first call (5 s, cold caches) less its steady one (1 s)
  assert row["xlt compile s"] == 4.0 and row["torch.compile s"] == 4.0 and row["compiled peer"] == "ok"
  without = [{k: v for k, v in r.items() if k != "compiled"} for r in rounds]
  row = dict(zip(columns, bench.summary(without, Args)[1][0]))
  assert row["xlt / eager"] == 2.0 and row["compiled tok/s"] is None and row["xlt / compiled"] is None
  assert row["compiled peer"] is None and row["torch.compile s"] is None
  # a round where torch.compile failed: no compiled figures, the reason in the row, the rest as before
  failed = [dict(r) for r in rounds]
  failed[1]["compiled"] = {"batches": {"2": {"error": "torch.compile failed: no C++ compiler"}}}
  row = dict(zip(columns, bench.summary(failed, Args)[1][0]))
  assert row["compiled peer"] == "torch.compile failed: no C++ compiler"
  assert row["compiled tok/s"] is None and row["xlt / compiled"] is None and row["same tokens compiled"] is None
  assert row["xlt / eager"] == 2.0 and row["eager tok/s"] == 4.0


def test_decode_speed_compile_failure_is_one_line():
  from conftest import load_script

  bench = load_script("benchmarks/decode_speed.py")
  e = RuntimeError("InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx\nmore")
  assert bench.compile_failure(e) == ("torch.compile failed: RuntimeError: InvalidCxxCompiler: No working C++ "
                                      "compiler found in torch._inductor.config.cpp.cxx")
  assert bench.compile_failure(ValueError()) == "torch.compile failed: ValueError: "


def test_decode_speed_compiled_peer_asks_for_static_cache_and_cpu_compile():
  """The generation-config fields transformers 5 needs to compile on a CPU (its
  `_valid_auto_compile_criteria`): a static cache and `_compile_all_devices`."""
  from conftest import load_script

  bench = load_script("benchmarks/decode_speed.py")

  class CompileConfig:  # transformers.CompileConfig's fields (no transformers in CI)
    _compile_all_devices = None

    def __init__(self, **kw):
      self.__dict__.update(kw)

  fields = bench.compiled_generation(type("transformers", (), {"CompileConfig": CompileConfig}))
  assert fields["cache_implementation"] == "static"
  c = fields["compile_config"]
  assert c._compile_all_devices is True and c.fullgraph is True and c.dynamic is False and c.mode == "default"


def test_schema_rows_pair_each_round_and_take_medians():
  jobs = [{"name": "graph_29", "kind": "train", "label": "graph 29"},
          {"name": "decode", "kind": "decode", "batch": 4, "prompt": 3, "new": 2}]
  res = lambda tps, new: {"results": {"graph_29": {"tokens_per_s": tps}, "decode": {"new_tokens_per_s": new}}}
  report = {"jobs": jobs, "rounds": [{"xlt": res(300.0, 10.0), "torch": res(200.0, 20.0)},
                                     {"xlt": res(100.0, 30.0), "torch": res(100.0, 10.0)},
                                     {"xlt": res(200.0, 20.0), "torch": res(50.0, 20.0)}]}
  rows = compare_table.schema_rows(report)
  assert len(rows[0]) == len(compare_table.SCHEMA_COLUMNS)
  # ratios per round 1.5, 1.0, 4.0: median 1.5, not the ratio of the medians (200 / 100)
  assert rows[0] == ["graph 29", 200.0, 100.0, 1.5, 1.0, 4.0]
  assert rows[1] == ["greedy decoding, batch 4, 3 + 2 tokens: new tokens/s", 20.0, 20.0, 1.0, 0.5, 3.0]


def test_decode_speed_writes_a_failed_compile_into_the_results_file(tmp_path, monkeypatch):
  """A run whose torch.compile peer failed still writes its results file: the other tools'
  figures, and the reason in the compiled peer's column."""
  import json

  from conftest import load_script

  bench = load_script("benchmarks/decode_speed.py")
  error = "torch.compile failed: InductorError: InvalidCxxCompiler: No working C++ compiler found"

  def child(tool, a, model, tmp):
    if tool == "compiled":
      return {"batches": {"1": {"error": error}}, "versions": {"torch": "t"}}
    ok = {"s": 0.5, "first_s": 2.5, "times": [0.5], "ids": [[1, 2]]}
    return {"batches": {"1": ok}, "versions": {"jax": "j"} if tool == "xlt" else {"torch": "t"}}

  monkeypatch.setattr(bench, "write_checkpoint", lambda *args: None)
  monkeypatch.setattr(bench, "run_child", child)
  out = tmp_path / "decode_speed.json"
  args = dict(quick=False, rounds=2, batches="1", reps=1, new=2, prompt=3, workdir=str(tmp_path), shape="tiny",
              peers="eager,compiled", out=str(out), notes="")
  bench.main(type("Args", (), args))
  record = json.loads(out.read_text())
  row = dict(zip(record["columns"], record["rows"][0]))
  assert row["compiled peer"] == error and row["compiled tok/s"] is None
  assert row["xlt tok/s"] == 4.0 and row["xlt / eager"] == 1.0 and row["xlt compile s"] == 2.0
