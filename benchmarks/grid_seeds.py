"""End to end: K seeds of an experiment trained together (one compiled step over the ensemble,
xlt.ensemble) versus the same K seeds run one after the other, each its own `xlt.main` experiment.

  python benchmarks/grid_seeds.py                                   # graph.py, K=3, 300 steps
  python benchmarks/grid_seeds.py --config configs/addition.py:cpu --seeds 3 --steps 500

Both sides do the same work: the same cells, steps, evaluations and test decoding, with early
stopping off (min_steps = steps) so neither side ends sooner. Wall time includes compilation,
data building, evaluation and checkpoints, as a user would wait for it. Reports the wall time
of each side and the speedup; `--workdir` keeps the runs (default: a temporary directory).
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import importlib.util  # noqa: E402

from xlt import runner  # noqa: E402  (after the path fix above)


def load(spec: str, seeds: int, first_seed: int, steps: int):
  path, _, arg = spec.partition(":")
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(arg) if arg else module.get_config()
  c.seed, c.num_seeds = first_seed, seeds
  c.train.steps = c.train.min_steps = steps
  c.train.checkpoint_every = steps
  return c


def timed(c, workdir: str) -> float:
  t0 = time.perf_counter()
  runner.run(c, workdir, progress=False)
  return time.perf_counter() - t0


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--config", default="configs/graph.py")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--workdir", default="")
  a = p.parse_args()
  root = a.workdir or tempfile.mkdtemp(prefix="xlt_grid_bench_")
  together = timed(load(a.config, a.seeds, 0, a.steps), os.path.join(root, "together"))
  separate = [timed(load(a.config, 1, s, a.steps), os.path.join(root, f"seed_{s}"))
              for s in range(a.seeds)]
  out = {"config": a.config, "seeds": a.seeds, "steps": a.steps,
         "together_s": round(together, 1), "one_after_another_s": round(sum(separate), 1),
         "per_seed_s": [round(s, 1) for s in separate],
         "speedup": round(sum(separate) / together, 2), "workdir": root}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
