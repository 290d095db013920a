"""The walkthroughs in colabs/ run top to bottom: each is executed in a fresh kernel with
small sizes appended to its `parameters` cell, and must raise in no cell, show its figures
and print its key results."""

import base64
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import COMPILE_FLAGS, REPO  # noqa: E402  (after the skips: without nbclient, nothing to run)

COLABS = REPO / "colabs"

# Small sizes: every stage of the notebook runs, in seconds (the numbers mean nothing).
SMALL = {
    "graph_walkthrough.ipynb": """
SEEDS, STEPS, SOURCE_SAMPLES, TARGET_SAMPLES = 1, 6, 128, 32
TEST_PAIRS, VAL_PAIRS = 16, 16  # equal: val and test decode share one compiled program
LAYERS, HEADS, WIDTH = 1, 2, 16
BATCH, EVAL_EVERY = 8, 3
""",
    "addition_walkthrough.ipynb": """
DIGITS = 2
SWEEP_SAMPLES, SWEEP_SEEDS = (16, 32), 1
PAIRS, PAIR_SAMPLES = ('standard+roman',), (64, 16)
PAIR_SEEDS, STEPS, NUM_TEST = 1, 6, 16
LAYERS, HEADS, WIDTH = 1, 2, 16
BATCH, EVAL_EVERY = 8, 3
""",
    "merging_walkthrough.ipynb": """
SEEDS, DIGITS, OPS = 1, 2, ('add_one', 'max')
BINARY, UNARY, TARGET_IN_BASE = 40, 20, 10
PRESETS, SWITCH, SWAPS = ('C',), (1,), ('1,1,0',)
NUM_TEST = GOAL_TEST = 16
LAYERS, HEADS, WIDTH = 4, 2, 16
BASE = dict(steps=6, batch_size=8, eval_every=3, checkpoint_every=3)
FINETUNE = dict(steps=6, batch_size=8, eval_every=3, checkpoint_every=3, min_steps=0)
""",
}
# How many figures each notebook shows, and what it must print (substrings of its text output).
FIGURES = {"graph_walkthrough.ipynb": 3, "addition_walkthrough.ipynb": 3, "merging_walkthrough.ipynb": 5}
PRINTS = {
    "graph_walkthrough.ipynb": ["edge_plain:", "node_plain:", "parameters per model"],
    "addition_walkthrough.ipynb": ["standard:", "letter:", "roman:", "hex:", "exact match"],
    "merging_walkthrough.ipynb": ["share", "best on the goal", "distance to task expert"],
}


def run_notebook(name, tmp_path, monkeypatch):
  nb = nbformat.read(COLABS / name, as_version=4)
  (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  params.source += "\n# tests/test_notebooks.py: small sizes\n" + SMALL[name] + f"WORKDIR = {str(tmp_path)!r}\n"
  # The kernel imports this checkout, on one real CPU device (not conftest's 8 fake ones).
  monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  monkeypatch.setenv("XLA_FLAGS", COMPILE_FLAGS)
  monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
  client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                   resources={"metadata": {"path": str(COLABS)}})
  client.execute()  # raises CellExecutionError on the first cell that fails
  return nb


def outputs(nb):
  for cell in nb.cells:
    if cell.cell_type == "code":
      yield from cell.outputs


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
  nb = run_notebook(name, tmp_path, monkeypatch)
  outs = list(outputs(nb))
  assert not [o for o in outs if o.output_type == "error"]
  pngs = [o for o in outs if "image/png" in o.get("data", {})]
  assert len(pngs) >= FIGURES[name], f"{len(pngs)} figures shown"
  assert all(base64.b64decode(p.data["image/png"]).startswith(b"\x89PNG") for p in pngs)
  text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outs)
  for want in PRINTS[name] + [f"xlt checkout: {REPO}"]:  # this checkout, found from colabs/
    assert want in text, want
  assert (tmp_path / "results.json").exists() or any(tmp_path.glob("*/results.json"))  # trained in WORKDIR


def test_every_notebook_is_tested():
  assert sorted(p.name for p in COLABS.glob("*.ipynb")) == sorted(SMALL)


def parameters(name) -> dict:
  nb = nbformat.read(COLABS / name, as_version=4)
  (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  values = {}
  exec(cell.source, values)
  return values


def test_default_parameters_are_the_configs_full_sizes():
  from configs import addition, addition_sweep, addition_table2, graph, merge

  p, c = parameters("graph_walkthrough.ipynb"), graph.get_config()
  assert (p["SEEDS"], p["STEPS"], p["SOURCE_SAMPLES"], p["TARGET_SAMPLES"], p["TEST_PAIRS"]) == (
      c.num_seeds, c.train.steps, c.mixture.source_samples, c.mixture.target_samples, c.graph.num_test_pairs)
  assert (p["LAYERS"], p["HEADS"], p["WIDTH"]) == (c.model.num_layers, c.model.num_heads, c.model.d_model)
  p, c = parameters("addition_walkthrough.ipynb"), addition.get_config("cpu")
  assert tuple(p["SWEEP_SAMPLES"]) == tuple(addition_sweep.get_config("cpu").sweep.samples)
  assert set(p["PAIRS"]) <= {g["name"] for g in addition_table2.get_config("cpu").grid} and p["PAIR_SAMPLES"] is None
  assert (p["DIGITS"], p["STEPS"], p["PAIR_SEEDS"], p["NUM_TEST"], p["BATCH"]) == (
      c.addition.max_digits, c.train.steps, c.num_seeds, c.addition.num_test, c.train.batch_size)
  assert (p["LAYERS"], p["HEADS"], p["WIDTH"]) == (c.model.num_layers, c.model.num_heads, c.model.d_model)
  p, c = parameters("merging_walkthrough.ipynb"), merge.get_config()
  assert (p["SEEDS"], p["OPS"], p["PRESETS"], p["SWAPS"], p["NUM_TEST"], p["GOAL_TEST"]) == (
      c.num_seeds, tuple(c.other_ops), tuple(c.partition.presets), tuple(c.merge.swaps), c.arithmetic.num_test,
      c.arithmetic.num_test_by_op["add_digit"])
  assert p["SWITCH"] == tuple(c.simultaneous.steps_per_switch)
  assert c.data.base == merge.parts(p["OPS"], "standard", p["BINARY"], p["UNARY"]) + merge.parts(
      p["OPS"], "letter", p["TARGET_IN_BASE"], p["TARGET_IN_BASE"])
  assert all(c.base.train[k] == v for k, v in p["BASE"].items())
  assert all(c.finetune.train[k] == v for k, v in p["FINETUNE"].items())
  assert all(c.lora.train[k] == v for k, v in p["FINETUNE"].items())  # the notebook gives LoRA that budget
  assert c.maet_neurons.short.train.steps <= p["FINETUNE"]["steps"]
  assert (p["LAYERS"], p["HEADS"], p["WIDTH"]) == (c.model.num_layers, c.model.num_heads, c.model.d_model)


def test_notebooks_are_committed_without_outputs():
  """Outputs belong to a run, not to the repository (and would go stale)."""
  for name in SMALL:
    nb = nbformat.read(COLABS / name, as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code"), name
    assert "github.com" not in nbformat.writes(nb) and "git clone" not in nbformat.writes(nb)
