"""Module-wise layer swapping (xlt.merge.swap's `modules`): in the swapped and transition blocks only
the named kinds (attn, mlp, norm) come from the language expert; on hand-made pytrees with exact
values, through the registry, the merge command line and the testbed's merge specs."""

import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from xlt.merge import registry, swap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = {"attn": ("attn", "qkv", "kernel"), "mlp": ("mlp", "fc", "kernel"), "norm": ("ln_1", "scale")}


def _tree(value: float, blocks: int = 3) -> dict:
  """xlt-named parameters: per block an attn, an mlp and a norm leaf, each block b's entries
  value + b + (0.1 attn, 0.2 mlp, 0.3 norm); the embedding `value`."""
  out = {"wte": {"embedding": np.full((2, 2), value)}}
  for b in range(blocks):
    block = out[f"block_{b}"] = {}
    for i, path in enumerate(KINDS.values()):
      node = block
      for k in path[:-1]:
        node = node.setdefault(k, {})
      node[path[-1]] = np.full((2,), value + b + 0.1 * (i + 1))
  return out


def _leaf(tree, block, kind):
  node = tree[f"block_{block}"]
  for k in KINDS[kind]:
    node = node[k]
  return float(node[0])


TASK, LANG = _tree(0.0), _tree(10.0)


@pytest.mark.parametrize("modules, swapped", [("all", {"attn", "mlp", "norm"}), (("attn",), {"attn"}),
                                              ("mlp", {"mlp"}), ("attn,mlp", {"attn", "mlp"}),
                                              (["mlp", "norm"], {"mlp", "norm"})])
def test_only_the_named_kinds_of_the_swapped_blocks_are_the_language_experts(modules, swapped):
  # bottom 1: block 0 swapped; blocks 1, 2 the task expert's
  got = registry.merge("layer_swap", {"task_expert": TASK, "language_expert": LANG},
                       {"bottom": 1, "top": 0, "modules": modules, "non_block": "task"})
  for kind in KINDS:
    assert _leaf(got, 0, kind) == _leaf(LANG if kind in swapped else TASK, 0, kind), kind
    assert _leaf(got, 1, kind) == _leaf(TASK, 1, kind) and _leaf(got, 2, kind) == _leaf(TASK, 2, kind)
  assert float(got["wte"]["embedding"][0, 0]) == 0.0


def test_a_transition_block_blends_the_named_kinds_only():
  # bottom 1, lower transition 1 with weights 1 : 3 -> block 1 is task + 0.75 (lang - task) for attn
  got = swap.layer_swap(TASK, LANG, bottom=1, top=0, lower_transition=1, language_weight=3.0, modules=("attn",))
  assert _leaf(got, 0, "attn") == 10.1 and _leaf(got, 0, "mlp") == 0.2
  assert _leaf(got, 1, "attn") == pytest.approx(1.1 + 0.75 * 10) and _leaf(got, 1, "mlp") == 1.2
  assert _leaf(got, 1, "norm") == 1.3 and _leaf(got, 2, "attn") == 2.1
  assert float(got["wte"]["embedding"][0, 0]) == pytest.approx(7.5)  # non_block average, the same weights


@pytest.mark.parametrize("bad", ["ffn", (), ("attn", "head"), 3])
def test_unknown_modules_are_errors(bad):
  with pytest.raises(ValueError, match="layer swap: modules must be 'all' or kinds among attn, mlp, norm"):
    swap.layer_swap(TASK, LANG, bottom=1, top=0, modules=bad)


def test_the_command_line_swaps_a_module(tmp_path):
  hf = os.path.join(REPO, "tests", "fixtures", "hf")
  task, lang = os.path.join(hf, "llama"), os.path.join(hf, "llama_b")
  r = subprocess.run([sys.executable, "-m", "xlt.merge", "--config=configs/merge_files.py",
                      f"--config.inputs.task_expert={task}", f"--config.inputs.language_expert={lang}",
                      "--config.options.bottom=1", "--config.options.top=0", "--config.options.modules=mlp",
                      "--config.options.non_block=task", "--config.heatmaps=false", f"--config.output={tmp_path / 'o'}"],
                     cwd=REPO, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO})
  assert r.returncode == 0, r.stderr
  got, t, lg = (load_file(os.path.join(d, "model.safetensors")) for d in (str(tmp_path / "o"), task, lang))
  for k in got:
    want = lg if k.startswith("model.layers.0.mlp.") else t
    assert np.array_equal(got[k], want[k]), k
  assert not np.array_equal(t["model.layers.0.mlp.up_proj.weight"], lg["model.layers.0.mlp.up_proj.weight"])


def test_the_testbeds_merge_specs_take_module_wise_swaps():
  from configs import merge as merge_config
  from xlt.experiments.testbed import experiment
  c = merge_config.get_config()
  c.merge.swaps, c.merge.swap_modules = ("1,0,0",), ("attn", "mlp")
  rows = [(label, options.get("modules")) for label, method, options in experiment.merges(c) if method == "layer_swap"]
  assert rows == [("layer swap b=1 u=0 t=0", None), ("layer swap b=1 u=0 t=0 [attn]", "attn"),
                  ("layer swap b=1 u=0 t=0 [mlp]", "mlp")]
  c.merge.extra = ("layer_swap bottom=1 top=0 modules='attn,norm'",)
  assert experiment.merges(c)[-1] == ("layer_swap bottom=1 top=0 modules='attn,norm'", "layer_swap",
                                      {"bottom": 1, "top": 0, "modules": "attn,norm"})
  c.merge.swap_modules = ("ffn",)
  with pytest.raises(ValueError, match="modules must be 'all' or kinds among"):
    experiment.check(c, 8)


def test_a_merge_search_chooses_among_module_choices():
  from xlt import merge_search
  dim = merge_search.parse_dim("modules=choice:all,attn,mlp,attn+norm")
  assert dim.choices == ("all", "attn", "mlp", "attn+norm")
  picked = {merge_search.sample_random([dim], 0, n)["modules"] for n in range(40)}
  assert picked == set(dim.choices)
  for choice, swapped in zip(dim.choices, ({"attn", "mlp", "norm"}, {"attn"}, {"mlp"}, {"attn", "norm"})):
    got = registry.merge("layer_swap", {"task_expert": TASK, "language_expert": LANG},
                         {"bottom": 0, "top": 1, "modules": choice})
    assert all(_leaf(got, 2, k) == _leaf(LANG if k in swapped else TASK, 2, k) for k in KINDS), choice
