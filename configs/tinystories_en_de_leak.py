"""Table 4's English–German proxy, with the held-out stories' English in the mixed training:
how much of a translated pair's gain can be content leaking through translation.

  python -m xlt.main --config=configs/tinystories_en_de_leak.py --workdir=runs/tinystories_en_de_leak

The reference's Czech test stories are translations of English TinyStories, and its mixed model
trained on English TinyStories; if those included the originals of its Czech test stories, part
of its 69.6% (28.67 → 8.72 Czech perplexity) is content seen in English, not ability transfer.
The paper does not say. configs/tinystories_en_de.py keeps every held-out story's English out
of training (the split is by story index, the same on both sides); this config adds the English
of the 200 held-out stories (64 validation, 136 test) to the mixed condition
(`data.mixed_high_held_out`), everything else equal: the same tokenizer, split, seeds and budget,
and the limited baseline trained beside it. The difference in German test perplexity between
the two configs' mixed rows is the leak's effect at this scale.
xlt's figures: results/tinystories_en_de_leak.json, docs/results.md.
"""

from configs import tinystories_en_de


def get_config():
  c = tinystories_en_de.get_config()
  c.name = "tinystories_proxy_en_de_leak"
  c.conditions = ("low_limited", "mixed")  # the comparison; English-only and German-full unchanged
  c.data.mixed_high_held_out = True
  return c
