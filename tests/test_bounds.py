"""Chat templates are bounded (xlt.io.chat_template): a template that would build gigabytes
(`'x' * 10**10`, a doubling loop, `center(10**10)`, an endless output) is one line naming its
file, refused before it allocates, on every route that renders one: xlt.generate --chat, chat
data for fine-tuning, xlt.eval's --apply_chat_template (the harness's LM), merge_search --chat
(through xlt.generate's decode), and a mergekit YAML's chat_template (rendered once on a sample
conversation before the merge writes it). Ordinary templates render as before."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from xlt import hf_tokenizer
from xlt.io import chat_template

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "llama")
LLAMA_B = os.path.join(REPO, "tests", "fixtures", "hf", "llama_b")
DOUBLING = "{%% set ns = namespace(s='x') %%}{%% for i in range(60) %%}{%% set ns.s = ns.s %s ns.s %%}{%% endfor %%}"
BOMBS = {
    "repeat a string": "{{ 'x' * 10**10 }}",
    "repeat a list": "{{ ([0] * 10**10)|length }}",
    "double with +": DOUBLING % "+",
    "double with ~": DOUBLING % "~",
    "a huge range": "{% for i in range(10**9) %}{% endfor %}",
    "a wide center": "{{ 'x'|center(10**10) }}",
    "a wide ljust": "{{ 'x'.ljust(10**10) }}",
    "a % width": "{{ '%*s' % (10**10, 'x') }}",
    "a format width": "{{ '{:>10000000000}'.format('x') }}",
    "a replace": "{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}",
    "a join": "{{ (['x' * 1000000] * 1000)|join }}",
    "a huge power": "{{ 10**100000 * 10**100000 }}",
    "an endless output": "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
    "lipsum": "{{ lipsum(10**9) }}",
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_template_that_builds_too_much_is_refused_fast(name):
  compiled = chat_template.compile(BOMBS[name])
  start = time.perf_counter()
  with pytest.raises(chat_template.BoundError) as e:
    chat_template.render(compiled, messages=chat_template.SAMPLE)
  assert time.perf_counter() - start < 5 and "\n" not in str(e.value) and "limit" in str(e.value)


def test_the_bombs_stay_under_a_memory_limit():
  """Every template above, rendered in a process limited to 1 GiB of address space: each is
  refused, none is killed or raises MemoryError (the old sandbox grew to 23 GB on the first)."""
  code = ("import resource, sys, json\n"
          "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
          "from xlt.io import chat_template as ct\n"
          "for t in json.loads(sys.argv[1]):\n"
          "  try:\n    ct.render(ct.compile(t), messages=ct.SAMPLE)\n    print('rendered')\n"
          "  except ct.BoundError:\n    print('refused')\n")
  out = subprocess.run([sys.executable, "-c", code, json.dumps(list(BOMBS.values()))], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO}, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["refused"] * len(BOMBS)


def test_ordinary_templates_render_as_before():
  template = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] ~ '>' }}{{ m['content'] | trim }}{% endfor %}"
              "{{ [1, 2] + [3] }}{{ 'ab' * 2 }}{{ '%s-%d' % ('a', 3) }}{{ '{}!'.format(2) }}{{ range(3)|list }}"
              "{{ ' cutoff 20231201 %s' % 'x' }}{{ ' {}: 20231201'.format('y') }}"  # long digits outside a spec
              "{% if add_generation_prompt %}<assistant>{% endif %}")
  out = chat_template.render(chat_template.compile(template), messages=chat_template.SAMPLE, bos_token="<s>",
                             add_generation_prompt=True)
  assert out == "<s><user>Hello<assistant>Hi<user>2 + 2?[1, 2, 3]ababa-32![0, 1, 2] cutoff 20231201 x y: 20231201<assistant>"


def _model_with(tmp_path, template: str) -> str:
  model = tmp_path / "model"
  shutil.copytree(LLAMA, model)
  (model / "chat_template.jinja").write_text(template)
  return str(model)


def test_generate_chat_is_one_line_naming_the_template(tmp_path):
  from xlt import generate
  model = _model_with(tmp_path, BOMBS["repeat a string"])
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text(json.dumps({"prompt": "w1"}) + "\n")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    status = generate.main([f"--model={model}", f"--prompts={prompts}", f"--output={tmp_path / 'out.jsonl'}",
                            "--chat"])
  lines = err.getvalue().splitlines()
  assert status == 2 and len(lines) == 1, lines
  assert lines[0].startswith(f"xlt.generate: error: {model}/chat_template.jinja: the chat template was stopped by "
                             "the sandbox: it builds a value (`*`) of 10,000,000,000"), lines[0]


def test_chat_data_and_the_eval_harness_hit_the_bound(tmp_path):
  """Fine-tuning's chat data (xlt.data.sft) and lm-eval's --apply_chat_template (XltLM's
  apply_chat_template) render through the tokenizer: both refuse in one line."""
  from xlt.data import sft
  tok = hf_tokenizer.load(_model_with(tmp_path, DOUBLING % "~"))
  msgs = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]
  with pytest.raises(sft.SFTError, match=r"data.jsonl line 1: .*chat_template.jinja: .*stopped by the sandbox"):
    sft._chat_pieces(tok, msgs, "data.jsonl line 1")
  harness = pytest.importorskip("xlt.eval.harness", exc_type=ImportError)
  lm = harness.XltLM.__new__(harness.XltLM)
  lm._tok = tok
  with pytest.raises(hf_tokenizer.TokenizerError, match="stopped by the sandbox"):
    lm.apply_chat_template(msgs)


def test_a_mergekit_chat_template_is_rendered_before_the_merge(tmp_path):
  from configs import merge_files
  from xlt.merge import chat
  from xlt.merge.__main__ import merge_config, with_yaml
  for template, says in [("{{ 'x' * 10**10 }}", "over the 16,777,216 limit"),
                         ("{% for i in range(10**9) %}{% endfor %}", "over the 16,777,216 limit"),
                         ("{{ raise_exception('no') }}", "fails on a sample conversation (user, assistant, user): no"),
                         ("{{ ''.__class__.__base__.__subclasses__() }}", "'__class__' of 'str' object is unsafe")]:
    with pytest.raises(ValueError, match="^chat_template: ") as e:
      chat.resolve(template, [LLAMA])
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
  yml = tmp_path / "merge.yml"
  yml.write_text(f"merge_method: linear\nmodels:\n  - model: {LLAMA}\n  - model: {LLAMA_B}\n"
                 "chat_template: \"{{ 'x' * 10**10 }}\"\n")
  with pytest.raises(ValueError, match="limit"):
    merge_config(with_yaml(merge_files.get_config(), str(yml)) | {"output": str(tmp_path / "out"), "heatmaps": False})
  assert not os.path.exists(tmp_path / "out")
