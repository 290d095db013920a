"""xlt.plan on the suite's fake CPU devices at tiny sizes: the compiled step's per-device
arguments are the sharded state counted by hand, a plan over a tiny memory limit says it does
not fit and what to change, fsdp brings collectives that one device has none of, LoRA's and a
frozen partition's steps plan, bad input is one line and exit 2; a TPU topology's plan where
libtpu is installed (the `tpu` extra), skipped without it; xlt.roofline's parsing and times."""

import datetime
import importlib.util
import json
import pathlib
import shlex

import jax
import numpy as np
import pytest

from xlt import loop, model, plan, plan_report, report, roofline

REPO = pathlib.Path(__file__).resolve().parent.parent
BASE = str(REPO / "tests" / "fixtures" / "hf" / "llama")  # Llama-shaped: vocab 64, width 32, 2 blocks
TINY = ["--config=" + str(REPO / "configs" / "finetune.py"), f"--config.base={BASE}", "--config.data.block_size=16",
        "--config.train.batch_size=8", "--config.merges=()", "--config.partition.presets=()"]


def _plan(*extra, tmp_path=None):
  out = str(tmp_path / "plan.json")
  plan.run([*TINY, *extra, f"--output={out}", "--overwrite"])
  with open(out) as f:
    return json.load(f)


def _hand_param_bytes(fsdp: int) -> int:
  """The tiny Llama's float32 parameters per device with `embed` over fsdp devices (every
  matrix has an embed axis; the norm scales are replicated by xlt's rules)."""
  d, v, f, layers, q, kv = 32, 64, 48, 2, 4 * 8, 2 * 8
  matrices = 2 * v * d + layers * (d * q + 2 * d * kv + q * d + 3 * d * f)
  norms = (2 * layers + 1) * d
  return 4 * (matrices // fsdp + norms)


def test_arguments_are_the_sharded_state_counted_by_hand(tmp_path):
  r = _plan("--cpu_devices=4", "--meshes=1x4x1", tmp_path=tmp_path)
  (stage,) = r["stages"]  # the task and the language expert compile to one step
  assert stage["names"] == ["finetune_task_expert", "finetune_language_expert"]
  x = stage["candidates"][0]
  params = _hand_param_bytes(4)
  # params, Adam's two moments like them, two int32 counts (Adam's, the schedule's), the step
  # (int32) and `active` (bool); the batch's rows split 4 ways: tokens [1, 8, 17] int32, mask [1, 8, 16] f32
  state = 3 * params + 2 * 4 + 4 + 1
  batch = (8 * 17 * 4 + 8 * 16 * 4) // 4
  assert x["memory"]["argument"] == state + batch
  assert x["state_bytes"] == state
  assert x["memory"]["alias"] == state  # the donated state's buffers are the outputs'
  assert x["analytic"]["params"] == params  # xlt.memory counts the same shards
  assert x["fits"] is None  # no limit given on a CPU


def test_over_a_tiny_limit_it_says_so_and_what_to_change(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    _plan("--cpu_devices=2", "--meshes=1x2x1", "--device_memory_gb=0.00001", tmp_path=tmp_path)
  assert e.value.code == 1
  advice = [line for line in capsys.readouterr().out.splitlines() if "does not fit" in line]
  assert len(advice) == 1 and "try" in advice[0] and "mesh 1x2x1" in advice[0]
  with open(tmp_path / "plan.json") as f:
    assert json.load(f)["stages"][0]["candidates"][0]["fits"] is False


def test_fsdp_brings_collectives_one_device_has_none(tmp_path):
  one = _plan("--cpu_devices=1", "--meshes=1x1x1", tmp_path=tmp_path)["stages"][0]["candidates"][0]
  assert one["collectives"] == {} and one["sent"] == 0
  four = _plan("--cpu_devices=4", "--meshes=1x4x1", tmp_path=tmp_path)["stages"][0]["candidates"][0]
  assert "all-gather" in four["collectives"] and four["sent"] > 0


def test_under_fsdp_the_residual_stream_stays_split_over_the_batch(tmp_path, monkeypatch):
  # model.batch_sharded holds the residual stream split over data x fsdp; left to itself the
  # partitioner gathered activations too (on these devices: 665 KB of collectives against 173
  # KB, half again the temp memory); a data-only mesh splits the batch either way: the same bytes
  def collectives(mesh, devices):
    x = _plan(f"--cpu_devices={devices}", f"--meshes={mesh}", tmp_path=tmp_path)["stages"][0]["candidates"][0]
    return sum(v["bytes"] for v in x["collectives"].values()), x["memory"]["temp"]

  split = {m: collectives(m, n) for m, n in (("1x4x1", 4), ("4x1x1", 4))}
  monkeypatch.setattr(model, "batch_sharded", lambda x: x)
  free = {m: collectives(m, n) for m, n in (("1x4x1", 4), ("4x1x1", 4))}
  assert split["1x4x1"][0] * 2 < free["1x4x1"][0] and split["1x4x1"][1] < free["1x4x1"][1], (split, free)
  assert split["4x1x1"] == free["4x1x1"]


def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path, capsys):
  out = tmp_path / "plan.json"
  out.write_text("a plan the user keeps")
  assert plan.main([*TINY, "--cpu_devices=1", f"--output={out}"]) == 2
  assert capsys.readouterr().err == f"xlt.plan: error: --output={out} exists: give --overwrite to replace it\n"
  assert out.read_text() == "a plan the user keeps"


def test_lora_and_a_frozen_partition_plan(tmp_path):
  r = _plan("--cpu_devices=2", "--meshes=2x1x1", "--config.partition.presets=('C',)", "--config.lora.enabled=True",
            "--stages=finetune_partial_task_expert_C,lora", tmp_path=tmp_path)
  by_name = {s["names"][0]: s["candidates"][0] for s in r["stages"]}
  partial, lora = by_name["finetune_partial_task_expert_C"], by_name["lora"]
  full_state = 3 * _hand_param_bytes(1)
  # the partial expert holds Adam moments for its trained part only; LoRA for its adapters
  assert _hand_param_bytes(1) < partial["state_bytes"] < full_state
  assert lora["state_bytes"] < 2 * full_state  # two LoRA recipes: the base twice, small adapters
  assert all(x["ratio"] > 0 for x in (partial, lora))


@pytest.mark.parametrize("argv, words", [
    (["--config=no/such.py"], "no such config file"),
    ([*TINY, "--meshes=2x2"], "DATAxFSDPxTENSOR"),
    ([*TINY, "--config.nope=1"], "no field"),
    ([*TINY, "--stages=nope"], "no stage"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
  assert plan.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("xlt.plan: error:") and words in err[0]


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed (pip install .[tpu])")
def test_a_tiny_plan_for_a_tpu_topology(tmp_path):
  r = _plan("--topology=v5e:2x2", "--meshes=1x4x1", tmp_path=tmp_path)
  x = r["stages"][0]["candidates"][0]
  assert r["chip"] == "TPU v5e" and r["devices"] == 4 and x["fits"] is True
  assert x["roofline"]["step_s"] > 0 and 0 < x["mfu"] < 1


def test_abstract_init_params_give_the_loops_state():
  from xlt import model, train

  cfg = model.Config(vocab_size=16, num_layers=1, num_heads=2, d_model=8, block_size=8)
  tx = train.make_optimizer(plan.load_config(str(REPO / "configs" / "finetune.py"), []).opt)
  params = jax.vmap(lambda k: model.init_params(cfg, k))(jax.random.split(jax.random.key(0), 2))
  params = jax.tree.map(np.asarray, params)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  assert loop.abstract_state(cfg, tx, [0, 1], params) == loop.abstract_state(cfg, tx, [0, 1], shapes)


def test_roofline_parses_each_collective_and_bounds_the_step():
  hlo = "\n".join([
      "%ag = bf16[8,128]{1,0} all-gather(bf16[2,128]{1,0} %p), replica_groups=mesh['data'=2,'fsdp'=4] {'fsdp'}",
      "%rs = f32[16]{0} reduce-scatter(f32[64]{0} %g), replica_groups=[2,4]<=[8], dimensions={0}",
      "%ar = f32[100]{0} all-reduce(f32[100]{0} %x), replica_groups={{0,1},{2,3},{4,5},{6,7}}",
      "%cp-start = (f32[10]{0}, f32[10]{0}) collective-permute-start(f32[10]{0} %y), source_target_pairs={{0,1}}",
      "%arc = (f32[4]{0}, bf16[8]{0}) all-reduce(f32[4]{0} %u, bf16[8]{0} %w), replica_groups=[1,8]<=[8]",
      "%add = f32[100]{0} add(f32[100]{0} %a, f32[100]{0} %b)"])
  found = roofline.collectives(hlo, 8)
  assert [(c["op"], c["bytes"], c["group"]) for c in found] == [
      ("all-gather", 2048, 4), ("reduce-scatter", 64, 4), ("all-reduce", 400, 2), ("collective-permute", 40, 2),
      ("all-reduce", 32, 8)]
  assert [c["sent"] for c in found] == [1536, 192, 400, 40, 56]
  chip = roofline.CHIPS["v5e"]
  t = roofline.step_time(chip, flops=197e12, hbm_bytes=0.0, sent=0.0)
  assert t["bound"] == "flops" and t["step_s"] == pytest.approx(1.0)
  assert roofline.chip_of("TPU v5 lite") is chip and roofline.chip_of("cpu") is None
  t = roofline.step_time(chip, flops=98.5e12, hbm_bytes=0.0, sent=0.0, model_flops=197e12)
  assert t["step_s"] == pytest.approx(1.0) and t["flops_from"] == "model"
  assert roofline.step_time(chip, 197e12, 0.0, 0.0, model_flops=98.5e12)["flops_from"] == "compiled"


def test_cost_analysis_counts_a_loop_body_once_so_the_model_flops_are_the_floor():
  import jax
  import jax.numpy as jnp
  x = jnp.ones((32, 32))
  ten = jax.jit(lambda x: jax.lax.scan(lambda c, _: (c @ x, None), x, None, length=10)[0]).lower(x).compile()
  one = jax.jit(lambda x: x @ x).lower(x).compile()
  flops = [c[0] if isinstance(c, (list, tuple)) else c for c in (ten.cost_analysis(), one.cost_analysis())]
  assert flops[0]["flops"] < 2 * flops[1]["flops"]  # ten matmuls counted as one (if this fails, the floor can go)
  assert roofline.while_loops(ten.as_text()) == 1 and roofline.while_loops(one.as_text()) == 0


def test_render_puts_the_tables_between_the_docs_markers(tmp_path):
  _plan("--cpu_devices=2", "--meshes=1x2x1", tmp_path=tmp_path)
  doc = tmp_path / "scale.md"
  doc.write_text(f"# Scale\n\nbefore\n{plan_report.BEGIN}\nold table\n{plan_report.END}\nafter\n")
  assert plan.main([f"--render={tmp_path}/*.json", f"--doc={doc}"]) == 0
  text = doc.read_text()
  assert "old table" not in text and text.startswith("# Scale\n\nbefore\n") and text.endswith("after\n")
  (row,) = [line for line in text.splitlines() if "finetune_task_expert" in line]
  assert "| 1x2x1 | none |" in row


def test_an_mfu_above_one_is_rendered_void_and_a_floored_step_says_so(tmp_path):
  r = json.loads((REPO / "results" / "plans" / "layer_swap_8b_v6e-16.json").read_text())
  x = r["stages"][0]["candidates"][0]
  assert 0 < x["mfu"] < 1
  (tmp_path / "ok.json").write_text(json.dumps(r))
  x["mfu"] = 1.17  # a compiled FLOP count below the model's own
  (tmp_path / "void.json").write_text(json.dumps({**r, "target": "elsewhere"}))
  rows = {line.split(" | ")[2]: line for line in plan_report.markdown([f"{tmp_path}/*.json"]).splitlines()
          if "finetune_task_expert" in line}
  assert "117.0% (void" in rows["elsewhere"] and "void" not in rows[r["target"]]
  x["mfu"], x["roofline"] = 1.0, {**x["roofline"], "bound": "flops", "flops_from": "model"}
  (tmp_path / "void.json").write_text(json.dumps({**r, "target": "elsewhere"}))
  rows = {line.split(" | ")[2]: line for line in plan_report.markdown([f"{tmp_path}/*.json"]).splitlines()
          if "finetune_task_expert" in line}
  assert "(flops, model's count) | 100.0% |" in rows["elsewhere"]


def test_a_plan_file_records_how_it_was_made(tmp_path):
  out = str(tmp_path / "plan.json")
  argv = [*TINY, "--cpu_devices=2", "--meshes=1x2x1", f"--output={out}"]
  plan.run(argv)
  with open(out) as f:
    r = json.load(f)
  assert set(plan_report.PROVENANCE) <= set(r)
  assert r["command"] == "python -m xlt.plan " + shlex.join(argv)
  assert r["commit"] == report.git_commit() and r["machine"] == report.machine()
  when = datetime.datetime.fromisoformat(r["date"])
  assert when.utcoffset() == datetime.timedelta(0)
  assert abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) < 3600
  assert isinstance(r["wall_s"], float) and r["wall_s"] > 0
  (line,) = [x for x in plan_report.markdown([out]).splitlines() if x.startswith("- plan.json:")]
  assert f"`{r['command']}` at {r['commit']}, {r['date']}, {r['machine']}, wall" in line


def test_the_docs_tables_are_the_committed_plans():
  text = (REPO / "docs" / "scale.md").read_text()
  tables = text.split(plan_report.BEGIN + "\n", 1)[1].split(plan_report.END, 1)[0]
  assert tables == plan_report.markdown([str(REPO / "results" / "plans" / "*.json")]), (
      "docs/scale.md is stale: python -m xlt.plan --render='results/plans/*.json' --doc=docs/scale.md")


def test_gpus_are_planned_analytically_and_labelled(tmp_path):
  r = _plan("--gpus=h200:2", "--meshes=1x2x1", tmp_path=tmp_path)
  x = r["stages"][0]["candidates"][0]
  assert r["target"] == "2x H200 SXM (analytic)" and x["analytic_only"] and x["fits"] is True
  assert "memory" not in x and x["analytic"]["params"] == _hand_param_bytes(2)
