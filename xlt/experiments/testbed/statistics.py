"""The statistics the testbed's data-aware merges take, from each expert's own training data.

A merge in `merge.extra` (or `remerge --merge`) is data-aware when its registry function takes
statistics only Python can give (xlt.merge.data_aware, xlt.merge.localize):

  regmean               grams    each expert's Gram matrices of its attn / mlp kernels' inputs (the
                                 head takes the mean, as in the recorded results)
  fisher                fishers  each expert's diagonal Fisher
  localize_and_stitch   losses   with losses="data" in its spec: the mask search on each
                                 expert's loss (without it, the paper's data-free variant)

The testbed fills them (`fill`): expert t's statistics come from a sample of the very set it
was fine-tuned on (its recipe's data with the replay of the base's: testbed_plan.with_replay),
`c.merge.statistics.examples` examples drawn once per seed and expert without replacement; the
Gram matrices count the positions of the prompt, answer and EOS (not the padding), the Fisher
and the mask search's loss are training's loss (the answer tokens, `loss_mask`). One seed's
statistics are computed once and shared by its merges (`Statistics`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xlt import merge_statistics
from xlt import model as model_lib

# method -> the option the testbed fills; localize_and_stitch's only when its spec asks for data
OPTION = {"regmean": "grams", "fisher": "fishers", "localize_and_stitch": "losses"}
ALWAYS = ("regmean", "fisher")
FROM_DATA = "data"  # localize_and_stitch losses="data": the mask search on each expert's loss
DEFAULTS = {"examples": 512, "batch_size": 64, "loss_examples": 64}


def needs_data(method: str, options: dict) -> bool:
  """Whether the testbed fills this merge's statistics (module docstring)."""
  if method in ALWAYS:
    return True
  return method in OPTION and options.get(OPTION[method]) == FROM_DATA


def placeholder(method: str, options: dict, num_experts: int) -> dict:
  """`options` with the statistics the testbed will fill stood in for, so the registry's check
  of the call can run before anything is trained."""
  if not needs_data(method, options):
    return options
  return {**options, OPTION[method]: None if method == "localize_and_stitch" else [None] * num_experts}


def settings(c) -> dict:
  """`c.merge.statistics` over DEFAULTS, checked (positive integers)."""
  given = c.merge.get("statistics") or {}
  given = given.to_dict() if hasattr(given, "to_dict") else dict(given)
  if unknown := sorted(set(given) - set(DEFAULTS)):
    raise ValueError(f"merge.statistics has no field {', '.join(unknown)}; its fields: {', '.join(DEFAULTS)}")
  out = {**DEFAULTS, **given}
  for k, v in out.items():
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
      raise ValueError(f"merge.statistics.{k} must be a positive integer, got {v!r}")
  return out


# the positions up to each sequence's last target (prompt, answer and EOS), not the padding after
input_mask = merge_statistics.input_mask


def sample(encoded: dict, examples: int, seed) -> dict:
  """`examples` rows of an encoded set ({"tokens", "loss_mask"}) drawn without replacement by a
  generator seeded with `seed` (all of them, in order, when there are no more)."""
  n = len(encoded["tokens"])
  idx = np.arange(n) if examples >= n else np.sort(np.random.default_rng(seed).choice(n, examples, replace=False))
  return {k: np.asarray(encoded[k])[idx] for k in ("tokens", "loss_mask")}


class Statistics:
  """One seed's statistics of its experts (in the merges' expert order), each computed once.

  cfg: the model; data: per expert its sample ({"tokens", "loss_mask"}, `sample`)."""

  def __init__(self, cfg: model_lib.Config, data: list[dict], batch_size: int, loss_examples: int):
    self.cfg, self.data, self.batch_size, self.loss_examples = cfg, data, batch_size, loss_examples
    self._done = {}

  def _batches(self, t: int, mask) -> list[tuple]:
    tokens, b = self.data[t]["tokens"], self.batch_size
    return [(tokens[i:i + b], mask[i:i + b]) for i in range(0, len(tokens), b)]

  def grams(self, experts) -> list[dict]:
    if "grams" not in self._done:
      self._done["grams"] = [merge_statistics.grams(self.cfg, e, self._batches(t, input_mask(d["loss_mask"])),
                                                    head=False)
                             for t, (e, d) in enumerate(zip(experts, self.data))]
    return self._done["grams"]

  def fishers(self, experts) -> list:
    if "fishers" not in self._done:
      self._done["fishers"] = [merge_statistics.diagonal_fisher(self.cfg, e, self._batches(t, d["loss_mask"]))
                               for t, (e, d) in enumerate(zip(experts, self.data))]
    return self._done["fishers"]

  def losses(self) -> list:
    """Per expert its training loss on its first `loss_examples` sampled examples, a function
    of a parameter tree (jax-traceable: the mask search differentiates it)."""
    def loss_of(d):
      tokens = jnp.asarray(d["tokens"][:self.loss_examples], jnp.int32)
      mask = jnp.asarray(d["loss_mask"][:self.loss_examples], jnp.float32)

      def loss(params):
        logits, _ = model_lib.apply(self.cfg, params, tokens)
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)
      return loss
    return [loss_of(d) for d in self.data]

  def fill(self, method: str, options: dict, experts) -> dict:
    """`options` with the statistics `method` takes over `experts` (module docstring)."""
    if not needs_data(method, options):
      return options
    if len(experts) != len(self.data):
      raise ValueError(f"{method}: {len(experts)} experts but data for {len(self.data)}")
    value = {"grams": lambda: self.grams(experts), "fishers": lambda: self.fishers(experts),
             "losses": self.losses}[OPTION[method]]()
    return {**options, OPTION[method]: value}


def for_seed(c, prep, expert_recipes, seed_index: int) -> Statistics:
  """The Statistics of seed `seed_index` for the experts trained by `expert_recipes` (Recipe,
  in the merges' order): each a sample of its recipe's training sets (prep.data)."""
  s = settings(c)
  data = []
  for k, r in enumerate(expert_recipes):
    sets = [prep.data[d] for d, _ in r.phases]
    encoded = {key: np.concatenate([np.asarray(x[key]) for x in sets]) for key in ("tokens", "loss_mask")}
    data.append(sample(encoded, s["examples"], [int(c.arithmetic.seed), int(prep.seeds[seed_index]), k]))
  return Statistics(prep.cfg, data, s["batch_size"], s["loss_examples"])
