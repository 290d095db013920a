"""The claims study (issue 40): where each of the papers' claims holds or fails on the merge
testbed, by the base's depth and the size of the experts' fine-tune. Preregistered in
docs/prereg/claims_study.md, committed before any of its runs; its verdicts are rendered by
`python -m xlt.claims` from the finished grid (docs/testbed.md, results/claims_study.json).

  python -m xlt.main --config=configs/claims_study.py --workdir=runs/claims_study

A grid (one point per depth: 6, 12 and 24 blocks at configs/merge.py's width), each point a
regime map (c.task "arithmetic_regimes", xlt.experiments.testbed.regimes) with two fine-tune
regimes from the same 10 bases: the papers' short SFT with a small relative delta (1e-4 x 400
steps, the regime map's smallest column) and the default's 3e-4 x 800. Everything else is
configs/merge.py's: the data, the base's training, the replay, the merge settings.
Per depth L, every layer count of the papers' 32-layer setting is scaled to L and rounded up
(`scaled`, so that a swapped zone never vanishes):
  partition preset [C]     bottom 6 / top 2 of 32 (the modular-training paper)
  layer swap, the paper's  bottom 5 / top 2, no transition (the layer-swapping paper's default)
  layer swap grid          bottom {3, 4, 5} x top {0, 1, 2} x transition {0, 1, 2} of 32
Recipes trained per regime and seed: task, language and source-language experts, data mixing,
partial experts [C], simultaneous [C] switching every step (7); the merges: layer swaps, soups,
task arithmetic (lambda 0.5, 1.0), TIES, DARE, MAET.

Not a table of the papers: no reference numbers (the layer-swapping paper's Table 2, Swahili MGSM
8-shot with Llama 3.1 8B, averages over 9 pairs: math expert 29.5, layer swap 32.4 in its default
configuration and 32.8 in its best, +2.9 and +3.3 points, ~10% relative; the modular-training
paper: reverting after training at least as good as freezing). The study was sized for a misread
~10-point gain (its preregistration, frozen, says so; docs/prereg/claims_study_2.md has the
correction and the second study). Wall time: see results/studies/claims_study.json.
"""

import math

from configs import merge

DEPTHS = (6, 12, 24)
# (fine-tuning peak learning rate, steps): the papers' short SFT, then configs/merge.py's default
REGIMES = ((1e-4, 400), (3e-4, 800))
PAPER_LAYERS = 32
PARTITION_C = (6, 2)  # bottom, top of 32 (the modular-training paper's [C])
PAPER_SWAP = (5, 2, 0)  # bottom, top, transition of 32 (the layer-swapping paper's default)
SWAP_GRID = ((3, 4, 5), (0, 1, 2), (0, 1, 2))


def scaled(n: int, depth: int) -> int:
  """n layers of the papers' 32, scaled to `depth` blocks and rounded up."""
  return math.ceil(n * depth / PAPER_LAYERS)


def paper_swap(depth: int) -> str:
  return ",".join(str(scaled(n, depth)) for n in PAPER_SWAP)


def swaps(depth: int) -> tuple[str, ...]:
  """The paper's swap first, then the scaled grid (each distinct spec once) that fits the depth."""
  grid = [paper_swap(depth)]
  for b in SWAP_GRID[0]:
    for u in SWAP_GRID[1]:
      for t in SWAP_GRID[2]:
        b_, u_, t_ = scaled(b, depth), scaled(u, depth), scaled(t, depth)
        # t blocks of transition on each side of the middle (testbed: lower and upper)
        if b_ + u_ + 2 * t_ < depth:
          grid.append(f"{b_},{u_},{t_}")
  return tuple(dict.fromkeys(grid))


def point(depth: int) -> dict:
  return {"name": f"depth_{depth}", "model.num_layers": depth,
          "partition.bottom": scaled(PARTITION_C[0], depth), "partition.top": scaled(PARTITION_C[1], depth),
          "merge.swaps": swaps(depth)}


def get_config():
  c = merge.get_config()
  c.name = "claims_study"
  c.task = "arithmetic_regimes"
  c.num_seeds = 10  # docs/prereg/claims_study.md: sized for a misread ~10-point gain (the paper's is ~3 points)
  c.regimes = REGIMES
  c.partition.presets = ("C",)
  c.simultaneous.presets = ("C",)
  c.lora.enabled = False
  c.maet_neurons.enabled = False
  c.grid = [point(d) for d in DEPTHS]
  return c
