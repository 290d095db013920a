"""Merges in the singular subspaces of the task vectors: TSV-M (task singular vectors), Iso-C /
Iso-CTS (isotropic merging) and WUDI (each task vector's interference on its own row space). Each a per-tensor function of the registry (xlt.merge.declare),
checked against fusion-bench's implementations by tests/test_merge_subspace.py.

A *matrix* is a tensor of two or more axes, seen as [axis 0, the rest] (a torch / Hugging Face
[out, in] weight is itself, as fusion-bench sees it; TSV-M and Iso-C do not depend on which side
is which, Iso-CTS projects its common space off the axis-0 side); every other tensor (biases,
norm scales) is the mean of the task vectors, as in both papers. They read no names, so they
merge any architecture. The linear algebra runs in float64 (fusion-bench: float32), which changes
results by rounding only. Each method's result is base + alpha * (its merged task vector).

Singular triplets and orthonormal factors come from the eigendecomposition of the Gram matrix on
the matrix's smaller side (one BLAS-3 product, then LAPACK syevd on a min(rows, cols)-square
matrix): about a third of the work of LAPACK's gesdd on the matrix itself (numpy's and torch's
SVD), and the same result up to float64 rounding while the part of the spectrum used stays away
from zero. Where it does not (a rank-deficient task vector, e.g. a LoRA fine-tune's, or stacked
singular vectors that nearly coincide), that matrix takes the SVD itself.
"""

from __future__ import annotations

import numpy as np

from xlt.merge import core, declare
from xlt.param_paths import path_str

_TSV = "Gargiulo et al. 2025, Task Singular Vectors: Reducing Task Interference in Model Merging (TSV-M)"
_ISO = "Marczak et al. 2025, No Task Left Behind: Isotropic Model Merging with Common and Task-Specific Subspaces"


# The smallest eigenvalue of a Gram matrix, relative to its largest, for which its eigenvectors
# stand for the SVD. Through the Gram matrix, float64 rounding moves the part of an orthonormal
# factor along singular value s_i by about 1e-16 * (s_1 / s_i)^2, at most 1e-16 / _GRAM_TOL =
# 1e-6 relative; float32's SVD (fusion-bench's) moves it by about 6e-8 * s_1 / s_i, up to 6e-3 here,
# so this path is never less accurate than the reference. Exact zeros (a rank-deficient matrix)
# sit at float64 rounding, about 1e-16, below the bound, and take the SVD.
_GRAM_TOL = 1e-10


def _gram_eigh(x):
  """(eigenvalues descending, their eigenvectors as columns, wide) of x x^T if x is wide (rows <=
  cols) else of x^T x."""
  wide = x.shape[0] <= x.shape[1]
  lam, q = np.linalg.eigh(x @ x.T if wide else x.T @ x)
  return lam[::-1], q[:, ::-1], wide


def _top_triplets(x, k: int):
  """x's k largest singular triplets (u [rows, k], s [k], vt [k, cols]); k <= min(rows, cols)."""
  if k == 0:
    return np.zeros((x.shape[0], 0)), np.zeros(0), np.zeros((0, x.shape[1]))
  lam, q, wide = _gram_eigh(x)
  if not lam[0] > 0 or lam[k - 1] < _GRAM_TOL * lam[0]:
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    return u[:, :k], s[:k], vt[:k]
  s, q = np.sqrt(lam[:k]), q[:, :k]
  return (q, s, (q.T @ x) / s[:, None]) if wide else ((x @ q) / s, s, q.T)


def _polar_factors(x):
  """((a, b), S) with a @ b = U V^T for x = U S V^T: the nearest matrix with orthonormal columns
  (rows, for a wide x), how both papers decorrelate stacked singular vectors, as two factors
  (x and (x^T x)^(-1/2), so a caller's product can take the cheaper order), and x's singular
  values."""
  lam, q, wide = _gram_eigh(x)
  if not lam[0] > 0 or lam[-1] < _GRAM_TOL * lam[0]:
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    return (u, vt), s
  s = np.sqrt(lam)
  inverse_root = (q / s) @ q.T  # (x x^T)^(-1/2), or (x^T x)^(-1/2)
  return ((inverse_root, x) if wide else (x, inverse_root)), s


def _pair_inverse_root(a, b):
  """(X^T X)^(-1/2) for X = [a b], a and b each with orthonormal columns, from the SVD of the
  small a^T b = P diag(c) Q^T (c: the cosines of their principal angles; X^T X's eigenvalues are
  1 +- c): TSV-M's two-expert case, a k-square SVD instead of a 2k-square eigendecomposition.
  None where the two spans nearly share a direction (the general path decides)."""
  if a.shape[1] != b.shape[1]:
    return None
  p, c, qt = np.linalg.svd(a.T @ b)
  if 1 - c[0] < _GRAM_TOL * (1 + c[0]):
    return None
  plus_root, minus_root = 1 / np.sqrt(1 + c), 1 / np.sqrt(1 - c)
  same, cross = (plus_root + minus_root) / 2, (plus_root - minus_root) / 2
  q = qt.T
  return np.block([[(p * same) @ p.T, (p * cross) @ qt], [(q * cross) @ p.T, (q * same) @ qt]])


def _polar(x) -> np.ndarray:
  a, b = _polar_factors(x)[0]
  return a @ b


def _task_vectors(base, experts):
  b = core.as_compute(base)
  return b, [core.as_compute(x) - b for x in experts]


def _matrix_merge(b, tvs, merge_rows):
  """merge_rows([task vectors as [axis 0, rest] float64]) in the tensor's shape for a matrix,
  else None (the caller takes the mean task vector)."""
  if b.ndim < 2:
    return None
  return merge_rows([t.reshape(t.shape[0], -1).astype(np.float64) for t in tvs]).reshape(b.shape).astype(b.dtype)


def _alpha(_, *, alpha: float, **options):
  if not np.isfinite(alpha):
    raise ValueError(f"alpha must be a finite number, got {alpha}")
  if "exclude_keys" in options:
    options["exclude_keys"] = _names(options["exclude_keys"])
  return {"alpha": alpha, **options}


def _names(keys) -> tuple[str, ...]:
  """exclude_keys as a tuple of tensor names: a list, or a comma-separated string (the command line)."""
  return tuple(k for k in keys.split(",") if k) if isinstance(keys, str) else tuple(keys or ())


@declare.per_tensor("tsv_m", ("base", "experts+"), paper=_TSV, prepare=_alpha)
def tsv_m(base, experts, *, alpha: float = 1.0, exclude_keys: tuple = (), path=()):
  """TSV-M (Gargiulo et al. 2025): each task vector's top singular vectors, stacked and
  decorrelated, per matrix.

  For T experts and a matrix of rank bound r = min(rows, cols), each task vector keeps its k =
  int(r * (1 / T)) largest singular triplets (U_i, S_i, V_i); the U_i side by side and the V_i
  stacked are each replaced by their nearest orthonormal matrix (U V^T of their SVD), and the
  merged task vector is U_perp diag(S_1..S_T) V_perp. With r < T no triplet fits (k = 0) and the
  matrix stays at the base. Other tensors take the mean task vector.

  alpha: the scale of the merged task vector (the paper's alpha, 1.0 by default, tuned on
    validation data there).
  exclude_keys: tensor names that take the mean task vector instead (fusion-bench's
    exclude_keys, e.g. the embeddings and head); a comma-separated string on the command line.
  """
  b, tvs = _task_vectors(base, experts)
  if path_str(path) in exclude_keys:
    return b + alpha * (sum(tvs) / len(tvs))

  def merge_rows(rows):
    k = int(min(rows[0].shape) * (1 / len(rows)))  # fusion-bench's expression, to its rounding
    if k == 0:
      return np.zeros_like(rows[0])
    svds = [_top_triplets(r, k) for r in rows]
    u = np.concatenate([u for u, _, _ in svds], axis=1)
    s = np.concatenate([s for _, s, _ in svds])
    vt = np.concatenate([vt for _, _, vt in svds], axis=0)
    root_u = _pair_inverse_root(svds[0][0], svds[1][0]) if len(svds) == 2 else None
    root_v = _pair_inverse_root(svds[0][2].T, svds[1][2].T) if len(svds) == 2 else None
    u1, u2 = (u, root_u) if root_u is not None else _polar_factors(u)[0]
    v1, v2 = (root_v, vt) if root_v is not None else _polar_factors(vt)[0]
    return np.linalg.multi_dot([u1, u2 * s, v1, v2])

  merged = _matrix_merge(b, tvs, merge_rows)
  return b + alpha * (sum(tvs) / len(tvs) if merged is None else merged)


@declare.per_tensor("iso_c", ("base", "experts+"), paper=_ISO + " (Iso-C)", prepare=_alpha)
def iso_c(base, experts, *, alpha: float = 1.0):
  """Iso-C (Marczak et al. 2025): the sum of the task vectors with a flattened spectrum, per
  matrix: U diag(mean(S)) V^T of the summed task vectors' SVD, so every direction they span
  gets the same weight. Other tensors take the mean task vector.

  alpha: the scale of the merged task vector (the paper's alpha, tuned on validation data;
    1.0 here).
  """
  b, tvs = _task_vectors(base, experts)

  def merge_rows(rows):
    (a, b), s = _polar_factors(sum(rows))
    return (a * s.mean()) @ b if a.shape[0] < b.shape[1] else a @ (b * s.mean())

  merged = _matrix_merge(b, tvs, merge_rows)
  return b + alpha * (sum(tvs) / len(tvs) if merged is None else merged)


def _iso_cts_options(_, *, alpha: float, common_space_fraction: float):
  core.check_range("iso_cts common_space_fraction", common_space_fraction, 0.0, 1.0)
  return _alpha(_, alpha=alpha, common_space_fraction=common_space_fraction)


def _iso_cts_rows(rows, fraction: float):
  """Iso-CTS's merged task vector of one matrix ([rows, rest] task vectors)."""
  n, r = len(rows), min(rows[0].shape)
  # the common space's size, so that the rest divides equally among the tasks
  common = r - round((r - int(r * fraction)) / n) * n
  common = max(common, 0)
  per_task = (r - common) // n
  uc, sc, vtc = _top_triplets(sum(rows), common)
  # each task's top directions outside the common space
  us, ss, vts = zip(*[_top_triplets(w - uc @ (uc.T @ w), per_task) for w in rows])
  u_all = _polar(np.concatenate([*us, uc], axis=1))
  vt_all = _polar(np.concatenate([*vts, vtc], axis=0))
  s_all = np.concatenate([*ss, sc])
  return (u_all * s_all.mean()) @ vt_all


@declare.per_tensor("iso_cts", ("base", "experts+"), paper=_ISO + " (Iso-CTS)", prepare=_iso_cts_options)
def iso_cts(base, experts, *, alpha: float = 1.0, common_space_fraction: float = 0.8):
  """Iso-CTS (Marczak et al. 2025): Iso-C over a common subspace plus each task's own
  directions, per matrix.

  For T experts and rank bound r: the common space is the top c singular vectors of the summed
  task vectors (c = r - round((r - int(r * common_space_fraction)) / T) * T, so the rest splits
  evenly); each task vector, projected off the common space (on its axis-0 side),
  contributes its top (r - c) / T singular triplets; the stacked left and right vectors are
  made orthonormal (U V^T of their SVD) and every direction takes the mean of all the kept
  singular values. Other tensors take the mean task vector.

  alpha: the scale of the merged task vector (the paper's alpha, tuned on validation data;
    1.0 here).
  common_space_fraction: in [0, 1], the share of the rank given to the common space (the
    paper's default 0.8).
  """
  b, tvs = _task_vectors(base, experts)
  merged = _matrix_merge(b, tvs, lambda rows: _iso_cts_rows(rows, common_space_fraction))
  return b + alpha * (sum(tvs) / len(tvs) if merged is None else merged)


_WUDI = ("Cheng et al. 2025, Whoever Started the Interference Should End It: Guiding Data-Free Model Merging "
         "via Task Vectors (WUDI)")


def _wudi_options(_, *, steps: int, lr: float, exclude_keys=()):
  if int(steps) != steps or steps < 0:
    raise ValueError(f"wudi steps must be a non-negative integer, got {steps}")
  if not lr > 0:
    raise ValueError(f"wudi lr must be positive, got {lr}")
  return {"steps": int(steps), "lr": float(lr), "exclude_keys": _names(exclude_keys)}


def _wudi_rows(rows, steps: int, lr: float):
  """WUDI's merged task vector of one matrix: from the sum of the task vectors T_i, `steps` of
  Adam (torch's: betas 0.9, 0.999, eps 1e-8, no weight decay) on
  sum_i |(M - T_i) T_i^T|_F^2 / |T_i|_F^2, whose gradient is sum_i 2 (M - T_i) T_i^T T_i / |T_i|^2."""
  tvs = np.stack(rows)  # [n, out, in]
  norms = np.maximum(np.square(tvs).sum(axis=(1, 2)), 1e-300)[:, None, None]
  m = tvs.sum(axis=0)
  first, second = np.zeros_like(m), np.zeros_like(m)
  for t in range(1, steps + 1):
    grad = (2 * ((m[None] - tvs) @ tvs.transpose(0, 2, 1)) @ tvs / norms).sum(axis=0)
    first = 0.9 * first + 0.1 * grad
    second = 0.999 * second + 0.001 * grad * grad
    m = m - (lr / (1 - 0.9 ** t)) * first / (np.sqrt(second) / np.sqrt(1 - 0.999 ** t) + 1e-8)
  return m


@declare.per_tensor("wudi", ("base", "experts+"), paper=_WUDI, prepare=_wudi_options)
def wudi(base, experts, *, steps: int = 300, lr: float = 1e-5, exclude_keys: tuple = (), path=()):
  """WUDI merging (Cheng et al. 2025), data-free: per matrix, the merged task vector M that
  minimises each task vector's interference on its own input subspace, sum_i |(M - T_i)
  T_i^T|_F^2 / |T_i|_F^2 (the task vectors' rows standing for their tasks' inputs), by Adam from
  the sum of the task vectors, as the authors' and fusion-bench's code do; every other tensor is
  the mean task vector. The result is base + M (no scale).

  steps: Adam's steps (fusion-bench's iter_num, 300).
  lr: Adam's learning rate (1e-5, fixed in fusion-bench and the authors' code).
  exclude_keys: tensor names left to the mean task vector (fusion-bench's exclude_keys, e.g. the
    embeddings and head); a comma-separated string on the command line.

  Cost: each step multiplies every task vector twice ([out, in] x [in, out], [out, out] x
  [out, in]) in float64 on the CPU: 300 steps on a 4096-square weight take minutes.
  """
  b, tvs = _task_vectors(base, experts)
  if path_str(path) in exclude_keys:
    return b + sum(tvs) / len(tvs)
  merged = _matrix_merge(b, tvs, lambda rows: _wudi_rows(rows, steps, lr))
  return b + (sum(tvs) / len(tvs) if merged is None else merged)
