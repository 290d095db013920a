"""xlt.merge.registry: every method by name, its roles and options read from its function,
the checks of a call, and `python -m xlt.merge` for any method."""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from xlt import merge
from xlt.io import tensor_files as files
from xlt.merge import core, registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}


def tiny(seed: int, blocks: int = 3) -> dict:
  """An xlt-named tree: an embedding and `blocks` blocks of one mlp kernel and bias."""
  rng = np.random.default_rng(seed)
  tree = {"wte": {"embedding": rng.normal(size=(5, 2)).astype(np.float32)}}
  for b in range(blocks):
    tree[f"block_{b}"] = {"mlp": {"fc": {"kernel": rng.normal(size=(2, 4)).astype(np.float32),
                                          "bias": rng.normal(size=(4,)).astype(np.float32)}}}
  return tree


# the methods declared in the modules of mergekit's kin (tested in tests/test_merge_sparse.py and
# _geometric.py) and of the subspace, mask and data-aware methods (tests/test_merge_subspace.py,
# test_merge_data_aware.py), in order
MERGEKIT_KIN = [m.name for m in registry.METHODS.values()
                if m.fn.__module__ in ("xlt.merge.sparse", "xlt.merge.geometric", "xlt.merge.selective")]
SUBSPACE = [m.name for m in registry.METHODS.values()
            if m.fn.__module__ in ("xlt.merge.subspace", "xlt.merge.localize", "xlt.merge.data_aware")]


def leaves(tree) -> dict:
  return {merge.path_str(p): np.asarray(x) for p, x in core.leaves_with_paths(tree)}


def test_roles_and_options_are_the_functions_parameters():
  assert list(registry.METHODS)[:8] == ["layer_swap", "soup", "task_arithmetic", "ties", "dare", "magmax",
                                        "sparsify_rows", "maet"]
  assert list(registry.METHODS)[8:] == MERGEKIT_KIN + SUBSPACE
  hidden = {"maet": {"return_info"}}
  for name, m in registry.METHODS.items():
    params = inspect.signature(m.fn).parameters
    roles = [r.name for r in m.roles]
    assert list(params)[:len(roles)] == roles, name
    rest = [p for p in list(params)[len(roles):] if p != "naming" and p not in hidden.get(name, ())]
    assert [o.name for o in m.options] == rest, name
    for o in m.options:
      p = params[o.name]
      assert o.default is p.default and o.required == (p.default is inspect.Parameter.empty), (name, o)
      assert o.type == (p.annotation if p.annotation is not inspect.Parameter.empty else ""), (name, o)
      assert o.help and "\n" not in o.help, (name, o.name)
    assert m.paper and m.summary, name
  roles = lambda name: [(r.name, r.many) for r in registry.METHODS[name].roles]
  assert roles("layer_swap") == [("task_expert", False), ("language_expert", False)]
  assert roles("soup") == [("experts", True)]
  assert roles("ties") == roles("dare") == roles("task_arithmetic") == [("base", False), ("experts", True)]
  assert roles("maet") == [("base", False), ("ability_model", False), ("source_language_model", False),
                           ("target_language_models", True)]
  assert roles("sparsify_rows") == [("expert", False), ("base", False)]
  assert registry.METHODS["sparsify_rows"].option("threshold").required
  assert [o.name for o in registry.METHODS["layer_swap"].options if o.required] == ["bottom", "top"]
  ties = registry.METHODS["ties"]
  assert ties.option("density").default == 0.2 and ties.option("density").type == "float"
  assert ties.option("density").help.startswith("in (0, 1], the fraction of each delta kept")
  assert ties.option("masks").tree and "Yadav et al. 2023" in ties.paper
  assert "Chen et al. 2024" in registry.METHODS["maet"].paper


def test_every_method_by_name_equals_its_function():
  base, t, l, l2 = (tiny(i) for i in range(4))
  cases = {
      "layer_swap": ({"task_expert": t, "language_expert": l}, {"bottom": 1, "top": 1},
                     lambda: merge.layer_swap(t, l, bottom=1, top=1)),
      "soup": ({"experts": [t, l]}, {"weights": [1.0, 3.0]}, lambda: merge.soup([t, l], [1.0, 3.0])),
      "task_arithmetic": ({"base": base, "experts": [t, l]}, {"lambdas": 0.5},
                          lambda: merge.task_arithmetic(base, [t, l], 0.5)),
      "ties": ({"base": base, "experts": (t, l)}, {"density": 0.5}, lambda: merge.ties(base, [t, l], density=0.5)),
      "dare": ({"base": base, "experts": [t, l]}, {"drop": 0.5, "seed": 1},
               lambda: merge.dare(base, [t, l], drop=0.5, seed=1)),
      "maet": ({"base": base, "ability_model": t, "source_language_model": l, "target_language_models": [l2]},
               {"key_ratio": 0.5, "tensor_ratio": 0.5},
               lambda: merge.maet(base, t, l, [l2], key_ratio=0.5, tensor_ratio=0.5)),
      "magmax": ({"base": base, "experts": [t, l]}, {"scale": 0.5}, lambda: merge.magmax(base, [t, l], scale=0.5)),
      "sparsify_rows": ({"expert": t, "base": base}, {"threshold": 0.8},
                        lambda: merge.sparsify_rows(t, base, 0.8)),
  }
  # a new method needs a case here, or (mergekit's) in tests/test_merge_sparse.py / _geometric.py
  assert set(cases) == set(registry.METHODS) - set(MERGEKIT_KIN) - set(SUBSPACE)
  for name, (inputs, options, direct) in cases.items():
    want = leaves(direct())
    for naming in (merge.XLT, "auto"):
      got = leaves(registry.merge(name, inputs, options, naming=naming))
      assert got.keys() == want.keys(), name
      for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{name} {k}")
  # the defaults are the function's
  np.testing.assert_array_equal(leaves(merge.merge("ties", {"base": base, "experts": [t, l]}))["block_0/mlp/fc/kernel"],
                                leaves(merge.ties(base, [t, l]))["block_0/mlp/fc/kernel"])


@pytest.mark.parametrize("call, message", [
    (("tie", {}, {}), "unknown merge method 'tie'; known: layer_swap, soup, task_arithmetic, ties, dare, "
                      "magmax, sparsify_rows, maet"),
    (("ties", {"experts": ["x"]}, {}),
     r"ties takes inputs base, experts \(list\); missing \['base'\], unknown \[\]"),
    (("soup", {"experts": ["x"], "base": "b"}, {}),
     r"soup takes inputs experts \(list\); missing \[\], unknown \['base'\]"),
    (("soup", {"experts": "x"}, {}), "input experts is a non-empty list of models, got str"),
    (("soup", {"experts": []}, {}), "input experts is a non-empty list of models, got list"),
    (("ties", {"base": "b", "experts": ["x"]}, {"drop": 0.1}),
     "ties has no option drop; its options: density, lambdas, masks"),
    (("sparsify_rows", {"expert": "e", "base": "b"}, {}), r"sparsify_rows needs option threshold \(no default\)"),
    (("layer_swap", {"task_expert": "t", "language_expert": "l"}, {"bottom": 1}), "needs option top"),
    (("ties", {"base": "b", "experts": ["x"]}, {"density": "high"}), "option density must be float, got 'high'"),
    (("layer_swap", {"task_expert": "t", "language_expert": "l"}, {"bottom": 1.5, "top": 1}),
     "option bottom must be int"),
    (("soup", {"experts": ["x"]}, {"weights": [1, "a"]}), r"option weights must be Sequence\[float\] \| None"),
])
def test_a_bad_call_is_one_clear_line(call, message):
  with pytest.raises(ValueError, match=message) as e:
    registry.check(*call)
  assert "\n" not in str(e.value)


def test_tree_options_are_python_only():
  base, t = tiny(0), tiny(1)
  masks = core.map_leaves(lambda p, x: np.ones(np.shape(x), bool), base)
  registry.check("ties", {"base": base, "experts": [t]}, {"masks": masks})
  with pytest.raises(ValueError, match="option masks takes a parameter tree, which only a Python call can give"):
    registry.check("ties", {"base": "b", "experts": ["x"]}, {"masks": masks}, trees_allowed=False)
  with pytest.raises(ValueError, match="maet has no option return_info"):
    registry.check("maet", {"base": 0, "ability_model": 0, "source_language_model": 0, "target_language_models": [0]},
                   {"return_info": True})


def test_describe_lists_every_method_role_option_and_paper():
  text = merge.describe()
  for m in registry.METHODS.values():
    assert f"{m.name}: {m.summary}" in text and m.paper in text
    for o in m.options:
      assert f"    {o.name} (" in text
  assert "    experts (list): the fine-tuned models to merge" in text
  assert "    threshold (float; required): " in text
  assert "    density (float; default 0.2): in (0, 1], the fraction of each delta kept" in text
  assert merge.describe("soup").startswith("soup: A model soup (Wortsman et al. 2022)")


# ---- the command, on tiny Hugging Face-named files


def hf(seed: int) -> dict:
  rng = np.random.default_rng(seed)
  tree = {"model.embed_tokens.weight": rng.normal(size=(6, 4)), "model.norm.weight": rng.normal(size=(4,))}
  for i in range(2):
    tree[f"model.layers.{i}.mlp.up_proj.weight"] = rng.normal(size=(8, 4))
    tree[f"model.layers.{i}.input_layernorm.weight"] = rng.normal(size=(4,))
  return {k: v.astype(np.float32) for k, v in tree.items()}


def command(*args, cwd=REPO):
  return subprocess.run([sys.executable, "-m", "xlt.merge", *args], cwd=cwd, env=ENV, capture_output=True,
                        text=True, timeout=120)


@pytest.fixture
def checkpoints(tmp_path):
  trees = {name: hf(i) for i, name in enumerate(("base", "a", "b"))}
  for name, tree in trees.items():
    files.save(tree, str(tmp_path / f"{name}.safetensors"))
  return trees, {name: str(tmp_path / f"{name}.safetensors") for name in trees}


@pytest.mark.parametrize("method", ["ties", "soup"])
def test_command_runs_any_method(tmp_path, checkpoints, method):
  trees, paths = checkpoints
  out = tmp_path / "out"
  args = [f"--config.inputs.experts={paths['a']},{paths['b']}", f"--config.output={out}"]
  if method == "ties":
    args += [f"--config.inputs.base={paths['base']}", "--config.options.density=0.3", "--config.options.lambdas=0.5,1"]
    want = merge.ties(trees["base"], [trees["a"], trees["b"]], density=0.3, lambdas=[0.5, 1.0], naming=merge.HF)
  else:
    args += ["--config.options.weights=(1, 3)", "--config.heatmaps=false"]
    want = merge.soup([trees["a"], trees["b"]], [1, 3])
  r = command("--config=configs/merge_files.py", f"--config.method={method}", *args)
  assert r.returncode == 0, r.stderr
  got = load_file(str(out / "model.safetensors"))
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  assert (out / "summary.json").exists()
  assert (out / "delta_experts_0.png").exists() == (method == "ties")


def test_command_user_errors_are_one_line_and_exit_2(tmp_path, checkpoints):
  _, paths = checkpoints
  r = command("--config=configs/merge_files.py", "--config.method=tie", f"--config.output={tmp_path / 'o'}")
  assert r.returncode == 2 and r.stdout == ""
  assert r.stderr.splitlines() == ["xlt.merge: error: unknown merge method 'tie'; known: "
                                   + ", ".join(registry.METHODS)]
  with open(paths["a"], "rb") as f:  # a copy cut short inside its tensor data
    data = f.read()
  (tmp_path / "cut.safetensors").write_bytes(data[:-10])
  r = command("--config=configs/merge_files.py", "--config.method=soup",
              f"--config.inputs.experts={tmp_path / 'cut.safetensors'}", f"--config.output={tmp_path / 'o'}")
  assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
  assert r.stderr.startswith("xlt.merge: error: ") and "cut.safetensors is truncated" in r.stderr
  assert not (tmp_path / "o").exists()
  r = command("--list_methods")
  assert r.returncode == 0 and r.stdout.strip() == merge.describe()


def test_truncated_or_foreign_files_fail_on_load(tmp_path, checkpoints):
  _, paths = checkpoints
  data = open(paths["a"], "rb").read()
  for cut, message in ((4, "not a complete safetensors file"), (100, "not a complete safetensors file"),
                       (len(data) - 1, "is truncated: its tensors end at byte")):
    (tmp_path / "x.safetensors").write_bytes(data[:cut])
    with pytest.raises(ValueError, match=message):
      files.load(str(tmp_path / "x.safetensors"))
  (tmp_path / "x.safetensors").write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{{{{")
  with pytest.raises(ValueError, match="header is not JSON"):
    files.load(str(tmp_path / "x.safetensors"))


def test_a_float_option_given_per_layer_merges_each_block_with_its_value():
  # mergekit's gradient: 3 blocks at 0, 1/2, 1 along [0.2, 0.8] -> densities 0.2, 0.5, 0.8;
  # outside the blocks (the embedding) the first value
  base, t, l = (tiny(i) for i in range(3))
  got = leaves(registry.merge("ties", {"base": base, "experts": [t, l]}, {"density": [0.2, 0.8]}))
  for path, density in (("wte/embedding", 0.2), ("block_0/mlp/fc/kernel", 0.2), ("block_1/mlp/fc/bias", 0.5),
                        ("block_2/mlp/fc/kernel", 0.8)):
    want = leaves(merge.ties(base, [t, l], density=density))[path]
    np.testing.assert_array_equal(got[path], want, err_msg=path)
  # a constant list is the plain call; dare's seeded masks follow each tensor's path
  np.testing.assert_equal(leaves(registry.merge("dare", {"base": base, "experts": [t, l]}, {"drop": [0.5, 0.5]})),
                          leaves(merge.dare(base, [t, l], drop=0.5)))
  with pytest.raises(ValueError, match="must be one number, not a per-layer list"):
    registry.merge("maet", {"base": base, "ability_model": t, "source_language_model": l,
                            "target_language_models": [l]}, {"alpha": [0.5, 1.0]})
  flat = {"encoder.x": np.ones(2, np.float32)}
  with pytest.raises(ValueError, match="no naming rule recognises"):  # the blocks must be known
    registry.merge("ties", {"base": flat, "experts": [flat]}, {"density": [0.5, 1.0]}, naming="auto")


def test_a_one_line_spec_names_a_method_and_its_options():
  assert registry.parse_spec("ties density=0.5 lambdas=[1.0,0.5]") == ("ties", {"density": 0.5, "lambdas": [1.0, 0.5]})
  assert registry.parse_spec("layer_swap bottom=1 top=1 non_block='average'") == (
      "layer_swap", {"bottom": 1, "top": 1, "non_block": "average"})
  with pytest.raises(ValueError, match="merges entry 'ties density=half' is not 'method option=value ...'"):
    registry.parse_spec("ties density=half", "merges")


def test_an_experiments_merges_pick_their_inputs_from_what_it_has():
  base, t, l = (tiny(i) for i in range(3))
  have = {"task_expert": t, "language_expert": l, "experts": [t, l], "base": base}
  np.testing.assert_equal(leaves(registry.merge_among("ties", have, {"density": 0.5})),
                          leaves(merge.ties(base, [t, l], density=0.5)))
  assert registry.check_among("layer_swap", {"bottom": 1, "top": 1}, have, "swap").name == "layer_swap"
  with pytest.raises(ValueError, match="merge 'm': no input for maet's ability_model, source_language_model, "
                                       "target_language_models"):
    registry.check_among("maet", {}, have, "m")
  with pytest.raises(ValueError, match="ties has no option drop"):
    registry.check_among("ties", {"drop": 0.1}, have, "t")


def test_the_docs_methods_table_is_rendered_from_the_declarations():
  from xlt.merge import methods_doc
  with open(os.path.join(REPO, "docs", "merge.md")) as f:
    text = f.read()
  assert methods_doc.with_methods_table(text) == text, "run python -m xlt.merge.methods_doc docs/merge.md"
  table = methods_doc.methods_table()
  assert "| soup | experts (list) | weights=None | linear | no | Wortsman et al. 2022" in table
  assert "| della | base, experts (list) |" in table and "| della_linear | della | yes |" not in table
  assert len([r for r in table.splitlines() if r.startswith("| ")]) == len(registry.METHODS) + 1
  stale = text.replace("| soup | experts (list)", "| soup | models (list)")
  assert methods_doc.with_methods_table(stale) == text
  out = subprocess.run([sys.executable, "-m", "xlt.merge.methods_doc", os.path.join(REPO, "docs", "merge.md"),
                        "--check"], capture_output=True, text=True, env=ENV)
  assert out.returncode == 0, out.stdout + out.stderr


def test_a_per_tensor_method_is_lifted_over_trees():
  from xlt.merge import declare
  seen = []

  def shrink(base, experts, *, by: float = 2.0, masks=None, path=None):
    """Toy: base + the mean delta / by."""
    seen.append(path)
    return base + sum(x - base for x in experts) / (len(experts) * by)

  def prepare(n, *, by):
    assert n == 2
    if by <= 0:
      raise ValueError("by must be positive")
    return {"by": float(by)}

  lifted = declare.lift(shrink, ("base", "experts+"), prepare)
  assert list(inspect.signature(lifted).parameters) == ["base", "experts", "by", "masks", "naming"]
  b = {"a": np.zeros(2, np.float32), "b": np.ones(3, np.float32)}
  e1 = {"a": np.array([2.0, 4.0], np.float32), "b": np.array([1, 3, 5], np.float32)}
  e2 = {"a": np.array([6.0, 0.0], np.float32), "b": np.array([1, 1, 1], np.float32)}
  out = lifted(b, [e1, e2], by=4)
  np.testing.assert_array_equal(out["a"], [1.0, 0.5])
  np.testing.assert_array_equal(out["b"], [1.0, 1.25, 1.5])
  assert seen == [("a",), ("b",)] and out["a"].dtype == np.float32
  # a mask restricts each expert to its neurons (the base elsewhere) before the function sees it
  out = lifted(b, [e1, e2], masks=[{"a": np.array([True, False]), "b": True}, None])
  np.testing.assert_array_equal(out["a"], [2.0, 0.0])
  with pytest.raises(ValueError, match="by must be positive"):
    lifted(b, [e1, e2], by=0)
  with pytest.raises(ValueError, match="b: shape \\(3,\\) in base vs \\(2,\\) in expert 1"):
    lifted(b, [e1, {"a": e2["a"], "b": e2["a"]}])
  with pytest.raises(ValueError, match="experts is empty"):
    lifted(b, [])
  # the registry's per-tensor methods keep their per-tensor form
  m = registry.get("ram")
  assert m.per_tensor is m.fn.per_tensor and m.mergekit == "ram"
  np.testing.assert_array_equal(m.per_tensor(np.zeros(2), [np.array([1.0, 0]), np.array([3.0, 0])], epsilon=1e-5),
                                [2.0, 0.0])


def test_help_prints_once_and_exits_0():
  r = command("--help")
  assert r.returncode == 0 and r.stdout.count("Merges checkpoint files with any method") == 1, r.stderr[-500:]
  assert "--[no]overwrite" in r.stdout and "mergekit: linear (accepted as its name too)" in r.stdout


def test_mergekit_names_on_the_command_line():
  from xlt.merge.from_mergekit import flags_aliases
  two = {"base": "b", "experts": "x,y"}
  assert flags_aliases("linear", {"experts": "x,y"}, {"weight": [1, 3]}) == ("soup", {"weights": [1, 3]})
  assert flags_aliases("dare_linear", two, {"density": 0.25, "weight": 0.5}) == (
      "dare", {"convention": "mergekit", "drop": 0.75, "lambdas": 0.5})
  assert flags_aliases("nuslerp", {"experts": "x,y"}, {"weight": [1, 2]}) == ("nuslerp_nobase", {"weights": [1, 2]})
  assert flags_aliases("nuslerp", two, {"weight": [1, 2]}) == ("nuslerp", {"weights": [1, 2]})
  # mergekit normalises the weights, then scales the merged delta by lambda
  assert flags_aliases("task_arithmetic", two, {"weight": [1, 3], "lambda": 0.5, "normalize": True}) == (
      "task_arithmetic", {"lambdas": [0.125, 0.375]})
  assert flags_aliases("dare_ties", two, {"lambda": 0.5}) == ("dare_ties", {"scale": 0.5})
  assert flags_aliases("ties", two, {"density": 0.2}) == ("ties", {"density": 0.2})  # xlt's names pass as they are
  assert flags_aliases("ties", two, {"lambda": 0.5, "normalize": False}) == (
      "ties", {"scale": 0.5, "normalize": False})
  with pytest.raises(ValueError, match=r"mergekit's dare_linear needs a base here \(--config.inputs.base\)"):
    flags_aliases("dare_linear", {"experts": "x,y"}, {})


def test_command_mergekit_names_overwrite_and_the_config_written(tmp_path, checkpoints):
  trees, paths = checkpoints
  out = tmp_path / "out"
  out.mkdir()
  (out / "notes.txt").write_text("mine")
  args = ["--config=configs/merge_files.py", "--config.method=linear", f"--config.inputs.experts={paths['a']},{paths['b']}",
          "--config.options.weight=(1, 3)", "--config.heatmaps=false", f"--config.output={out}"]
  r = command(*args)
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and "replace it with --overwrite" in r.stderr
  assert os.listdir(out) == ["notes.txt"]
  r = command(*args, "--overwrite")
  assert r.returncode == 0, r.stderr
  got, want = load_file(str(out / "model.safetensors")), merge.soup([trees["a"], trees["b"]], [1, 3])
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  import json
  ran = json.loads((out / "merge_config.json").read_text())
  assert ran["method"] == "soup" and ran["options"] == {"weights": [1, 3]} and "notes.txt" not in os.listdir(out)
  # a mergekit YAML is kept beside the output as mergekit_config.yml
  yml = tmp_path / "merge.yml"
  yml.write_text(f"merge_method: linear\nmodels:\n  - model: {paths['a']}\n  - model: {paths['b']}\n")
  r = command(f"--mergekit_yaml={yml}", f"--config.output={tmp_path / 'yaml_out'}", "--config.heatmaps=false")
  assert r.returncode == 0, r.stderr
  assert (tmp_path / "yaml_out" / "mergekit_config.yml").read_text() == yml.read_text()


def test_ties_normalize_and_scale_and_dare_without_rescale_by_hand():
  from xlt.merge import combine
  base = {"w": np.zeros(2, np.float32)}
  experts = [{"w": np.array([2, -1], np.float32)}, {"w": np.array([4, 3], np.float32)}]
  # density 1: sums [6, 2] elect + on both; entry 0 has two agreeing deltas, entry 1 one
  np.testing.assert_array_equal(combine.ties(base, experts, density=1.0)["w"], [3, 3])
  np.testing.assert_array_equal(combine.ties(base, experts, density=1.0, normalize=False)["w"], [6, 3])
  np.testing.assert_array_equal(combine.ties(base, experts, density=1.0, normalize=False, scale=0.5)["w"], [3, 1.5])
  np.testing.assert_array_equal(combine.ties(base, experts, density=1.0, convention="xlt", scale=2.0)["w"], [6, 6])
  big = {"w": np.ones(64, np.float32)}
  kept = combine.dare({"w": np.zeros(64, np.float32)}, [big], drop=0.5, seed=3, rescale=False)["w"]
  np.testing.assert_array_equal(kept, combine.dare_mask(3, 0, ("w",), (64,), 0.5).astype(np.float32))


def test_mergekit_yaml_ties_lambda_normalize_false_and_dare_rescale_false():
  from xlt.merge.from_mergekit import from_mergekit
  models = [{"model": "b"}, {"model": "x", "parameters": {"weight": 1.0, "density": 0.5}},
            {"model": "y", "parameters": {"weight": 0.5, "density": 0.5}}]
  ties = from_mergekit({"merge_method": "ties", "base_model": "b", "models": models,
                        "parameters": {"normalize": False, "lambda": 0.5}})
  assert ties["method"] == "ties" and ties["options"]["normalize"] is False and ties["options"]["scale"] == 0.5
  dare = from_mergekit({"merge_method": "dare_linear", "base_model": "b", "models": models,
                        "parameters": {"rescale": False}})
  assert dare["method"] == "dare" and dare["options"]["rescale"] is False and dare["options"]["drop"] == 0.5


def test_a_mergekit_yaml_on_gpt2_reads_rows_as_mergekit_does(tmp_path):
  import json
  import shutil
  from configs import merge_files
  from xlt.merge import from_mergekit, tool
  from xlt.merge.__main__ import merge_config, with_yaml
  gpt2 = os.path.join(REPO, "tests", "fixtures", "hf", "gpt2")
  other = tmp_path / "gpt2_b"
  shutil.copytree(gpt2, other)
  tensors = load_file(str(other / "model.safetensors"))
  rng = np.random.default_rng(0)
  from safetensors.numpy import save_file
  save_file({k: v + 0.01 * rng.normal(size=v.shape).astype(v.dtype) for k, v in tensors.items()},
            str(other / "model.safetensors"), metadata={"format": "pt"})
  yml = tmp_path / "della.yml"
  yml.write_text(f"merge_method: della\nbase_model: {gpt2}\nmodels:\n  - model: {other}\n    parameters:\n"
                 "      weight: 1.0\n      density: 0.5\n      epsilon: 0.1\n")
  mapped = from_mergekit.load_yaml(str(yml))
  assert mapped["naming"] == "transformer.h.{i}."  # Conv1D: mergekit's rows are raw axis 0
  summary = merge_config(with_yaml(merge_files.get_config(), str(yml)) | {"output": str(tmp_path / "yaml"),
                                                                          "heatmaps": False})
  assert summary["naming"] != "hf"
  got = load_file(str(tmp_path / "yaml" / "model.safetensors"))
  kw = dict(options=mapped["options"], heatmaps=False)
  tool.merge_files(mapped["inputs"], "della", str(tmp_path / "flag"), naming="transformer.h.{i}.", **kw)
  tool.merge_files(mapped["inputs"], "della", str(tmp_path / "hf"), naming="hf", **kw)
  flag, hf_rows = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("flag", "hf"))
  k = "transformer.h.0.attn.c_attn.weight"
  np.testing.assert_array_equal(got[k], flag[k])
  assert not np.array_equal(got[k], hf_rows[k])
  assert json.loads((tmp_path / "yaml" / "merge_config.json").read_text())["naming"] == "transformer.h.{i}."


def test_per_model_densities_for_ties_and_dare():
  from xlt.merge import combine
  from xlt.merge.from_mergekit import from_mergekit
  base = {"w": np.zeros(4, np.float32)}
  experts = [{"w": np.array([4, 3, 2, 1], np.float32)}, {"w": np.array([1, 2, 3, 4], np.float32)}]
  # expert 0 keeps all four entries, expert 1 its top half: [3, 4]; means of the agreeing entries
  got = combine.ties(base, experts, densities=[1.0, 0.5])["w"]
  np.testing.assert_array_equal(got, [4, 3, 2.5, 2.5])
  np.testing.assert_array_equal(combine.ties(base, experts, density=0.5, densities=[0.5, 0.5])["w"],
                                combine.ties(base, experts, density=0.5)["w"])
  big = [{"w": np.ones(64, np.float32)}, {"w": np.full(64, 2.0, np.float32)}]
  zero = {"w": np.zeros(64, np.float32)}
  mixed = combine.dare(zero, big, drops=[0.0, 0.5], seed=1)["w"]
  keep = combine.dare_mask(1, 1, ("w",), (64,), 0.5)
  np.testing.assert_array_equal(mixed, 1 + np.where(keep, 4.0, 0.0))
  with pytest.raises(ValueError, match="TIES densities has 1 values for 2 experts"):
    combine.ties(base, experts, densities=[0.5])
  models = [{"model": "b"}, {"model": "x", "parameters": {"density": 0.5}}, {"model": "y", "parameters": {"density": 0.3}}]
  assert from_mergekit({"merge_method": "ties", "base_model": "b", "models": models})["options"]["densities"] == [
      0.5, 0.3]
  drops = from_mergekit({"merge_method": "dare_linear", "base_model": "b", "models": models})["options"]["drops"]
  assert drops == pytest.approx([0.5, 0.7])
