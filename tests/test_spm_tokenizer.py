"""xlt.data.spm_tokenizer: the sentencepiece tokenizer trained on both languages' corpora (special
ids, round trips, the cache and when it retrains, balanced training sentences)."""

import pytest
import sentencepiece as spm

from conftest import jsonl, write
from xlt.data import corpus, spm_tokenizer


def test_tokenizer_special_ids(story_sp):
  assert (story_sp.pad_id(), story_sp.unk_id(), story_sp.bos_id(), story_sp.eos_id()) == (
      spm_tokenizer.PAD_ID, spm_tokenizer.UNK_ID, spm_tokenizer.BOS_ID, spm_tokenizer.EOS_ID) == (0, 1, 2, 3)
  assert story_sp.get_piece_size() == 400
  assert story_sp.id_to_piece(4) == "\n" and story_sp.id_to_piece(5) == "<0x00>"


@pytest.mark.parametrize("string", [
    "The little girl found a red ball.",
    "Das kleine Mädchen fand einen roten Ball.\n\nIhr Bruder teilte süßen Kuchen.",
    # Characters outside the training text are encoded as bytes.
    "Unseen: Žluťoučký kůň 🙂🚀 漢字かな 데이터 ∑√",
    "  leading and  double spaces, trailing \n",
])
def test_tokenizer_round_trip(story_sp, string):
  ids = spm_tokenizer.encode(story_sp, string)
  assert spm_tokenizer.UNK_ID not in ids
  assert spm_tokenizer.decode(story_sp, ids) == string
  specials = [spm_tokenizer.BOS_ID, *ids, spm_tokenizer.EOS_ID, spm_tokenizer.PAD_ID]
  assert spm_tokenizer.decode(story_sp, specials) == string  # specials decode to ""


def test_tokenizer_learns_both_languages(story_sp):
  # Frequent words of both languages became single pieces (the budget is balanced).
  assert len(spm_tokenizer.encode(story_sp, "the")) == 1 and len(spm_tokenizer.encode(story_sp, "einen")) == 1
  assert len(spm_tokenizer.encode(story_sp, "Mädchen")) < len("Mädchen".encode())


def test_tokenizer_cache_reuse_and_invalidation(story_corpora, tmp_path, monkeypatch):
  calls = []
  train = spm.SentencePieceTrainer.train
  monkeypatch.setattr(spm.SentencePieceTrainer, "train",
                      lambda **kw: calls.append(kw["vocab_size"]) or train(**kw))
  workdir = str(tmp_path)
  models = lambda: sorted((tmp_path / "tokenizer").glob("*.model"))
  first = spm_tokenizer.train_or_load_tokenizer(workdir, story_corpora, vocab_size=350)
  [path] = models()
  mtime = path.stat().st_mtime_ns
  second = spm_tokenizer.train_or_load_tokenizer(workdir, story_corpora, vocab_size=350)
  assert calls == [350] and models() == [path] and path.stat().st_mtime_ns == mtime
  assert second.serialized_model_proto() == first.serialized_model_proto()
  assert not list((tmp_path / "tokenizer").glob("*.tmp"))  # no temporary file left behind
  spm_tokenizer.train_or_load_tokenizer(workdir, story_corpora, vocab_size=360)  # a setting changed
  assert calls == [350, 360] and len(models()) == 2
  spm_tokenizer.train_or_load_tokenizer(workdir, story_corpora, vocab_size=350, split=corpus.SplitSpec(seed=1))
  assert calls == [350, 360, 350] and len(models()) == 3


def test_tokenizer_input_change_retrains(story_corpora, tmp_path):
  en = write(tmp_path / "en.jsonl", open(story_corpora[0].path, encoding="utf-8").read())
  specs = [corpus.CorpusSpec(en, "jsonl"), story_corpora[1]]
  spm_tokenizer.train_or_load_tokenizer(str(tmp_path), specs, vocab_size=350)
  with open(en, "a", encoding="utf-8") as f:
    f.write(jsonl([{"text": "A new story about a purple elephant."}]))
  spm_tokenizer.train_or_load_tokenizer(str(tmp_path), specs, vocab_size=350)
  assert len(list((tmp_path / "tokenizer").glob("*.model"))) == 2


def test_tokenizer_vocab_too_large_is_clear(story_corpora, tmp_path):
  with pytest.raises(ValueError, match="smaller vocab_size"):
    spm_tokenizer.train_or_load_tokenizer(str(tmp_path), story_corpora, vocab_size=50_000)
  with pytest.raises(ValueError, match="use a larger vocab_size"):
    spm_tokenizer.train_or_load_tokenizer(str(tmp_path), story_corpora, vocab_size=262)
  assert not list(tmp_path.glob("tokenizer/*"))  # nothing cached after a failure


def test_tokenizer_sentences_balanced():
  long_lines = ["x" * 10] * 100  # 1,000 characters
  short_lines = ["y" * 10] * 20  # 200 characters
  sentences = spm_tokenizer.tokenizer_sentences([["\n".join(long_lines)], ["\n\n".join(short_lines)]], 1000)
  assert sentences.count("x" * 10) == sentences.count("y" * 10) == 20
  assert sentences[:4] == ["x" * 10, "y" * 10, "x" * 10, "y" * 10]  # interleaved
