"""Where a merge-testbed base keeps its languages and where its experts learned: the structure
that the layer-swapping and modular-training papers explain their results by (language in the
first and last layers, the task in the middle, experts that move few parameters).

  python -m xlt.structure --workdir=runs/claims_study/depth_12 --stage=finetune_r0 \
      --out=results/structure/depth_12_r0.json --png=docs/images/structure_depth_12_r0.png

For a finished testbed or regime-map run (its config.json, base/ and fine-tune stage), per seed:

  delta    each expert's relative delta ||theta_expert - theta_base|| / ||theta_base|| per block
           and module kind (attn, mlp, norm), and per non-block parameter (embeddings, final norm,
           head);
  swap     the per-block swap curve: block i of the task expert replaced by the language
           expert's, scored (greedy exact match) on the goal, the task and the target language;
  probe    per layer (0: the embeddings, i: after block i) of the base and both experts, a linear
           probe of language identity on the residual stream at the answer position ("="): a
           logistic regression trained with optax's L-BFGS on half the problems, its accuracy on
           the other half (the two languages' prompts share their problems and differ only in
           the tag); and the cross-language similarity, the mean cosine between the centred
           residuals of the same problem in the two languages;
  lens     (arithmetic) per layer of the base, the logit lens at the answer position (the
           model's own final norm and head on the residual): the source answer script's share
           of the lens mass on the two languages' scripts, on the target's prompts and on the
           source's (where the middle reads out: the source, as multilingual LLMs' middle
           layers decode into their dominant language, or the target);
  edges    the papers' picture in numbers: the share of each expert's squared delta that lies in
           the paper's swap zone (bottom 5 and top 2 of 32 layers, scaled to the depth) divided
           by the zone's share of the block parameters (> 1: concentrated at the edges).

Writes one JSON file (means over seeds and the per-seed values) and one figure. Only xlt's own
base (trained from scratch) is measured: a run with `base_model` is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from xlt import checkpoint as ckpt_lib
from xlt import compile_cache
from xlt import ensemble_decode
from xlt import experiments
from xlt import model as model_lib
from xlt import report
from xlt import results as results_lib
from xlt.data import arithmetic
from xlt.experiments import common as kind_lib
from xlt.io import fileio

KINDS = ("attn", "mlp", "norm")
PAPER_LAYERS, PAPER_ZONE = 32, (5, 2)  # the layer-swapping paper's default: bottom 5, top 2 of 32


# --------------------------------------------------------------------------- deltas


def delta_by_block(expert, base, num_layers: int) -> dict:
  """The expert's relative delta per block and module kind, per block, and per non-block
  parameter; and each block's squared delta and parameter count (for `edge_ratio`)."""
  sq = np.zeros((num_layers, len(KINDS)))
  norm = np.zeros((num_layers, len(KINDS)))
  size = np.zeros(num_layers)
  non_block = {}
  flat_e = jax.tree_util.tree_flatten_with_path(expert)[0]
  for (path, e), b in zip(flat_e, jax.tree.leaves(base)):
    e, b = np.asarray(e, np.float64), np.asarray(b, np.float64)
    block, kind = model_lib.path_info(path)
    d2, b2 = float(np.sum((e - b) ** 2)), float(np.sum(b ** 2))
    if block is None:
      name = "/".join(str(getattr(k, "key", k)) for k in path)
      non_block[name] = math.sqrt(d2 / b2) if b2 else 0.0
      continue
    k = KINDS.index(kind) if kind in KINDS else KINDS.index("norm")
    sq[block, k] += d2
    norm[block, k] += b2
    size[block] += e.size
  with np.errstate(invalid="ignore", divide="ignore"):
    by_kind = np.where(norm > 0, np.sqrt(sq / norm), 0.0)
    by_block = np.sqrt(sq.sum(1) / norm.sum(1))
  return {"kinds": list(KINDS), "by_kind": by_kind.tolist(), "by_block": by_block.tolist(),
          "non_block": non_block, "sq_by_block": sq.sum(1).tolist(), "size_by_block": size.tolist()}


def zone(num_layers: int) -> tuple[int, int]:
  """The paper's swap zone (bottom, top) scaled to `num_layers` and rounded up."""
  return tuple(math.ceil(n * num_layers / PAPER_LAYERS) for n in PAPER_ZONE)


def edge_ratio(sq_by_block, size_by_block, bottom: int, top: int) -> float:
  """(the bottom `bottom` and top `top` blocks' share of the squared delta) / (their share of
  the block parameters): 1 when the change is spread evenly, > 1 when it sits at the edges."""
  sq, size = np.asarray(sq_by_block, float), np.asarray(size_by_block, float)
  edge = np.zeros(len(sq), bool)
  edge[:bottom] = True
  if top:
    edge[len(sq) - top:] = True
  if sq.sum() == 0:
    return float("nan")
  return float((sq[edge].sum() / sq.sum()) / (size[edge].sum() / size.sum()))


# --------------------------------------------------------------------------- swaps


def swap_block(task_expert, language_expert, i: int):
  """The task expert with its block i (every parameter under `block_<i>`) taken from the
  language expert."""
  return jax.tree_util.tree_map_with_path(
      lambda path, t, l: l if model_lib.path_info(path)[0] == i else t, task_expert, language_expert)


def _subset(es, k: int):
  """The first k problems of an evaluation set (its scorer indexes problems from the start)."""
  return dataclasses.replace(es, prompts=es.prompts[:k])


def swap_curve(cfg, task, sets: dict[str, list[str]], seeds_models: list[tuple], problems: int,
               batch: int, roles=("goal", "task", "language")) -> dict:
  """{role: [[score per block] per seed]} for `roles`: per seed (model, donor), the model with
  each single block taken from the donor (the task expert and the language expert: the swap
  curve; the task expert and the base: the revert curve), scored on each role's sets (their
  first `problems` problems each; a role with several sets averages them)."""
  names = [n for r in roles for n in sets[r]]
  eval_sets = {n: _subset(task.test[n], problems) for n in names}
  out = {r: [] for r in roles}
  for task_expert, language_expert in seeds_models:
    models = [swap_block(task_expert, language_expert, i) for i in range(cfg.num_layers)]
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *models)
    scored = ensemble_decode.score_members(cfg, stacked, task, eval_sets, [names] * len(models), batch)
    for r in roles:
      out[r].append([float(np.mean([s[n]["exact_match"] for n in sets[r]])) for s in scored])
  return out


# --------------------------------------------------------------------------- probes


def residuals(cfg, params, tokens_BxT) -> np.ndarray:
  """[layers + 1, B, T, D]: the residual stream after the token embeddings and after each
  block."""
  return np.asarray(_residuals(cfg, params, jnp.asarray(tokens_BxT)))


@functools.partial(jax.jit, static_argnums=0)
def _residuals(cfg, params, tokens_BxT):
  _, state = model_lib.GPT(cfg).apply(
      {"params": params}, tokens_BxT, capture_intermediates=lambda mdl, _: isinstance(
          mdl, (model_lib.Block, nn.Embed)), mutable=["intermediates"])
  inter = state["intermediates"]
  embed = inter["wte"]["__call__"][0]
  if cfg.embed_scale:
    embed = embed * cfg.d_model ** 0.5
  blocks = [inter[f"block_{i}"]["__call__"][0][0] for i in range(cfg.num_layers)]
  return jnp.stack([embed.astype(jnp.float32)] + [b.astype(jnp.float32) for b in blocks])


def fit_probe(x_train, y_train, x_test, y_test, l2: float = 1e-3, steps: int = 100) -> float:
  """Held-out accuracy of an L2-regularised logistic regression (features standardised on the
  training half) fitted with optax's L-BFGS."""
  mean, std = x_train.mean(0), x_train.std(0) + 1e-6
  w = _fit_logistic(jnp.asarray((x_train - mean) / std, jnp.float32), jnp.asarray(y_train, jnp.float32),
                    jnp.float32(l2), steps)
  predicted = np.asarray(jnp.asarray((x_test - mean) / std, jnp.float32) @ w[:-1] + w[-1]) > 0
  return float(np.mean(predicted == np.asarray(y_test, bool)))


@functools.partial(jax.jit, static_argnums=3)
def _fit_logistic(x, y, l2, steps: int):
  def loss(w):
    return jnp.mean(optax.sigmoid_binary_cross_entropy(x @ w[:-1] + w[-1], y)) + l2 * jnp.sum(w[:-1] ** 2)

  opt = optax.lbfgs()
  value_and_grad = optax.value_and_grad_from_state(loss)

  def step(carry, _):
    w, state = carry
    value, grad = value_and_grad(w, state=state)
    updates, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=loss)
    return (optax.apply_updates(w, updates), state), None

  w = jnp.zeros(x.shape[1] + 1)
  (w, _), _ = jax.lax.scan(step, (w, opt.init(w)), None, length=steps)
  return w


def cross_language_similarity(h_a, h_b) -> float:
  """Mean cosine between paired rows of h_a and h_b ([N, D], the same problems in two
  languages), each centred by the mean over both (so a direction every row shares does not
  count); a pair whose rows are equal counts 1 (at the embeddings the answer position holds
  the same token in both languages, and centring leaves nothing to take a cosine of)."""
  mean = np.concatenate([h_a, h_b]).mean(0)
  a, b = h_a - mean, h_b - mean
  na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
  same = np.linalg.norm(h_a - h_b, axis=1) <= 1e-6 * (np.linalg.norm(h_a, axis=1) + np.linalg.norm(h_b, axis=1))
  cos = np.where(same, 1.0, np.sum(a * b, 1) / np.maximum(na * nb, 1e-30))
  return float(np.mean(cos))


def paired_prompts(task, sets: dict[str, list[str]], source: str, target: str) -> list[tuple]:
  """Per target-language operation set, the token ids of its prompts and of the same problems'
  prompts in the source language (the `language` and `source_language` roles' sets)."""
  pairs = []
  for name in sets["language"]:
    twin = name.rsplit("/", 1)[0] + "/" + source
    if twin not in task.test or not name.endswith("/" + target):
      continue
    # an operation's test set asks the same problems in every language (arithmetic.held_out);
    # the languages may write them with other tokens, in another order
    a, b = task.test[twin].prompts, task.test[name].prompts
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
      raise ValueError(f"{twin} and {name} do not hold the same problems: no paired probe")
    pairs.append((np.asarray([task.tokenizer.encode(p) for p in a]),
                  np.asarray([task.tokenizer.encode(p) for p in b])))
  if not pairs:
    raise ValueError("no operation is tested in both languages: nothing to probe")
  return pairs


def probe_model(cfg, params, pairs) -> dict:
  """Per layer of `params`, the language probe's held-out accuracy and the cross-language
  similarity at the last prompt position ("="), over every operation's paired prompts
  (`paired_prompts`) together: train on the even problems, test on the odd."""
  last = lambda tokens: residuals(cfg, params, tokens)[:, :, -1]
  ra = np.concatenate([last(a) for a, _ in pairs], axis=1)
  rb = np.concatenate([last(b) for _, b in pairs], axis=1)
  n = ra.shape[1]
  train, test = np.arange(0, n, 2), np.arange(1, n, 2)
  label = lambda idx: np.concatenate([np.zeros(len(idx)), np.ones(len(idx))])
  acc, sim = [], []
  for layer in range(ra.shape[0]):
    both = lambda idx, layer=layer: np.concatenate([ra[layer, idx], rb[layer, idx]])
    acc.append(fit_probe(both(train), label(train), both(test), label(test)))
    sim.append(cross_language_similarity(ra[layer], rb[layer]))
  return {"accuracy": acc, "similarity": sim}


# --------------------------------------------------------------------------- logit lens


@functools.partial(jax.jit, static_argnums=0)
def _last_logits(cfg, params, tokens_BxT):
  return model_lib.apply(cfg, params, tokens_BxT)[0][:, -1, :cfg.vocab_size].astype(jnp.float32)


def lens_probabilities(cfg, params, tokens_BxT, layer: int) -> np.ndarray:
  """[B, V]: the logit lens at the last position after `layer` blocks (0: the embeddings), the
  model's own final norm and head applied to that residual: the model cut to its first `layer`
  blocks, so the lens at the last layer is the model's own next-token distribution."""
  cut = dataclasses.replace(cfg, num_layers=max(layer, 1))
  kept = {k: v for k, v in params.items() if not (k.startswith("block_") and int(k[len("block_"):]) >= layer)}
  if layer == 0:  # a model needs a block: one whose every weight is zero adds exactly 0 to the residual
    kept["block_0"] = jax.tree.map(jnp.zeros_like, params["block_0"])
  return np.asarray(jax.nn.softmax(_last_logits(cut, kept, jnp.asarray(tokens_BxT)), axis=-1))


def script_lens(cfg, params, prompts: list[np.ndarray], first_ids, second_ids) -> dict:
  """Per layer 0..L over every prompt (each array [N, T] of one operation's prompts): the mean
  share of the first script in the lens's mass on the two, P(first) / (P(first) + P(second)),
  with P(S) the lens probability summed over S's token ids at the answer position; and the mean
  mass P(first) + P(second) (how much of the lens points at an answer at all)."""
  first, second = np.asarray(first_ids), np.asarray(second_ids)
  if set(first_ids) & set(second_ids):
    raise ValueError("the two languages' answer scripts share tokens: no script lens")
  share, mass = [], []
  for layer in range(cfg.num_layers + 1):
    p = np.concatenate([lens_probabilities(cfg, params, x, layer) for x in prompts])
    a, b = p[:, first].sum(1), p[:, second].sum(1)
    share.append(float(np.mean(a / np.maximum(a + b, 1e-30))))
    mass.append(float(np.mean(a + b)))
  return {"share": share, "mass": mass}


def lens_model(cfg, params, task, pairs, source: str, target: str) -> dict:
  """The script lens of `params` on the target language's prompts and on the same problems'
  source prompts (`paired_prompts`): the source script's share per layer, and the mass on the
  two scripts. Arithmetic languages only (their answer scripts)."""
  ids = {lang: task.tokenizer.encode(list(arithmetic.answer_script(lang))) for lang in (source, target)}
  on = lambda k: script_lens(cfg, params, [p[k] for p in pairs], ids[source], ids[target])
  return {"target_prompts": on(1), "source_prompts": on(0)}


# --------------------------------------------------------------------------- a finished run


def _members(stage_dir: str, like, count: int, ids) -> list:
  """Members `ids` of a finished stage's `count` best parameters (checkpoint.BestParams, the
  models the run tested), each a tree of numpy arrays."""
  path = os.path.join(stage_dir, "best_params.npz")
  if not os.path.isfile(path):
    raise ValueError(f"{path} is missing: the stage has not finished")
  stacked_like = jax.tree.map(lambda x: jax.ShapeDtypeStruct((count, *x.shape), x.dtype), like)
  stacked = ckpt_lib.BestParams(path, count).params(stacked_like)
  return [kind_lib.member(stacked, i) for i in ids]


def load_run(workdir: str, stage: str):
  """(config, testbed.Prep, per seed (base, task expert, language expert)) of a finished
  testbed or regime-map run; `stage` is its fine-tune stage (finetune, finetune_r<i>)."""
  from xlt.experiments.testbed import experiment as testbed  # the testbed's own reading of its config and data

  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise ValueError(f"{workdir} holds no config.json: not an xlt run")
  with open(path) as f:
    c = experiments.with_kind(ml_collections.ConfigDict(json.load(f)))  # older runs' too
  if c.kind not in ("testbed", "testbed.regimes") or c.get("base_model"):
    raise ValueError(f"{workdir}: the structure measure reads testbed runs with xlt's own base "
                     f"(kind {c.kind!r}, base_model {c.get('base_model')!r})")
  prep = testbed.prepare(c, workdir)
  like = jax.eval_shape(lambda: model_lib.init_params(prep.cfg, jax.random.key(0)))
  n = len(prep.seeds)
  bases = _members(os.path.join(workdir, "base"), like, n, range(n))
  names = [r.name for r in prep.of("full")]
  k_task, k_lang = names.index("task expert"), names.index("language expert")
  ft, members = os.path.join(workdir, stage), len(names) * n  # recipe-major: recipe k, seed i at k * n + i
  tasks = _members(ft, like, members, [k_task * n + i for i in range(n)])
  langs = _members(ft, like, members, [k_lang * n + i for i in range(n)])
  return c, prep, list(zip(bases, tasks, langs))


def model_scores(cfg, task, sets: dict[str, list[str]], models: list[tuple], problems: int, batch: int) -> dict:
  """{model: {role: [score per seed]}}: the base and both experts on every role's sets (their
  first `problems` problems each), the denominators of the revert curve's retention."""
  names = [n for r in sets for n in sets[r]]
  eval_sets = {n: _subset(task.test[n], problems) for n in names}
  flat = [m for seed in models for m in seed]
  stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *flat)
  scored = ensemble_decode.score_members(cfg, stacked, task, eval_sets, [names] * len(flat), batch)
  out = {}
  for k, name in enumerate(("base", "task expert", "language expert")):
    out[name] = {r: [float(np.mean([scored[i * 3 + k][n]["exact_match"] for n in sets[r]])) for i in range(len(models))]
                 for r in sets}
  return out


def _mean(per_seed) -> list:
  return np.mean(np.asarray(per_seed, float), axis=0).tolist()


def measure(workdir: str, stage: str, problems: int = 200, seeds: int = 0) -> dict:
  """Every measure of the module docstring for a finished run (its first `seeds` seeds; 0:
  all), as means over seeds with the per-seed values."""
  c, prep, models = load_run(workdir, stage)
  models = models[:seeds] if seeds else models
  cfg, layers = prep.cfg, prep.cfg.num_layers
  bottom, top = zone(layers)
  out = {"workdir": workdir, "stage": stage, "num_layers": layers,
         "seeds": prep.seeds[:len(models)], "zone": {"bottom": bottom, "top": top}, "delta": {}, "edge_ratio": {}}
  for name, which in (("task expert", 1), ("language expert", 2)):
    per = [delta_by_block(m[which], m[0], layers) for m in models]
    out["delta"][name] = {"kinds": list(KINDS), "by_kind": _mean([d["by_kind"] for d in per]),
                          "by_block": _mean([d["by_block"] for d in per]),
                          "non_block": {k: float(np.mean([d["non_block"][k] for d in per])) for k in per[0]["non_block"]}}
    ratios = [edge_ratio(d["sq_by_block"], d["size_by_block"], bottom, top) for d in per]
    out["edge_ratio"][name] = {"mean": float(np.mean(ratios)), "values": ratios}
  swap = swap_curve(cfg, prep.task, prep.sets, [(m[1], m[2]) for m in models], problems, c.eval.batch_size)
  out["swap"] = {r: {"mean": _mean(v), "values": v} for r, v in swap.items()}
  revert = swap_curve(cfg, prep.task, prep.sets, [(m[1], m[0]) for m in models], problems, c.eval.batch_size,
                      roles=("task", "language"))
  out["revert"] = {r: {"mean": _mean(v), "values": v} for r, v in revert.items()}
  out["scores"] = model_scores(cfg, prep.task, prep.sets, models, problems, c.eval.batch_size)
  pairs = paired_prompts(prep.task, prep.sets, c.languages.source, c.languages.target)
  out["probe"] = {}
  for name, which in (("base", 0), ("task expert", 1), ("language expert", 2)):
    per = [probe_model(cfg, m[which], pairs) for m in models]
    out["probe"][name] = {k: {"mean": _mean([p[k] for p in per]), "values": [p[k] for p in per]}
                          for k in ("accuracy", "similarity")}
  if c.task == "arithmetic":
    per = [lens_model(cfg, m[0], prep.task, pairs, c.languages.source, c.languages.target) for m in models]
    out["lens"] = {"base": {f"{prompts} {k}": {"mean": _mean([p[prompts][k] for p in per]),
                                               "values": [p[prompts][k] for p in per]}
                            for prompts in ("target_prompts", "source_prompts") for k in ("share", "mass")}}
  return out


def plot(result: dict, path: str):
  """Panels by block: the experts' relative deltas, the swap curve, the language probe's
  accuracy, the cross-language similarity and (arithmetic) the base's script lens (the paper's
  swap zone shaded)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  layers, z = result["num_layers"], result["zone"]
  lens = result.get("lens", {}).get("base")
  fig, axes = plt.subplots(1, 5 if lens else 4, figsize=(21 if lens else 17, 3.6))
  blocks = np.arange(layers)
  for name, d in result["delta"].items():
    axes[0].plot(blocks, d["by_block"], marker="o", label=name)
  axes[0].set(title="relative delta per block", xlabel="block")
  for role, v in result["swap"].items():
    axes[1].plot(blocks, np.asarray(v["mean"]) * 100, marker="o", label=role)
  axes[1].set(title="task expert, block i from the language expert", xlabel="swapped block", ylabel="exact match %")
  for name, p in result["probe"].items():
    axes[2].plot(np.arange(layers + 1), np.asarray(p["accuracy"]["mean"]) * 100, marker="o", label=name)
    axes[3].plot(np.arange(layers + 1), p["similarity"]["mean"], marker="o", label=name)
  axes[2].set(title="language probe (held out)", xlabel="layer (0: embeddings)", ylabel="accuracy %")
  axes[3].set(title="cross-language similarity", xlabel="layer (0: embeddings)", ylabel="mean cosine")
  if lens:
    for prompts in ("target_prompts", "source_prompts"):
      axes[4].plot(np.arange(layers + 1), lens[f"{prompts} share"]["mean"], marker="o", label=prompts.replace("_", " "))
    axes[4].set(title="base's lens: source script's share", xlabel="layer (0: embeddings)", ylabel="share")
  for k, ax in enumerate(axes):
    shift = 0.5 if k >= 2 else 0.0  # layer l is the residual after block l - 1
    ax.axvspan(-0.5 + shift, z["bottom"] - 0.5 + shift, color="0.9", zorder=0)
    if z["top"]:
      ax.axvspan(layers - z["top"] - 0.5 + shift, layers - 0.5 + shift, color="0.9", zorder=0)
    ax.legend(fontsize=7)
  fig.suptitle(f"{os.path.basename(result['workdir'])} {result['stage']}: {layers} blocks, "
               f"{len(result['seeds'])} seeds (shaded: the paper's swap zone)")
  fig.tight_layout()
  with fileio.atomic_open(path) as f:
    fig.savefig(f, format="png", dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m xlt.structure", description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True, help="a finished testbed or regime-map run (a grid's point)")
  p.add_argument("--stage", default="", help="its fine-tune stage: finetune (default for a testbed run) or "
                 "finetune_r<i> (a regime map's regime i; default finetune_r0)")
  p.add_argument("--problems", type=int, default=200, help="problems per set in the swap curve")
  p.add_argument("--seeds", type=int, default=0, help="measure the first N seeds (0: all)")
  p.add_argument("--out", default="", help="JSON file (default <workdir>/structure_<stage>.json)")
  p.add_argument("--png", default="", help="figure (default <workdir>/structure_<stage>.png)")
  a = p.parse_args(argv)
  stage = a.stage or ("finetune" if os.path.isdir(os.path.join(a.workdir, "finetune")) else "finetune_r0")
  start = time.time()
  compile_cache.enable()
  try:
    result = measure(a.workdir, stage, a.problems, a.seeds)
  except (ValueError, OSError) as e:
    print(f"xlt.structure: {e}", file=sys.stderr)
    return 2
  result.update(command=" ".join(["python -m xlt.structure"] + list(argv if argv is not None else sys.argv[1:])),
                commit=report.git_commit(), machine=report.machine(), wall_s=round(time.time() - start, 1))
  out = a.out or os.path.join(a.workdir, f"structure_{stage}.json")
  results_lib.atomic_write(out, json.dumps(result, indent=1))
  plot(result, a.png or os.path.join(a.workdir, f"structure_{stage}.png"))
  e = result["edge_ratio"]
  print(f"{out}: edge ratio task expert {e['task expert']['mean']:.2f}, language expert "
        f"{e['language expert']['mean']:.2f} (1: even; > 1: at the paper's swap zone)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
