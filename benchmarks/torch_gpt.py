"""xlt's GPT in plain PyTorch eager: the reference that benchmarks/compare.py times xlt against.

  pip install -e '.[bench]'                      # torch is an optional extra, never an xlt dependency
  python -m pytest tests/test_torch_gpt.py       # checks it computes what xlt computes

The same model as xlt.model.GPT, module for module: token embedding, learned positions
(`wpe`) or RoPE (GPT-NeoX half split, as xlt.model.rope), pre-LayerNorm blocks (eps 1e-5)
of one fused qkv projection with bias, causal softmax attention
(`scaled_dot_product_attention`), output projection, GELU MLP (tanh approximation: flax's
`nn.gelu` default) of width mlp_ratio x D; final LayerNorm, untied lm_head without bias.
Training is xlt.train's: mean masked next-token cross-entropy, global-norm clipping,
AdamW (b1 0.9, b2 0.95, eps 1e-8) with weight decay on the parameters xlt decays.
`greedy_decode` is xlt.ensemble_decode.greedy_decode: prefill the shortest prompt, then one token
per step through a preallocated KV cache. `load_xlt_params` copies an xlt parameter tree
in, so the tests can run both on the same weights.

Shape letters as in xlt.model: B batch, T query positions, S key positions, D width,
H heads, K head width, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class Config:
  """xlt.model.Config's fields, so `Config(**dataclasses.asdict(xlt_cfg))` works."""
  vocab_size: int
  block_size: int = 128
  num_layers: int = 6
  num_heads: int = 4
  d_model: int = 64
  mlp_ratio: int = 4
  tie_embeddings: bool = False
  dtype: str = "float32"
  ln_eps: float = 1e-5
  pos_embedding: str = "learned"
  rope_base: float = 10000.0
  dropout: float = 0.0

  def __post_init__(self):
    if self.dropout:  # the benchmarks time xlt's steps without dropout, and this model has none
      raise ValueError(f"torch_gpt has no dropout (got {self.dropout})")
    # bfloat16 as in xlt: float32 weights, the caller computes under torch.autocast
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"torch_gpt runs float32 or bfloat16 (autocast), got dtype={self.dtype!r}")
    if self.pos_embedding not in ("learned", "rope"):
      raise ValueError(f"pos_embedding must be 'learned' or 'rope', got {self.pos_embedding!r}")


def rope_tables(cfg: Config):
  """cos and sin [block_size, K/2] of position x frequency, as xlt.model.rope."""
  half = cfg.d_model // cfg.num_heads // 2
  freq = cfg.rope_base ** (-torch.arange(half, dtype=torch.float32) / half)
  angle = torch.arange(cfg.block_size, dtype=torch.float32)[:, None] * freq[None, :]
  return torch.cos(angle), torch.sin(angle)


def rope(x_BxHxTxK, cos_TxK, sin_TxK):
  half = x_BxHxTxK.shape[-1] // 2
  x1, x2 = x_BxHxTxK[..., :half], x_BxHxTxK[..., half:]
  return torch.cat([x1 * cos_TxK - x2 * sin_TxK, x2 * cos_TxK + x1 * sin_TxK], -1)


class Attention(nn.Module):

  def __init__(self, cfg: Config):
    super().__init__()
    self.h, self.k = cfg.num_heads, cfg.d_model // cfg.num_heads
    self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # output features ordered (3, H, K), as xlt's kernel
    self.proj = nn.Linear(cfg.d_model, cfg.d_model)

  def forward(self, x_BxTxD, rope_cs, cache, pos: int):
    b, t, d = x_BxTxD.shape
    q, k, v = self.qkv(x_BxTxD).view(b, t, 3, self.h, self.k).permute(2, 0, 3, 1, 4).unbind(0)
    if rope_cs is not None:  # keys are cached rotated, as in xlt
      cos, sin = rope_cs[0][pos:pos + t], rope_cs[1][pos:pos + t]
      q, k = rope(q, cos, sin), rope(k, cos, sin)
    if cache is not None:  # decoding: write this chunk at `pos`, attend to all written so far
      cache[0][:, :, pos:pos + t], cache[1][:, :, pos:pos + t] = k, v
      k, v = cache[0][:, :, :pos + t], cache[1][:, :, :pos + t]
    if t == 1:  # one new query: every key written so far is in its past
      out_BxHxTxK = F.scaled_dot_product_attention(q, k, v)
    elif pos == 0:
      out_BxHxTxK = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:  # a chunk after earlier positions (not used by greedy_decode)
      mask_TxS = torch.arange(t, device=q.device)[:, None] + pos >= torch.arange(pos + t, device=q.device)[None, :]
      out_BxHxTxK = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_TxS)
    return self.proj(out_BxHxTxK.transpose(1, 2).reshape(b, t, d))


class Mlp(nn.Module):

  def __init__(self, cfg: Config):
    super().__init__()
    self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
    self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

  def forward(self, x_BxTxD):
    return self.proj(F.gelu(self.fc(x_BxTxD), approximate="tanh"))


class Block(nn.Module):

  def __init__(self, cfg: Config):
    super().__init__()
    self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
    self.attn = Attention(cfg)
    self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
    self.mlp = Mlp(cfg)

  def forward(self, x_BxTxD, rope_cs, cache, pos: int):
    x_BxTxD = x_BxTxD + self.attn(self.ln_1(x_BxTxD), rope_cs, cache, pos)
    return x_BxTxD + self.mlp(self.ln_2(x_BxTxD))


class GPT(nn.Module):
  """`forward(tokens_BxT, cache=None, pos=0) -> logits_BxTxV`; with a cache (`init_cache`)
  the tokens are written at positions pos .. pos+T-1 and the cache is updated in place."""

  def __init__(self, cfg: Config):
    super().__init__()
    self.cfg = cfg
    self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
    self.wpe = nn.Parameter(torch.empty(cfg.block_size, cfg.d_model)) if cfg.pos_embedding == "learned" else None
    self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
    self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
    self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
    if cfg.pos_embedding == "rope":
      cos, sin = rope_tables(cfg)
      self.register_buffer("rope_cos", cos, persistent=False)
      self.register_buffer("rope_sin", sin, persistent=False)
    self.reset_parameters()

  def reset_parameters(self):
    """xlt.model's initialisation: normal(0.02), residual projections 0.02 / sqrt(2L),
    zero biases, unit LayerNorm scales (the benchmark's speed does not depend on it)."""
    residual_std = 0.02 / (2 * self.cfg.num_layers) ** 0.5
    for name, p in self.named_parameters():
      if name.endswith("bias"):
        nn.init.zeros_(p)
      elif ".ln_" in name or name.startswith("ln_f"):
        nn.init.ones_(p)
      else:
        nn.init.normal_(p, std=residual_std if name.endswith("proj.weight") else 0.02)

  def forward(self, tokens_BxT, cache=None, pos: int = 0):
    t = tokens_BxT.shape[1]
    x_BxTxD = self.wte(tokens_BxT)
    if self.wpe is not None:
      x_BxTxD = x_BxTxD + self.wpe[pos:pos + t]
    rope_cs = (self.rope_cos, self.rope_sin) if self.cfg.pos_embedding == "rope" else None
    for i, block in enumerate(self.blocks):
      x_BxTxD = block(x_BxTxD, rope_cs, None if cache is None else cache[i], pos)
    x_BxTxD = self.ln_f(x_BxTxD)
    return F.linear(x_BxTxD, self.wte.weight) if self.lm_head is None else self.lm_head(x_BxTxD)

  def init_cache(self, batch: int, length: int):
    """Per layer [keys, values], each [B, H, S, K] (the layout SDPA reads), zero-filled."""
    c = self.cfg
    shape, device = (batch, c.num_heads, length, c.d_model // c.num_heads), self.wte.weight.device
    return [[torch.zeros(shape, device=device), torch.zeros(shape, device=device)] for _ in range(c.num_layers)]


def load_xlt_params(model: GPT, params) -> GPT:
  """Copies an xlt parameter tree (xlt.model.init_params's layout; numpy or jax arrays,
  one model, no ensemble axis) into `model`, in place. DenseGeneral kernels [in..., out...]
  become nn.Linear weights [out, in]: qkv [D, 3, H, K] -> [3D, D], proj [H, K, D] -> [D, D]."""
  c = model.cfg
  expected = {"wte", "ln_f"} | {f"block_{i}" for i in range(c.num_layers)}
  expected |= {"wpe"} if model.wpe is not None else set()
  expected |= {"lm_head"} if model.lm_head is not None else set()
  if set(params) != expected:
    raise ValueError(f"xlt params have {sorted(params)}, this torch model expects {sorted(expected)}")

  def put(dst, src, shape=None, transpose=False):
    x = torch.from_numpy(np.array(src, np.float32))
    x = x.reshape(shape) if shape else x
    dst.copy_(x.T if transpose else x)

  d = c.d_model
  with torch.no_grad():
    put(model.wte.weight, params["wte"]["embedding"])
    if model.wpe is not None:
      put(model.wpe, params["wpe"])
    for i, block in enumerate(model.blocks):
      p = params[f"block_{i}"]
      for ln in ("ln_1", "ln_2"):
        put(getattr(block, ln).weight, p[ln]["scale"])
        put(getattr(block, ln).bias, p[ln]["bias"])
      put(block.attn.qkv.weight, p["attn"]["qkv"]["kernel"], (d, 3 * d), transpose=True)
      put(block.attn.qkv.bias, p["attn"]["qkv"]["bias"], (3 * d,))
      put(block.attn.proj.weight, p["attn"]["proj"]["kernel"], (d, d), transpose=True)
      put(block.attn.proj.bias, p["attn"]["proj"]["bias"])
      put(block.mlp.fc.weight, p["mlp"]["fc"]["kernel"], transpose=True)
      put(block.mlp.fc.bias, p["mlp"]["fc"]["bias"])
      put(block.mlp.proj.weight, p["mlp"]["proj"]["kernel"], transpose=True)
      put(block.mlp.proj.bias, p["mlp"]["proj"]["bias"])
    put(model.ln_f.weight, params["ln_f"]["scale"])
    put(model.ln_f.bias, params["ln_f"]["bias"])
    if model.lm_head is not None:
      put(model.lm_head.weight, params["lm_head"]["kernel"], transpose=True)
  return model


def decays(name: str, p: torch.Tensor) -> bool:
  """Whether xlt's AdamW decays this parameter: xlt decays every leaf of more than one
  dimension in *its* layout, which includes the qkv bias (stored [3, H, K] there)."""
  return p.ndim > 1 or name.endswith("attn.qkv.bias")


def make_optimizer(model: GPT, lr: float = 3e-3, b1: float = 0.9, b2: float = 0.95,
                   weight_decay: float = 0.1) -> torch.optim.AdamW:
  """xlt.train.make_optimizer's AdamW (optax's eps 1e-8, decoupled decay lr x wd x p) at
  a constant learning rate (xlt's schedule costs nothing per step). foreach: one
  multi-tensor kernel per op rather than a Python loop over the parameters."""
  named = list(model.named_parameters())
  groups = [{"params": [p for n, p in named if decays(n, p)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0}]
  return torch.optim.AdamW(groups, lr=lr, betas=(b1, b2), eps=1e-8, foreach=True)


def loss_fn(model: GPT, tokens_BxT, loss_mask_BxT):
  """xlt.train.loss_sums / count: mean cross-entropy over the masked next-token targets."""
  logits_BxTxV = model(tokens_BxT[:, :-1])
  ce = F.cross_entropy(logits_BxTxV.flatten(0, 1), tokens_BxT[:, 1:].flatten(), reduction="none")
  mask = loss_mask_BxT.flatten()
  return (ce * mask).sum() / mask.sum().clamp(min=1.0)


def train_step(model: GPT, opt: torch.optim.Optimizer, tokens_BxT, loss_mask_BxT, clip: float = 1.0,
               accum: int = 1):
  """One full step: forward, backward, global-norm clip, AdamW. Returns (loss, grad norm
  before clipping), as xlt's step; neither is read back, so nothing waits on them. With
  `accum` > 1 the batch runs as that many micro-batches whose gradients add up to the
  whole batch's (xlt.train's gradient accumulation)."""
  opt.zero_grad(set_to_none=True)
  count = loss_mask_BxT.sum().clamp(min=1.0)
  loss = 0.0
  for tok, mask in zip(tokens_BxT.chunk(accum), loss_mask_BxT.chunk(accum)):
    micro = loss_fn(model, tok, mask) * (mask.sum().clamp(min=1.0) / count)
    micro.backward()
    loss = loss + micro.detach()
  grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
  opt.step()
  return loss.detach(), grad_norm


@torch.inference_mode()
def greedy_decode(model: GPT, prompts_BxP, prompt_len_B, *, max_new: int, min_prompt: int):
  """xlt.ensemble_decode.greedy_decode: tokens [B, P + max_new], each prompt followed by its greedy
  continuation; rows whose prompt is longer than `min_prompt` copy their prompt tokens."""
  b, p = prompts_BxP.shape
  length = p + max_new
  if length > model.cfg.block_size:
    raise ValueError(f"prompt {p} + {max_new} new tokens exceeds the block size {model.cfg.block_size}")
  buf_BxL = torch.zeros((b, length), dtype=torch.long, device=prompts_BxP.device)
  buf_BxL[:, :p] = prompts_BxP
  cache = model.init_cache(b, length)
  next_B = model(buf_BxL[:, :min_prompt], cache, 0)[:, -1].argmax(-1)
  for i in range(min_prompt, length - 1):  # the last position needs no forward pass
    tok_B = torch.where(i < prompt_len_B, buf_BxL[:, i], next_B)
    buf_BxL[:, i] = tok_B
    next_B = model(tok_B[:, None], cache, i)[:, 0].argmax(-1)
  last = length - 1
  buf_BxL[:, last] = torch.where(last < prompt_len_B, buf_BxL[:, last], next_B)
  return buf_BxL
