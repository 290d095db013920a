"""The second claims study's pilot machinery: arithmetic languages with their own scripts, a
base dosed with the task, and xlt.pilots' structure verdicts (S1-S4, B1, the gates) on
hand-made measures."""

import ml_collections
import numpy as np
import pytest

from configs import merge as merge_config
from configs import structure_pilots, structure_pilots_1b, structure_pilots_1c
from xlt import grid, pilots
from xlt.data import arithmetic
from xlt.experiments.testbed import experiment as testbed

SPEC = {"S1": {"mid_min": 0.5, "margin": 0.15}, "S2": {"margin": 0.05}, "S3": {"edge_keep": 0.9, "middle_loss": 0.3},
        "S4": {"edge_ratio": 1.2}, "B1": {"min": 0.2, "max": 0.8}, "G1": 0.9, "G2": 0.9}


def test_own_script_languages_write_operands_and_answers_in_their_digits():
  ex = arithmetic.make_example("add", 327, 104, "thai")
  assert " ".join(ex.prompt) == "[tha] ๓ ๒ ๗ + ๑ ๐ ๔ =" and ex.answer == ("๑", "๓", "๔")  # 431, units first
  rev = arithmetic.make_example("max", 327, 104, "clone_rev")  # every token its own; operands units first
  assert rev.prompt == ("[clr]", "7ʹ", "2ʹ", "3ʹ", "maxʹ", "4ʹ", "0ʹ", "1ʹ", "=ʹ") and rev.answer == ("7ʹ", "2ʹ", "3ʹ")
  to = arithmetic.make_example("to_deva", 305, None, "standard")
  assert " ".join(to.prompt) == "[std] 3 0 5 to [dev] =" and to.answer == ("५", "०", "३")
  assert arithmetic.score("to_deva", 305, None, ["५", "०", "३"], "standard")["exact_match"] == 1.0
  # the right value in another language's script: the operation transferred, the language did not
  assert arithmetic.score("add", 327, 104, ["1", "3", "4"], "thai") == {"exact_match": 0.0, "any_script": 1.0}
  assert arithmetic.score("add", 327, 104, ["๑", "๓"], "thai") == {"exact_match": 0.0, "any_script": 0.0}
  assert arithmetic.decode_answer(("๐", "๑"), "thai") == 10  # units first
  with pytest.raises(ValueError, match="not a number"):
    arithmetic.decode_answer(("๑", "๐"), "thai")  # 1 with a leading zero
  with pytest.raises(ValueError, match="not a number"):
    arithmetic.decode_answer(("1", "๐"), "thai")  # mixed scripts


def test_the_first_two_languages_keep_their_vocabulary_and_new_ones_append():
  old = arithmetic.symbols()
  assert old[:10] == list("0123456789") and old[-2:] == ["[std]", "[let]"] and "to" not in old
  assert arithmetic.symbols(["standard", "letter"], ["add", "max"]) == old
  grown = arithmetic.symbols(["thai"], ["to_thai"])
  assert grown[:len(old)] == old and {"[tha]", "๙", "to"} <= set(grown)
  assert len(grown) == len(set(grown))
  c = merge_config.get_config()
  assert testbed.vocabulary(c) == old  # configs/merge.py's base has the tokens it always had


def test_every_pilot_design_builds_its_data_and_tokens():
  c = structure_pilots.get_config()
  for point in c.grid:
    sub = grid.point_config(c, point)
    sets = testbed.datasets(sub)
    tokens = set(testbed.vocabulary(sub))
    for ex in sets["base"][:: max(1, len(sets["base"]) // 200)] + sets["language"][:50]:
      assert set(ex.prompt) | set(ex.answer) <= tokens
    want = {p["name"]: p["dose"] for p in pilots.claims.read_prereg("docs/prereg/claims_study_2.md")["pilot"]["designs"]}
    assert sum(n for _, _, n in sub.data.base_task) == want[point["name"]]


def test_base_task_must_be_the_task_in_the_source():
  c = merge_config.get_config()
  c.data.base_task = (("add_digit", "letter", 10),)
  with pytest.raises(ValueError, match=r"data.base_task holds \(add_digit, letter\)"):
    testbed.datasets(c)
  c.data.base_task = (("add_digit", "standard", 10),)
  c.finetune.replay = 0.0
  sets = testbed.datasets(c)
  plain = testbed.datasets(_no_replay())
  assert len(sets["base"]) == len(plain["base"]) + 10
  assert sets["base"][-10:] == sets["task"][:10]  # the dose is the task expert's stream's start


def _no_replay():
  c = merge_config.get_config()
  c.finetune.replay = 0.0
  return c


def _measured(similarity, accuracy, revert_task, ratio, base_task=0.5, base_lang=0.95, lang=0.95, task=1.0,
              seeds=3):
  """xlt.structure's measures of `seeds` identical bases at 8 blocks."""
  per = lambda v: {"mean": list(v), "values": [list(v)] * seeds}
  scores = {"base": {"task": [base_task] * seeds, "language": [base_lang] * seeds},
            "task expert": {"task": [task] * seeds}, "language expert": {"language": [lang] * seeds}}
  return {"num_layers": 8, "seeds": list(range(seeds)), "scores": scores,
          "probe": {"base": {"similarity": per(similarity), "accuracy": per(accuracy)}},
          "revert": {"task": per(revert_task)}, "edge_ratio": {"language expert": {"mean": ratio, "values": [ratio] * seeds}}}


# layers 0-8; at 8 blocks the bottom zone is blocks 0-1 (layers 1-2), the top block 7 (layer 8),
# the middle third blocks 2-5 (layers 3-6)
GOOD = dict(similarity=[0, 0.2, 0.3, 0.8, 0.9, 0.9, 0.8, 0.5, 0.3], accuracy=[1, 1, 1, 0.8, 0.7, 0.7, 0.8, 0.9, 1],
            revert_task=[0.95, 0.92, 0.9, 0.5, 0.9, 0.9, 0.9, 0.99], ratio=1.5)


def test_judge_passes_a_design_with_the_papers_structure():
  v = pilots.judge(_measured(**GOOD), SPEC, dosed=True)
  assert all(v[k]["passes"] for k in pilots.judged(SPEC)), v
  assert "S2L" not in v  # stage 1's preregistration names the probe, not the lens
  assert v["S1"]["mean"] == pytest.approx({"middle": 0.85, "bottom": 0.25, "top": 0.3})
  assert v["S3"]["mean"] == pytest.approx({"edge_min": 0.92, "middle_min": 0.5})
  assert pilots.design_passes(v)
  assert pilots.judge(_measured(**GOOD), SPEC, dosed=False)["B1"] is None


@pytest.mark.parametrize("change, fails", [
    (dict(similarity=[0, 0.2, 0.3, 0.8, 0.9, 0.9, 0.8, 0.9, 0.9]), "S1"),  # the top is not lower
    (dict(accuracy=[1, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 1]), "S2"),  # no dip below the bottom zone
    (dict(revert_task=[0.85, 1, 1, 0.5, 1, 1, 1, 1]), "S3"),  # an edge block holds the task
    (dict(revert_task=[1, 1, 1, 0.75, 1, 1, 1, 1]), "S3"),  # no middle block does
    (dict(ratio=1.1), "S4"), (dict(base_task=0.9), "B1"), (dict(base_lang=0.85), "G1"),
    (dict(task=0.8), "G2"), (dict(lang=0.8), "G2")])
def test_judge_fails_exactly_the_criterion_that_does_not_hold(change, fails):
  v = pilots.judge(_measured(**{**GOOD, **change}), SPEC, dosed=True)
  assert [k for k in pilots.judged(SPEC) if not v[k]["passes"]] == [fails]
  assert not pilots.design_passes(v)


def test_a_criterion_needs_a_majority_of_bases_as_well_as_the_mean():
  m = _measured(**GOOD)
  bad = list(GOOD["revert_task"])
  bad[3] = 0.8  # base 1 and 2 keep the task through the middle; the mean still loses 30%
  m["revert"]["task"]["values"] = [[*GOOD["revert_task"][:3], 0.1, *GOOD["revert_task"][4:]], bad, bad]
  m["revert"]["task"]["mean"] = np.mean(m["revert"]["task"]["values"], axis=0).tolist()
  v = pilots.judge(m, SPEC, dosed=True)
  assert v["S3"]["mean"]["middle_min"] == pytest.approx(0.5666, abs=1e-3)
  assert [b["passes"] for b in v["S3"]["per_base"]] == [True, False, False] and not v["S3"]["passes"]


SPEC_1B = {**{k: v for k, v in SPEC.items() if k != "S2"}, "S2L": {"mid_min": 0.6, "top_max": 0.4}}
# the source script's share of the lens on the target's prompts, layers 0-8: the middle (layers
# 3-6) reads out in the source, the top (layer 8) in the target
LENS = [0.5, 0.5, 0.6, 0.8, 0.9, 0.7, 0.6, 0.3, 0.1]


def _with_lens(share, **change):
  m = _measured(**{**GOOD, **change})
  m["lens"] = {"base": {"target_prompts share": {"mean": list(share), "values": [list(share)] * 3}}}
  return m


@pytest.mark.parametrize("share, passes, middle", [
    (LENS, True, 0.75),
    ([0.5, 0.5, 0.6, 0.8, 0.9, 0.3, 0.3, 0.3, 0.1], False, 0.575),  # the middle is half in the target
    ([0.5, 0.5, 0.6, 0.8, 0.9, 0.7, 0.6, 0.6, 0.5], False, 0.75)])  # the top does not switch to the target
def test_stage_1b_judges_the_lens_in_place_of_the_probe(share, passes, middle):
  v = pilots.judge(_with_lens(share), SPEC_1B, dosed=True)
  assert list(v) == ["S1", "S2L", "S3", "S4", "B1", "G1", "G2"]
  assert v["S2L"]["passes"] is passes and v["S2L"]["mean"] == pytest.approx({"middle": middle, "top": share[8]})
  assert pilots.design_passes(v) is passes


def test_the_panel_has_a_place_per_stage(tmp_path):
  result = {"stage": "pilots_1b", "prereg": {"file": "p.md", "commit": "a" * 40, "criteria": SPEC_1B},
            "runs_commit": "b" * 40, "machine": "m", "command": "c",
            "designs": [{"name": "x", "status": "run", "passes": True, "seeds": [0, 1, 2], "num_layers": 8,
                         "wall_s": {"total": 600}, "verdicts": pilots.judge(_with_lens(LENS), SPEC_1B, dosed=True)}]}
  doc = tmp_path / "doc.md"
  stage1 = pilots.markers("pilots")
  doc.write_text("\n".join(["# t", stage1[0], "old 1", stage1[1], "between", *pilots.markers("pilots_1b"), "end"]))
  out = pilots.render(result, str(doc))
  assert "old 1" in out and out.index("between") < out.index("| x | **pass**") and out.endswith("end")
  assert "| design | S1 | S2L | S3 | S4 | B1 | G1 | G2 | passes |" in out
  doc.write_text("no markers")
  with pytest.raises(ValueError, match="pilots_1b"):
    pilots.render(result, str(doc))


def test_zones_at_the_pilots_depth():
  assert pilots.zones(8) == {"bottom": [0, 1], "top": [7], "middle": [2, 3, 4, 5]}
  assert pilots.zones(12) == {"bottom": [0, 1], "top": [11], "middle": [4, 5, 6, 7]}


@pytest.mark.parametrize("prereg_file, config", [("claims_study_2.md", structure_pilots),
                                                  ("claims_study_2_pilots_1b.md", structure_pilots_1b),
                                                  ("claims_study_2_pilots_1c.md", structure_pilots_1c)])
def test_the_config_matches_its_preregistration(prereg_file, config):
  prereg = pilots.claims.read_prereg(f"docs/prereg/{prereg_file}")["pilot"]
  c = config.get_config()
  assert [p["name"] for p in c.grid] == [d["name"] for d in prereg["designs"]]
  assert [p["data.base_task"][0][2] if p["data.base_task"] else 0 for p in c.grid] == [
      d["dose"] for d in prereg["designs"]]
  assert [p.get("model.num_layers", c.model.num_layers) for p in c.grid] == [
      d.get("num_layers", prereg["num_layers"]) for d in prereg["designs"]]
  assert c.model.num_layers == prereg["num_layers"] and c.num_seeds == len(prereg["seeds"]) and c.seed == 0
  assert c.base.train.steps == prereg.get("base_steps", 2000) == c.base.opt.total_steps
  assert ml_collections.ConfigDict(prereg["criteria"]).S3.edge_keep == 0.9


@pytest.mark.parametrize("name", ["structure_pilots.json", "structure_pilots_1b.json", "structure_pilots_1c.json"])
def test_recorded_pilot_verdicts_follow_the_rule_and_the_panel_in_docs_is_theirs(name):
  import json
  import os
  path = os.path.join(pilots.claims.STUDIES, name)
  if not os.path.isfile(path):
    pytest.skip("no pilot results recorded")
  with open(path) as f:
    result = json.load(f)
  for d in result["designs"]:
    if d["status"] == "run":
      assert pilots.judge(d["measures"], result["prereg"]["criteria"], bool(d["dose"])) == d["verdicts"]
      assert d["passes"] == pilots.design_passes(d["verdicts"])
  with open(pilots.claims.DOC) as f:
    assert f.read() == pilots.render(result, pilots.claims.DOC), "run: python -m xlt.pilots ... (the panel is stale)"


def test_the_wall_time_line_names_each_design_s_depth_only_where_depths_differ():
  one = {"name": "x", "status": "run", "passes": False, "seeds": [0, 1, 2], "num_layers": 8,
         "wall_s": {"total": 600}, "verdicts": pilots.judge(_with_lens(LENS), SPEC_1B, dosed=True)}
  result = {"stage": "pilots_1c", "prereg": {"file": "p.md", "commit": "a" * 40, "criteria": SPEC_1B},
            "runs_commit": "b" * 40, "machine": "m", "command": "c", "designs": [one, {**one, "name": "y"}]}
  assert "Wall time per design (3 bases, 8 blocks): x 10 min, y 10 min." in pilots.section(result)
  result["designs"][1] = {**one, "name": "y", "num_layers": 16, "wall_s": {"total": 1500}}
  assert "Wall time per design (3 bases): x (8 blocks) 10 min, y (16 blocks) 25 min." in pilots.section(result)
