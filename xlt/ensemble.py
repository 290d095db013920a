"""How a function of one model runs over an ensemble's leading axis E.

xlt trains and decodes several models (seeds, grid cells) in one compiled program; every
leaf of their state has a leading ensemble axis. Two ways to compute over that axis:

  vmap     batch the members: every matmul gains a batch dimension. On GPUs and TPUs this
           is what fills a device that one small model leaves idle.
  map      `lax.map`: members one after another inside one program (one dispatch, plain
           matmuls). On XLA:CPU batched small matmuls are slow: 9 graph models vmapped ran
           about 3x slower than the same 9 stepped separately, while `map` is at least as
           fast as separate steps (`python benchmarks/compare.py --only ensemble`).

`auto` (the default) picks `map` on CPU (each member's step data-parallel over the mesh, as
separate runs would be) and `vmap` elsewhere. `map` runs the very steps that separate runs
would, in one program, so it is not slower than they are on any machine. (Splitting the
members over a CPU's devices instead ran at 0.9-1.05x separate steps, depending on the
machine, and padded members to fill the devices: it was removed; docs/speed.md.)
Results agree to float rounding (tests/test_train.py checks each against separate runs).
"""

from __future__ import annotations

from typing import Callable

import jax

STRATEGIES = ("auto", "vmap", "map")

# Members of a stacked tree by index (an int or an index array), and writing them back: one
# compiled program over the whole tree, not one small op per leaf (eager indexing of every
# leaf was seconds of dispatch in a merge testbed that selects members thousands of times).
take = jax.jit(lambda tree, idx: jax.tree.map(lambda x: x[idx], tree))
put = jax.jit(lambda tree, idx, sub: jax.tree.map(lambda x, y: x.at[idx].set(y), tree, sub))


def resolve(strategy: str = "auto", platform: str | None = None) -> str:
  """"vmap" or "map": `strategy` itself, or for auto the one that suits `platform` (default:
  jax's default backend): map on CPU, vmap elsewhere."""
  if strategy not in STRATEGIES:
    raise ValueError(f"ensemble strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
  if strategy != "auto":
    return strategy
  return "map" if (platform or jax.default_backend()) == "cpu" else "vmap"


def over_members(fn: Callable, strategy: str) -> Callable:
  """`fn(*args)` of one member -> a function of stacked args [E, ...] (every positional
  argument carries the ensemble axis), computed as `strategy` ("vmap" or "map") says."""
  if strategy == "vmap":
    return jax.vmap(fn)
  if strategy == "map":
    return lambda *args: jax.lax.map(lambda a: fn(*a), args)
  raise ValueError(f"over_members needs 'vmap' or 'map', got {strategy!r} (resolve 'auto' first)")
