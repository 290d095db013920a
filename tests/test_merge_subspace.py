"""xlt.merge.subspace (TSV-M, Iso-C, Iso-CTS) and xlt.merge.localize (TALL masks, Consensus,
Localize-and-Stitch): exact values on hand-made trees, their invariants, and each method from the
command line and the testbed's merge.extra. Parity with fusion-bench: tests/test_merge_fusion.py."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from xlt.merge import localize, registry, subspace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
NEW = ("tsv_m", "iso_c", "iso_cts", "consensus", "tall_mask", "localize_and_stitch")


def rank_one(a, i, j, shape):
  x = np.zeros(shape, np.float32)
  x[i, j] = a
  return x


def test_every_new_method_is_declared_with_its_paper():
  papers = {"tsv_m": "Gargiulo et al. 2025", "iso_c": "Marczak et al. 2025", "iso_cts": "Marczak et al. 2025",
            "consensus": "Wang et al. 2024", "tall_mask": "Wang et al. 2024", "localize_and_stitch": "He et al. 2024"}
  for name, paper in papers.items():
    m = registry.get(name)
    assert paper in m.paper and [r.name for r in m.roles] == ["base", "experts"] and m.layer_aware is False
    assert all(o.help for o in m.options), name
  losses = registry.get("localize_and_stitch").option("losses")
  assert losses.tree and not losses.rows and not registry.get("localize_and_stitch").uses_layers({"losses": []})


def test_tsv_m_of_orthogonal_rank_one_task_vectors_is_their_sum():
  # each task vector is rank one and they share no direction: the top-k (k = 2 // 2 = 1) triplets
  # are already orthonormal, so TSV-M is task arithmetic; 1-D tensors take the mean task vector
  base = {"w": np.full((2, 3), 0.5, np.float32), "b": np.ones(3, np.float32)}
  e1 = {"w": base["w"] + rank_one(3.0, 0, 0, (2, 3)), "b": np.array([3, 1, 1], np.float32)}
  e2 = {"w": base["w"] + rank_one(-2.0, 1, 2, (2, 3)), "b": np.array([1, 1, 5], np.float32)}
  out = subspace.tsv_m(base, [e1, e2])
  np.testing.assert_allclose(out["w"], [[3.5, 0.5, 0.5], [0.5, 0.5, -1.5]], atol=1e-6)
  np.testing.assert_array_equal(out["b"], [2, 1, 3])
  half = subspace.tsv_m(base, [e1, e2], alpha=0.5)
  np.testing.assert_allclose(half["w"], [[2.0, 0.5, 0.5], [0.5, 0.5, -0.5]], atol=1e-6)
  assert out["w"].dtype == np.float32


def test_tsv_m_of_one_expert_is_the_expert_and_too_small_matrices_stay_at_the_base():
  rng = np.random.default_rng(0)
  base = {"w": rng.normal(size=(5, 4)).astype(np.float32)}
  e = {"w": base["w"] + rng.normal(size=(5, 4)).astype(np.float32)}
  np.testing.assert_allclose(subspace.tsv_m(base, [e])["w"], e["w"], atol=1e-5)
  # rank bound 2 < 3 experts: no triplet fits (k = 0)
  small = {"w": rng.normal(size=(2, 6)).astype(np.float32)}
  experts = [{"w": small["w"] + 1} for _ in range(3)]
  np.testing.assert_array_equal(subspace.tsv_m(small, experts)["w"], small["w"])


def test_iso_c_flattens_the_spectrum_of_the_summed_task_vectors():
  base = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32)}
  e1 = {"w": np.diag([3.0, 0.0]).astype(np.float32), "b": np.array([2, 0], np.float32)}
  e2 = {"w": np.diag([0.0, 1.0]).astype(np.float32), "b": np.array([0, 4], np.float32)}
  out = subspace.iso_c(base, [e1, e2])
  np.testing.assert_allclose(out["w"], np.diag([2.0, 2.0]), atol=1e-6)  # singular values 3, 1 -> 2, 2
  np.testing.assert_array_equal(out["b"], [1, 2])
  rng = np.random.default_rng(1)
  base = {"w": rng.normal(size=(8, 6)).astype(np.float32)}
  experts = [{"w": base["w"] + rng.normal(size=(8, 6)).astype(np.float32)} for _ in range(3)]
  delta = subspace.iso_c(base, experts, alpha=2.0)["w"].astype(np.float64) - base["w"]
  s_sum = np.linalg.svd(sum(e["w"].astype(np.float64) - base["w"] for e in experts), compute_uv=False)
  np.testing.assert_allclose(np.linalg.svd(delta, compute_uv=False), np.full(6, 2 * s_sum.mean()), rtol=1e-5)


def test_iso_cts_is_isotropic_and_is_iso_c_with_all_of_the_rank_common():
  rng = np.random.default_rng(2)
  base = {"w": rng.normal(size=(12, 10)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}
  experts = [{k: v + rng.normal(size=v.shape).astype(np.float32) for k, v in base.items()} for _ in range(2)]
  out = subspace.iso_cts(base, experts, common_space_fraction=0.8)  # c = 8, one direction per task
  singular = np.linalg.svd(out["w"].astype(np.float64) - base["w"], compute_uv=False)
  np.testing.assert_allclose(singular, np.full(10, singular.mean()), rtol=1e-4)
  assert not np.allclose(out["w"], subspace.iso_c(base, experts)["w"], atol=1e-3)
  same = subspace.iso_cts(base, experts, common_space_fraction=1.0)
  np.testing.assert_allclose(same["w"], subspace.iso_c(base, experts)["w"], atol=1e-5)
  np.testing.assert_allclose(out["b"], (experts[0]["b"] + experts[1]["b"]) / 2, atol=1e-6)
  with pytest.raises(ValueError, match="common_space_fraction must be in"):
    subspace.iso_cts(base, experts, common_space_fraction=1.5)


def svd_polar(x):
  u, _, vt = np.linalg.svd(x, full_matrices=False)
  return u @ vt


def tsv_m_by_svd(tvs):
  """TSV-M of one matrix as the paper writes it, with numpy's SVD throughout."""
  k = min(tvs[0].shape) // len(tvs)
  svds = [np.linalg.svd(t, full_matrices=False) for t in tvs]
  u = svd_polar(np.concatenate([u[:, :k] for u, _, _ in svds], axis=1))
  vt = svd_polar(np.concatenate([vt[:k] for _, _, vt in svds], axis=0))
  return (u * np.concatenate([s[:k] for _, s, _ in svds])) @ vt


@pytest.mark.parametrize("shape", [(9, 14), (14, 9)])
def test_the_gram_eigendecomposition_path_is_the_svd_and_rank_deficient_matrices_take_the_svd(shape):
  # full-rank task vectors take the Gram path (no SVD called); a rank-one one, whose kept triplets
  # include zero singular values, and experts whose singular vectors coincide fall back to the SVD
  rng = np.random.default_rng(3)
  base = {"w": np.zeros(shape)}
  full = [{"w": rng.normal(size=shape)} for _ in range(2)]
  low = [{"w": np.outer(rng.normal(size=shape[0]), rng.normal(size=shape[1]))}, full[1]]
  same = [full[0], {"w": 2 * full[0]["w"]}]
  two_rank_one = [low[0], {"w": np.outer(rng.normal(size=shape[0]), rng.normal(size=shape[1]))}]
  cases = []
  for experts in (full, low, same, two_rank_one):
    total = sum(e["w"] for e in experts)
    iso = svd_polar(total) * np.linalg.svd(total, compute_uv=False).mean()
    cases.append((experts, tsv_m_by_svd([e["w"] for e in experts]), iso))
  calls = []
  svd = np.linalg.svd

  def counted(*args, **kwargs):
    k = min(shape) // 2
    if args[0].shape != (k, k):  # TSV-M's two-expert case: the SVD of u_1^T u_2, k x k
      calls.append(args[0].shape)
    return svd(*args, **kwargs)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(np.linalg, "svd", counted)
    # Iso-C falls back only where the summed task vector is rank-deficient
    for (experts, tsv, iso), tsv_svd, iso_svd in zip(cases, (False, True, True, True), (False, False, False, True)):
      calls.clear()
      got = subspace.tsv_m(base, experts)["w"]
      assert bool(calls) == tsv_svd, calls
      if experts is not same:  # coinciding stacked vectors: U V^T of their SVD is not unique
        np.testing.assert_allclose(got, tsv, atol=1e-9)
      calls.clear()
      got = subspace.iso_c(base, experts)["w"]
      assert bool(calls) == iso_svd, calls
      if not iso_svd:  # a rank-deficient sum's U V^T is not unique (its null directions are arbitrary)
        np.testing.assert_allclose(got, iso, atol=1e-9)


CONSENSUS_EXPERTS = [np.array([1, 0, 2, 0], np.float32), np.array([1, 3, 0, 0], np.float32),
                     np.array([1, 0, 0, -1], np.float32)]  # tau_MTL = [3, 3, 2, -1]


def test_tall_masks_and_consensus_by_hand():
  tvs = np.stack(CONSENSUS_EXPERTS)
  # |tau_t| >= 0.5 |tau_MTL - tau_t|
  np.testing.assert_array_equal(localize.tall_masks(tvs, 0.5), [[1, 0, 1, 0], [1, 1, 0, 0], [1, 0, 0, 1]])
  base = {"w": np.zeros(4, np.float32)}
  experts = [{"w": e} for e in CONSENSUS_EXPERTS]
  # entry 0 is in all three masks, the others in one each ("selfish"): k = 2 keeps entry 0 only
  np.testing.assert_array_equal(localize.consensus(base, experts, k=2, tall_lambda=0.5)["w"], [3, 0, 0, 0])
  np.testing.assert_array_equal(localize.consensus(base, experts, k=1, tall_lambda=0.5, scale=0.5)["w"],
                                [1.5, 1.5, 1, -0.5])
  np.testing.assert_array_equal(localize.consensus(base, experts, k=4, tall_lambda=0.5)["w"], [0, 0, 0, 0])
  np.testing.assert_array_equal(localize.tall_mask(base, experts, expert=1, tall_lambda=0.5)["w"], [3, 3, 0, 0])
  with pytest.raises(ValueError, match="an index among the 3 experts"):
    localize.tall_mask(base, experts, expert=3)


def test_localize_and_stitch_data_free():
  base = {"a": np.zeros(4, np.float32)}
  experts = [{"a": np.array([4, 1, 0, 0], np.float32)}, {"a": np.array([0, 3, 2, 0.5], np.float32)}]
  # half of each task vector kept; entry 1 is in both masks: the mean of the two changes
  out = localize.localize_and_stitch(base, experts, sparsity=0.5)
  np.testing.assert_array_equal(out["a"], [4, 2, 2, 0])
  # over the whole model (the paper's) or per tensor
  base = {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}
  expert = {"a": np.array([5, 4], np.float32), "b": np.array([0.1, 0.2], np.float32)}
  model = localize.localize_and_stitch(base, [expert], sparsity=0.5)
  np.testing.assert_array_equal(np.concatenate([model["a"], model["b"]]), [5, 4, 0, 0])
  tensor = localize.localize_and_stitch(base, [expert], sparsity=0.5, scope="tensor")
  np.testing.assert_array_equal(np.concatenate([tensor["a"], tensor["b"]]), np.float32([5, 0, 0, 0.2]))


def test_localize_searches_the_mask_with_a_loss():
  # the magnitude mask picks entry 0, but the expert's "data" wants entry 1 changed and entry 0 not
  base = {"a": np.zeros(2, np.float32)}
  expert = {"a": np.array([5, 1], np.float32)}
  assert list(localize.localize_and_stitch(base, [expert], sparsity=0.5)["a"]) == [5, 0]
  loss = lambda p: (p["a"][0] - 0.0) ** 2 + (p["a"][1] - 1.0) ** 2
  out = localize.localize_and_stitch(base, [expert], sparsity=0.5, losses=[loss], steps=20, learning_rate=0.5,
                                     l1=0.01)
  np.testing.assert_array_equal(out["a"], [0, 1])
  with pytest.raises(ValueError, match="option losses takes Python objects, which only a Python call can give"):
    registry.check("localize_and_stitch", {"base": 0, "experts": [0]}, {"losses": [loss]}, trees_allowed=False)


def test_each_new_method_runs_from_the_testbed_config():
  from configs import merge as merge_config
  from xlt.experiments.testbed import experiment as testbed
  c = merge_config.get_config()
  c.merge.extra = ("tsv_m alpha=0.5", "iso_c", "iso_cts common_space_fraction=0.5", "consensus k=1",
                   "tall_mask expert=0", "localize_and_stitch sparsity=0.1")
  testbed._check_merges(c)
  specs = [m for _, m, _ in testbed.merges(c)][-len(c.merge.extra):]
  assert specs == list(NEW)
  rng = np.random.default_rng(3)
  base = {"block_0": {"mlp": {"fc": {"kernel": rng.normal(size=(4, 6)).astype(np.float32)}}}}
  available = {"base": base, "experts": [{"block_0": {"mlp": {"fc": {"kernel": rng.normal(size=(4, 6)).astype(
      np.float32)}}}} for _ in range(2)]}
  for _, method, options in testbed.merges(c)[-len(NEW):]:
    out = registry.merge_among(method, available, options)
    assert out["block_0"]["mlp"]["fc"]["kernel"].shape == (4, 6), method


def test_each_new_method_runs_from_the_command_line(tmp_path):
  from configs import merge_files
  from xlt.merge.__main__ import merge_config
  rng = np.random.default_rng(4)
  names = {"model.layers.0.mlp.up_proj.weight": (6, 4), "model.norm.weight": (4,)}
  paths = []
  for i in range(3):
    paths.append(str(tmp_path / f"m{i}.safetensors"))
    save_file({k: rng.normal(size=s).astype(np.float32) for k, s in names.items()}, paths[-1])
  trees = [load_file(p) for p in paths]
  # one through the command line itself, every one through the config it parses into
  r = subprocess.run([sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py", "--config.method=iso_cts",
                      f"--config.inputs.base={paths[0]}", f"--config.inputs.experts={paths[1]},{paths[2]}",
                      "--config.options.common_space_fraction=0.5", f"--config.output={tmp_path / 'cli'}"],
                     cwd=REPO, env=ENV, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  got = load_file(str(tmp_path / "cli" / "model.safetensors"))
  want = subspace.iso_cts(trees[0], trees[1:], common_space_fraction=0.5)
  for k in names:
    np.testing.assert_array_equal(got[k], want[k])
  for name in NEW:
    c = merge_files.get_config()
    c.method, c.inputs.base, c.inputs.experts = name, paths[0], f"{paths[1]},{paths[2]}"
    c.output, c.heatmaps = str(tmp_path / name), False
    summary = merge_config(c)
    merged = load_file(str(tmp_path / name / "model.safetensors"))
    want = registry.merge(name, {"base": trees[0], "experts": trees[1:]}, naming="auto")
    for k in names:
      np.testing.assert_array_equal(merged[k], want[k], err_msg=f"{name} {k}")
    assert json.loads((tmp_path / name / "summary.json").read_text()) == summary
