"""MAET, Multi-lingual Ability Extraction and Transfer (Chen et al., "Extracting and
transferring abilities for building multi-lingual ability-enhanced large language
models", equations 1-5), as a merge of models that are already trained.

The models, all trained from one `base`:
  ability_model          Theta_{A,L0}: trained on ability (task) data in the source
                         language L0 (e.g. English math);
  source_language_model  Theta_{L0}: trained on general (non-task) data in L0;
  target_language_models one per target language L_i, trained on general data in L_i;
                         their deltas are R(L_i) = target_i - base.

  1. key neurons (eq. 1): a neuron's importance is the L2 norm of its row of the delta
     (rows: `naming.rows`, output units); all rows of the model are ranked together and
     the top `key_ratio` kept: N_A from the ability model's delta, N_L0 from the source
     language model's.
  2. ability weight (eq. 2): R(A) = alpha * Delta_{A,L0} - beta * Delta_{L0}, the second
     term removing what general training in L0 changes.
  3. multilingual weight (eq. 3): R_Lang = sum_i mu_i R(L_i).
  4. tensor selection (eq. 4): per tensor tau, V(tau) = sim(R(A)[tau], R_Lang[tau]);
     ranked descending, the last `tensor_ratio` (the least language-like) form T.
  5. merge (eq. 5): tau = tau_base + gamma R(A)[tau] + eta R_Lang[tau] for tau in T,
     tau_base + R_Lang[tau] otherwise.

The paper's settings (Table 5): alpha 0.8, beta 0.2, key neurons 5%, gamma 0.2, eta 1.0;
tensors 80% for math, 60% for science.

Where this differs from the paper, or the paper leaves a choice:
  * MAET *trains* Theta_{A,L0} on the neurons N_A u N_L0 only and Theta_{L0} on N_L0
    only, with N_A, N_L0 located by short extra trainings. Here the models are trained
    fully, so the neurons are located on their own deltas and the deltas are restricted
    to them: Delta_{A,L0} to N_A u N_L0, Delta_{L0} to N_L0 (key_ratio=1 turns this off).
    Target-language deltas are used whole.
  * Eq. 4's text says "cosine similarity" and then "we use the dot product"; the default
    here is cosine, because a dot product grows with a tensor's size and norm, so the
    ranking would sort tensors by size more than by direction. similarity="dot" gives
    the other reading. A tensor where either weight is zero has cosine 0.
  * Every leaf is a tensor for eq. 4 (biases, norms and embeddings included).
  * Ties in the rankings: rows tied with the last key row are all kept; tensors of equal
    similarity keep tree order, so the later one counts as less language-like.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xlt.merge import core, declare
from xlt.param_paths import XLT, Naming, path_str

SIMILARITIES = ("cosine", "dot")


def key_rows(model, base, key_ratio: float, *, naming: Naming = XLT) -> dict:
  """{path: bool per row}: the top `key_ratio` of all the model's rows (neurons) by the
  L2 norm of their change from the base (MAET eq. 1: importance ~ ||theta~_j - theta_j||)."""
  core.check_compatible([model, base], ["model", "base"])
  paths, norms = [], []
  for (p, x), (_, b) in zip(core.leaves_with_paths(model), core.leaves_with_paths(base)):
    rows = naming.rows(p, core.as_compute(x) - core.as_compute(b))
    paths.append(p)
    norms.append(np.sqrt(np.sum(np.square(rows, dtype=np.float64), axis=1)))
  keep = core.top_fraction_mask(np.concatenate(norms), key_ratio) if norms else np.zeros(0, bool)
  cuts = np.cumsum([len(n) for n in norms])[:-1]
  return dict(zip(paths, np.split(keep, cuts)))


def tensor_similarity(a, b, similarity: str = "cosine") -> float:
  """sim(a, b) of MAET eq. 4: the cosine of the two flattened tensors (0 when either is
  zero) or their dot product."""
  a, b = np.ravel(a), np.ravel(b)
  dot = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
  if similarity == "dot":
    return dot
  norms = float(np.linalg.norm(a.astype(np.float64)) * np.linalg.norm(b.astype(np.float64)))
  return dot / norms if norms > 0 else 0.0


# the registry's merges return one tree (hidden return_info): call maet itself for the info
@declare.method("maet", ("base", "ability_model", "source_language_model", "target_language_models+"),
                paper="Chen et al. 2024, MAET: Extracting and Transferring Abilities for Building Multi-lingual "
                "Ability-enhanced Large Language Models", trees=("ability_neurons", "source_neurons"),
                hidden=("return_info",), layer_aware=True)
def maet(base, ability_model, source_language_model, target_language_models, *,
         alpha: float = 0.8, beta: float = 0.2, mu: float | Sequence[float] | None = None,
         key_ratio: float = 0.05, tensor_ratio: float = 0.8, gamma: float = 0.2, eta: float = 1.0,
         similarity: str = "cosine", ability_neurons=None, source_neurons=None,
         return_info: bool = False, naming: Naming = XLT):
  """The MAET merge: base + the ability weight on the least language-like tensors + the
  multilingual weight everywhere (eqs. 1-5 of the module docstring).

  Args:
    base: the model all others were trained from (Theta_o).
    ability_model: base trained on ability data in the source language (Theta_{A,L0}).
    source_language_model: base trained on general source-language data (Theta_{L0}).
    target_language_models: a non-empty list, base trained on general data in each
      target language.
    alpha: scale of the ability model's delta in R(A) (eq. 2; paper 0.8).
    beta: scale of the subtracted source-language delta in R(A) (eq. 2; paper 0.2).
    mu: weight of each target language's delta in R_Lang (eq. 3): one float for all or
      one per target; None = 1 each.
    key_ratio: in (0, 1], the fraction of all rows (neurons) kept as key neurons (eq. 1;
      paper 5%); 1.0 uses the deltas whole.
    tensor_ratio: in [0, 1], the fraction of tensors that receive the ability weight:
      the least similar to R_Lang (eq. 4; paper 80% math, 60% science).
    gamma: scale of R(A) on the selected tensors (eq. 5; paper 0.2).
    eta: scale of R_Lang on the selected tensors (eq. 5; paper 1.0); the other tensors
      always receive R_Lang at scale 1.
    similarity: "cosine" or "dot" (eq. 4; see the module docstring).
    ability_neurons, source_neurons: neuron mask trees (`core.leaf_mask`: per tensor, per
      row or per entry) for N_A and N_L0, e.g. the masks the models were *trained* on
      (xlt.neurons, MAET's extraction stage); each given one replaces locating that set on
      the model's own delta (then key_ratio does not apply to it).
    return_info: also return {"selected": paths in T, "ranking": all paths, most
      language-like first, "similarity": {path: V}, "key_rows": counts}.
    naming: how rows are laid out in each tensor (`naming.XLT` for xlt.model).
  """
  targets = core.expert_list(target_language_models, "target_language_models")
  trees = [base, ability_model, source_language_model, *targets]
  _check_arguments(trees, key_ratio, tensor_ratio, similarity)
  mu = core.per_expert(1.0 if mu is None else mu, len(targets), "MAET mu")
  # Deltas are recomputed leaf by leaf in each pass (key rows, eq. 4, eq. 5), so no
  # whole-model delta is held: memory stays at the inputs plus one leaf's work.
  keep_ability = _key_neurons(ability_model, base, key_ratio, ability_neurons, naming)
  keep_source = _key_neurons(source_language_model, base, key_ratio, source_neurons, naming)
  weights = _leaf_weights(keep_ability, keep_source, alpha, beta, mu, naming)
  sims, ranking, selected = _select_tensors(trees, weights, tensor_ratio, similarity)

  def merge(path, b, *rest):  # eq. 5
    r_ability, r_lang = weights(path, b, *rest)
    b = core.as_compute(b)
    if path in selected:
      return b + gamma * r_ability + eta * r_lang
    return b + r_lang

  merged = core.map_leaves(merge, *trees)
  if not return_info:
    return merged
  return merged, _info(sims, ranking, selected, keep_ability, keep_source)


def _check_arguments(trees, key_ratio, tensor_ratio, similarity):
  core.check_compatible(trees, ["base", "ability model", "source language model",
                                *[f"target language model {i}" for i in range(len(trees) - 3)]])
  core.check_range("MAET key_ratio", key_ratio, 0.0, 1.0, low_open=True)
  core.check_range("MAET tensor_ratio", tensor_ratio, 0.0, 1.0)
  if similarity not in SIMILARITIES:
    raise ValueError(f"MAET similarity must be one of {SIMILARITIES}, got {similarity!r}")


def _key_neurons(model, base, key_ratio, neurons, naming) -> dict:
  """Eq. 1: {path: kept rows} located on the model's delta, or the given neuron masks."""
  if neurons is None:
    return key_rows(model, base, key_ratio, naming=naming)
  return core.masked_leaves(neurons, base)


def _leaf_weights(keep_ability, keep_source, alpha, beta, mu, naming):
  """The function (path, base, ability, source, *targets) -> (R(A), R_Lang) of one leaf:
  eqs. 2 and 3, the ability delta on N_A u N_L0 and the source delta on N_L0."""

  def weights(path, b, ability, source, *target_leaves):
    b = core.as_compute(b)
    shape = b.shape
    in_source = core.leaf_mask(path, keep_source[path], shape, naming)
    in_ability = core.leaf_mask(path, keep_ability[path], shape, naming) | in_source
    r_ability = (alpha * np.where(in_ability, core.as_compute(ability) - b, 0)
                 - beta * np.where(in_source, core.as_compute(source) - b, 0))
    r_lang = sum(m * (core.as_compute(t) - b) for m, t in zip(mu, target_leaves))
    return r_ability.astype(b.dtype), np.asarray(r_lang, b.dtype)

  return weights


def _select_tensors(trees, weights, tensor_ratio, similarity):
  """Eq. 4: ({path: V}, paths most language-like first, the set T of the last
  `tensor_ratio` of them)."""
  sims = {}
  for p, leaves in zip(*_leaves_by_path(trees)):
    sims[p] = tensor_similarity(*weights(p, *leaves), similarity)
  paths = list(sims)
  ranking = [paths[i] for i in np.argsort([-sims[p] for p in paths], kind="stable")]
  num_selected = core.fraction_count(tensor_ratio, len(paths))
  return sims, ranking, set(ranking[len(ranking) - num_selected:])


def _info(sims, ranking, selected, keep_ability, keep_source) -> dict:
  """maet's return_info dict: key rows are counted in rows when located here, in entries
  when given as masks."""
  return {"selected": [path_str(p) for p in sims if p in selected],
          "ranking": [path_str(p) for p in ranking],
          "similarity": {path_str(p): v for p, v in sims.items()},
          "key_rows": {"ability": int(sum(np.sum(k) for k in keep_ability.values())),
                       "source_language": int(sum(np.sum(k) for k in keep_source.values())),
                       "total": int(sum(np.size(k) for k in keep_ability.values()))}}


def _leaves_by_path(trees):
  """(paths, per path the tuple of that leaf in every tree), trees of one structure."""
  flat = [core.leaves_with_paths(t) for t in trees]
  paths = [p for p, _ in flat[0]]
  return paths, [tuple(f[i][1] for f in flat) for i in range(len(paths))]
