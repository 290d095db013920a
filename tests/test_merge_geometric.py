"""xlt.merge.geometric and xlt.merge.selective (mergekit's slerp, nuslerp, multislerp, karcher,
model_stock, nearswap, arcee_fusion, ram, ramplus_tl): the same tensors as mergekit on the tiny
Llama fixtures (tests/fixtures/mergekit/geometric/, made by
tests/fixtures/make_mergekit_fixtures_geometric.py; live where mergekit is installed), exact
values on hand-made trees, the invariants each method promises, and the command end to end."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import load_script
from xlt.io import hf_dir as hf
from xlt.merge import geometric, registry, selective
from xlt.param_paths import HF, XLT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
GEOMETRIC = os.path.join(FIXTURES, "mergekit", "geometric")
MODEL_DIRS = {"llama": os.path.join(FIXTURES, "hf", "llama"), "llama_b": os.path.join(FIXTURES, "hf", "llama_b"),
              "llama_c": os.path.join(GEOMETRIC, "llama_c")}

# fixture case -> (xlt method, {role: model name or list}, options): the same merge as the
# mergekit config of that name in the fixture script's CASES
CASES = {
    "slerp": ("slerp", {"base": "llama", "other": "llama_b"}, {"t": 0.3}),
    "slerp_gradient": ("slerp", {"base": "llama", "other": "llama_b"}, {"t": [0.1, 0.9, 0.5]}),
    "nuslerp": ("nuslerp", {"base": "llama", "experts": ["llama_b", "llama_c"]}, {"weights": [0.3, 0.7]}),
    "nuslerp_rows": ("nuslerp", {"base": "llama", "experts": ["llama_b", "llama_c"]},
                     {"weights": [0.3, 0.7], "flatten": False}),
    "nuslerp_nobase_columns": ("nuslerp_nobase", {"models": ["llama", "llama_b"]},
                               {"weights": [1.0, 2.0], "flatten": False, "row_wise": True}),
    "multislerp": ("multislerp", {"base": "llama", "experts": ["llama_b", "llama_c"]}, {"weights": [0.4, 0.6]}),
    "multislerp_nobase": ("multislerp_nobase", {"models": ["llama", "llama_b", "llama_c"]},
                          {"weights": [0.2, 0.3, 0.4], "normalize_weights": False}),
    "karcher": ("karcher", {"models": ["llama", "llama_b", "llama_c"]}, {}),
    "karcher_3_steps": ("karcher", {"models": ["llama", "llama_b", "llama_c"]}, {"max_iter": 3, "tol": 1e-4}),
    "model_stock": ("model_stock", {"base": "llama", "experts": ["llama_b", "llama_c"]}, {}),
    "model_stock_filter_wise": ("model_stock", {"base": "llama", "experts": ["llama_b", "llama_c"]},
                                {"filter_wise": True}),
    "nearswap": ("nearswap", {"base": "llama", "other": "llama_b"}, {"t": 0.3}),
    "arcee_fusion": ("arcee_fusion", {"base": "llama", "other": "llama_b"}, {}),
    "ram": ("ram", {"base": "llama", "experts": ["llama_b", "llama_c"]}, {}),
    "ramplus_tl": ("ramplus_tl", {"base": "llama", "experts": ["llama_b", "llama_c"]}, {"r": 0.5, "alpha": 0.4}),
}
TOLERANCE = 1e-5  # float32 rounding (xlt accumulates in float64, mergekit in float32)


def fixture_script():
  return load_script("tests/fixtures/make_mergekit_fixtures_geometric.py")


def model(name: str) -> dict:
  return hf.read_model_dir(MODEL_DIRS[name])[1]  # lazy tensors, as the command merges them


def xlt_merge(case: str) -> dict:
  method, inputs, options = CASES[case]
  trees = {r: [model(m) for m in v] if isinstance(v, list) else model(v) for r, v in inputs.items()}
  return registry.merge(method, trees, options, naming="auto")


def max_diff(got: dict, want: dict) -> float:
  return max(float(np.abs(np.asarray(got[k], np.float64) - want[k]).max()) for k in want)


def test_cases_are_the_fixture_scripts_and_every_method_has_one():
  assert set(CASES) == set(fixture_script().CASES)
  declared = [m for m in registry.METHODS.values() if m.fn.__module__ in ("xlt.merge.geometric", "xlt.merge.selective")]
  assert {m for m, _, _ in CASES.values()} == {m.name for m in declared}
  for m in declared:
    assert m.paper and m.mergekit == m.name.removesuffix("_nobase") and not any(o.tree for o in m.options)
    assert all(o.help for o in m.options), m.name


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_tensors_as_mergekit(case):
  want = load_file(os.path.join(GEOMETRIC, f"{case}.safetensors"))
  got = xlt_merge(case)
  assert max_diff(got, want) < TOLERANCE, case
  assert all(np.asarray(got[k]).dtype == np.float32 for k in want)


def test_the_mergekit_fixtures_are_not_trivial():
  """Each case tells its options apart: a parity test of a no-op would prove nothing."""
  f = lambda case: load_file(os.path.join(GEOMETRIC, f"{case}.safetensors"))
  base, other = (load_file(os.path.join(MODEL_DIRS[m], "model.safetensors")) for m in ("llama", "llama_b"))
  k = "model.layers.0.self_attn.k_proj.weight"
  for a, b in (("slerp", "slerp_gradient"), ("nuslerp", "nuslerp_rows"), ("model_stock", "model_stock_filter_wise"),
               ("ram", "ramplus_tl")):
    assert np.abs(f(a)[k] - f(b)[k]).max() > 0.01, (a, b)
  fusion = f("arcee_fusion")[k]
  assert 0.8 < np.isclose(fusion, base[k], atol=1e-6).mean() < 1 and np.isclose(fusion, other[k], atol=1e-6).any()
  near = f("nearswap")[k]
  assert 0.5 < np.isclose(near, other[k]).mean() < 1


@pytest.mark.parametrize("case", ["slerp_gradient", "nuslerp_rows", "multislerp_nobase", "karcher", "arcee_fusion",
                                  "ramplus_tl"])
def test_live_against_mergekit(tmp_path, case):
  pytest.importorskip("mergekit")
  want = fixture_script().run_mergekit(fixture_script().CASES[case], str(tmp_path / "out"))
  got = xlt_merge(case)
  assert sorted(got) == sorted(want)
  assert max_diff(got, want) < TOLERANCE, case


# ---- exact values and invariants on hand-made trees


def tree(*values, name="model.layers.0.mlp.up_proj.weight") -> dict:
  return {name: np.array(values, np.float32)}


def close(got: dict, want, atol=1e-6):
  np.testing.assert_allclose(next(iter(got.values())), np.asarray(want, np.float32), atol=atol, rtol=0)


def test_slerp_values_endpoints_and_colinear_lerp():
  e1, e2 = tree(1.0, 0.0), tree(0.0, 1.0)
  close(geometric.slerp(e1, e2, t=0.5, naming=HF), [math.sqrt(0.5)] * 2)
  close(geometric.slerp(e1, e2, t=1 / 3, naming=HF), [math.cos(math.pi / 6), math.sin(math.pi / 6)])
  a, b = tree(1.0, -2.0, 3.0), tree(0.5, 4.0, 1.0)
  np.testing.assert_array_equal(geometric.slerp(a, b, t=0.0)[next(iter(a))], a[next(iter(a))])
  np.testing.assert_array_equal(geometric.slerp(a, b, t=1.0)[next(iter(a))], b[next(iter(a))])
  close(geometric.slerp(tree(1.0, 2.0), tree(2.0, 4.0), t=0.5), [1.5, 3.0])  # colinear: lerp
  close(geometric.slerp(tree(1.0, 2.0), tree(-1.0, -2.0), t=0.5), [0.0, 0.0])  # antipodal: lerp
  # the angle's norm follows the arc between the norms (here 1 and 3) as sin-weights give it
  close(geometric.slerp(e1, tree(0.0, 3.0), t=0.5), [math.sqrt(0.5), 3 * math.sqrt(0.5)])


def test_per_block_t_is_mergekits_gradient():
  """Three blocks sit at 0, 0.5, 1 of the list [0, 1]; the embedding takes the first value.
  Colinear tensors (b = 2a) make slerp the lerp, so the result is a * (1 + t)."""
  def gpt(scale):
    out = {"wte": {"embedding": np.full((2, 2), scale, np.float32)}}
    out.update({f"block_{i}": {"mlp": {"fc": {"kernel": np.full((2, 2), scale, np.float32)}}} for i in range(3)})
    return out

  a, b = gpt(1.0), gpt(2.0)
  out = geometric.slerp(a, b, t=[0.0, 1.0], naming=XLT)
  assert [float(out[f"block_{i}"]["mlp"]["fc"]["kernel"][0, 0]) for i in range(3)] == [1.0, 1.5, 2.0]
  assert float(out["wte"]["embedding"][0, 0]) == 1.0
  at = geometric.per_block([0.1, 0.9, 0.5], a, XLT, "t")
  assert [round(at(("block_1", "mlp")), 6), at(("wte",))] == [0.9, 0.1]
  with pytest.raises(ValueError, match="empty list"):
    geometric.slerp(a, b, t=[])


def test_nuslerp_values():
  e1, e2 = tree(1.0, 0.0), tree(0.0, 1.0)
  close(geometric.nuslerp(None, [e1, e2], weights=[1, 1]), [math.sqrt(0.5)] * 2)
  np.testing.assert_array_equal(geometric.nuslerp(None, [e1, e2], weights=[0, 1])[next(iter(e1))], [0, 1])
  close(geometric.nuslerp(tree(1.0, 1.0), [tree(2.0, 1.0), tree(1.0, 2.0)], weights=[1, 1]),
        [1 + math.sqrt(0.5), 1 + math.sqrt(0.5)])  # base + slerp of the task vectors
  # rows (output units: axis 0 of a Hugging Face weight) slerped one by one: row 0 on the arc,
  # row 1 colinear (lerp); columns (row_wise) instead: column 0 colinear, column 1 zero vs 1
  a, b = tree([1.0, 0.0], [1.0, 0.0]), tree([0.0, 1.0], [2.0, 0.0])
  close(geometric.nuslerp(None, [a, b], weights=[1, 1], flatten=False, naming=HF),
        [[math.sqrt(0.5), math.sqrt(0.5)], [1.5, 0.0]])
  col = next(iter(geometric.nuslerp(None, [a, b], weights=[1, 1], flatten=False, row_wise=True,
                                    naming=HF).values()))
  col0 = geometric.nuslerp(None, [tree(1.0, 1.0), tree(0.0, 2.0)], weights=[1, 1])  # column 0 alone
  np.testing.assert_allclose(col[:, 0], next(iter(col0.values())), atol=1e-6)
  np.testing.assert_allclose(col[:, 1], [math.sqrt(0.5), 0], atol=1e-6)  # a zero column: 90 degrees
  with pytest.raises(ValueError, match="exactly two models"):
    geometric.nuslerp(None, [e1, e2, e1], weights=[1, 1, 1])


def test_multislerp_values_and_invariants():
  e1, e2, e3 = tree(1.0, 0.0, 0.0), tree(0.0, 1.0, 0.0), tree(0.0, 0.0, 2.0)
  close(geometric.multislerp(None, [e1, e2], weights=[1, 1]), [math.sqrt(0.5), math.sqrt(0.5), 0])
  close(geometric.multislerp(None, [e1, e2, e3], weights=[1, 0, 0]), [1, 0, 0])  # one weight 1: that model
  a = tree(0.3, -1.2, 2.0)
  assert geometric.multislerp(None, [a], weights=1.0)[next(iter(a))].tolist() == a[next(iter(a))].tolist()
  close(geometric.multislerp(None, [a, a], weights=[1, 3]), a[next(iter(a))], atol=1e-5)  # identical: itself
  close(geometric.multislerp(None, [e1, tree(-1.0, 0.0, 0.0)], weights=[1, 1]), [0, 0, 0])  # antipodal pair: lerp
  with pytest.raises(ValueError, match="weighted sum of the unit tensors is zero"):
    geometric.multislerp(None, [e1, tree(-1.0, 0.0, 0.0), tree(-1.0, 0.0, 0.0)], weights=[2, 1, 1])
  base = tree(1.0, 1.0, 1.0)
  close(geometric.multislerp(base, [tree(2.0, 1.0, 1.0), tree(1.0, 2.0, 1.0)], weights=[1, 1]),
        [1 + math.sqrt(0.5), 1 + math.sqrt(0.5), 1])
  close(geometric.multislerp(None, [e1, e2], weights=[1, 1], normalize_weights=False),
        [2 * math.sqrt(0.5), 2 * math.sqrt(0.5), 0])  # weights summing to 2 double the norm


def test_karcher_values_and_invariants():
  a = tree(0.5, -1.0, 2.0)
  close(geometric.karcher([a, a, a]), a[next(iter(a))], atol=1e-6)  # identical models: that model
  e1, e2 = tree(1.0, 0.0), tree(0.0, 3.0)
  close(geometric.karcher([e1, e2]), [math.sqrt(2), math.sqrt(2)], atol=1e-5)  # direction 45 deg, mean norm 2
  # on a circle the weighted Karcher mean is the weighted mean angle: 1/4 of 90 deg
  close(geometric.karcher([tree(1.0, 0.0), tree(0.0, 1.0)], weights=[3, 1], max_iter=100, tol=1e-9),
        [math.cos(math.pi / 8), math.sin(math.pi / 8)], atol=1e-6)
  close(geometric.karcher([tree(0.0, 0.0), tree(0.0, 0.0)]), [0, 0])
  with pytest.raises(ValueError, match="non-negative"):
    geometric.karcher([e1, e2], weights=[1, -1])


def test_model_stock_values():
  base = tree(1.0, 1.0)
  same = geometric.model_stock(base, [tree(2.0, 2.0), tree(2.0, 2.0)])  # cos 1: t = 1, the experts
  close(same, [2, 2])
  close(geometric.model_stock(base, [tree(2.0, 1.0), tree(1.0, 2.0)]), [1, 1])  # cos 0: t = 0, the base
  close(geometric.model_stock(base, [tree(2.0, 1.0), tree(0.0, 1.0)]), [1, 1])  # cos -1: singular, the base
  # cos 0.5 (60 deg): t = 2 * 0.5 / 1.5 = 2/3 of the average's offset
  off = [math.cos(math.pi / 3), math.sin(math.pi / 3)]
  got = geometric.model_stock(base, [tree(2.0, 1.0), tree(1 + off[0], 1 + off[1])])
  close(got, [1 + 2 / 3 * (1 + off[0]) / 2, 1 + 2 / 3 * off[1] / 2])
  rows = geometric.model_stock(tree([1.0, 1.0], [0.0, 0.0]), [tree([2.0, 2.0], [1.0, 0.0]), tree([2.0, 2.0], [0.0, 1.0])],
                               filter_wise=True, naming=HF)
  close(rows, [[2, 2], [0, 0]])  # row 0 agrees (its experts), row 1 orthogonal (its base)
  with pytest.raises(ValueError, match="at least two experts"):
    geometric.model_stock(base, [base])


def test_nearswap_values():
  got = geometric.nearswap(tree(0.0, 0.0, 0.0, 1.0), tree(0.1, 0.5, 2.0, 1.0), t=0.5)
  close(got, [0.1, 0.5, 0.5, 1.0])  # near entries swapped, the far one moved by t


def test_arcee_fusion_threshold_and_values():
  assert selective.fusion_threshold(np.arange(9.0)) == 4 + 1.5 * (6 - 2)
  base = {"model.norm.weight": np.zeros(8, np.float32)}
  assert (selective.arcee_fusion(base, base)["model.norm.weight"] == 0).all()
  other = {"model.norm.weight": np.array([0.01, 0.02, 0.0, 0.01, 0.02, 0.02, 0.01, 5.0], np.float32)}
  got = selective.arcee_fusion(base, other, naming=HF)["model.norm.weight"]
  np.testing.assert_array_equal(got, [0, 0, 0, 0, 0, 0, 0, 5.0])  # only the outlier change is taken


def test_ram_and_ramplus_values():
  base = tree(0.0, 0.0, 0.0, 0.0)
  experts = [tree(1.0, 0.0, 2.0, 1e-6), tree(0.0, 0.0, 4.0, 0.0)]
  close(selective.ram(base, experts), [1, 0, 3, 0])  # unique kept, shared averaged, below epsilon dropped
  # expert 0: 1 unique, 1 shared entry: rho 1, capped at alpha 0.2: its unique change * 1.02
  close(selective.ramplus_tl(base, experts), [1.02, 0, 3, 0])
  close(selective.ramplus_tl(base, experts, r=1.0, alpha=2.0), [2, 0, 3, 0])


def test_registry_nobase_entries_and_errors():
  m = registry.get("nuslerp_nobase")
  assert [r.name for r in m.roles] == ["models"] and [o.name for o in m.options] == ["weights", "row_wise", "flatten"]
  assert m.option("weights").required and m.summary == registry.get("nuslerp").summary
  a, b = tree(1.0, 0.0), tree(0.0, 1.0)
  got = registry.merge("multislerp_nobase", {"models": [a, b]}, {"weights": [1, 1]}, naming=HF)
  close(got, [math.sqrt(0.5)] * 2)
  with pytest.raises(ValueError, match=r"slerp takes inputs base, other; missing \['other'\]"):
    registry.check("slerp", {"base": a}, {"t": 0.5})
  with pytest.raises(ValueError, match="slerp needs option t"):
    registry.check("slerp", {"base": a, "other": b})
  with pytest.raises(ValueError, match="shape"):
    geometric.slerp(a, tree(1.0, 2.0, 3.0), t=0.5)


def test_command_slerp_with_per_block_t_matches_mergekit(tmp_path):
  out = tmp_path / "merged"
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  r = subprocess.run([sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py", "--config.method=slerp",
                      f"--config.inputs.base={MODEL_DIRS['llama']}", f"--config.inputs.other={MODEL_DIRS['llama_b']}",
                      "--config.options.t=[0.1, 0.9, 0.5]", "--config.heatmaps=false", f"--config.output={out}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  got = load_file(str(out / "model.safetensors"))
  assert max_diff(got, load_file(os.path.join(GEOMETRIC, "slerp_gradient.safetensors"))) < TOLERANCE
  assert (out / "config.json").exists()


def test_arcee_fusion_in_mergekit_float32_precision():
  method, inputs, options = CASES["arcee_fusion"]
  trees = {r: model(m) for r, m in inputs.items()}
  want = load_file(os.path.join(GEOMETRIC, "arcee_fusion.safetensors"))
  got = registry.merge(method, trees, {**options, "precision": "float32"}, naming="auto")
  assert max_diff(got, want) < TOLERANCE
  k = "model.layers.0.self_attn.k_proj.weight"
  assert selective.fusion_importance((k,), trees["base"][k], trees["other"][k], HF, np.float32).dtype == np.float32
  with pytest.raises(ValueError, match="precision must be 'float64' or 'float32'"):
    selective.arcee_fusion(trees["base"], trees["other"], precision="float16", naming=HF)
