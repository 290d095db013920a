"""Device mesh and the mapping from logical axes to mesh axes.

The mesh has three axes, sized by the config (`mesh.data`, `mesh.fsdp`, `mesh.tensor`;
one of them may be -1 = "all remaining devices"; `mesh.devices` > 0 uses only the first
that many devices, `mesh.cpu_devices` > 0 only each process's first that many when they are
CPU devices):
  data:   batch only (parameters replicated)
  fsdp:   batch, and parameters sharded along `embed`
  tensor: attention heads and MLP width (Megatron-style)
Models train with a leading *ensemble* axis (seeds/cells trained together), which is
never sharded.
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH = ("data", "fsdp")

# logical axis -> mesh axis (None: replicated). Overridable from the config.
DEFAULT_RULES = (
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("qkv", None),
    # the separate k/v kernels' G key/value heads stay replicated: G is often below or not a
    # multiple of the tensor size (1 for multi-query attention) and a rule cannot depend on the
    # model, while the k/v projections are only G/H of the queries' work; the heads repeated
    # to H for attention then follow the queries' tensor sharding
    ("kv_heads", None),
    ("kv", None),
    ("pos", None),
    ("norm", None),
)


def mesh_shape(spec: dict, num_devices: int) -> tuple[int, ...]:
  sizes = [int(spec.get(a, 1)) for a in AXES]  # "devices" and "cpu_devices" are not axes
  if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
    raise ValueError(f"mesh sizes must be positive, with at most one -1; got {dict(zip(AXES, sizes))}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"mesh {dict(zip(AXES, sizes))} does not divide the {num_devices} devices")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(
        f"mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices but {num_devices} are in use")
  return tuple(sizes)


def make_mesh(spec: dict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over `devices` (default: all, or the first `spec["devices"]` when set > 0; on a
  CPU, at most `spec["cpu_devices"]` of each process's when set > 0)."""
  devices = list(devices if devices is not None else jax.devices())
  n = int(spec.get("devices", -1))
  if n > len(devices):
    raise ValueError(f"mesh.devices={n} but only {len(devices)} devices exist")
  devices = devices[:n] if n > 0 else devices
  # xlt.cpu_devices splits a CPU's cores into devices for small models' chains of small ops; a
  # model whose products fill the cores on their own gains less from the split than it pays in
  # the replicated optimizer update, the gradients' all-reduce and a state copy per device.
  # Per process: in a multi-host run every process keeps its first `cpu` devices.
  cpu = int(spec.get("cpu_devices", -1))
  if cpu > 0 and devices[0].platform == "cpu":
    kept, per_process = [], collections.Counter()
    for d in devices:
      per_process[d.process_index] += 1
      if per_process[d.process_index] <= cpu:
        kept.append(d)
    devices = kept
  shape = mesh_shape(spec, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), AXES)


def param_shardings(logical_specs, mesh: Mesh, rules=DEFAULT_RULES, ensemble: bool = True):
  """NamedShardings for parameters (with a leading unsharded ensemble axis)."""
  mesh_specs = nn.logical_to_mesh(logical_specs, list(rules))

  def to_sharding(spec):
    spec = tuple(spec) if spec is not None else ()
    return NamedSharding(mesh, P(*(((None,) if ensemble else ()) + spec)))

  return jax.tree.map(to_sharding, mesh_specs, is_leaf=lambda x: isinstance(x, P) or x is None)


def batch_sharding(mesh: Mesh, ndim: int, ensemble: bool = True) -> NamedSharding:
  """Batch axis over data x fsdp; the ensemble axis (leading) replicated."""
  lead = (None,) if ensemble else ()
  return NamedSharding(mesh, P(*lead, BATCH, *([None] * (ndim - len(lead) - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_ways(mesh) -> int:
  """How many ways a batch is split: the size of the mesh's batch axes (data x fsdp); a Mesh or
  an AbstractMesh."""
  return math.prod(mesh.shape[a] for a in BATCH)


def check_batch(batch_size: int, mesh: Mesh):
  n = batch_ways(mesh)
  if batch_size % n:
    raise ValueError(f"batch size {batch_size} is not divisible by the data x fsdp mesh size {n}")


def check_divisible(shapes, shardings):
  """A clear error (instead of XLA's) when a parameter dim does not split evenly."""
  for (path, shape), sh in zip(jax.tree_util.tree_flatten_with_path(shapes)[0], jax.tree.leaves(shardings)):
    for dim, axis in zip(shape.shape, sh.spec):
      if axis is None:
        continue
      n = math.prod(sh.mesh.shape[a] for a in (axis if isinstance(axis, tuple) else (axis,)))
      if dim % n:
        raise ValueError(
            f"parameter {jax.tree_util.keystr(path)} of shape {shape.shape}: dim {dim} is "
            f"not divisible by mesh axis {axis} of size {n}")


def _mesh_of(tree) -> Mesh | None:
  """The mesh the first leaf of `tree` is laid out on, or None (host array, one device)."""
  sh = getattr(jax.tree.leaves(tree)[0], "sharding", None)
  return sh.mesh if isinstance(sh, NamedSharding) and sh.mesh.size > 1 else None


def replicated_mesh(tree) -> Mesh | None:
  """The mesh of several devices that every leaf of `tree` is replicated over, or None."""
  mesh = _mesh_of(tree)
  if mesh is None or not all(getattr(x, "sharding", None) is not None and x.sharding.is_fully_replicated
                             for x in jax.tree.leaves(tree)):
    return None
  return mesh


def devices_of(tree) -> int:
  """How many devices `spread` splits rows over for pytree `tree`: its mesh's size, else 1."""
  mesh = _mesh_of(tree)
  return mesh.size if mesh is not None else 1


def spread(x: np.ndarray, like, axis: int):
  """Host array `x` (the same on every process) as a global array whose `axis` is split over
  every device of the mesh that pytree `like` (e.g. parameters) lives on, or `x` itself when
  `like` is on one device or not on a mesh.

  Why: jit of parameters replicated over several devices and a host array computes the whole
  thing on every device, once per device (on a CPU whose cores are devices, xlt.cpu_devices,
  that is the same work on each core); with the rows spread, each device computes its share.
  `x.shape[axis]` must be divisible by the mesh size (`round_up` the batch)."""
  mesh = _mesh_of(like)
  if mesh is None:
    return x
  if x.shape[axis] % mesh.size:
    raise ValueError(f"axis {axis} of shape {x.shape} does not split over {mesh.size} devices")
  spec = [None] * x.ndim
  spec[axis] = tuple(mesh.axis_names)
  return jax.make_array_from_callback(x.shape, NamedSharding(mesh, P(*spec)), lambda idx: x[idx])


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
