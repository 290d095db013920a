"""The seed tables' configs: Roman's own sweep, Table 2's shared alone baselines (every alone
condition of configs/addition_table2.py:cpu, each once), Table 3's Diff. Vocab direction, and
Table 4's English-German settings (more English, the held-out originals in the mix)."""

import os

import pytest

from configs import (addition_sweep_roman, addition_table2, addition_table2_shared, graph_table3, graph_vocab,
                     tinystories_en_de, tinystories_en_de_leak, tinystories_en_de_more)
from xlt import grid
from xlt.data import corpus
from xlt.experiments import synthetic
from xlt.experiments import text as text_kind


def _conditions(c) -> list[tuple[str, int]]:
  return sorted({s for p in c.grid for cell in synthetic.plan(grid.point_config(c, p)) if cell.condition != "mixed"
                 for s in cell.samples})


def test_shared_baselines_are_table2s_alone_conditions_each_once_with_three_seeds():
  shared = addition_table2_shared.get_config()
  want = _conditions(addition_table2.get_config("cpu"))
  assert _conditions(shared) == want
  points = [grid.point_config(shared, p) for p in shared.grid]
  cells = [cell for s in points for cell in synthetic.plan(s)]
  assert len(cells) == 3 * len(want)  # 3 seeds of each, no condition twice
  for s in points:
    assert (s.train.steps, s.model.num_layers, s.addition.max_digits) == (5000, 4, 3)  # Table 2's :cpu recipe
  with pytest.raises(ValueError, match="unknown config argument"):
    addition_table2_shared.get_config("gpu")


def test_roman_sweep_spans_the_reference_threshold_at_the_reduced_scale():
  c = addition_sweep_roman.get_config()
  assert c.sweep.language == "roman" and c.num_seeds >= 2
  # the reference's 2,048 (19.42%) and 4,096 (> 80%) samples, divided by 8, lie inside the sweep
  assert min(c.sweep.samples) <= 2048 // 8 and max(c.sweep.samples) >= 4096 // 8
  task = synthetic.get_task(c)
  assert task.seq_len <= c.model.block_size


def test_diff_vocab_is_offset_edges_to_plain_edges_as_the_reference():
  c = graph_vocab.get_config()
  assert (c.mixture.source, c.mixture.target) == ("edge_offset", "edge_plain")
  points = {p["name"]: p for p in graph_table3.get_config().grid}
  assert points["diff_vocab_m256"]["mixture.target"] == points["diff_grammar_m256"]["mixture.target"] == "edge_plain"


def test_en_de_settings_change_only_the_mixed_english():
  base, leak, more = (m.get_config() for m in (tinystories_en_de, tinystories_en_de_leak, tinystories_en_de_more))
  assert text_kind.condition_parts("mixed", leak) == text_kind.condition_parts("mixed", base) + [("high", "held_out")]
  assert text_kind.condition_parts("low_limited", leak) == text_kind.condition_parts("low_limited", base)
  assert text_kind.condition_parts("mixed", more)[-1] == ("high_extra", "all")
  for c in (leak, more):
    assert (c.data.split, c.tokenizer, c.train) == (base.data.split, base.tokenizer, base.train)
  if not os.path.isfile(more.data.high_extra.path):
    pytest.skip("the shared data is not on this machine")
  specs = text_kind.corpus_specs(more)
  last_story = list(corpus.iter_documents(specs["high"]))[-1]
  with open(more.data.high_extra.path, encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  skip = more.data.high_extra.skip_lines
  # the skipped lines end with the parallel file's last story, and the first kept one is not of it
  assert last_story.endswith(lines[skip - 1]) and lines[skip] not in last_story


def test_russian_proxy_with_every_story_changes_only_the_caps_and_budget():
  from configs import tinystories, tinystories_ru_more
  base, more = tinystories.get_config(), tinystories_ru_more.get_config()
  assert (more.data.high.max_documents, more.data.low.max_documents) == (0, 0)
  assert (base.data.split, base.tokenizer, base.model) == (more.data.split, more.tokenizer, more.model)
  assert more.train.steps == 3 * base.train.steps
