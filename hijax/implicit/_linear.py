"""What the linear solvers of `hijax.implicit` share (`Dense` is in
``_dense``, `CG` and `GMRES` in ``_krylov``): a pytree problem as one
vector, the working dtype, the Krylov solvers' residual check and default
tolerance, and `MatMul`, the matvec that says it is a matrix.

A linear solver is called as ``solver(matvec, b)``, ``matvec`` a function of a
pytree like ``b``, and returns ``(x, Status)``; every one checks the residual
of the ``x`` it returns, so a wrong solution is reported, not returned.
Each is a frozen dataclass, so that it is hashable and can be a static
parameter of a primitive; its fields are its options.

Narrow floats (bfloat16, float16) are solved in float32 and rounded back: the
factorizations of ``jnp.linalg`` do not take them.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from hijax.implicit._precision import (check_precision, evaluated_at,
                                       iteration_precision)
from hijax.implicit._status import (CONVERGED, MAX_ITER, NONFINITE,
                                    default_tol, status)

__all__ = ["MatMul", "flat_problem", "work_dtype", "working", "krylov_tol",
           "norm", "norms", "residual_status", "max_iter_field",
           "empty_solution"]


def work_dtype(dtype: Any) -> Any:
  """The dtype linear algebra is done in: float32 for narrower floats."""
  if jnp.finfo(dtype).bits < 32:
    return jnp.dtype(jnp.float32)
  return jnp.dtype(dtype)


def working(a: Any) -> Any:
  """``a`` in the dtype linear algebra is done in (float32 for narrower)."""
  work = work_dtype(a.dtype)
  return a if a.dtype == work else a.astype(work)


def flat_problem(matvec: Callable, b: Any, precision: Any = "iteration"
                 ) -> Any:
  """``b`` as one vector in the working dtype, the matvec on such vectors and
  the map back to ``b``'s pytree and dtypes.

  The matvec is traced at ``precision`` (`hijax.implicit._precision`):
  "iteration" (the default) for the products a solver iterates on, "check"
  for those a check computes, or a matmul precision (None: as it is)."""
  b_flat, unravel = ravel_pytree(b)
  dtype = b_flat.dtype
  work = work_dtype(dtype)
  if precision == "iteration":
    precision = iteration_precision(dtype)
  elif precision == "check":
    precision = check_precision(dtype)

  def flat_matvec(v: Any) -> Any:
    with evaluated_at(precision):
      return ravel_pytree(matvec(unravel(v.astype(dtype))))[0].astype(work)
  return b_flat.astype(work), flat_matvec, lambda v: unravel(v.astype(dtype))


def krylov_tol(dtype: Any) -> float:
  """The default ``tol`` of `CG` and `GMRES`: 1e-10 for 64-bit unknowns (the
  relative residual of an ill-conditioned system, e.g. the 8x8 Hilbert
  matrix, stops near 1e-12), `default_tol` otherwise."""
  return 1e-10 if jnp.finfo(dtype).bits == 64 else default_tol(dtype)


def norm(v: Any) -> Any:
  """The 2-norm of a vector, as float32."""
  return jnp.sqrt(jnp.sum(jnp.abs(v) ** 2)).astype(jnp.float32)


def norms(*vectors: Any) -> Any:
  """The 2-norms of equally long vectors, as float32, in one reduction (on
  CPU, each of XLA's reductions costs more than the arithmetic in it)."""
  stacked = jnp.stack(vectors)
  squares = jnp.real(jnp.einsum("ij,ij->i", jnp.conj(stacked), stacked,
                                precision=check_precision(stacked.dtype)))
  return tuple(jnp.sqrt(squares).astype(jnp.float32))


def residual_status(flat_matvec: Any, x: Any, b: Any, tol: Any, atol: Any,
                    steps: Any, reason: Any = None, more: Any = ()) -> Any:
  """The Status of ``x`` for ``A x = b``: converged when finite and
  ``|b - A x|_2 <= max(tol |b|_2, atol)``; ``error`` is the relative
  residual ``|b - A x|_2 / |b|_2``. ``flat_matvec`` is traced at the
  checks' precision (`flat_problem`'s "check"). ``reason``: a reason code
  that overrides a converged one, or, with ``more`` (vectors as long as
  ``b``, whose 2-norms are computed in the residual's one reduction), a
  function of their norms returning it."""
  # xn is NaN or inf when x is not finite
  r, bn, xn, *more_norms = norms(b - flat_matvec(x), b, x, *more)
  if more:
    reason = reason(more_norms)
  ok = jnp.isfinite(r) & jnp.isfinite(xn) & (
      r <= jnp.maximum(tol * bn, atol))
  code = jnp.where(ok, CONVERGED, jnp.where(jnp.isfinite(r), MAX_ITER,
                                            NONFINITE))
  if reason is not None:
    code = jnp.where(reason == CONVERGED, code, reason)
  return status(code, steps, r / jnp.where(bn > 0, bn, 1.))


def max_iter_field(solver: Any, maxiter: Any) -> None:
  """Takes the old spelling ``maxiter=`` of `CG` and `GMRES` (a
  DeprecationWarning) into their ``max_iter``."""
  if maxiter is None:
    return
  name = type(solver).__name__
  if solver.max_iter is not None:
    raise TypeError(f"{name}: pass `max_iter` only (`maxiter` is its old "
                    f"spelling), got max_iter={solver.max_iter} and "
                    f"maxiter={maxiter}")
  warnings.warn(f"{name}(maxiter=...) is deprecated: the bound on "
                f"iterations is `max_iter` in every solver of "
                f"hijax.implicit; write {name}(max_iter={maxiter})",
                DeprecationWarning, stacklevel=4)
  object.__setattr__(solver, "max_iter", maxiter)


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


def empty_solution(b_flat: Any, unravel: Callable) -> Any:
  """The solution of a system of no unknowns, converged after no step."""
  return unravel(b_flat), status(CONVERGED, 0, 0.)

