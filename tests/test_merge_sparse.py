"""xlt.merge.sparse (dare_ties, breadcrumbs, breadcrumbs_ties, della, della_linear, sce) and
the mergekit conventions of combine.ties / combine.dare: mergekit's own results on the tiny
Llama fixtures (tests/fixtures/mergekit/sparse/, made by make_mergekit_fixtures_sparse.py;
random methods with xlt's masks handed to mergekit) to float rounding, exact values on
hand-made trees, invariants, the statistics of the random drops, the registry and the
command line; and, where mergekit is installed, mergekit run live."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from conftest import load_script
from xlt.io import hf_dir as hf
from xlt.merge import combine, core, registry, sparse
from xlt.param_paths import HF, XLT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
MERGEKIT = os.path.join(FIXTURES, "mergekit", "sparse")
FILES = ("ties", "breadcrumbs", "breadcrumbs_ties", "sce", "dare_ties", "dare_linear", "della")
TOLERANCE = 1e-6  # float32 rounding of values of order 1


def fixture_case_data(directory: str = MERGEKIT):
  """[(file, case, spec, {name: mergekit's tensor})] of every stored case."""
  out = []
  for file in FILES:
    path = os.path.join(directory, f"{file}.safetensors")
    with safe_open(path, "np") as f:
      cases = json.loads(f.metadata()["cases"])
    tensors = load_file(path)
    for case, spec in cases.items():
      out.append((file, case, spec, {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(case + "/")}))
  return out


def inputs(names):
  """base, [llama_b, llama_c] restricted to `names` (every merge here is per tensor)."""
  _, base = hf.read_model_dir(os.path.join(FIXTURES, "hf", "llama"))
  _, b = hf.read_model_dir(os.path.join(FIXTURES, "hf", "llama_b"))
  c = load_file(os.path.join(MERGEKIT, "llama_c.safetensors"))
  pick = lambda tree: {n: np.asarray(tree[n]) for n in names}
  return pick(base), [pick(b), pick(c)]


def xlt_merge(spec: dict, base, experts):
  """xlt's merge with the options that mean what the mergekit case's parameters do."""
  method, models, params, seed = spec["method"], spec["models"], spec["parameters"], spec["seed"]
  per = lambda key: [m[key] for m in models]
  if method == "ties":
    assert len(set(per("density"))) == 1
    return combine.ties(base, experts, density=per("density")[0], lambdas=per("weight"), convention="mergekit",
                        naming=HF)
  if method == "dare_linear":
    assert len(set(per("density"))) == 1
    return combine.dare(base, experts, drop=1 - per("density")[0], seed=seed, lambdas=per("weight"),
                        convention="mergekit", naming=HF)
  if method == "sce":
    return sparse.sce(base, experts, select_topk=params.get("select_topk", 1.0), naming=HF)
  kwargs = {"density": per("density"), "weights": per("weight"), "scale": params.get("lambda", 1.0),
            "naming": HF}
  kwargs.update({k: params[k] for k in ("normalize", "rescale") if k in params})
  if method.startswith("breadcrumbs"):
    kwargs["gamma"] = per("gamma")
  if method.startswith("della"):
    kwargs["epsilon"] = per("epsilon")
  if method.startswith(("dare", "della")):
    kwargs["seed"] = seed
  return getattr(sparse, method)(base, experts, **kwargs)


CASES = fixture_case_data()


@pytest.mark.parametrize("file, case, spec, want", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_equals_mergekit_on_the_llama_fixtures(file, case, spec, want):
  base, experts = inputs(sorted(want))
  got = xlt_merge(spec, base, experts)
  diffs = {n: float(np.max(np.abs(np.asarray(got[n], np.float64) - want[n]))) for n in want}
  assert max(diffs.values()) <= TOLERANCE, diffs
  moved = max(float(np.max(np.abs(want[n] - base[n]))) for n in want)
  assert moved > 0.01  # the merge did something: the comparison is not base vs base


def test_mergekit_conventions_differ_from_xlts_where_documented():
  base, experts = inputs(["model.layers.1.mlp.down_proj.weight"])
  name = "model.layers.1.mlp.down_proj.weight"
  spec = [s for f, c, s, _ in CASES if (f, c) == ("ties", "w")][0]
  want = [w for f, c, _, w in CASES if (f, c) == ("ties", "w")][0][name]
  xlt = combine.ties(base, experts, density=0.3, lambdas=[1.0, 0.5], convention="xlt")[name]
  assert spec["models"][1]["weight"] == 0.5 and np.max(np.abs(xlt - want)) > 0.01  # count vs weight sum
  dare = [w for f, c, _, w in CASES if (f, c) == ("dare_linear", "w")][0][name]
  exact = combine.dare(base, experts, drop=0.6, seed=5, lambdas=[1.0, 0.5])[name]
  assert 1e-5 < np.max(np.abs(exact - dare)) < 0.1  # 1 / (1 - p) vs the L1 rescale: close, not equal


# ---- exact values on hand-made trees


def test_outlier_mask_keeps_the_range_below_the_outliers():
  d = np.array([-1.0, 2, -3, 4, 5, -6, 7, 8, -9, 10])
  np.testing.assert_array_equal(sparse.outlier_mask(d, 0.5, 0.1), (np.abs(d) >= 5) & (np.abs(d) <= 9))
  np.testing.assert_array_equal(sparse.outlier_mask(d, 0.95, 0.2), np.abs(d) <= 9)  # target 9 + top 2 > 10
  assert not sparse.outlier_mask(d, 0.05, 0.0).any()  # int(0.5) = 0 entries
  assert sparse.outlier_mask(d, 1.0, 0.3).all()  # density 1 keeps everything, as mergekit


def test_della_keep_prob_grows_with_the_rank_in_each_row():
  d = np.array([[3.0, -1.0, 2.0], [0.5, -4.0, 1.0]])
  p = sparse.della_keep_prob(("model.layers.0.mlp.up_proj.weight",), d, 0.5, 0.1, HF)
  np.testing.assert_allclose(p, [[0.6, 0.4, 0.5], [0.4, 0.6, 0.5]], rtol=1e-6)
  assert p.dtype == np.float32
  np.testing.assert_allclose(sparse.della_keep_prob(("b",), np.array([2.0]), 0.5, 0.1), [0.5])


def test_consensus_and_normalize_by_hand():
  base = {"w": np.zeros(4, np.float32)}
  experts = [{"w": np.array([1.0, -2, 3, 0], np.float32)}, {"w": np.array([-1.0, 1, 1, 0], np.float32)}]
  # sums 0, -1, 4, 0: elected +, -, +, + (mergekit: + on 0); zeros never agree
  summed = sparse.breadcrumbs_ties(base, experts, density=1.0)
  np.testing.assert_array_equal(summed["w"], [1, -2, 4, 0])
  mean = sparse.breadcrumbs_ties(base, experts, density=1.0, weights=[1.0, 3.0], normalize=True, scale=0.5)
  # weighted: [1, -2, 3, 0] and [-3, 3, 3, 0]; sums -2, 1, 6: elected -, +, +, +
  np.testing.assert_allclose(mean["w"], 0.5 * np.array([-3 / 3, 3 / 3, 6 / 4, 0]), rtol=1e-6)
  linear = sparse.breadcrumbs(base, experts, density=1.0, weights=[1.0, 3.0], normalize=True)
  np.testing.assert_allclose(linear["w"], (np.array([1.0, -2, 3, 0]) + 3 * np.array([-1.0, 1, 1, 0])) / 4, rtol=1e-6)


def test_ties_conventions_by_hand():
  base = {"w": np.zeros(5, np.float32)}
  experts = [{"w": np.array([5.0, -4, 3, 2, 1], np.float32)}, {"w": np.array([-5.0, 1, 2, 0, 0], np.float32)}]
  # density 0.5 of 5: xlt keeps round(2.5) = 3, mergekit int(2.5) = 2
  xlt = combine.ties(base, experts, density=0.5, lambdas=[1.0, 2.0], convention="xlt")["w"]
  mk = combine.ties(base, experts, density=0.5, lambdas=[1.0, 2.0], convention="mergekit")["w"]
  # trimmed: xlt [5,-4,3,0,0], [-10,2,4,0,0]; mergekit [5,-4,0,0,0], [-10,0,4,0,0]
  np.testing.assert_allclose(xlt, [-10, -4, 3.5, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(mk, [-10 / 2, -4 / 1, 4 / 2, 0, 0], rtol=1e-6)
  tie = [{"w": np.array([1.0], np.float32)}, {"w": np.array([-1.0], np.float32)}]
  assert combine.ties({"w": np.zeros(1, np.float32)}, tie, density=1.0, convention="xlt")["w"][0] == 0  # no sign elected
  assert combine.ties({"w": np.zeros(1, np.float32)}, tie, density=1.0, convention="mergekit")["w"][0] == 1
  with pytest.raises(ValueError, match="convention must be 'xlt' or 'mergekit'"):
    combine.ties(base, experts, convention="MergeKit")


def test_sce_by_hand():
  base = {"w": np.zeros(4, np.float32)}
  a, b = np.array([2.0, -1, 0, 1], np.float32), np.array([1.0, 1, 0, -3], np.float32)
  out = sparse.sce(base, [{"w": a}, {"w": b}])["w"]
  wa, wb = np.mean(a ** 2), np.mean(b ** 2)  # 1.5, 2.75 -> normalised; sums 3, 0, 0, -2: elected +, +, +, -
  wa, wb = wa / (wa + wb), wb / (wa + wb)
  np.testing.assert_allclose(out, [(2 * wa + wb) / (wa + wb), 1.0, 0, -3.0], rtol=1e-6)
  # select_topk 0.5: variances 0.25, 1, 0, 4 -> 3 nonzero, k = int(1.5) = 1: only the last entry
  top = sparse.sce(base, [{"w": a}, {"w": b}], select_topk=0.5)["w"]
  np.testing.assert_allclose(top, [0, 0, 0, -3.0], rtol=1e-6)
  tiny = sparse.sce(base, [{"w": a * 1e-4}, {"w": b * 1e-4}])["w"]  # scale-free weights (mergekit: uniform)
  np.testing.assert_allclose(tiny, out * 1e-4, rtol=1e-5)


# ---- invariants


def trees(seed: int, n: int = 3, size=(16, 24)):
  rng = np.random.default_rng(seed)
  base = {"a": {"kernel": rng.normal(size=size).astype(np.float32)}, "b": rng.normal(size=size[1]).astype(np.float32)}
  experts = [{"a": {"kernel": base["a"]["kernel"] + rng.normal(size=size).astype(np.float32)},
              "b": base["b"] + rng.normal(size=size[1]).astype(np.float32)} for _ in range(n)]
  return base, experts


def assert_trees_close(a, b, atol=1e-6):
  for (pa, x), (pb, y) in zip(core.leaves_with_paths(a), core.leaves_with_paths(b)):
    assert pa == pb
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, err_msg=str(pa))


def test_density_one_is_task_arithmetic():
  base, experts = trees(0)
  want = combine.task_arithmetic(base, experts, [0.5, 1.0, 0.25])
  for fn in (sparse.breadcrumbs, sparse.della_linear):
    assert_trees_close(fn(base, experts, density=1.0, weights=[0.5, 1.0, 0.25]), want)
  assert_trees_close(sparse.breadcrumbs(base, experts, density=1.0, weights=[1, 2, 1], normalize=True, scale=4),
                     combine.task_arithmetic(base, experts, [1.0, 2.0, 1.0]))


def test_dare_ties_of_one_expert_is_dare_and_della_without_spread_is_dare_ties():
  base, experts = trees(1)
  for density in (0.5, 0.25):
    one = sparse.dare_ties(base, experts[:1], density=density, rescale="inverse", seed=3)
    assert_trees_close(one, combine.dare(base, experts[:1], drop=1 - density, seed=3), atol=0)
  assert_trees_close(sparse.della(base, experts, density=0.3, epsilon=0.0, seed=4),
                     sparse.dare_ties(base, experts, density=0.3, seed=4, normalize=True), atol=0)
  assert_trees_close(sparse.sce(base, experts[:1]), experts[0])
  assert_trees_close(sparse.sce(base, experts[:1], select_topk=0.5), base)  # one expert: no variance to select


def test_masks_restrict_each_delta():
  base, experts = trees(2)
  masks = {"a": {"kernel": np.arange(24) % 2 == 0}, "b": False}  # a per-row mask on xlt's [in, out] kernel
  masked = combine._restrict(base, experts, masks, XLT, "test")
  for fn in (sparse.breadcrumbs_ties, sparse.dare_ties, sparse.della, sparse.sce):
    assert_trees_close(fn(base, experts, masks=masks), fn(base, masked), atol=0)
    assert_trees_close(fn(base, experts, masks=masks)["b"], base["b"], atol=0)


def test_random_drops_are_seeded_and_keep_their_statistics():
  rng = np.random.default_rng(0)
  base = {"w": np.zeros((200, 500), np.float32)}
  d = rng.normal(size=(200, 500)).astype(np.float32)
  expert = [{"w": d}]
  for density in (0.1, 0.6):
    l1 = sparse.dare_ties(base, expert, density=density, seed=1)["w"]
    assert abs(np.mean(l1 != 0) - density) < 0.01
    np.testing.assert_allclose(np.abs(l1).sum(), np.abs(d).sum(), rtol=1e-5)  # L1 kept exactly
    inverse = sparse.dare_ties(base, expert, density=density, seed=1, rescale="inverse")["w"]
    np.testing.assert_array_equal(inverse != 0, l1 != 0)
    np.testing.assert_allclose(inverse[inverse != 0], d[inverse != 0] / np.float32(density), rtol=1e-6)
    assert abs(np.abs(inverse).sum() / np.abs(d).sum() - 1) < 0.02  # in expectation
    none = sparse.dare_ties(base, expert, density=density, seed=1, rescale=False)["w"]
    np.testing.assert_array_equal(none[none != 0], d[none != 0])
  assert not np.array_equal(sparse.dare_ties(base, expert, seed=2)["w"], sparse.dare_ties(base, expert, seed=1)["w"])
  kept = sparse.della(base, expert, density=0.5, epsilon=0.2, seed=1)["w"] != 0
  assert abs(kept.mean() - 0.5) < 0.01
  order = np.argsort(np.argsort(np.abs(d), axis=1), axis=1)  # rank within each row
  low, high = kept[order < 50].mean(), kept[order >= 450].mean()  # about 0.3 + 0.04 and 0.7 - 0.04
  assert abs(low - 0.32) < 0.02 and abs(high - 0.68) < 0.02


@pytest.mark.parametrize("call, message", [
    (lambda b, e: sparse.della(b, e, density=0.1, epsilon=0.15), r"density \+/- epsilon must lie in \(0, 1\)"),
    (lambda b, e: sparse.dare_ties(b, e, rescale="l2"), "rescale must be True, False or one of l1, none, inverse"),
    (lambda b, e: sparse.breadcrumbs(b, e, rescale="inverse"), "rescale must be True, False or one of l1, none"),
    (lambda b, e: sparse.dare_ties(b, e, density=0.0), r"dare_ties density must be in \(0.0, 1.0\]"),
    (lambda b, e: sparse.breadcrumbs_ties(b, e, gamma=1.0), r"gamma must be in \[0.0, 1.0\)"),
    (lambda b, e: sparse.della_linear(b, e, seed=-1), "seed must be a non-negative integer"),
    (lambda b, e: sparse.dare_ties(b, e, weights=[1.0]), "weights has 1 values for 3 experts"),
    (lambda b, e: sparse.sce(b, e, select_topk=1.5), r"select_topk must be in \(0.0, 1.0\]"),
])
def test_bad_options_fail_clearly(call, message):
  base, experts = trees(3)
  with pytest.raises(ValueError, match=message):
    call(base, experts)


# ---- the registry and the command line


def test_registry_runs_each_method_as_its_function():
  base, experts = trees(4, n=2)
  options = {"dare_ties": {"density": 0.3, "seed": 2}, "breadcrumbs": {"density": 0.5, "gamma": 0.05},
             "breadcrumbs_ties": {"density": [0.5, 0.3], "weights": [1.0, 0.5], "normalize": True},
             "della": {"density": 0.4, "epsilon": 0.1, "rescale": "inverse"}, "della_linear": {"scale": 0.5},
             "sce": {"select_topk": 0.5}}
  assert [m.name for m in registry.METHODS.values() if m.fn.__module__ == "xlt.merge.sparse"] == list(options)
  for name in options:
    m, fn = registry.get(name), getattr(sparse, name)
    assert m.fn is fn and [r.name for r in m.roles] == ["base", "experts"] and m.paper and m.mergekit == name
    assert m.option("masks").tree
    assert all(o.help and "\n" not in o.help for o in m.options), name
    assert_trees_close(registry.merge(name, {"base": base, "experts": experts}, options[name]),
                       fn(base, experts, **options[name]), atol=0)
  assert "Deep et al. 2024" in registry.get("della").paper and "Yadav et al. 2023" in registry.get("dare_ties").paper
  text = registry.describe("della")
  assert "    epsilon (float | Sequence[float]; default 0.15): the spread of the keep probabilities" in text
  assert "    scale (float; default 1.0): multiplies the merged delta, after normalize (mergekit's `lambda`)" in text


def test_command_line_merge_equals_the_in_memory_merge(tmp_path):
  out = tmp_path / "bt"
  llama, llama_b = os.path.join(FIXTURES, "hf", "llama"), os.path.join(FIXTURES, "hf", "llama_b")
  cmd = [sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py", "--config.method=breadcrumbs_ties",
         f"--config.inputs.base={llama}", f"--config.inputs.experts={llama_b},{llama}",
         "--config.options.density=0.3", "--config.options.weights=1,0.5", "--config.options.normalize=true",
         f"--config.output={out}", "--config.heatmaps=false"]
  run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert run.returncode == 0, run.stderr
  _, got = hf.read_model_dir(str(out))
  trees_ = {"base": hf.read_model_dir(llama)[1], "experts": [hf.read_model_dir(llama_b)[1], hf.read_model_dir(llama)[1]]}
  want = sparse.breadcrumbs_ties(trees_["base"], trees_["experts"], density=0.3, weights=[1, 0.5], normalize=True,
                                 naming=HF)
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)


# ---- mergekit itself, where it is installed


def test_live_mergekit_gives_the_stored_fixtures_and_xlts_results(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("mergekit")
  make = load_script("tests/fixtures/make_mergekit_fixtures_sparse.py")
  make.build(str(tmp_path))
  stored = {(f, c): w for f, c, _, w in CASES}
  for file, case, spec_, want in fixture_case_data(str(tmp_path)):
    base, experts = inputs(sorted(want))
    got = xlt_merge(spec_, base, experts)
    for n in want:
      np.testing.assert_allclose(want[n], stored[file, case][n], atol=TOLERANCE, rtol=0, err_msg=f"{file} {case} {n}")
      np.testing.assert_allclose(np.asarray(got[n]), want[n], atol=TOLERANCE, rtol=0, err_msg=f"{file} {case} {n}")
