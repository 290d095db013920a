"""A Hugging Face config.json's sizes checked against its safetensors headers, before anything
is built from them: a model's shapes come from config.json, and a config that does not belong
to the weights beside it (a vocabulary of 10^12, a million layers of width 10^6) would
otherwise overflow or hang the shape computation instead of failing in one line.

`parameters(hf)` counts, in Python integers (no overflow) and without building anything, the
parameters the config describes: at least the embedding, the attention and the MLP weights
of every block (norms and biases, a few per mille, are left out, and embeddings counted once,
so it is a lower bound). `check(hf, tensors, path)` refuses a config whose count exceeds what
the headers hold. Both take well under a millisecond, whatever the sizes claim.
"""

from __future__ import annotations

import math

# a config may describe somewhat more than the files hold (a default head_dim the family
# overrides); a smaller mismatch is left to the loader, which names the tensor whose shape
# differs; over twice as much means it is not these weights' config
SLACK = 2
# model types whose MLP is one up and one down projection, no gate (xlt.families)
PLAIN_MLP = ("starcoder2",)
# the largest size field of any released decoder is ~10^6 (a vocabulary, a context)
MAX_FIELD = 1 << 31


def _size(hf: dict, key: str, default=None) -> int:
  value = hf.get(key, default)
  if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < MAX_FIELD:
    raise ValueError(f"config.json: {key} must be a positive integer below {MAX_FIELD:,}, got {value!r}")
  return value


def parameters(hf: dict) -> int:
  """A lower bound of the parameters config.json `hf` describes (module doc)."""
  if "n_embd" in hf or hf.get("model_type") == "gpt2":
    d, layers = _size(hf, "n_embd", 768), _size(hf, "n_layer", 12)
    mlp = _size(hf, "n_inner") if hf.get("n_inner") is not None else 4 * d
    return _size(hf, "vocab_size") * d + _size(hf, "n_positions", 1024) * d + layers * (4 * d * d + 2 * d * mlp)
  d, layers, heads = _size(hf, "hidden_size"), _size(hf, "num_hidden_layers"), _size(hf, "num_attention_heads")
  kv = _size(hf, "num_key_value_heads") if hf.get("num_key_value_heads") is not None else heads
  head_dim = _size(hf, "head_dim") if hf.get("head_dim") is not None else max(d // heads, 1)
  attention = 2 * d * heads * head_dim + 2 * d * kv * head_dim
  # gated MLPs (gate, up, down) have three matrices, StarCoder2's plain one (c_fc, c_proj) two
  mlp_matrices = 2 if hf.get("model_type") in PLAIN_MLP else 3
  return _size(hf, "vocab_size") * d + layers * (attention + mlp_matrices * d * _size(hf, "intermediate_size"))


def check(hf: dict, tensors: dict, path: str) -> int:
  """The parameters the safetensors headers hold (`tensors`: {name: anything with .shape}),
  after checking that config.json describes no more than that (one-line ValueError)."""
  held = sum(math.prod(int(n) for n in t.shape) for t in tensors.values())
  described = parameters(hf)
  if described > SLACK * held:
    raise ValueError(f"{path}/config.json describes at least {described:,} parameters, but its safetensors files "
                     f"hold {held:,}: the config does not belong to these weights")
  return held
