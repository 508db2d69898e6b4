"""The solvers of `hijax.implicit`: linear (`Dense`, `CG`, `GMRES`) and
nonlinear (`FixedPointIteration`, `Newton`).

Each is a frozen dataclass, so that it is hashable and can be a static
parameter of a primitive; its fields are its options.
"""
from __future__ import annotations

from typing import Any

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg  # noqa: F401  (CG, GMRES)
from jax.flatten_util import ravel_pytree


def _max_abs(tree):
  leaves = [jnp.max(jnp.abs(x), initial=0.) for x in jax.tree.leaves(tree)]
  return jnp.max(jnp.stack(leaves)) if leaves else jnp.float32(0.)


def _default_tol(tol, tree):
  """``tol``, or 1e-12 for float64 unknowns and 1e-6 for narrower ones."""
  if tol is not None:
    return tol
  floats = [x.dtype for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  eps = float(jnp.finfo(floats[0]).eps) if floats else 1e-7
  return max(1e-12 if eps < 1e-10 else 1e-6, 4 * eps)


# --- linear solvers -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Dense:
  """Direct linear solver: builds the matrix from one ``matvec`` per unknown
  (vectorized with ``vmap``) and calls ``jnp.linalg.solve``. Exact and robust
  for small to medium systems; memory grows with the square of the size."""

  def __call__(self, matvec: Callable, b: Any) -> Any:
    b_flat, unravel = ravel_pytree(b)
    flat_matvec = lambda v: ravel_pytree(matvec(unravel(v)))[0]
    eye = jnp.eye(b_flat.size, dtype=b_flat.dtype)
    matrix = jax.vmap(flat_matvec, out_axes=1)(eye)
    return unravel(jnp.linalg.solve(matrix, b_flat))


@dataclasses.dataclass(frozen=True)
class CG:
  """Conjugate gradient (``jax.scipy.sparse.linalg.cg``), matrix-free. Only for
  symmetric positive definite systems. ``tol`` is relative to ``|b|``; None
  means 1e-12 in float64 and 1e-6 otherwise."""
  tol: float | None = None
  atol: float = 0.0
  maxiter: int | None = None

  def __call__(self, matvec: Callable, b: Any) -> Any:
    return jax.scipy.sparse.linalg.cg(
        matvec, b, tol=_default_tol(self.tol, b), atol=self.atol,
        maxiter=self.maxiter)[0]


@dataclasses.dataclass(frozen=True)
class GMRES:
  """GMRES (``jax.scipy.sparse.linalg.gmres``), matrix-free, for general
  (nonsymmetric) systems. ``tol`` as for `CG`."""
  tol: float | None = None
  atol: float = 0.0
  restart: int = 20
  maxiter: int | None = None

  def __call__(self, matvec: Callable, b: Any) -> Any:
    return jax.scipy.sparse.linalg.gmres(
        matvec, b, tol=_default_tol(self.tol, b), atol=self.atol,
        restart=self.restart, maxiter=self.maxiter)[0]


# --- nonlinear solvers --------------------------------------------------------

def _iterate(step, x0, tol, max_iter):
  """Runs ``x, dx = step(x)`` until ``max|dx| <= tol (1 + max|x|)``."""
  def cond(carry):
    k, x, err = carry
    return (k < max_iter) & (err > tol * (1 + _max_abs(x)))

  def body(carry):
    k, x, _ = carry
    x, dx = step(x)
    return k + 1, x, _max_abs(dx)

  err0 = jnp.full_like(_max_abs(x0), jnp.inf)
  return jax.lax.while_loop(cond, body, (0, x0, err0))[1]


@dataclasses.dataclass(frozen=True)
class FixedPointIteration:
  """Iterates ``x <- f(x, params)`` until the step is below ``tol`` relative to
  ``1 + max|x|`` (None: 1e-12 in float64, 1e-6 otherwise), or ``max_iter``
  steps. Converges when ``f`` is a contraction in ``x``."""
  tol: float | None = None
  max_iter: int = 1000

  def __call__(self, f: Callable, x0: Any, params: Any) -> Any:
    def step(x):
      new = f(x, params)
      return new, jax.tree.map(jnp.subtract, new, x)
    return _iterate(step, x0, _default_tol(self.tol, x0), self.max_iter)


@dataclasses.dataclass(frozen=True)
class Newton:
  """Newton's method for ``g(x, params) = 0``: each step solves with the
  Jacobian ``dg/dx`` (as a matvec) using ``linear_solver``. Stops like
  `FixedPointIteration`."""
  tol: float | None = None
  max_iter: int = 50
  linear_solver: Callable = Dense()

  def __call__(self, g: Callable, x0: Any, params: Any) -> Any:
    def step(x):
      gx = lambda y: g(y, params)
      matvec = lambda v: jax.jvp(gx, (x,), (v,))[1]
      dx = self.linear_solver(matvec, gx(x))
      return jax.tree.map(jnp.subtract, x, dx), dx
    return _iterate(step, x0, _default_tol(self.tol, x0), self.max_iter)
