"""The linear solvers of `hijax.implicit` (`Dense`, `CG`, `GMRES`) and
`MatMul`, the matvec that says it is a matrix.

A linear solver is called as ``solver(matvec, b)``, ``matvec`` a function of a
pytree like ``b``, and returns ``(x, Status)``; every one checks the residual
of the ``x`` it returns, so a wrong solution is reported, not returned.
Each is a frozen dataclass, so that it is hashable and can be a static
parameter of a primitive; its fields are its options.

Narrow floats (bfloat16, float16) are solved in float32 and rounded back: the
factorizations of ``jnp.linalg`` do not take them.
"""
from __future__ import annotations

from typing import Any

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.scipy.linalg  # noqa: F401  (lu_factor, lu_solve)
import jax.scipy.sparse.linalg  # noqa: F401  (gmres)
from jax.flatten_util import ravel_pytree

from hijax.implicit._status import (CONVERGED, MAX_ITER, NONFINITE, NOT_SPD,
                                    Status, _across_batch, default_tol,
                                    status)

__all__ = ["Dense", "CG", "GMRES", "MatMul", "flat_problem"]


def _work_dtype(dtype: Any) -> Any:
  """The dtype linear algebra is done in: float32 for narrower floats."""
  if jnp.finfo(dtype).bits < 32:
    return jnp.dtype(jnp.float32)
  return jnp.dtype(dtype)


def _working(a: Any) -> Any:
  """``a`` in the dtype linear algebra is done in (float32 for narrower)."""
  work = _work_dtype(a.dtype)
  return a if a.dtype == work else a.astype(work)


def flat_problem(matvec: Callable, b: Any) -> Any:
  """``b`` as one vector in the working dtype, the matvec on such vectors and
  the map back to ``b``'s pytree and dtypes."""
  b_flat, unravel = ravel_pytree(b)
  dtype = b_flat.dtype
  work = _work_dtype(dtype)

  def flat_matvec(v: Any) -> Any:
    return ravel_pytree(matvec(unravel(v.astype(dtype))))[0].astype(work)
  return b_flat.astype(work), flat_matvec, lambda v: unravel(v.astype(dtype))


def krylov_tol(dtype: Any) -> float:
  """The default ``tol`` of `CG` and `GMRES`: 1e-10 for 64-bit unknowns (the
  relative residual of an ill-conditioned system, e.g. the 8x8 Hilbert
  matrix, stops near 1e-12), `default_tol` otherwise."""
  return 1e-10 if jnp.finfo(dtype).bits == 64 else default_tol(dtype)


def _tol(tol: Any, b_flat: Any) -> float:
  return krylov_tol(b_flat.dtype) if tol is None else tol


def _norm(v: Any) -> Any:
  return jnp.sqrt(jnp.sum(jnp.abs(v) ** 2)).astype(jnp.float32)


def _norms(*vectors: Any) -> Any:
  """The 2-norms of equally long vectors, as float32, in one reduction (on
  CPU, each of XLA's reductions costs more than the arithmetic in it)."""
  stacked = jnp.stack(vectors)
  squares = jnp.real(jnp.einsum("ij,ij->i", jnp.conj(stacked), stacked))
  return tuple(jnp.sqrt(squares).astype(jnp.float32))


def _residual_status(flat_matvec: Any, x: Any, b: Any, tol: Any, atol: Any, steps: Any, reason: Any=None) -> Any:
  """The Status of ``x`` for ``A x = b``: converged when finite and
  ``|b - A x|_2 <= max(tol |b|_2, atol)``; ``error`` is the relative
  residual ``|b - A x|_2 / |b|_2``."""
  # xn is NaN or inf when x is not finite
  r, bn, xn = _norms(b - flat_matvec(x), b, x)
  ok = jnp.isfinite(r) & jnp.isfinite(xn) & (
      r <= jnp.maximum(tol * bn, atol))
  code = jnp.where(ok, CONVERGED, jnp.where(jnp.isfinite(r), MAX_ITER,
                                            NONFINITE))
  if reason is not None:
    code = jnp.where(reason == CONVERGED, code, reason)
  return status(code, steps, r / jnp.where(bn > 0, bn, 1.))


# --- Dense --------------------------------------------------------------------

_LAZY_NORM = 64 * 64  # from this size, Dense reads |A| only when needed


def _norm_inf(matrix: Any, transpose: bool) -> Any:
  """``|A|_inf``, the largest row sum of ``|A|`` (``|A.T|_inf``: the largest
  column sum). Summed by a matrix-vector product: on CPU, XLA's reduction of
  the matrix costs more than the rest of the check together, the product a
  fraction of it."""
  abs_matrix = jnp.abs(matrix)
  ones = jnp.ones(matrix.shape[0], abs_matrix.dtype)
  return jnp.max(ones @ abs_matrix if transpose else abs_matrix @ ones,
                 initial=0.)


def _matrix(flat_matvec: Callable, b_flat: Any) -> Any:
  """The matrix of ``flat_matvec``: one matvec per unknown, under ``vmap``
  (a single matvec for one unknown)."""
  n = b_flat.size
  if n == 1:
    return flat_matvec(jnp.ones_like(b_flat)).reshape(1, 1)
  eye = jnp.eye(n, dtype=b_flat.dtype)
  return jax.vmap(flat_matvec, out_axes=1)(eye)


@dataclasses.dataclass(frozen=True)
class Dense:
  """Direct solver: materializes the matrix (one ``matvec`` per unknown,
  vectorized with ``vmap``) and factorizes it (LU, ``jnp.linalg.solve``); a
  system of one unknown is a division. Exact and robust for small to medium
  systems; memory grows with the square of the size.

  ``tol`` bounds the backward error: the solve fails unless the solution is
  finite and ``|b - A x|_inf <= tol (|A|_inf |x|_inf + |b|_inf)``. None means
  the square root of the machine epsilon of the working dtype (3e-4 in float32,
  1.5e-8 in float64), which a backward-stable factorization meets by far: it
  fails for singular matrices, not for ill-conditioned ones.
  """
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None

  def __call__(self, matvec: Callable, b: Any) -> Any:
    b_flat, flat_matvec, unravel = flat_problem(matvec, b)
    x, st = self.solve_matrix(_matrix(flat_matvec, b_flat), b_flat)
    return unravel(x), st

  def solve_transposed(self, matvec: Callable, b: Any) -> Any:
    """Solves ``A.T x = b``, where ``matvec`` computes ``A v`` (``v`` with
    the structure of ``b``): builds ``A`` itself, not its transpose, so that
    a program that also solves with ``A`` (a solve and its gradient, or the
    tangent and cotangent systems of a root in an HVP) builds and factorizes
    one matrix, which XLA computes once. Returns ``(x, Status)``."""
    b_flat, flat_matvec, unravel = flat_problem(matvec, b)
    matrix = _matrix(flat_matvec, b_flat)
    x, st = self.solve_factored(matrix, self.factor(matrix), b_flat, True)
    return unravel(x), st

  def _check(self, matrix: Any, x: Any, b: Any, transpose: bool = False) -> Any:
    """The backward-error check of ``x`` for ``matrix @ x = b`` (or, with
    ``transpose``, ``matrix.T @ x = b``, read from ``matrix`` without making
    its transpose: XLA on CPU copies ``matrix.T`` and runs ``matrix.T @ x``
    as a slow loop, while ``x @ matrix`` is a fast vector-matrix product)."""
    eps = float(jnp.finfo(matrix.dtype).eps)
    tol = eps ** 0.5 if self.tol is None else self.tol
    if x.size == 1:  # elementwise: under vmap, no batch of 1x1 products
      a = matrix.reshape(())
      r, x_max, b_max = (jnp.abs(v).reshape(()) for v in (b - a * x, x, b))
      scale = jnp.abs(a) * x_max + b_max
      finite = jnp.isfinite(x_max) & jnp.isfinite(r)
      ok = finite & (r <= tol * scale)
    else:
      ax = x @ matrix if transpose else matrix @ x
      # the maxima in one reduction; a NaN or inf in x shows in its max
      r, x_max, b_max, ax_max = jnp.max(
          jnp.stack([jnp.abs(b - ax), jnp.abs(x), jnp.abs(b), jnp.abs(ax)]),
          axis=1, initial=0.)
      scale = _norm_inf(matrix, transpose) * x_max + b_max
      finite = jnp.isfinite(x_max) & jnp.isfinite(r)
      if matrix.size < _LAZY_NORM:
        ok = finite & (r <= tol * scale)
      else:
        # |A x| <= |A| |x|, so a residual within tol (|A x| + |b|) meets the
        # bound whatever |A| is: the pass over |A| (as long as the residual
        # itself) is made only when some instance of a batch needs it. The
        # verdict is the same; `scale` is computed for the Status's error,
        # which XLA drops when nothing reads it.
        easy = finite & (r <= tol * (ax_max + b_max))
        ok = easy | jax.lax.cond(
            _across_batch(~easy, "any"),
            lambda: finite & (r <= tol * (_norm_inf(matrix, transpose) * x_max
                                          + b_max)),
            lambda: jnp.zeros_like(easy))
    code = jnp.where(ok, CONVERGED, jnp.where(finite, MAX_ITER, NONFINITE))
    return status(code, 1, r / jnp.where(scale > 0, scale, 1.))

  def solve_matrix(self, matrix: Any, b: Any) -> tuple[jax.Array, Status]:
    """Solves ``matrix @ x = b`` for a vector ``b``; returns ``(x, Status)``."""
    dtype = b.dtype
    matrix, b = _working(matrix), _working(b)
    if b.size == 1:
      x = b / matrix[0, 0]
    else:
      x = jnp.linalg.solve(matrix, b)
    return x.astype(dtype), self._check(matrix, x, b)

  def factor(self, matrix: Any) -> Any:
    """The LU factorization of ``matrix``, for `solve_factored`."""
    matrix = _working(matrix)
    if matrix.shape[0] == 1:
      return matrix, None
    return jax.scipy.linalg.lu_factor(matrix)

  def solve_factored(self, matrix: Any, factors: Any, b: Any, transpose: bool) -> Any:
    """Solves ``matrix @ x = b`` (or ``matrix.T @ x = b``) with the factors
    of `factor`; returns ``(x, Status)``."""
    dtype = b.dtype
    matrix, b = _working(matrix), _working(b)
    if b.size == 1:
      x = b / matrix[0, 0]
    else:
      x = jax.scipy.linalg.lu_solve(factors, b, trans=int(transpose))
    return x.astype(dtype), self._check(matrix, x, b, transpose)


# --- CG -----------------------------------------------------------------------

def _probe(b: Any) -> Any:
  """A fixed vector unlike ``b``, to test the matrix with."""
  i = jnp.arange(b.size, dtype=jnp.float32)
  return jnp.cos(1.0 + 2.3 * i).astype(b.dtype)


@dataclasses.dataclass(frozen=True)
class CG:
  """Conjugate gradients, matrix-free, for symmetric (Hermitian) positive
  definite systems.

  ``tol`` bounds the relative residual: the solve fails unless
  ``|b - A x|_2 <= max(tol |b|_2, atol)``, checked on the true residual of the
  returned ``x``; None means 1e-10 for 64-bit and 1e-6 for 32-bit unknowns
  (`krylov_tol`).
  ``maxiter`` (None: 10 times the number of unknowns) bounds the iterations.

  With ``check=True`` (the default), two extra matvecs test the matrix on two
  vectors (``b`` and a fixed probe): it must be symmetric on them
  (``u.A v == v.A u`` to the square root of eps) and positive
  (``u.A u > 0``). This catches a non-symmetric or negative definite matrix
  before CG returns a wrong answer, but is a necessary condition only: an
  indefinite matrix that passes it makes CG fail to converge, which the
  residual check reports.
  """
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None
  atol: float = 0.0
  maxiter: int | None = None
  check: bool = True

  def __call__(self, matvec: Callable, b: Any) -> Any:
    b_flat, A, unravel = flat_problem(matvec, b)
    tol = _tol(self.tol, b_flat)
    maxiter = 10 * b_flat.size if self.maxiter is None else self.maxiter
    reason = jnp.int32(CONVERGED)
    if self.check:
      reason = jnp.where(self._spd_on_probes(A, b_flat), CONVERGED, NOT_SPD)
    x, steps = _cg(A, b_flat, tol, self.atol, maxiter)
    return unravel(x), _residual_status(A, x, b_flat, tol, self.atol, steps,
                                        reason)

  @staticmethod
  def _spd_on_probes(A: Any, b: Any) -> Any:
    u = b / jnp.where(_norm(b) > 0, _norm(b), 1.).astype(b.dtype)
    u = jnp.where(_norm(b) > 0, u, _probe(b) * 0.5)
    probes = jnp.stack([u, _probe(b)])
    # one batched matvec, a 2x2 Gram matrix and one reduction for the four
    # norms, instead of two matvecs and six vector reductions:
    # gram[i, j] = <probe_i, A probe_j>
    images = jax.vmap(A)(probes)
    gram = jnp.conj(probes) @ images.T
    norms = _norms(*probes, *images)  # |u|, |v|, |Au|, |Av|
    eps = float(jnp.finfo(b.dtype).eps)
    scale = norms[0] * norms[3] + norms[1] * norms[2]
    symmetric = jnp.abs(gram[0, 1] - jnp.conj(gram[1, 0])) <= eps ** 0.5 * scale
    positive = (jnp.real(gram[0, 0]) > 0) & (jnp.real(gram[1, 1]) > 0)
    return symmetric & positive


def _cg(A: Any, b: Any, tol: Any, atol: Any, maxiter: Any) -> Any:
  """Plain conjugate gradients from zero; returns ``(x, steps)``."""
  bound = jnp.maximum(tol * _norm(b), atol) ** 2
  rr0 = jnp.real(jnp.vdot(b, b))

  def cond(c: Any) -> Any:
    k, _, r, _, rr = c
    return (k < maxiter) & (rr > bound) & jnp.isfinite(rr)

  def body(c: Any) -> Any:
    k, x, r, p, rr = c
    Ap = A(p)
    alpha = rr / jnp.vdot(p, Ap)
    x = x + alpha * p
    r = r - alpha * Ap
    rr_new = jnp.real(jnp.vdot(r, r))
    p = r + (rr_new / rr) * p
    return k + 1, x, r, p, rr_new

  init = (jnp.int32(0), jnp.zeros_like(b), b, b, rr0)
  k, x, *_ = jax.lax.while_loop(cond, body, init)
  return x, k


# --- GMRES --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GMRES:
  """GMRES (``jax.scipy.sparse.linalg.gmres`` with the "incremental" method,
  which stays accurate on ill-conditioned systems), matrix-free, for general
  systems. ``restart`` is capped at the number of unknowns. ``tol`` and
  ``atol`` bound the relative residual, checked as for `CG`; ``steps`` in
  the Status is the bound on restarts, since JAX's GMRES does not count."""
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None
  atol: float = 0.0
  restart: int = 20
  maxiter: int | None = None

  def __call__(self, matvec: Callable, b: Any) -> Any:
    b_flat, A, unravel = flat_problem(matvec, b)
    tol = _tol(self.tol, b_flat)
    restart = max(1, min(self.restart, b_flat.size))
    maxiter = 10 * b_flat.size if self.maxiter is None else self.maxiter
    x, _ = jax.scipy.sparse.linalg.gmres(
        A, b_flat, tol=tol, atol=self.atol, restart=restart, maxiter=maxiter,
        solve_method="incremental")
    return unravel(x), _residual_status(A, x, b_flat, tol, self.atol,
                                        maxiter)


# --- a matvec that is a matrix ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MatMul:
  """The matvec ``x -> A @ x`` with the matrix ``A`` as ``params``:
  ``linear_solve(MatMul(), b, A)`` solves ``A x = b`` for a vector ``b``.

  Unlike a matvec function, it says that its params *are* the matrix, so
  `Dense` uses ``A`` as it is (no matrix built from matvecs) and factorizes
  it once: the transposed solve of reverse mode reuses the LU factors of the
  forward solve. Other solvers use it as a matvec.
  """

  def __call__(self, x: Any, A: Any) -> Any:
    return A @ x

  def __repr__(self) -> Any:
    return "MatMul()"

