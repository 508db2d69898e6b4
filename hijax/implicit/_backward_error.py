"""`Dense`'s check of a solution: its backward error, one right-hand side at
a time or, for many right-hand sides of one matrix, by a random sketch.

A solution ``x`` of ``M x = b`` (``M`` the matrix, or its transpose for a
transposed solve) passes when it is finite and

    |b - M x|_inf  <=  tau = tol (|M|_inf |x|_inf + |b|_inf),

the backward error of a backward-stable factorization being far below
``tol`` (``sqrt(eps)`` by default). One right-hand side costs a matrix-vector
product, as many flops as the triangular solves it checks.

**Many right-hand sides.** Under ``vmap`` over ``b`` with one matrix (the
tangent systems of ``jacfwd``, the cotangent ones of ``jacrev``, a batch of
solves), checking each of ``m`` columns is a matrix product, ``m n^2``
flops. The sketch tests them all in ``k (n^2 + 2 m n)``: with the residuals
``e_j = b_j - M x_j`` scaled by their bounds, ``f_j = e_j / tau_j`` (a column
passes when ``|f_j|_inf <= 1``), and ``k = 8`` fixed random Gaussian vectors
``s_l`` (of ``m`` entries, drawn once from a fixed seed),

    z_l = sum_j s_lj f_j = W B - (W X) M^T,   W_lj = s_lj / tau_j,

two products with the ``k x m`` matrix ``W`` and one ``k x n`` by ``n x n``,
no residual of any column formed. Every ``|z_li| <= c = 1/8`` passes all the
columns; anything else (a larger entry, a NaN) runs the per-column check,
whose verdict is then the one returned. A non-finite ``x_j`` or ``b_j``
fails its column exactly (its weight is 0 in the sketch).

*Why a wrong column is caught.* Scaling each column by its own bound makes
the test as sharp for each column as its own check: if column ``j`` fails,
some entry has ``|f_j[i]| = rho > 1``, and ``z_li = s_lj f_j[i] + y`` with
``y`` independent of ``s_lj``. For a standard normal ``s`` and any ``y``,
``P(|s rho + y| <= c) <= P(|s| <= c / rho) <= sqrt(2/pi) c / rho`` (the
interval centred on 0 is the likeliest), so with ``d`` bounding the rounding
of the computed ``z``, all ``k`` vectors miss it with probability at most
``(sqrt(2/pi) (c + d) / rho)^k``. The sketch is used only where the
rounding is small against ``c``: ``d = 4 sqrt((m + n) m) u / tol <= c / 2``
(``u`` the unit roundoff; the probabilistic rounding bound, each sum of
``p`` terms off by about ``sqrt(p) u`` times its terms' size, with a factor
4 of margin; the worst case, ``p u``, is not met by rounding in practice),
so the miss probability is at most ``(0.8 * 3/16 / rho)^8 = (0.15 / rho)^8``:
2.6e-7 for a column that exceeds its bound at all (``rho`` just above 1,
where the per-column check itself is decided by rounding), 1e-9 at twice
the bound, 2.6e-15 at ten times.

*Why right columns pass.* A backward-stable solution has ``|f_j|`` of a few
``u / tol`` (about 1e-3 in float32 at ``tol = sqrt(eps)``), so ``z`` is a
few times ``sqrt(m)`` of that plus ``d``: below ``c``. A sketch that flags
right columns only costs the per-column check.

*Where it runs.* Where it takes a quarter of the flops of the per-column
check or less (``4 k (n^2 + 2 m n) <= m n^2``: from about 100 unknowns and
columns), and its rounding is small against its bound. Below that its
extra operations cost more than the flops it saves: at 50 unknowns and 50
columns in float32 on a CPU, it made ``jacrev`` of a 50-unknown root 6%
slower, the check being bound by the number of XLA operations, not flops
(at 200 and 200, measured alone, it took 35 us against 156). Where each
instance has its own matrix (``vmap`` over the matrix) every column is
checked alone. In float32 with the default tolerance (``sqrt(eps)``) the
rounding bound leaves it about 60 unknowns and columns, under the size
where it pays: it runs in float64, and in float32 with a looser ``tol``
(``Dense(tol=1e-2)``: hundreds). Products are computed at the checks'
precision (`hijax.implicit._precision.check_precision`).

One solution's check of fewer than `DEFER_NORM_FROM` unknowns reads
``|M|_inf`` always (a conditional costs compile time at every first call,
XLA's CPU backend compiling each kernel on its own, and there it costs more
run time than the row sums); from `DEFER_NORM_FROM`, only where the
residual is not already within half of ``tol (|M x|_inf + |b|_inf)``
(`_one`), since there the row sums cost twice the time of ``M x``.
``M x`` is a reduction of the elementwise products, one kernel where a
matrix-vector product was two, and as fast (but from 33 to 127 unknowns a
product: faster there); the row sums of ``|M|`` are a product with ones,
faster than a reduction there; the four maxima are one variadic reduction
(`_maxima`), not a reduction of their stack. The columns of one matrix
under ``vmap`` are checked together (`_columns`: one matrix product, one
reduction over the whole batch), each with its own bound.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax._internals.core import ShapedArray
from hijax.implicit._precision import check_precision, unit_roundoff
from hijax.implicit._status import (CONVERGED, MAX_ITER, NONFINITE,
                                    _across_batch)
from hijax.primitive import HiPrim

__all__ = ["backward_error", "code_of", "SKETCH_VECTORS", "SKETCH_BOUND",
           "sketch_applies", "sketch_flags"]

SKETCH_VECTORS = 8
# from 33 unknowns up to this many `_one` computes M x as a matrix-vector
# product (on a CPU, a reduction took the HVP of the bench's 50-unknown root
# 8-10% more time: XLA splits a reduction of more than 32 entries in two);
# else as a reduction (at 200: as fast, one kernel fewer; up to 32: one
# kernel, not split)
PRODUCT_BELOW = 128
# from this many unknowns `_one` reads |M|_inf only where the residual needs
# it (a conditional: about a microsecond on a CPU, more than the row sums of
# a smaller matrix cost)
DEFER_NORM_FROM = 128
SKETCH_BOUND = 1 / 8


def _dot(a: Any, b: Any) -> Any:
  return jnp.matmul(a, b, precision=check_precision(a.dtype))


def _row_sums(matrix: Any, transpose: bool) -> Any:
  """The row sums of ``|M|`` (of ``|matrix|``, or its column sums with
  ``transpose``), by a matrix-vector product: on CPU, XLA's reduction of
  ``|M|`` took a 200x200 dense solve 20% more time than the product
  (measured against ``M x`` as a reduction of the elementwise products,
  which costs what the product does)."""
  abs_matrix = jnp.abs(matrix)
  # a NumPy constant: jnp.ones is one more kernel for XLA to compile
  ones = np.ones(matrix.shape[0], abs_matrix.dtype)
  return _dot(ones, abs_matrix) if transpose else _dot(abs_matrix, ones)


def _norm_inf(matrix: Any, transpose: bool) -> Any:
  """``|M|_inf``, the largest row sum of ``|M|`` (`_row_sums`)."""
  return jnp.max(_row_sums(matrix, transpose))  # of 2 or more rows


def _maxima(vectors: Any, axis: int) -> Any:
  """The maxima of each of ``vectors`` (arrays of one shape) along ``axis``,
  as one variadic reduction (NaN propagates): XLA's CPU backend compiles it
  as one kernel, where the maxima of their stack were three (the stack, and
  a long reduction split in two)."""
  low = tuple(np.array(-np.inf, v.dtype) for v in vectors)
  return jax.lax.reduce(tuple(vectors), low, lambda a, b: tuple(
      jax.lax.max(p, q) for p, q in zip(a, b)), (axis,))


def _one(matrix: Any, x: Any, b: Any, tol: float, transpose: bool,
         defer: bool = True) -> Any:
  """(code, error) of one solution (under ``vmap`` over the matrix:
  each, with ``defer=False``). ``M x`` is a reduction of the elementwise
  products (exact products in the matrix's dtype on any backend, as
  `_dot`'s are at the checks' precision), or a product from 33 to
  `PRODUCT_BELOW` unknowns.

  From `DEFER_NORM_FROM` unknowns the verdict reads ``|M|_inf`` only where
  the residual is not already within half the bound with ``|M x|_inf`` in
  its place (``|M x|_inf <= |M|_inf |x|_inf``, the half covering the
  rounding of both), behind a conditional: the same verdict. On a CPU the
  row sums of ``|M|`` took twice the time of ``M x`` (a 200x200 solve: 18
  us of 250; its gradient reads the column sums too); a backward-stable
  solution of a system whose condition number is below about ``tol / u``
  (5,000 in float32) never reads them; the conditional returns the reason.
  The Status's error divides by the full bound, computed where it is read."""
  axis = 0 if transpose else 1
  if 32 < x.shape[0] < PRODUCT_BELOW:
    ax = _dot(x, matrix) if transpose else _dot(matrix, x)
  else:
    ax = jnp.sum(matrix * (x[:, None] if transpose else x), axis=axis)
  if not defer or x.shape[0] < DEFER_NORM_FROM:
    # the maxima in one reduction (a NaN or inf in x shows in its max)
    return _verdict(_maxima([jnp.abs(b - ax), jnp.abs(x), jnp.abs(b),
                             _row_sums(matrix, transpose)], 0), tol)
  r, x_max, b_max, ax_max = _maxima([jnp.abs(b - ax), jnp.abs(x),
                                     jnp.abs(b), jnp.abs(ax)], 0)
  # NaN compares False: a NaN residual is never within
  within = jnp.isfinite(x_max) & (r <= tol / 2 * (ax_max + b_max))
  # the rare side in as few kernels as it takes (each is compile time): the
  # row sums by one reduction
  code = jax.lax.cond(within, lambda: np.int32(CONVERGED), lambda: _verdict(
      (r, x_max, b_max, jnp.max(jnp.sum(jnp.abs(matrix), axis=axis))),
      tol)[0])
  return code, _verdict((r, x_max, b_max, _norm_inf(matrix, transpose)),
                        tol)[1]


def _columns(matrix: Any, X: Any, B: Any, tol: float, transpose: bool) -> Any:
  """`_one` of each row of ``X`` for the row of ``B`` beside it (one
  matrix): the same bound and verdicts, the products of all the columns as
  one matrix product, reduced over the whole batch at once (one variadic
  reduction: ``jacrev`` of the bench's 50-unknown root 0.98-1.02 of
  optimistix's time, against 0.88-0.89 with a ``(4, m, n)`` stack).)"""
  AX = _dot(X, matrix) if transpose else _dot(X, matrix.T)
  row_sums = jnp.broadcast_to(_row_sums(matrix, transpose), X.shape)
  return _verdict(_maxima([jnp.abs(B - AX), jnp.abs(X), jnp.abs(B),
                           row_sums], 1), tol)


def code_of(ok: Any, finite: Any) -> Any:
  """The Status's reason of a check that says ``ok`` and ``finite``."""
  return jnp.where(ok, CONVERGED, jnp.where(finite, MAX_ITER,
                                            NONFINITE)).astype(jnp.int32)


def _verdict(maxima: Any, tol: float) -> Any:
  """(code, error) from ``maxima``, the maxima of the residual ``r``, of
  ``x``, of ``b`` and the largest row sum of ``|M|``."""
  r, x_max, b_max, norm = maxima
  finite = jnp.isfinite(x_max) & jnp.isfinite(r)
  scale = norm * x_max + b_max
  ok = finite & (r <= tol * scale)
  return code_of(ok, finite), (r / jnp.where(scale > 0, scale, 1.)).astype(
      jnp.float32)


def sketch_applies(n: int, m: int, tol: float, dtype: Any) -> bool:
  """Whether ``m`` right-hand sides of ``n`` unknowns are checked by the
  sketch: it takes a quarter of the flops of checking each, or less, and its
  rounding is small against its bound."""
  rounding = 4 * math.sqrt((m + n) * m) * unit_roundoff(dtype) / tol
  saves = 4 * SKETCH_VECTORS * (n * n + 2 * m * n) <= m * n * n
  return saves and rounding <= SKETCH_BOUND / 2


def _sketch_vectors(m: int, dtype: Any) -> Any:
  """The ``k x m`` Gaussian matrix of the sketch, the same at every call."""
  rng = np.random.default_rng(20261203 + m)
  return jnp.asarray(rng.standard_normal((SKETCH_VECTORS, m)), dtype)


def sketch_flags(matrix: Any, X: Any, B: Any, tol: float,
                 transpose: bool) -> Any:
  """``(flagged, finite)``: whether the sketch of the rows of ``X`` (the
  solutions) and ``B`` (the right-hand sides) exceeds its bound, so that
  each column must be checked, and which columns are finite."""
  m = X.shape[0]
  x_max = jnp.max(jnp.abs(X), axis=1, initial=0.)
  b_max = jnp.max(jnp.abs(B), axis=1, initial=0.)
  finite = jnp.isfinite(x_max) & jnp.isfinite(b_max)
  tau = tol * (_norm_inf(matrix, transpose) * x_max + b_max)
  # a column with tau = 0 has x = 0 (or M = 0) and b = 0: its residual is 0
  weight = jnp.where(finite & (tau > 0), 1 / jnp.where(tau > 0, tau, 1.), 0.)
  W = _sketch_vectors(m, X.dtype) * weight.astype(X.dtype)
  X0 = jnp.where(finite[:, None], X, 0.)
  B0 = jnp.where(finite[:, None], B, 0.)
  WX = _dot(W, X0)
  Z = _dot(W, B0) - (_dot(WX, matrix) if transpose else _dot(WX, matrix.T))
  return ~(jnp.max(jnp.abs(Z), initial=0.) <= SKETCH_BOUND), finite


def _many(matrix: Any, X: Any, B: Any, tol: float, transpose: bool) -> Any:
  """(code, error) of the rows of ``X`` for the rows of ``B``, one
  matrix: the sketch, and the per-column check where it flags."""
  flagged, finite = sketch_flags(matrix, X, B, tol, transpose)

  code = jax.lax.cond(_across_batch(flagged),
                      lambda: _columns(matrix, X, B, tol, transpose)[0],
                      lambda: code_of(finite, finite))
  # each column's error, from its own residual (XLA drops it if unread)
  return code, _columns(matrix, X, B, tol, transpose)[1]


class _BackwardError(HiPrim):
  """(code, error) of ``x`` for ``M x = b``, with ``M`` the matrix or, with
  ``transpose``, its transpose: the per-column check, and under ``vmap``
  over ``x`` and ``b`` alone the sketch (see the module's docstring).
  (``transposed``: the system's matrix is the transpose.)"""

  def __init__(self, matrix_aval: Any, x_aval: Any, b_aval: Any, *,
               tol: float, transposed: bool):
    self.in_avals = (matrix_aval, x_aval, b_aval)
    self.out_aval = (ShapedArray((), jnp.int32), ShapedArray((), jnp.float32))
    self.params = dict(tol=tol, transposed=transposed)
    super().__init__()

  def expand(self, matrix: Any, x: Any, b: Any) -> Any:
    return _one(matrix, x, b, self.tol, self.transposed)

  def batch(self, axis_data: Any, args: Any, dims: Any) -> Any:
    matrix, x, b = args
    d_matrix, d_x, d_b = dims
    n, m = x.shape[-1], axis_data.size
    if d_matrix is not None:
      # each its own bound: a conditional under vmap would run both sides
      out = jax.vmap(lambda M, x, b: _one(M, x, b, self.tol, self.transposed,
                                          defer=False), in_axes=dims)(
                                              matrix, x, b)
      return out, 0
    X = (jnp.broadcast_to(x, (m, n)) if d_x is None
         else jnp.moveaxis(x, d_x, 0))
    B = (jnp.broadcast_to(b, (m, n)) if d_b is None
         else jnp.moveaxis(b, d_b, 0))
    if sketch_applies(n, m, self.tol, x.dtype):
      return _many(matrix, X, B, self.tol, self.transposed), 0
    return _columns(matrix, X, B, self.tol, self.transposed), 0


def backward_error(matrix: Any, x: Any, b: Any, tol: float,
                   transpose: bool = False) -> Any:
  """The Status's reason (`code_of`) and error of ``x`` for ``matrix @ x =
  b`` (``matrix.T @ x = b`` with ``transpose``): the module's bound."""
  # A verdict has no derivative: a rule that checks a solve it computes
  # (vjp_fwd of a factored solve) may run under jvp, and sees no tangent here
  matrix, x, b = jax.lax.stop_gradient((matrix, x, b))
  return _BackwardError(jax.typeof(matrix), jax.typeof(x), jax.typeof(b),
                        tol=float(tol), transposed=transpose)(matrix, x, b)
