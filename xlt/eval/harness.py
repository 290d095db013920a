"""xlt's models as an lm-evaluation-harness model class, `xlt`:

  python -m xlt.eval.harness --model xlt --model_args 'pretrained=DIR[,mesh=data=4;tensor=2]' --tasks ...
  python -m xlt.eval --model=DIR --tasks=...                    (xlt's own command line)

  from xlt.eval import harness                    # importing it registers "xlt" with lm-eval
  lm = harness.XltLM(pretrained=DIR, batch_size=16, mesh="data=8")
  lm_eval.simple_evaluate(model=lm, tasks=[...])

Importing this module imports lm-eval (an optional dependency: `pip install 'xlt[eval]'`);
nothing else in xlt does. The requests are answered by xlt.eval.requests, which follows
lm-eval's `hf` backend token for token (tests/test_eval_harness.py holds it to that backend's
answers). model_args: pretrained (a Hugging Face model directory), dtype (float32, bfloat16,
float16; default the checkpoint's), batch_size, max_length (default the model's context),
mesh ("data=4;tensor=2": `;` between axes, since lm-eval splits model_args at commas),
max_gen_toks (default 256, as hf's), chat_template (a named template of the tokenizer's files),
dense_layout (kernel or weight: xlt.model.Config.dense_layout; default xlt.decode.DENSE_LAYOUT).
"""

from __future__ import annotations

import inspect
import sys

import jax
import jax.numpy as jnp
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from xlt import decode
from xlt import hf_tokenizer
from xlt.eval import requests as requests_lib


def _until(gen_kwargs: dict, eos_text: str | None) -> list[str]:
  until = gen_kwargs.get("until")
  until = [until] if isinstance(until, str) else list(until or [])
  if eos_text and eos_text not in until:
    until.append(eos_text)
  return until


@register_model("xlt")
class XltLM(TemplateLM):
  """lm-eval's LM interface over one xlt model (see the module docstring)."""

  # device and max_batch_size: lm-eval passes them to every model; jax places this one
  def __init__(self, pretrained: str, dtype: str | None = None, batch_size: int | str = 16,
               max_length: int | None = None, mesh: str | None = None, max_gen_toks: int = 256,
               chat_template: str | None = None, device: str | None = None, max_batch_size: int | None = None,
               dense_layout: str = decode.DENSE_LAYOUT):
    super().__init__()
    from xlt import pretrained as pretrained_lib  # the model loader and its dependencies

    mesh = decode.make_mesh(str(mesh).replace(";", ",") if mesh else None)
    cfg, params = pretrained_lib.load(str(pretrained), mesh=mesh, dtype=dtype, dense_layout=dense_layout)
    batch = 16 if str(batch_size).startswith("auto") else int(batch_size)
    self._setup(cfg, params, hf_tokenizer.load(str(pretrained), chat_template), mesh, batch, max_length,
                max_gen_toks, str(pretrained))

  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
    """lm-eval's constructor from --model_args, after checking its keys: an unknown one (a
    typo, an hf backend's option) is one line naming it, not a TypeError's traceback."""
    check_model_args([kv.split("=", 1)[0].strip() for kv in str(arg_string or "").split(",") if kv.strip()])
    return super().create_from_arg_string(arg_string, additional_config)

  @classmethod
  def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
    check_model_args(list(arg_dict or {}))
    return super().create_from_arg_obj(arg_dict, additional_config)

  def _setup(self, cfg, params, tok, mesh, batch, max_length, max_gen_toks, name):
    self._tok = tok
    self._model = requests_lib.Model(cfg, params, self._tok, mesh, batch, int(max_length) if max_length else None)
    self._max_gen_toks = int(max_gen_toks)
    self._name = name

  @classmethod
  def from_params(cls, cfg, params, tok, batch_size: int = 16, mesh: str | None = None, max_length: int | None = None,
                  max_gen_toks: int = 256, name: str = "model") -> XltLM:
    """The model class over parameters in memory (no ensemble axis; host or device arrays,
    laid out on `mesh` as training lays them out) and their xlt.hf_tokenizer `tok`: how the
    kinds score the models they write, and xlt.merge_search its candidates."""
    lm = cls.__new__(cls)
    TemplateLM.__init__(lm)
    mesh = decode.make_mesh(str(mesh).replace(";", ",") if mesh else None)
    params = decode.place(cfg, jax.tree.map(jnp.asarray, params), mesh)
    lm._setup(cfg, params, tok, mesh, int(batch_size), max_length, max_gen_toks, name)
    return lm

  # ------------------------------------------------------------------ what lm-eval reads

  @property
  def eot_token_id(self) -> int:
    return self._tok.eos_id

  @property
  def prefix_token_id(self) -> int:
    return requests_lib.prefix_id(self._tok)

  @property
  def max_length(self) -> int:
    return self._model.context

  @property
  def max_gen_toks(self) -> int:
    return self._max_gen_toks

  @property
  def tokenizer_name(self) -> str:
    return self._name.rstrip("/").replace("/", "__")

  def chat_template(self, chat_template: bool | str = False) -> str | None:
    return self._tok.template if chat_template else None

  def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    return self._tok.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

  def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
    return requests_lib.tok_encode(self._tok, string, self.prefix_token_id, add_special_tokens)

  def tok_decode(self, tokens, skip_special_tokens: bool = True) -> str:
    return self._tok.decode(tokens, skip_special_tokens=skip_special_tokens)

  # ------------------------------------------------------------------ the three request kinds

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    out = requests_lib.loglikelihood_tokens(self._model, [(ctx, cont) for _, ctx, cont in requests])
    for (key, _, _), answer in zip(requests, out):
      if key is not None:
        self.cache_hook.add_partial("loglikelihood", key, answer)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    docs = [self.tok_encode(req.args[0]) for req in requests]
    out = requests_lib.loglikelihood_rolling(self._model, docs, self.prefix_token_id)
    for req, total in zip(requests, out):
      self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
    return out

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Greedy (do_sample must be false or absent, temperature 0), grouped by generation kwargs."""
    eos_text = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
    groups: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
      groups.setdefault(repr(sorted(req.args[1].items(), key=str)), []).append(i)
    out: list = [None] * len(requests)
    for idx in groups.values():
      kwargs = dict(requests[idx[0]].args[1])
      if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
        raise ValueError(f"xlt's lm-eval backend decodes greedily; the task asks for sampling ({kwargs})")
      max_gen = next((int(kwargs[k]) for k in ("max_gen_toks", "max_new_tokens", "max_tokens") if kwargs.get(k)),
                     self._max_gen_toks)
      contexts = [self._encode_context(requests[i].args[0]) for i in idx]
      texts = requests_lib.generate(self._model, contexts, until=_until(kwargs, eos_text), max_gen_toks=max_gen)
      for i, text in zip(idx, texts):
        out[i] = text
        self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return out

  def _encode_context(self, text: str) -> list[int]:
    """As hf's tok_batch_encode: no special tokens where the text starts with BOS's text."""
    bos = self._tok.special.get("bos_token")
    return self._tok.encode(text, add_special_tokens=not (bos and text.startswith(bos)))

  def get_model_info(self) -> dict:
    return {"model": self._name, "backend": "xlt"}


class ModelArgsError(ValueError):
  """A --model_args key that XltLM does not take (one line, exit 2 from the command line)."""


def check_model_args(keys) -> None:
  accepted = [p for p in inspect.signature(XltLM.__init__).parameters if p != "self"]
  if unknown := [k for k in keys if k not in accepted]:
    raise ModelArgsError(f"model_args: unknown key {unknown[0]!r}; the xlt model takes {', '.join(accepted)}")


if __name__ == "__main__":  # lm-eval's own command line, with "xlt" registered
  from lm_eval.__main__ import cli_evaluate

  try:
    cli_evaluate()
  except ModelArgsError as e:
    print(f"xlt.eval.harness: error: {e}", file=sys.stderr)
    sys.exit(2)
