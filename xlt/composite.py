"""Composite parameters: what an ensemble member trains when it is more than the model's own
tree, behind one set of functions over pytrees. The train step, its shardings and the loop
go through these and never ask which kind they hold.

  plain    the model's parameters: the loss runs them, the optimizer trains them whole.
  LoRA     {"base", "lora"} (xlt.lora): the loss runs the adapter forward; only the adapters
           train, the base and the scale stay bit for bit.
  neurons  {"params", "neuron_mask"} (xlt.neurons): the loss runs the params; the optimizer
           trains them and gets the mask (`neurons.masked`).

Each composite kind is a module with the same functions (`is_composite`, `apply`, `split`,
`update_args`, `shardings`, `base`, `merged`), which keep the kind's specifics; a new kind is
one more module in `KINDS`.
"""

from __future__ import annotations

from types import ModuleType

from xlt import lora as lora_lib
from xlt import model as model_lib
from xlt import neurons as neurons_lib

KINDS: tuple[ModuleType, ...] = (lora_lib, neurons_lib)


def _kind(params) -> ModuleType | None:
  """The module of `params`'s composite kind; None for plain parameters."""
  return next((k for k in KINDS if k.is_composite(params)), None)


def is_composite(params) -> bool:
  """Whether `params` (one model's tree, or stacked, or abstract) is a composite of any kind."""
  return _kind(params) is not None


def apply(cfg: model_lib.Config, params, tokens_BxT, dropout_rng=None):
  """`model.apply` of what `params` computes: plain params as they are, a composite by its
  kind's forward (LoRA's adapter forward, a neuron composite's params)."""
  kind = _kind(params)
  if kind is None:
    return model_lib.apply(cfg, params, tokens_BxT, dropout_rng=dropout_rng)
  return kind.apply(cfg, params, tokens_BxT, dropout_rng=dropout_rng)


def split(params):
  """(what the optimizer trains, rebuild: trained -> params of `params`'s structure, extra
  keyword arguments of the optimizer's update). The train step differentiates and updates only
  the trained part, so whatever a composite keeps out of it gets no gradient, no optimizer
  state and no update. Plain params train whole, with no extra arguments."""
  kind = _kind(params)
  if kind is None:
    return params, lambda trained: trained, {}
  trained, rebuild = kind.split(params)
  return trained, rebuild, kind.update_args(params)


def shardings(abstract_params, param_shardings, replicated):
  """Shardings of `abstract_params` (plain or composite) from `param_shardings`, those of the
  model's own tree, and `replicated`: each kind places its extra leaves."""
  kind = _kind(abstract_params)
  return param_shardings if kind is None else kind.shardings(abstract_params, param_shardings, replicated)


def base(params):
  """The part of `params` shaped like the model's tree (plain params are all of it): what must
  match a model config."""
  kind = _kind(params)
  return params if kind is None else kind.base(params)


def merged(params):
  """One model's plain parameters computing what `params` computes (LoRA merged into its base,
  a neuron composite's params): for decoding, saving or merging."""
  kind = _kind(params)
  return params if kind is None else kind.merged(params)
