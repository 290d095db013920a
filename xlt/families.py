"""The Hugging Face model families xlt reads and writes: one record each.

A `Family` holds everything that differs between families: its model_type and architecture
(what config.json names), its config.json mapped onto model.Config and back, its weight table
(the Hugging Face tensor(s) behind each xlt leaf, and their layout), and how a bare model.Config
is recognised as one of its models. xlt.pretrained's load and save, the fixture maker and the
tests iterate over FAMILIES. What each family computes, and so which model.Config options it
maps to: docs/families.md; adding one: docs/extending.md.

FAMILIES is in detection order: `detect` is asked most specific family first, and llama,
the plain RoPE decoder, takes whatever is left.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from xlt import model

_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
_LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class Map:
  """Hugging Face tensor(s) `names` behind one xlt leaf. layout: "copy" (same shape),
  "linear" (torch's Linear [out, in]) or "conv" (GPT-2's Conv1D [in, out]), each side the
  xlt leaf's `num_in` input axes flattened and its other axes flattened: an xlt "weight"
  ([out..., in...]) holds a Linear as stored, a "kernel" ([in..., out...]) a Conv1D
  (xlt.model.Config.dense_layout); num_in 0 flattens a bias. With several names they stack
  along xlt's axis `stack`."""
  names: tuple[str, ...]
  layout: str = "copy"
  num_in: int = 1
  stack: int | None = None


@dataclasses.dataclass(frozen=True)
class Family:
  """One Hugging Face model family, as xlt maps it onto its decoder (xlt.model)."""
  name: str  # config.json's model_type
  architecture: str  # config.json's architectures: the transformers class that loads it
  # (config.json, dtype, tie_embeddings) -> model.Config; ValueError for what xlt cannot compute
  from_hf: Callable[[dict, str, bool], model.Config]
  # model.Config -> the config.json entries that decide the computation (besides vocab_size,
  # tie_word_embeddings and dtype, which every family writes alike)
  to_hf: Callable[[model.Config], dict]
  # model.Config -> {xlt path: Map}: a superset of the leaves of every model of the family
  table: Callable[[model.Config], dict]
  # does a bare model.Config (no config.json) describe one of this family's models?
  detect: Callable[[model.Config], bool]
  tied: bool = False  # tie_word_embeddings' default when config.json does not say


# ---- config.json -> model.Config


def rope(hf: dict) -> tuple[float, dict]:
  """(rope_theta, llama3 scaling or {}) from transformers 5's rope_parameters or 4's
  rope_theta + rope_scaling (whose rope_type may be spelt `type`)."""
  params = hf.get("rope_parameters") or {}
  theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
  scaling = params if params.get("rope_type", "default") != "default" else (hf.get("rope_scaling") or {})
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "default":
    return theta, {}
  if kind != "llama3":
    raise ValueError(f"rope_type {kind!r} is not supported: xlt.pretrained knows default and llama3")
  return theta, {"rope_type": "llama3", **{k: scaling[k] for k in _LLAMA3}}


# Sliding windows, as transformers applies them: (window, the layers it applies to, None = all)


def _no_window(hf: dict, layers: int) -> tuple[int, tuple[int, ...] | None]:
  return 0, None


def _every_layer_window(hf: dict, layers: int) -> tuple[int, tuple[int, ...] | None]:
  """Mistral: every layer, whatever layer_types says."""
  window = hf.get("sliding_window") or 0
  return (window, None) if window else (0, None)


def _typed_window(default_local: Callable[[dict, int], tuple[int, ...]], switch: str | None = None):
  """The layers layer_types marks "sliding_attention", else `default_local(hf, layers)`; none
  without a window (or with config.json's `switch` entry off)."""
  def window_of(hf: dict, layers: int) -> tuple[int, tuple[int, ...] | None]:
    window = hf.get("sliding_window") or 0
    if not window or (switch and not hf.get(switch)):
      return 0, None
    types = hf.get("layer_types")
    local = (tuple(i for i, t in enumerate(types) if t == "sliding_attention") if types
             else default_local(hf, layers))
    return (window, local) if local else (0, None)
  return window_of


# Qwen: the layers from max_window_layers on; Gemma 2: the even layers
_qwen_window = _typed_window(lambda hf, n: tuple(range(hf.get("max_window_layers", n), n)), "use_sliding_window")
_gemma2_window = _typed_window(lambda hf, n: tuple(range(0, n, 2)))


def _decoder_config(hf: dict, dtype: str, tied: bool, *, family: str, head_dim: int | None = None,
                    act_key: str | None = None, mlp_bias: bool = False, window=_no_window, **options) -> model.Config:
  """The model.Config of a RoPE decoder's config.json. act_key: an entry read before
  hidden_act (Gemma 2's hidden_activation); mlp_bias: mlp_bias may be on, with attention_bias
  (Llama); window: the family's sliding-window rule; options: model.Config fields the family
  fixes (norm, qkv_bias, ...), or takes from config.json itself."""
  heads, d, layers = hf["num_attention_heads"], hf["hidden_size"], hf["num_hidden_layers"]
  act = (hf.get(act_key) if act_key else None) or hf.get("hidden_act")
  if act not in ("silu",) + _TANH_GELU:
    raise ValueError(f"{family} hidden activation {act!r} is not supported: xlt knows silu and tanh-GELU")
  attn_bias, has_mlp_bias = bool(hf.get("attention_bias")), bool(hf.get("mlp_bias"))
  if attn_bias != (has_mlp_bias if mlp_bias else False):
    raise ValueError(f"{family} with attention_bias={attn_bias} and mlp_bias={has_mlp_bias} is not supported: "
                     "xlt's dense layers have biases all or none (besides q/k/v)")
  theta, scaling = rope(hf)
  sliding_window, local = window(hf, layers)
  fields = dict(norm="rmsnorm", qkv_bias=None, qk_norm=False, post_norms=False, embed_scale=False,
                attn_logit_softcap=None, final_logit_softcap=None, query_pre_attn_scalar=None) | options
  return model.Config(
      vocab_size=hf["vocab_size"], block_size=hf.get("max_position_embeddings", 2048), num_layers=layers,
      num_heads=heads, d_model=d, mlp_dim=hf["intermediate_size"], num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or head_dim or d // heads, tie_embeddings=tied,
      dtype=dtype, param_dtype=dtype, ln_eps=float(hf.get("rms_norm_eps", 1e-6)), pos_embedding="rope",
      rope_base=theta, rope_scaling=scaling, mlp="swiglu" if act == "silu" else "geglu", bias=attn_bias,
      sliding_window=sliding_window, sliding_layers=local, dense_layout="weight", **fields)


def _gemma2_config(hf: dict, dtype: str, tied: bool) -> model.Config:
  return _decoder_config(
      hf, dtype, tied, family="gemma2", head_dim=256, act_key="hidden_activation", window=_gemma2_window,
      norm="rmsnorm_plus_one", embed_scale=True, post_norms=True,
      attn_logit_softcap=hf.get("attn_logit_softcapping"), final_logit_softcap=hf.get("final_logit_softcapping"),
      query_pre_attn_scalar=hf.get("query_pre_attn_scalar"))


def _gpt2_config(hf: dict, dtype: str, tied: bool) -> model.Config:
  act = hf.get("activation_function", "gelu_new")
  if act not in _TANH_GELU or hf.get("scale_attn_by_inverse_layer_idx") or not hf.get("scale_attn_weights", True):
    raise ValueError(f"gpt2 with activation_function={act!r}, scale_attn_by_inverse_layer_idx="
                     f"{hf.get('scale_attn_by_inverse_layer_idx')}, scale_attn_weights="
                     f"{hf.get('scale_attn_weights', True)} is not supported (xlt: tanh-GELU, head_dim ** -0.5)")
  d = hf["n_embd"]
  return model.Config(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], num_layers=hf["n_layer"],
                      num_heads=hf["n_head"], d_model=d, mlp_dim=hf.get("n_inner") or 4 * d, tie_embeddings=tied,
                      dtype=dtype, param_dtype=dtype, ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)))


def _starcoder2_config(hf: dict, dtype: str, tied: bool) -> model.Config:
  """StarCoder2: GPT-2's block (LayerNorm with bias, fc -> GELU -> proj) with RoPE, grouped
  key/value heads and Mistral's window; `use_bias` switches every dense bias."""
  act = hf.get("hidden_act", "gelu_pytorch_tanh")
  if act not in _TANH_GELU:
    raise ValueError(f"starcoder2 hidden activation {act!r} is not supported: xlt knows tanh-GELU")
  heads, d, layers = hf["num_attention_heads"], hf["hidden_size"], hf["num_hidden_layers"]
  theta, scaling = rope(hf)
  sliding_window, local = _every_layer_window(hf, layers)
  return model.Config(
      vocab_size=hf["vocab_size"], block_size=hf.get("max_position_embeddings", 4096), num_layers=layers,
      num_heads=heads, d_model=d, mlp_dim=hf["intermediate_size"], num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or d // heads, tie_embeddings=tied, dtype=dtype, param_dtype=dtype,
      ln_eps=float(hf.get("norm_epsilon", 1e-5)), pos_embedding="rope", rope_base=theta, rope_scaling=scaling,
      norm="layernorm", mlp="gelu", bias=bool(hf.get("use_bias", True)), sliding_window=sliding_window,
      sliding_layers=local, dense_layout="weight")


# ---- model.Config -> config.json


def _decoder_to_hf(cfg: model.Config) -> dict:
  """The entries every RoPE decoder writes. RoPE settings in both spellings, 5.x's
  rope_parameters and 4.x's rope_theta + rope_scaling: each version ignores the other's."""
  scaling = dict(cfg.rope_scaling)
  return dict(hidden_size=cfg.d_model, intermediate_size=cfg.mlp_width, num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_width,
              max_position_embeddings=cfg.block_size, rms_norm_eps=cfg.ln_eps,
              hidden_act="silu" if cfg.mlp == "swiglu" else "gelu_pytorch_tanh",
              rope_theta=cfg.rope_base, rope_scaling=scaling or None,
              rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base} | scaling)


def _layer_types(cfg: model.Config) -> dict:
  return dict(sliding_window=cfg.sliding_window or None, layer_types=[
      "sliding_attention" if cfg.window(i) else "full_attention" for i in range(cfg.num_layers)])


def _llama_to_hf(cfg):
  return _decoder_to_hf(cfg) | dict(attention_bias=cfg.bias, mlp_bias=cfg.bias)


def _mistral_to_hf(cfg):
  return _decoder_to_hf(cfg) | dict(sliding_window=cfg.sliding_window or None)


def _qwen_to_hf(cfg, attention_bias: bool):
  out = _decoder_to_hf(cfg) | (dict(attention_bias=cfg.bias) if attention_bias else {})
  return out | dict(use_sliding_window=bool(cfg.sliding_window)) | _layer_types(cfg)


def _gemma_to_hf(cfg):
  return _decoder_to_hf(cfg) | dict(attention_bias=cfg.bias)


def _gemma2_to_hf(cfg):
  out = _gemma_to_hf(cfg)
  return out | dict(hidden_activation=out["hidden_act"], query_pre_attn_scalar=cfg.query_pre_attn_scalar,
                    attn_logit_softcapping=cfg.attn_logit_softcap,
                    final_logit_softcapping=cfg.final_logit_softcap) | _layer_types(cfg)


def _starcoder2_to_hf(cfg):
  out = {k: v for k, v in _decoder_to_hf(cfg).items() if k != "rms_norm_eps"}
  return out | dict(norm_epsilon=cfg.ln_eps, use_bias=cfg.bias, sliding_window=cfg.sliding_window or None)


def _gpt2_to_hf(cfg):
  return dict(n_embd=cfg.d_model, n_head=cfg.num_heads, n_layer=cfg.num_layers, n_positions=cfg.block_size,
              n_inner=cfg.mlp_width, layer_norm_epsilon=cfg.ln_eps, activation_function="gelu_new",
              scale_attn_by_inverse_layer_idx=False, scale_attn_weights=True)


# ---- the weight tables: {xlt path: Map}

_NORMS = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm"}
_GEMMA2_NORMS = {"ln_1": "input_layernorm", "ln_1_post": "post_attention_layernorm",
                 "ln_2": "pre_feedforward_layernorm", "ln_2_post": "post_feedforward_layernorm"}


def _decoder_table(cfg: model.Config, norms: dict = _NORMS) -> dict:
  """Llama's names, which Mistral, Qwen and Gemma share: q, k, v, o, gate, up, down
  projections, with every bias and norm any of them has (a model uses those it has)."""
  w = cfg.dense_layout  # the dense leaves' name
  t = {("wte", "embedding"): Map(("model.embed_tokens.weight",)), ("ln_f", "scale"): Map(("model.norm.weight",)),
       ("lm_head", w): Map(("lm_head.weight",), "linear")}
  for i in range(cfg.num_layers):
    b, p = f"block_{i}", f"model.layers.{i}."
    t |= {(b, ln, "scale"): Map((f"{p}{hf}.weight",)) for ln, hf in norms.items()}
    for x in "qkv":
      t[(b, "attn", x, w)] = Map((f"{p}self_attn.{x}_proj.weight",), "linear")
      t[(b, "attn", x, "bias")] = Map((f"{p}self_attn.{x}_proj.bias",), num_in=0)
    # the fused qkv [D, 3, H, K] of a kernel model with as many key/value heads as query heads
    t[(b, "attn", "qkv", "kernel")] = Map(tuple(f"{p}self_attn.{x}_proj.weight" for x in "qkv"), "linear", stack=1)
    t[(b, "attn", "qkv", "bias")] = Map(tuple(f"{p}self_attn.{x}_proj.bias" for x in "qkv"), num_in=0, stack=0)
    t[(b, "attn", "proj", w)] = Map((f"{p}self_attn.o_proj.weight",), "linear", num_in=2)
    t[(b, "attn", "proj", "bias")] = Map((f"{p}self_attn.o_proj.bias",), num_in=0)
    t |= {(b, "attn", f"{x}_norm", "scale"): Map((f"{p}self_attn.{x}_norm.weight",)) for x in "qk"}
    for x, hf in (("gate", "gate_proj"), ("up", "up_proj"), ("proj", "down_proj")):
      t[(b, "mlp", x, w)] = Map((f"{p}mlp.{hf}.weight",), "linear")
      t[(b, "mlp", x, "bias")] = Map((f"{p}mlp.{hf}.bias",), num_in=0)
  return t


def _starcoder2_table(cfg: model.Config) -> dict:
  """Llama's attention names; LayerNorms with biases; GPT-2's MLP as Linear layers c_fc, c_proj."""
  t = _decoder_table(cfg) | {("ln_f", "bias"): Map(("model.norm.bias",))}
  for i in range(cfg.num_layers):
    b, p = f"block_{i}", f"model.layers.{i}."
    t |= {(b, ln, "bias"): Map((f"{p}{hf}.bias",)) for ln, hf in _NORMS.items()}
    for x, hf in (("fc", "c_fc"), ("proj", "c_proj")):
      t[(b, "mlp", x, cfg.dense_layout)] = Map((f"{p}mlp.{hf}.weight",), "linear")
      t[(b, "mlp", x, "bias")] = Map((f"{p}mlp.{hf}.bias",), num_in=0)
  return t


def _gpt2_table(cfg: model.Config) -> dict:
  t = {("wte", "embedding"): Map(("transformer.wte.weight",)), ("wpe",): Map(("transformer.wpe.weight",)),
       ("ln_f", "scale"): Map(("transformer.ln_f.weight",)), ("ln_f", "bias"): Map(("transformer.ln_f.bias",)),
       ("lm_head", cfg.dense_layout): Map(("lm_head.weight",), "linear")}
  for i in range(cfg.num_layers):
    b, p = f"block_{i}", f"transformer.h.{i}."
    for ln in ("ln_1", "ln_2"):
      t |= {(b, ln, "scale"): Map((f"{p}{ln}.weight",)), (b, ln, "bias"): Map((f"{p}{ln}.bias",))}
    # c_attn's 3 * D columns are [q | k | v], each [H, K]: xlt's [3, H, K] as it is
    for mod, x, hf, num_in in (("attn", "qkv", "attn.c_attn", 1), ("attn", "proj", "attn.c_proj", 2),
                               ("mlp", "fc", "mlp.c_fc", 1), ("mlp", "proj", "mlp.c_proj", 1)):
      t[(b, mod, x, cfg.dense_layout)] = Map((f"{p}{hf}.weight",), "conv", num_in)
      t[(b, mod, x, "bias")] = Map((f"{p}{hf}.bias",), num_in=0)
  return t


# ---- the records, most specific first (the order `detect` is asked in)


def _gemma2_like(cfg: model.Config) -> bool:
  return bool(cfg.post_norms or cfg.attn_logit_softcap or cfg.final_logit_softcap or cfg.query_pre_attn_scalar)


_decoder = _decoder_config
FAMILIES: tuple[Family, ...] = (
    Family("gpt2", "GPT2LMHeadModel", _gpt2_config, _gpt2_to_hf, _gpt2_table,
           detect=lambda cfg: cfg.pos_embedding == "learned", tied=True),
    Family("starcoder2", "Starcoder2ForCausalLM", _starcoder2_config, _starcoder2_to_hf, _starcoder2_table,
           detect=lambda cfg: cfg.norm == "layernorm", tied=True),
    Family("gemma2", "Gemma2ForCausalLM", _gemma2_config, _gemma2_to_hf,
           functools.partial(_decoder_table, norms=_GEMMA2_NORMS), detect=_gemma2_like, tied=True),
    Family("gemma", "GemmaForCausalLM",
           functools.partial(_decoder, family="gemma", head_dim=256, norm="rmsnorm_plus_one", embed_scale=True),
           _gemma_to_hf, _decoder_table, detect=lambda cfg: cfg.norm == "rmsnorm_plus_one", tied=True),
    Family("qwen3", "Qwen3ForCausalLM", functools.partial(_decoder, family="qwen3", head_dim=128, qk_norm=True,
                                                          window=_qwen_window),
           functools.partial(_qwen_to_hf, attention_bias=True), _decoder_table, detect=lambda cfg: cfg.qk_norm),
    Family("qwen2", "Qwen2ForCausalLM", functools.partial(_decoder, family="qwen2", qkv_bias=True, window=_qwen_window),
           functools.partial(_qwen_to_hf, attention_bias=False), _decoder_table,
           detect=lambda cfg: bool(cfg.qkv_bias and not cfg.bias)),
    Family("mistral", "MistralForCausalLM", functools.partial(_decoder, family="mistral", window=_every_layer_window),
           _mistral_to_hf, _decoder_table, detect=lambda cfg: bool(cfg.sliding_window and cfg.sliding_layers is None)),
    Family("llama", "LlamaForCausalLM", functools.partial(_decoder, family="llama", mlp_bias=True), _llama_to_hf,
           _decoder_table, detect=lambda cfg: True),
)
BY_NAME = {f.name: f for f in FAMILIES}
BY_ARCHITECTURE = {f.architecture: f for f in FAMILIES}


def of_config_json(hf: dict) -> Family:
  """The family of a config.json: its model_type, else its architecture."""
  archs = hf.get("architectures") or []
  family = BY_NAME.get(hf.get("model_type")) or next((BY_ARCHITECTURE[a] for a in archs if a in BY_ARCHITECTURE), None)
  if family is None or (archs and not any(a in BY_ARCHITECTURE for a in archs)):
    raise ValueError(f"unknown model_type {hf.get('model_type')!r} / architectures {archs}: xlt.pretrained knows "
                     f"{', '.join(f'{f.name} ({f.architecture})' for f in FAMILIES)}")
  return family


def of_config(cfg: model.Config) -> Family:
  """The family whose config.json describes `cfg`, for a model with no Hugging Face config."""
  return next(f for f in FAMILIES if f.detect(cfg))
