"""The matrix-free linear solvers of `hijax.implicit`: `CG` (symmetric
positive definite systems) and `GMRES` (general ones).

Each iterates on the user's matvec at `iteration_precision` and checks the
true residual of the ``x`` it returns, computed at the checks' precision
(`hijax.implicit._precision`): on a TPU, where a float32 matrix product at
the default precision rounds to bfloat16, both are float32's."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg  # noqa: F401  (gmres)

from hijax.implicit._linear import (empty_solution, flat_problem, krylov_tol,
                                    max_iter_field, norm, norms,
                                    residual_status)
from hijax.implicit._precision import check_precision
from hijax.implicit._status import CONVERGED, NOT_SPD, Status

__all__ = ["CG", "GMRES"]


def _tol(tol: Any, b_flat: Any) -> float:
  return krylov_tol(b_flat.dtype) if tol is None else tol


def _max_iter(max_iter: Any, b_flat: Any) -> int:
  return 10 * b_flat.size if max_iter is None else max_iter


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
  ``max_iter`` (None: 10 times the number of unknowns) bounds the
  iterations (``maxiter``, its old spelling, is still accepted, with a
  DeprecationWarning).

  With ``check=True`` (the default), two extra matvecs test the matrix on two
  vectors (``b`` and a fixed probe): it must be symmetric on them
  (``u.A v == v.A u`` to the square root of eps, or to ``tol`` where that is
  looser) and positive
  (``u.A u > 0``). This catches a non-symmetric or negative definite matrix
  before CG returns a wrong answer, but is a necessary condition only: an
  indefinite matrix that passes it makes CG fail to converge, which the
  residual check reports.
  """
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None
  atol: float = 0.0
  max_iter: int | None = None
  check: bool = True
  maxiter: dataclasses.InitVar[int | None] = None

  def __post_init__(self, maxiter: int | None) -> None:
    max_iter_field(self, maxiter)

  def __call__(self, matvec: Callable, b: Any) -> Any:
    b_flat, A, unravel = flat_problem(matvec, b)
    if not b_flat.size:
      return empty_solution(b_flat, unravel)
    x, steps = self._iterate(A, b_flat)
    return unravel(x), self._status(matvec, b, x, steps)

  def _iterate(self, A: Any, b_flat: Any) -> Any:
    return _cg(A, b_flat, _tol(self.tol, b_flat), self.atol,
               _max_iter(self.max_iter, b_flat))

  def _status(self, matvec: Callable, b: Any, x: Any, steps: Any) -> Status:
    b_flat, A, _ = flat_problem(matvec, b, "check")
    tol = _tol(self.tol, b_flat)
    if not self.check:
      return residual_status(A, x, b_flat, tol, self.atol, steps)
    probes, images, gram = self._probe_products(A, b_flat)

    def reason(probe_norms: Any) -> Any:
      spd = self._spd_on_probes(gram, probe_norms, tol, b_flat.dtype)
      return jnp.where(spd, CONVERGED, NOT_SPD)
    # the probes' norms in the residual check's one reduction (a reduction
    # of its own was three more kernels for XLA to compile)
    return residual_status(A, x, b_flat, tol, self.atol, steps, reason,
                           more=(*probes, *images))

  @staticmethod
  def _probe_products(A: Any, b: Any) -> Any:
    """The probes (``b`` normalized, and a fixed vector), their images and
    their Gram matrix, ``gram[i, j] = <probe_i, A probe_j>``: one batched
    matvec and one 2x2 product, instead of two matvecs and four inner
    products."""
    u = b / jnp.where(norm(b) > 0, norm(b), 1.).astype(b.dtype)
    u = jnp.where(norm(b) > 0, u, _probe(b) * 0.5)
    probes = jnp.stack([u, _probe(b)])
    images = jax.vmap(A)(probes)
    gram = jnp.matmul(jnp.conj(probes), images.T,
                      precision=check_precision(b.dtype))
    return probes, images, gram

  @staticmethod
  def _spd_on_probes(gram: Any, probe_norms: Any, tol: float,
                     dtype: Any) -> Any:
    """Whether the matrix is symmetric and positive on the probes, from
    their Gram matrix and the norms ``|u|, |v|, |Au|, |Av|``."""
    eps = float(jnp.finfo(dtype).eps)
    scale = probe_norms[0] * probe_norms[3] + probe_norms[1] * probe_norms[2]
    # to the square root of eps, or to the solve's tolerance where looser
    symmetric = jnp.abs(gram[0, 1] - jnp.conj(gram[1, 0])) <= max(
        eps ** 0.5, tol) * scale
    positive = (jnp.real(gram[0, 0]) > 0) & (jnp.real(gram[1, 1]) > 0)
    return symmetric & positive


def _cg(A: Any, b: Any, tol: Any, atol: Any, max_iter: Any) -> Any:
  """Plain conjugate gradients from zero; returns ``(x, steps)``. Its inner
  products are exact to the dtype (at the checks' precision): under ``vmap``
  they are matrix products, which a TPU would round to bfloat16."""
  precision = check_precision(b.dtype)
  vdot = lambda u, v: jnp.vdot(u, v, precision=precision)
  bound = jnp.maximum(tol * norm(b), atol) ** 2
  rr0 = jnp.real(vdot(b, b))

  def cond(c: Any) -> Any:
    k, _, r, _, rr = c
    return (k < max_iter) & (rr > bound) & jnp.isfinite(rr)

  def body(c: Any) -> Any:
    k, x, r, p, rr = c
    Ap = A(p)
    alpha = rr / vdot(p, Ap)
    x = x + alpha * p
    r = r - alpha * Ap
    rr_new = jnp.real(vdot(r, r))
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
  ``atol`` bound the relative residual, checked as for `CG`; ``max_iter``
  (None: 10 times the number of unknowns; ``maxiter``, its old spelling, is
  still accepted, with a DeprecationWarning) bounds the restarts, and is the
  ``steps`` of the Status, since JAX's GMRES does not count."""
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None
  atol: float = 0.0
  restart: int = 20
  max_iter: int | None = None
  maxiter: dataclasses.InitVar[int | None] = None

  def __post_init__(self, maxiter: int | None) -> None:
    max_iter_field(self, maxiter)

  def __call__(self, matvec: Callable, b: Any) -> Any:
    b_flat, A, unravel = flat_problem(matvec, b)
    if not b_flat.size:
      return empty_solution(b_flat, unravel)
    x = self._iterate(A, b_flat)
    return unravel(x), self._check(matvec, b, x)

  def _iterate(self, A: Any, b_flat: Any) -> Any:
    restart = max(1, min(self.restart, b_flat.size))
    x, _ = jax.scipy.sparse.linalg.gmres(
        A, b_flat, tol=_tol(self.tol, b_flat), atol=self.atol,
        restart=restart, maxiter=_max_iter(self.max_iter, b_flat),
        solve_method="incremental")
    return x

  def _check(self, matvec: Callable, b: Any, x: Any) -> Status:
    b_flat, A, _ = flat_problem(matvec, b, "check")
    return residual_status(A, x, b_flat, _tol(self.tol, b_flat), self.atol,
                           _max_iter(self.max_iter, b_flat))
