"""`Dense`, the direct linear solver of `hijax.implicit`: the matrix built
from matvecs (or handed over), factorized by LU, and each solution checked
by its backward error (``_backward_error``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg  # noqa: F401  (lu_factor, lu_solve)
import numpy as np

from hijax.implicit._backward_error import backward_error, code_of
from hijax.implicit._linear import (empty_solution, flat_problem,
                                    working)
from hijax.implicit import _precision
from hijax.implicit._status import CONVERGED, Status, status

__all__ = ["Dense"]


def _matrix(flat_matvec: Callable, b_flat: Any) -> Any:
  """The matrix of ``flat_matvec``: one matvec per unknown, under ``vmap``
  (a single matvec for one unknown)."""
  n = b_flat.size
  if n == 1:
    return flat_matvec(jnp.ones_like(b_flat)).reshape(1, 1)
  # a NumPy constant: jnp.eye is a kernel of its own for XLA to compile
  eye = np.eye(n, dtype=b_flat.dtype)
  return jax.vmap(flat_matvec, out_axes=1)(eye)


def _no_lu_here(dtype: Any) -> None:
  """Refuses a factorization the backend cannot do: a TPU has no LU in
  float64 (XLA's "Only F32 and C64 types are implemented in
  LuDecomposition", raised when the program is compiled)."""
  if _precision.backend() == "tpu" and jnp.dtype(dtype) in (jnp.float64,
                                                  jnp.complex128):
    raise NotImplementedError(
        f"hijax.implicit Dense: a TPU has no {jnp.dtype(dtype).name} LU "
        "factorization (XLA implements LuDecomposition there in float32 and "
        "complex64 only), which Dense needs for a system of 2 or more "
        "unknowns. Solve in float32 (cast the arguments, or turn "
        "jax_enable_x64 off), use a matrix-free solver (GMRES() or CG(); "
        "float64 arithmetic is emulated on a TPU, and slow), or run the "
        "solve on the CPU: with jax.default_device(jax.devices('cpu')[0])")


@dataclasses.dataclass(frozen=True)
class Dense:
  """Direct solver: materializes the matrix (one ``matvec`` per unknown,
  vectorized with ``vmap``) and factorizes it (LU, ``jnp.linalg.solve``); a
  system of one unknown is a division. Exact and robust for small to medium
  systems; memory grows with the square of the size. (On a TPU, a system of
  2 or more unknowns in float64 is refused: XLA has no float64 LU there.)

  ``tol`` bounds the backward error: the solve fails unless the solution is
  finite and ``|b - A x|_inf <= tol (|A|_inf |x|_inf + |b|_inf)``. None means
  the square root of the machine epsilon of the working dtype (3e-4 in float32,
  1.5e-8 in float64), which a backward-stable factorization meets by far: it
  fails for singular matrices, not for ill-conditioned ones. Many
  right-hand sides of one matrix (``vmap`` over ``b``, ``jacfwd``,
  ``jacrev``) are checked together by a random sketch, with the per-column
  check where it flags (``hijax/implicit/_backward_error.py`` says why a
  wrong column is still caught).

  The matrix built from matvecs, and the products of the check, are exact
  to the dtype on any backend (``"highest"`` matmul precision where the
  default is coarser, as on a TPU).
  """
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None

  def __call__(self, matvec: Callable, b: Any) -> Any:
    b_flat, flat_matvec, unravel = flat_problem(matvec, b, "check")
    if not b_flat.size:
      return empty_solution(b_flat, unravel)
    x, st = self.solve_matrix(_matrix(flat_matvec, b_flat), b_flat)
    return unravel(x), st

  def solve_transposed(self, matvec: Callable, b: Any) -> Any:
    """Solves ``A.T x = b``, where ``matvec`` computes ``A v`` (``v`` with
    the structure of ``b``): builds ``A`` itself, not its transpose, so that
    a program that also solves with ``A`` (a solve and its gradient, or the
    tangent and cotangent systems of a root in an HVP) builds and factorizes
    one matrix, which XLA computes once. Returns ``(x, Status)``."""
    b_flat, flat_matvec, unravel = flat_problem(matvec, b, "check")
    if not b_flat.size:
      return empty_solution(b_flat, unravel)
    matrix = _matrix(flat_matvec, b_flat)
    x, st = self.solve_factored(matrix, self.factor(matrix), b_flat, True)
    return unravel(x), st

  def _check(self, matrix: Any, x: Any, b: Any, transpose: bool = False,
             quotient: bool = False) -> Any:
    """The backward-error check of ``x`` for ``matrix @ x = b`` (or, with
    ``transpose``, ``matrix.T @ x = b``, read from ``matrix`` without making
    its transpose: XLA on CPU copies ``matrix.T`` and runs ``matrix.T @ x``
    as a slow loop, while ``x @ matrix`` is a fast vector-matrix product).

    ``quotient``: ``x`` is ``b / a`` for one unknown, as this solver
    computed it. A division is correctly rounded, ``b / a (1 + d)`` with
    ``|d| <= u`` (the unit roundoff; a few ``u`` for a complex one), so its
    residual ``b - a x = -b d`` is within ``tol |b|`` for any ``tol >= 32
    u`` (the default is ``sqrt(eps)``): the verdict is whether ``x`` and
    ``a`` are finite (an ``x`` that underflowed has a larger backward error,
    but is the quotient to the format's precision). This is most of the
    check's cost in a scalar Newton step under ``vmap`` (10,000 roots: 11%
    of the value's time, 15% of the gradient's); the Status's error is still
    the backward error, computed only where it is read."""
    eps = float(jnp.finfo(matrix.dtype).eps)
    tol = eps ** 0.5 if self.tol is None else self.tol
    if x.size == 1:  # elementwise: under vmap, no batch of 1x1 products
      a = matrix.reshape(())
      r, x_max, b_max = (jnp.abs(v).reshape(()) for v in (b - a * x, x, b))
      scale = jnp.abs(a) * x_max + b_max
      error = r / jnp.where(scale > 0, scale, 1.)
      if quotient and tol >= 16 * eps:
        ok = finite = jnp.isfinite(x.reshape(())) & jnp.isfinite(a)
      else:
        finite = jnp.isfinite(x_max) & jnp.isfinite(r)
        ok = finite & (r <= tol * scale)
      code = code_of(ok, finite)
    else:
      code, error = backward_error(matrix, x, b, tol, transpose)
    return status(code, 1, error)

  def _raw_solve(self, matrix: Any, b: Any) -> Any:
    if b.size == 1:
      return b / matrix[0, 0]
    _no_lu_here(matrix.dtype)
    return jnp.linalg.solve(matrix, b)

  def solve_matrix(self, matrix: Any, b: Any) -> tuple[jax.Array, Status]:
    """Solves ``matrix @ x = b`` for a vector ``b``; returns ``(x, Status)``."""
    dtype = b.dtype
    matrix, b = working(matrix), working(b)
    if not b.size:
      return b.astype(dtype), status(CONVERGED, 0, 0.)
    x = self._raw_solve(matrix, b)
    return x.astype(dtype), self._check(matrix, x, b, quotient=b.size == 1)

  def factor(self, matrix: Any) -> Any:
    """The LU factorization of ``matrix``, for `solve_factored`."""
    matrix = working(matrix)
    if matrix.shape[0] <= 1:
      return matrix, None
    _no_lu_here(matrix.dtype)
    return jax.scipy.linalg.lu_factor(matrix)

  def solve_factored(self, matrix: Any, factors: Any, b: Any, transpose: bool) -> Any:
    """Solves ``matrix @ x = b`` (or ``matrix.T @ x = b``) with the factors
    of `factor`; returns ``(x, Status)``."""
    dtype = b.dtype
    matrix, b = working(matrix), working(b)
    if not b.size:
      return b.astype(dtype), status(CONVERGED, 0, 0.)
    if b.size == 1:
      x = b / matrix[0, 0]
    else:
      x = jax.scipy.linalg.lu_solve(factors, b, trans=int(transpose))
    return x.astype(dtype), self._check(matrix, x, b, transpose,
                                        quotient=b.size == 1)
