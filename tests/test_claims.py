"""A preregistered study's verdicts (xlt.claims): the gates, each claim's sides, Holm's rule,
on hand-made per-seed scores; and the committed results file's verdicts and docs/testbed.md's
claims map follow from its numbers."""

import json
import os

import numpy as np
import pytest

from xlt import claims, stats

PREREG = os.path.join(claims.ROOT, "docs", "prereg", "claims_study.md")


def _scores(n=10, seed=0):
  """Hand-made per-seed scores: the task expert ~0.3 on the goal, the paper's swap 0.2 below it,
  task arithmetic 0.1 above it, DARE equal to it, base 3's target language under the gate."""
  rng = np.random.default_rng(seed)
  te = 0.3 + 0.05 * rng.standard_normal(n)
  jitter = lambda: 0.01 * rng.standard_normal(n)
  goal = {"task expert": te, "language expert": np.zeros(n), "layer swap b=1 u=1 t=0": te - 0.2 + jitter(),
          "layer swap b=1 u=0 t=0": te - 0.25 + jitter(), "simultaneous [C] k=1": np.full(n, 0.01),
          "train-then-revert [C]": np.zeros(n), "freeze-then-train [C]": 0.05 + jitter(), "MAET": np.zeros(n),
          "task arithmetic λ=1.0": te + 0.1 + jitter(), "TIES density=0.2": te - 0.25 + jitter(),
          "DARE drop=0.5": te.copy()}
  s = {(m, "goal"): v.tolist() for m, v in goal.items()}
  base_language = np.full(n, 0.95)
  base_language[3] = 0.4
  s[("base", "language")] = base_language.tolist()
  s[("task expert", "task")] = [0.99] * n
  s[("language expert", "language")] = [0.98] * n
  return s


SWAPS = ["layer swap b=1 u=1 t=0", "layer swap b=1 u=0 t=0"]


def test_verdicts_follow_holm_over_the_regimes_claims_on_the_bases_that_pass_the_gate():
  prereg = claims.read_prereg(PREREG)
  r = claims.regime_claims(_scores(), prereg, SWAPS)
  assert r["bases"] == 9 and r["excluded_seeds"] == [3] and r["gates_failed"] == []
  got = {c["id"]: c for c in r["claims"]}
  assert got["swap_paper"]["a"] == "layer swap b=1 u=1 t=0" and got["swap_paper"]["b"] == "task expert"
  assert got["swap_best"]["a"] == "layer swap b=1 u=1 t=0"  # the higher mean of the two swaps
  assert got["swap_paper"]["verdict"] == "fails" and got["task_arithmetic"]["verdict"] == "holds"
  assert got["dare"]["verdict"] == "undecided" and got["dare"]["p"] == 1.0  # equal on every base
  assert got["maet_vs_ta"]["verdict"] == "fails" and got["revert"]["verdict"] == "fails"
  assert len(got["swap_paper"]["values"]) == 9
  expect = stats.holm([c["p"] for c in r["claims"]], prereg["alpha"])
  assert [c["holm_rejects"] for c in r["claims"]] == expect


def test_a_regime_whose_experts_miss_their_gate_or_keeps_too_few_bases_is_gated():
  prereg = claims.read_prereg(PREREG)
  s = _scores()
  s[("task expert", "task")] = [0.5] * 10
  r = claims.regime_claims(s, prereg, SWAPS)
  assert r["gates_failed"] and {c["verdict"] for c in r["claims"]} == {"gated"}
  s = _scores()
  s[("base", "language")] = [0.1] * 6 + [0.95] * 4  # 4 bases < min_bases 5
  r = claims.regime_claims(s, prereg, SWAPS)
  assert r["bases"] == 4 and "fewer than 5" in r["gates_failed"][0]


def test_t_test_matches_scipy():
  scipy_stats = pytest.importorskip("scipy.stats")
  d = [0.1, -0.05, 0.2, 0.03, 0.12]
  assert claims.t_test(d) == pytest.approx(scipy_stats.ttest_1samp(d, 0.0).pvalue, rel=1e-6)
  assert claims.t_test([0.0, 0.0]) == 1.0 and claims.t_test([0.1, 0.1]) == 0.0


def test_the_preregistration_names_every_claim_and_gate_once():
  prereg = claims.read_prereg(PREREG)
  ids = [c["id"] for c in prereg["claims"]]
  assert len(ids) == len(set(ids)) == 10 and prereg["alpha"] == 0.05 and prereg["seeds"] == list(range(10))
  assert set(prereg["gates"]) == {"base_language", "task_expert_task", "language_expert_language", "min_bases"}


def _studies():
  """The claims studies' results files (a pilots' file holds structure verdicts: tests/test_pilots.py)."""
  names = sorted(os.listdir(claims.STUDIES)) if os.path.isdir(claims.STUDIES) else []
  return [n for n in names if not claims.is_pilots(json.load(open(os.path.join(claims.STUDIES, n))))]


def test_study_wide_holm_is_one_family_over_the_regimes_that_passed_their_gates():
  claim = lambda i, p, rej: {"id": f"c{i}", "p": p, "holm_rejects": rej}
  result = {"prereg": {"alpha": 0.05}, "regimes": [
      {"depth": 6, "regime": 0, "gates_failed": [], "claims": [claim(0, 0.001, True), claim(1, 0.03, True)]},
      {"depth": 6, "regime": 1, "gates_failed": ["the base"], "claims": [claim(0, 0.0001, True), claim(1, 0.5, False)]},
      {"depth": 12, "regime": 0, "gates_failed": [], "claims": [claim(0, 0.018, True), claim(1, 0.2, False)]}]}
  rows = claims.study_wide(result)
  # four tested claims: 0.001 <= 0.05/4 rejects, 0.018 > 0.05/3 stops; the gated regime is not in the family
  assert [(r["depth"], r["id"], r["study_rejects"]) for r in rows] == [
      (6, "c0", True), (6, "c1", False), (12, "c0", False), (12, "c1", False)]
  line = claims.study_wide_line(result)
  assert "all 4 claims of the 2 regimes" in line and "rejects 1, against 3 per regime" in line
  assert "no longer rejected: c1 at 6 blocks (p 0.0300), c0 at 12 blocks (p 0.0180)" in line


@pytest.mark.parametrize("name", _studies())
def test_recorded_verdicts_follow_the_rule_from_their_numbers(name):
  with open(os.path.join(claims.STUDIES, name)) as f:
    result = json.load(f)
  prereg = result["prereg"]
  assert prereg["commit"] not in ("uncommitted", "unknown")
  for r in result["regimes"]:
    ps = [claims.t_test(c["values"]) if len(c["values"]) > 1 else 1.0 for c in r["claims"]]
    assert ps == pytest.approx([c["p"] for c in r["claims"]])
    rejected = stats.holm(ps, prereg["alpha"])
    for c, rej in zip(r["claims"], rejected):
      assert c["mean"] is None or c["mean"] == pytest.approx(float(np.mean(c["values"])))
      assert c["verdict"] == claims.verdict(c["mean"], rej, bool(r["gates_failed"]))


def test_the_claims_map_in_docs_is_the_one_the_results_give():
  with open(claims.DOC) as f:
    assert f.read() == claims.render(write=False), "run: python -m xlt.claims render"
