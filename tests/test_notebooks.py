"""The walkthroughs in colabs/ run top to bottom: each is executed in a fresh kernel with
small sizes appended to its `parameters` cell, and must raise in no cell, show its figures
and print its key results."""

import base64
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import REPO

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
NUM_TEST = 16
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
  monkeypatch.setenv("XLA_FLAGS", "")
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
  for want in PRINTS[name]:
    assert want in text, want
  assert (tmp_path / "results.json").exists() or any(tmp_path.glob("*/results.json"))  # trained in WORKDIR


def test_notebooks_are_committed_without_outputs():
  """Outputs belong to a run, not to the repository (and would go stale)."""
  for name in SMALL:
    nb = nbformat.read(COLABS / name, as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code"), name
    assert "github.com" not in nbformat.writes(nb) and "git clone" not in nbformat.writes(nb)
