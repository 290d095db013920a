"""How a function of one model runs over an ensemble's leading axis E.

xlt trains and decodes several models (seeds, grid cells) in one compiled program; every
leaf of their state has a leading ensemble axis. Three ways to compute over that axis:

  vmap     batch the members: every matmul gains a batch dimension. On GPUs and TPUs this
           is what fills a device that one small model leaves idle.
  map      `lax.map`: members one after another inside one program (one dispatch, plain
           matmuls). On XLA:CPU batched small matmuls are slow: 9 graph models vmapped ran
           about 3x slower than the same 9 stepped separately, while `map` is at least as
           fast as separate steps (`python benchmarks/compare.py --only ensemble`).
  devices  the members split over the mesh's devices (member e on device e mod n), each
           device `map`s over its own with the whole batch, then the results are gathered:
           independent work per core instead of data-parallel steps of every member. It
           needs a mesh of data parallelism only (parameters replicated) and one process.

`auto` (the default) picks `map` on CPU (each member's step data-parallel over the mesh, as
separate runs would be) and `vmap` elsewhere. Why not `devices` on a CPU of several devices
(xlt.cpu_devices): whether it pays depends on the machine, and where it does not, it is slower
than separate runs. With 9 graph models on 2 devices (`python benchmarks/ensemble_strategies.py
--rounds 3 --steps 15`), devices ran at about 0.9x the member-steps/s of separate steps on a
2-core AMD EPYC with AVX2 and about 1.05x on an AVX-512 EPYC. `map` runs the very steps that
separate runs would, in one program, so it is not slower than they are on any machine;
and `devices` also pads: 9 members on 2 devices compute 10 (one device repeats a member), and
members that stop early leave more such gaps. `devices` stays available by name
(`--config.train.ensemble=devices`).
Results agree to float rounding (tests/test_train.py checks each against separate runs).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

STRATEGIES = ("auto", "vmap", "map", "devices")

# Members of a stacked tree by index (an int or an index array), and writing them back: one
# compiled program over the whole tree, not one small op per leaf (eager indexing of every
# leaf was seconds of dispatch in a merge testbed that selects members thousands of times).
take = jax.jit(lambda tree, idx: jax.tree.map(lambda x: x[idx], tree))
put = jax.jit(lambda tree, idx, sub: jax.tree.map(lambda x, y: x.at[idx].set(y), tree, sub))


def why_not_devices(mesh, members: int) -> str | None:
  """Why `devices` cannot run `members` members on `mesh` (None: it can)."""
  if mesh is None:
    return "it needs a mesh"
  n = mesh.devices.size
  if n < 2:
    return "the mesh has one device"
  if mesh.shape.get("data", 1) != n:
    return f"the mesh {dict(mesh.shape)} shards parameters (it needs every device on the data axis)"
  if members < n:
    return f"{members} members are fewer than the mesh's {n} devices"
  if jax.process_count() > 1:
    return "it runs in one process only"
  return None


def resolve(strategy: str = "auto", platform: str | None = None, *, mesh=None,
            members: int | None = None) -> str:
  """"vmap", "map" or "devices": `strategy` itself (checked against `mesh` and `members`
  for devices), or for auto the one that suits `platform` (default: jax's default backend):
  map on CPU, vmap elsewhere."""
  if strategy not in STRATEGIES:
    raise ValueError(f"ensemble strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
  if strategy == "devices":
    why = why_not_devices(mesh, members or 0)
    if why:
      raise ValueError(f"ensemble strategy 'devices' cannot run here: {why}")
  if strategy != "auto":
    return strategy
  return "map" if (platform or jax.default_backend()) == "cpu" else "vmap"


def over_members(fn: Callable, strategy: str, mesh=None) -> Callable:
  """`fn(*args)` of one member -> a function of stacked args [E, ...] (every positional
  argument carries the ensemble axis), computed as `strategy` ("vmap", "map", or "devices"
  over `mesh`, inside a jit whose arguments and results are replicated) says."""
  if strategy == "vmap":
    return jax.vmap(fn)
  if strategy == "map":
    return lambda *args: jax.lax.map(lambda a: fn(*a), args)
  if strategy == "devices":
    return _over_devices(fn, mesh)
  raise ValueError(f"over_members needs 'vmap', 'map' or 'devices', got {strategy!r} (resolve 'auto' first)")


def _over_devices(fn: Callable, mesh) -> Callable:
  n = mesh.devices.size

  def run(*args):
    e = jax.tree.leaves(args)[0].shape[0]
    k = -(-e // n)  # members per device; the last devices repeat member E-1 to fill up

    def body(*local):  # every device holds every member's args (replicated)
      d = jax.lax.axis_index(mesh.axis_names)
      mine = jnp.minimum(d + n * jnp.arange(k), e - 1)
      out = over_members(fn, "map")(*jax.tree.map(lambda x: x[mine], local))
      every = jax.lax.all_gather(out, mesh.axis_names)  # [n, k, ...]: device d's j-th is member d + n j
      return jax.tree.map(lambda g: jnp.swapaxes(g, 0, 1).reshape(n * k, *g.shape[2:])[:e], every)

    # check_vma off: the results are the same on every device by construction (all_gather),
    # which the checker cannot see through the member index taken from axis_index.
    return jax.shard_map(body, mesh=mesh, in_specs=tuple(P() for _ in args), out_specs=P(),
                         check_vma=False)(*args)

  return run
