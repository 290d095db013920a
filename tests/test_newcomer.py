"""What a newcomer misread: the base's table says which prompts its exact match covers (the
first eval.num_prompts, which can be one operation's alone); docs/pretrained.md's generate
comment names the --match the command uses; with LoRA recipes the finetune kind prints the LoRA
model's memory and its trained parameters (the adapters), not only the full model's; xlt.eval
says where it wrote its scores; files written atomically (results, summaries, scores) get the
umask's permissions like the models beside them, not mkstemp's 0600."""

import json
import os
import re
import stat
import sys
import types

import ml_collections
import pytest

from xlt.io import fileio

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "llama")


def test_the_base_table_says_which_prompts_it_scored(tmp_path):
  from xlt.experiments import pretrain_hf
  path = tmp_path / "language_prompts.jsonl"
  rows = [{"prompt": f"p{i}", "answer": "1", "set": s} for s in ("mul/de", "sub/de") for i in range(300)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  c = ml_collections.ConfigDict({"eval": {"num_prompts": 200}})
  assert pretrain_hf.scored_prompts(c, str(path)) == "the first 200 of 600 prompts, mul/de only"
  c.eval.num_prompts = 400
  assert pretrain_hf.scored_prompts(c, str(path)) == "the first 400 of 600 prompts (mul/de, sub/de)"
  c.eval.num_prompts = 1000
  assert pretrain_hf.scored_prompts(c, str(path)) == "all 600 prompts (mul/de, sub/de)"


def test_the_generate_comment_names_the_match_the_command_uses():
  with open(os.path.join(REPO, "docs", "pretrained.md")) as f:
    text = f.read()
  comment, command = re.search(r"(# the table's exact match of one model.*?)\npython -m xlt.generate(.*?)\n```", text,
                               re.S).groups()
  used = re.search(r"--match=(\w+)", command).group(1)
  assert f"--match={used}, the table's" in comment.replace("\n# ", " ")


def test_the_lora_memory_counts_the_adapters(capsys):
  from configs import finetune as finetune_config
  from xlt import pretrained
  from xlt.experiments import finetune, finetune_memory
  c = finetune_config.get_config()
  c.base, c.lora.enabled, c.data.block_size, c.mesh.data, c.mesh.devices = LLAMA, True, 32, 1, 1
  cfg, shapes = pretrained.abstract(LLAMA)
  finetune_memory.estimate(c, cfg, shapes, finetune.plan(c))
  out = capsys.readouterr().out
  full, lora = out.split("finetune: estimated memory of one LoRA model (rank 8: adapters only trained)\n")
  assert "19,616 of 19,616 parameters trained" in full
  trained, total = (int(x.replace(",", "")) for x in re.search(r"([\d,]+) of ([\d,]+) parameters trained",
                                                                 lora).groups())
  assert 0 < trained < 19_616 < total  # the adapters alone are trained; the base is held beside them
  c.lora.enabled = False
  finetune_memory.estimate(c, cfg, shapes, finetune.plan(c))
  assert "LoRA model" not in capsys.readouterr().out


def test_xlt_eval_says_where_it_wrote_the_scores(tmp_path, monkeypatch, capsys):
  from xlt.eval import __main__ as eval_main
  utils = types.ModuleType("lm_eval.utils")
  utils.make_table = lambda out: "| task | score |"
  monkeypatch.setitem(sys.modules, "lm_eval", types.ModuleType("lm_eval"))
  monkeypatch.setitem(sys.modules, "lm_eval.utils", utils)
  monkeypatch.setattr(eval_main, "evaluate", lambda *a, **k: {"results": {"x": {"acc": 0.5}}})
  out = tmp_path / "scores.json"
  assert eval_main.main(["--model", LLAMA, "--tasks=x", f"--output={out}"]) == 0
  assert capsys.readouterr().out.endswith(f"scores written to {out}\n")
  assert json.loads(out.read_text())["results"] == {"x": {"acc": 0.5}}
  assert eval_main.main(["--model", LLAMA, "--tasks=x"]) == 0
  assert "scores not written to a file (--output=FILE writes them as JSON)" in capsys.readouterr().out


@pytest.fixture
def umask_022():
  old = os.umask(0o022)
  yield
  os.umask(old)


def test_atomic_writes_get_the_umask_permissions(tmp_path, umask_022):
  from xlt import results
  fileio.write_text(str(tmp_path / "summary.json"), "{}")
  assert stat.S_IMODE(os.stat(tmp_path / "summary.json").st_mode) == 0o644
  results.write(str(tmp_path), [{"experiment": "e", "metric": "m", "values": [1.0]}])
  for name in ("results.json", "results.csv"):
    assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644, name
  os.umask(0o077)
  fileio.write_bytes(str(tmp_path / "private.bin"), b"x")
  assert stat.S_IMODE(os.stat(tmp_path / "private.bin").st_mode) == 0o600
  os.chmod(tmp_path / "summary.json", 0o640)  # a file's own permissions survive its rewrite
  fileio.write_text(str(tmp_path / "summary.json"), "{ }")
  assert stat.S_IMODE(os.stat(tmp_path / "summary.json").st_mode) == 0o640
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp_")]
