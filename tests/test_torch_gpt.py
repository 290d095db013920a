"""benchmarks/torch_gpt.py computes what xlt computes, so benchmarks/compare.py compares
the same model: same logits, same greedy decodes, same AdamW step. Skipped without torch
(`pip install -e '.[bench]'`)."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks import torch_gpt  # noqa: E402  (needs torch)
from xlt import ensemble_decode, model  # noqa: E402
from xlt import train as train_lib  # noqa: E402


def _pair(pos_embedding, seed=0, **kw):
  cfg = model.Config(**{**dict(vocab_size=24, block_size=32, num_layers=2, num_heads=2, d_model=16,
                               pos_embedding=pos_embedding), **kw})
  params = model.init_params(cfg, jax.random.key(seed))
  net = torch_gpt.GPT(torch_gpt.Config(**dataclasses.asdict(cfg)))
  return cfg, params, torch_gpt.load_xlt_params(net, params)


def _tokens(shape, vocab, seed=1):
  return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
@pytest.mark.parametrize("tie_embeddings", [False, True])
def test_forward_logits_match_xlt(pos_embedding, tie_embeddings):
  cfg, params, net = _pair(pos_embedding, tie_embeddings=tie_embeddings)
  x = _tokens((3, 20), cfg.vocab_size)
  want, _ = model.apply(cfg, params, x)
  with torch.no_grad():
    got = net(torch.from_numpy(x).long()).numpy()
  np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
def test_cached_forward_matches_xlt(pos_embedding):
  # a prefill, one token, then a chunk at pos > 0 (the masked branch) through the cache
  cfg, params, net = _pair(pos_embedding)
  x = _tokens((2, 12), cfg.vocab_size)
  cache, torch_cache = model.init_cache(cfg, 2, 12), net.init_cache(2, 12)
  with torch.no_grad():
    for start, end in ((0, 5), (5, 6), (6, 12)):
      want, cache = model.apply(cfg, params, x[:, start:end], cache, start)
      got = net(torch.from_numpy(x[:, start:end]).long(), torch_cache, start).numpy()
      np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
def test_greedy_decode_matches_xlt_token_for_token(pos_embedding):
  # scaled-up weights: a random model's logits are then far apart, so float rounding
  # cannot flip an argmax and the check is exact
  cfg, params, _ = _pair(pos_embedding, seed=3)
  params = jax.tree.map(lambda p: p * 8.0, params)
  net = torch_gpt.load_xlt_params(torch_gpt.GPT(torch_gpt.Config(**dataclasses.asdict(cfg))), params)
  prompts = _tokens((6, 7), cfg.vocab_size, seed=4)
  lens = np.array([7, 5, 7, 6, 5, 7], np.int32)  # rows longer than min_prompt copy their prompt
  want = np.asarray(ensemble_decode.greedy_decode(cfg, params, prompts, lens, max_new=12, min_prompt=5))
  got = torch_gpt.greedy_decode(net, torch.from_numpy(prompts).long(), torch.from_numpy(lens).long(),
                                max_new=12, min_prompt=5).numpy()
  assert len(set(want[:, 7:].ravel().tolist())) > 3  # a real continuation, not one repeated token
  np.testing.assert_array_equal(got, want)


def _opt_config(lr):
  return ml_collections.ConfigDict(dict(name="adamw", schedule="constant", peak_lr=lr, warmup_steps=0,
                                        total_steps=10, b1=0.9, b2=0.95, weight_decay=0.1, clip=1.0))


def _tree_in_torch_layout(cfg, tree):
  """An xlt-shaped tree (parameters, gradients, updates) as a torch state dict."""
  net = torch_gpt.GPT(torch_gpt.Config(**dataclasses.asdict(cfg)))
  return {k: v.clone() for k, v in torch_gpt.load_xlt_params(net, tree).state_dict().items()}


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
def test_adamw_steps_match_xlt(pos_embedding):
  cfg, params, net = _pair(pos_embedding, seed=5)
  lr = 1e-2
  tx = train_lib.make_optimizer(_opt_config(lr))
  tokens = _tokens((4, 17), cfg.vocab_size, seed=6)
  mask = (np.random.default_rng(7).random((4, 16)) < 0.7).astype(np.float32)
  batch = {"tokens": tokens, "loss_mask": mask}
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
           "active": jnp.ones((), bool)}
  opt = torch_gpt.make_optimizer(net, lr=lr)
  t_tokens, t_mask = torch.from_numpy(tokens).long(), torch.from_numpy(mask)
  start = _tree_in_torch_layout(cfg, params)

  # the same loss and gradients (gradients compared against the largest, since some are
  # rounding noise around an exact zero: a softmax ignores the key bias)
  loss, grads = jax.value_and_grad(lambda p: train_lib.loss_sums(cfg, p, batch)[0] / mask.sum())(params)
  t_loss = torch_gpt.loss_fn(net, t_tokens, t_mask)
  t_loss.backward()
  np.testing.assert_allclose(t_loss.item(), float(loss), rtol=1e-5)
  want_g = _tree_in_torch_layout(cfg, grads)
  scale = max(float(g.abs().max()) for g in want_g.values())
  for name, p in net.named_parameters():
    np.testing.assert_allclose(p.grad.numpy(), want_g[name].numpy(), atol=1e-5 * scale, err_msg=name)

  # three full steps; each moves every parameter by about lr (Adam) plus lr x 0.1 x p
  # (decay): the moves agree to a thousandth of lr. PyTorch's run as two micro-batches: the
  # accumulated gradient is the whole batch's
  for _ in range(3):
    state, metrics = train_lib.train_step(state, batch, cfg=cfg, tx=tx)
    t_loss, t_norm = torch_gpt.train_step(net, opt, t_tokens, t_mask, accum=2)
  np.testing.assert_allclose(float(t_loss), float(metrics["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(t_norm), float(metrics["grad_norm"]), rtol=1e-4)
  want = _tree_in_torch_layout(cfg, state["params"])
  got = net.state_dict()
  for name in want:
    move_want, move_got = (want[name] - start[name]).numpy(), (got[name] - start[name]).numpy()
    np.testing.assert_allclose(move_got, move_want, atol=2e-3 * lr, err_msg=name)
  # the decay mask is xlt's: a matrix and the qkv bias decay, LayerNorm and other biases do not
  decayed = {n for g in opt.param_groups if g["weight_decay"] for n, p in net.named_parameters()
             if any(p is q for q in g["params"])}
  assert "blocks.0.attn.qkv.bias" in decayed and "blocks.0.attn.qkv.weight" in decayed
  assert not {"blocks.0.ln_1.weight", "blocks.0.mlp.fc.bias", "blocks.0.attn.proj.bias"} & decayed
