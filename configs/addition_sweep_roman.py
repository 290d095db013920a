"""Sample-size sweep for Roman addition alone, at the reduced setting (reference Figure 1b).

  python -m xlt.main --config=configs/addition_sweep_roman.py --workdir=runs/sweep_roman_cpu

The reference's Roman alone reaches 19.42% with 2,048 9-digit samples (Table 2) and above 80%
with 4,096 (Figure 1b): Roman is *easier* than Standard there (Standard fails at 4k). xlt's
`:cpu` setting (3-digit operands, a 4×128 model, counts / 8) was calibrated on Standard's
threshold only (configs/addition_sweep.py: 500 fail, 1,000 work); its Roman alone reached 34%
with 1,024 samples, best at the budget's last step (results/addition_table2_cpu.json). This
sweep measures Roman's own threshold at that setting: 256 to 4,096 samples, 2 seeds each, and a
budget of 8,000 steps so that the best step need not be the last. Its figures are the input of
configs/addition_roman_transfer.py, which places Standard + Roman relative to this threshold.

xlt's Roman encoding differs from the paper's, whose one example (`X X I + I V = V I X`) does
not say how answers are ordered or how values above 3,999 are written: xlt writes one token per
Roman-numeral glyph, operands most significant first and the answer reversed (least significant
symbol first, as for every xlt language: `Ⅹ Ⅹ Ⅰ + Ⅰ Ⅴ = Ⅴ Ⅹ Ⅹ`), and values above 3,999 in
its own "|" notation (each `|` multiplies what precedes it by 1,000); 9-digit examples need a
block of 128 tokens, 3-digit ones fit in 64 (xlt/data/addition.py).
xlt's figures: results/addition_sweep_roman_cpu.json, docs/results.md.
"""

from configs import addition_sweep

SAMPLES = (256, 512, 1024, 2048, 4096)


def get_config(arg: str = ""):
  if arg not in ("", "cpu"):  # the reduced setting only: the reference's Figure 1b is a GPU's run
    raise ValueError(f"unknown config argument {arg!r}; expected '' or 'cpu' (the same sweep)")
  c = addition_sweep.get_config("cpu")
  c.name = "addition_sweep_roman"
  c.sweep.language = "roman"
  c.sweep.samples = SAMPLES
  c.num_seeds = 2
  c.train.steps = 8000
  return c
