"""xlt.loop's summary of a call: the tokens/s it measured, also when it resumed a run and ran
too few steps for a log line. (tests/test_train.py checks that a resumed run ends as an
uninterrupted one.)"""

import math

import jax
import numpy as np

from xlt import loop
from xlt.data import common
from xlt.experiments import synthetic


def _members(c, seeds=(0, 1)):
  task = synthetic.get_task(c)
  enc = common.encode_examples(task.train[c.mixture.source], task.tokenizer, task.seq_len)
  arrays = {"tokens": enc.tokens, "loss_mask": enc.loss_mask}
  return synthetic.model_config(c, task), [loop.Member(f"m{s}", s, arrays) for s in seeds]


def test_a_resumed_call_reports_the_rate_it_measured(graph_config, tmp_path):
  c = graph_config
  c.train.steps, c.train.log_every, c.train.checkpoint_every = 12, 50, 4  # no log line is ever due
  cfg, members = _members(c)
  first = loop.train_ensemble(c, cfg, members, None, str(tmp_path), stop_after=9, progress=False)
  assert not first["finished"] and first["step"] == 9
  assert math.isfinite(first["tokens_per_s"]) and first["tokens_per_s"] > 0
  # resumes at step 8 (the last checkpoint): 4 steps, the first of which compiles
  resumed = loop.train_ensemble(c, cfg, members, None, str(tmp_path), progress=False)
  assert resumed["finished"] and resumed["step"] == 12
  assert math.isfinite(resumed["tokens_per_s"]) and resumed["tokens_per_s"] > 0
  # a call with nothing left to run timed no step
  again = loop.train_ensemble(c, cfg, members, None, str(tmp_path), progress=False)
  assert again["finished"] and again["step"] == 12 and math.isnan(again["tokens_per_s"])
  for x, y in zip(jax.tree.leaves(resumed["state"]), jax.tree.leaves(again["state"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_call_of_one_step_timed_none(graph_config, tmp_path):
  cfg, members = _members(graph_config, seeds=(0,))
  out = loop.train_ensemble(graph_config, cfg, members, None, str(tmp_path), stop_after=1, progress=False)
  assert out["step"] == 1 and math.isnan(out["tokens_per_s"])  # its one step compiled
