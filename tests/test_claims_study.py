"""The claims study's config (configs/claims_study.py): the papers' layer counts scaled to each
depth, and every point a testbed config that fits its model."""

from configs import claims_study
from xlt import grid
from xlt.experiments.testbed import experiment as testbed


def test_layer_counts_scale_the_papers_32_layers_rounding_up():
  assert [claims_study.scaled(n, 32) for n in (0, 1, 5, 6)] == [0, 1, 5, 6]
  assert [claims_study.scaled(6, d) for d in (6, 12, 24)] == [2, 3, 5]  # [C]'s bottom: 1.125 -> 2
  assert [claims_study.paper_swap(d) for d in (6, 12, 24)] == ["1,1,0", "2,1,0", "4,2,0"]


def test_swap_grid_is_the_papers_grid_scaled_with_the_papers_swap_first():
  assert claims_study.swaps(6) == ("1,1,0", "1,0,0", "1,0,1", "1,1,1")
  deep = claims_study.swaps(24)
  assert deep[0] == "4,2,0" and len(deep) == len(set(deep)) == 18
  assert {tuple(map(int, s.split(","))) for s in deep} == {(b, u, t) for b in (3, 4) for u in (0, 1, 2)
                                                          for t in (0, 1, 2)}


def test_every_point_is_a_testbed_config_that_fits_its_depth():
  c = claims_study.get_config()
  assert [p["name"] for p in c.grid] == ["depth_6", "depth_12", "depth_24"]
  for p in c.grid:
    sub = grid.point_config(c, p)
    assert sub.model.num_layers == int(p["name"].split("_")[1])
    testbed.check(sub, sub.model.num_layers)  # partitions, swaps and merges fit, or it raises
