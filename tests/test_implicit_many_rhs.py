"""Solves of many right-hand sides with one matrix (``vmap`` over ``b``, the
tangent and cotangent systems of ``jacfwd`` and ``jacrev``) are checked as
surely as one: a wrong solution in any one column fails that column, with
its verdict, reason and error those of the per-column backward-error check,
and every right column passes; where the columns are checked together by a
sketch (float64, or a loose ``tol``, from about 100 unknowns and columns)
as where each is checked alone."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hijax.implicit import Dense, MatMul, linear_solve
from hijax.implicit._backward_error import (SKETCH_BOUND, SKETCH_VECTORS, _columns,
                                            _one, sketch_applies, sketch_flags)

TOL = float(np.finfo(np.float32).eps) ** 0.5  # Dense's default in float32


def system(seed, n, m, log_cond, dtype=np.float32):
  """A matrix with singular values from 1 to 10**-log_cond, and m
  right-hand sides."""
  rng = np.random.default_rng(seed)
  U, _ = np.linalg.qr(rng.standard_normal((n, n)))
  V, _ = np.linalg.qr(rng.standard_normal((n, n)))
  A = (U * np.logspace(0, -log_cond, n)) @ V.T
  return A.astype(dtype), rng.standard_normal((m, n)).astype(dtype), rng


# (dtype, Dense's tol, unknowns, columns) checked by the sketch
SKETCHED = [(np.float64, None, 100, 100), (np.float32, 1e-2, 100, 120)]


def backward_errors(A, X, B, transpose):
  """Each column's |b - A x|_inf / (|A|_inf |x|_inf + |b|_inf), in float64."""
  A, X, B = (np.asarray(v, np.float64) for v in (A, X, B))
  M = A.T if transpose else A
  r = np.max(np.abs(B - X @ M.T), axis=1)
  scale = (np.max(np.sum(np.abs(M), axis=1)) * np.max(np.abs(X), axis=1)
           + np.max(np.abs(B), axis=1))
  return r / scale


def one_wrong_column(A, B, column, factor, transpose, rng, tol=TOL):
  """The solutions of ``A X = B`` (or ``A.T X = B``), row by row, with the
  one in ``column`` moved so that its backward error is ``factor`` times
  ``tol``."""
  M = (A.T if transpose else A).astype(np.float64)
  X = np.linalg.solve(M, B.astype(np.float64).T).T
  d = rng.standard_normal(A.shape[0])
  x, b = X[column], B[column].astype(np.float64)
  # |M (x + s d) - b| = s |M d|; the scale barely moves for small s
  for _ in range(3):
    scale = (np.max(np.sum(np.abs(M), axis=1)) * np.max(np.abs(x + d))
             + np.max(np.abs(b)))
    d = d * factor * tol * scale / np.max(np.abs(M @ d))
  X[column] = x + d
  return X.astype(A.dtype)


@functools.partial(jax.jit, static_argnums=(3, 4))
def batched_check(A, X, B, transpose, tol=None):
  # A is an argument, not a constant baked into the program: one program per
  # shape, traced once and then loaded from the persistent compilation cache
  return jax.vmap(lambda x, b: Dense(tol)._check(A, x, b, transpose))(X, B)


# (unknowns, columns): small and large, square and not (a few shapes, each
# compiled once); 70 x 70 takes Dense's path that reads |A| only if needed
SHAPES = [(3, 5), (50, 50), (70, 33), (20, 80), (2, 2)]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 16), st.sampled_from(SHAPES + SKETCHED), st.data(),
       st.floats(0.3, 6.), st.floats(0., 4.), st.booleans())
def test_a_wrong_solution_in_any_one_column_fails_that_column(
    seed, case, data, log_factor, log_cond, transpose):
  dtype, tol, n, m = case if len(case) == 4 else (np.float32, None, *case)
  bound = TOL if tol is None else tol
  if dtype == np.float64:
    bound = float(np.finfo(np.float64).eps) ** 0.5
  column = data.draw(st.integers(0, m - 1), label="column")
  with jax.enable_x64(dtype == np.float64):
    A, B, rng = system(seed, n, m, log_cond, dtype)
    X = one_wrong_column(A, B, column, 10. ** log_factor, transpose, rng,
                         bound)
    errors = backward_errors(A, X, B, transpose)
    assert errors[column] > 1.5 * bound  # it fails, beyond rounding
    status = batched_check(jnp.asarray(A), jnp.asarray(X), jnp.asarray(B),
                           transpose, tol)
  expected = errors <= bound
  assert not expected[column]
  assert status.converged.tolist() == expected.tolist(), (
      column, errors / bound)
  assert status.reason.tolist() == [0 if ok else 1 for ok in expected]
  np.testing.assert_allclose(status.error[column], errors[column], rtol=1e-3)


# the matrix an argument: one program per shape, traced once for all examples
_solve_columns = jax.jit(jax.vmap(
    lambda M, b: linear_solve(MatMul(), b, M, throw=False), in_axes=(None, 0)))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2 ** 16), st.sampled_from(SHAPES), st.floats(0., 5.),
       st.booleans())
def test_right_solutions_of_many_columns_all_pass(seed, shape, log_cond,
                                                  transpose):
  n, m = shape
  A, B, _ = system(seed, n, m, log_cond)
  M = A.T if transpose else A
  X, status = _solve_columns(jnp.asarray(M), jnp.asarray(B))
  assert all(status.converged.tolist()), status
  errors = backward_errors(A, X, B, transpose)
  # the errors are at the rounding level: each column's, to rounding
  np.testing.assert_allclose(status.error, errors, atol=1e-6)
  assert float(jnp.max(status.error)) <= TOL


def test_a_non_finite_column_is_named_non_finite_and_the_others_pass():
  A, B, rng = system(3, 20, 12, 1.)
  X = one_wrong_column(A, B, 0, 1e-3, False, rng)  # all right
  X[5, 2] = np.nan
  X[7, 0] = np.inf
  status = batched_check(jnp.asarray(A), jnp.asarray(X), jnp.asarray(B),
                         False)
  assert status.converged.tolist() == [i not in (5, 7) for i in range(12)]
  assert [status.reason.tolist()[i] for i in (5, 7)] == [2, 2]


def test_jacrev_and_jacfwd_of_a_solve_match_the_inverse():
  """The cotangent (jacrev) and tangent (jacfwd) systems, 30 columns each."""
  A, _, _ = system(1, 30, 1, 1.)
  A = jnp.asarray(A + 3 * np.eye(30, dtype=np.float32))
  b = jnp.ones(30)
  for jac in (jax.jacrev, jax.jacfwd):
    got = jax.jit(jac(lambda b: linear_solve(lambda x, A: A @ x + 0.5 * x, b,
                                             A)))(b)
    np.testing.assert_allclose(got, jnp.linalg.inv(A + 0.5 * jnp.eye(30)),
                               rtol=1e-4, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2 ** 16), st.sampled_from(SKETCHED), st.floats(0., 3.),
       st.booleans())
def test_the_sketch_passes_right_columns_and_flags_a_wrong_one(
    seed, case, log_cond, transpose):
  """Where it applies, the sketch lets right solutions through without the
  per-column check (else it would save nothing), and flags one wrong
  column (then the per-column check gives the verdict)."""
  dtype, tol, n, m = case
  tol = float(np.finfo(dtype).eps) ** 0.5 if tol is None else tol
  assert sketch_applies(n, m, tol, dtype)
  flags = jax.jit(sketch_flags, static_argnums=(3, 4))
  with jax.enable_x64(dtype == np.float64):
    A, B, rng = system(seed, n, m, log_cond, dtype)
    X = one_wrong_column(A, B, 0, 1e-4, transpose, rng, tol)  # right
    flagged, finite = flags(jnp.asarray(A), jnp.asarray(X), jnp.asarray(B),
                            tol, transpose)
    assert not bool(flagged) and all(finite.tolist())
    X = one_wrong_column(A, B, int(rng.integers(m)), 1.5, transpose, rng,
                         tol)
    flagged, _ = flags(jnp.asarray(A), jnp.asarray(X), jnp.asarray(B), tol,
                       transpose)
    assert bool(flagged)


def test_where_the_sketch_applies():
  """Where it takes a quarter of the per-column flops or less, and its
  rounding is small against its bound: in float32 at the default tolerance
  nowhere (the rounding bound stops at about 60 unknowns and columns, the
  flops start at about 100), in float64 from about 100 to thousands."""
  assert SKETCH_VECTORS == 8 and SKETCH_BOUND == 1 / 8
  f64 = float(np.finfo(np.float64).eps) ** 0.5
  assert not sketch_applies(50, 50, TOL, np.float32)  # saves too little
  assert not sketch_applies(50, 50, f64, np.float64)
  assert not sketch_applies(200, 200, TOL, np.float32)  # rounding
  assert sketch_applies(200, 200, 1e-2, np.float32)
  assert sketch_applies(100, 100, f64, np.float64)
  assert sketch_applies(2000, 2000, f64, np.float64)
  # the miss probability of the docstring, for a column at its bound
  bound = (np.sqrt(2 / np.pi) * 1.5 * SKETCH_BOUND) ** SKETCH_VECTORS
  assert 2e-7 < bound < 3e-7


# one program per shape and side, traced once for all the examples below
@functools.partial(jax.jit, static_argnums=3)
def _jit_columns(A, X, B, transpose):
  return _columns(A, X, B, TOL, transpose)


@functools.partial(jax.jit, static_argnums=3)
def _jit_one(A, X, B, transpose):
  return jax.vmap(lambda x, b: _one(A, x, b, TOL, transpose))(X, B)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 16), st.sampled_from([(3, 5), (50, 50), (20, 80), (1, 1)]),
       st.floats(0., 4.), st.booleans(), st.booleans())
def test_many_columns_of_a_small_matrix_get_each_columns_own_verdict(
    seed, shape, log_cond, transpose, spoil):
  """Columns of one matrix are checked together (one matrix product, one
  reduction over the batch), with each column's verdict, finiteness and
  error as its own check gives them (the products summed in another order:
  the residuals agree to their rounding, n eps times the bound's scale at
  worst, so the errors to n eps and the verdicts where not decided by it):
  right columns, wrong ones, non-finite ones, zero ones."""
  n, m = shape
  A, B, rng = system(seed, n, m, log_cond)
  X = (B @ np.linalg.inv(A.T if transpose else A).T).astype(np.float32)
  # each column off by its own amount, 1e-7 to 1e-2 relative: some fail
  off = 10. ** rng.uniform(-7, -2, (m, 1))
  X = (X * (1 + off * rng.standard_normal(X.shape))).astype(np.float32)
  if spoil:
    X[rng.integers(m)] = 0.
    X[rng.integers(m), rng.integers(n)] = np.nan
    B[rng.integers(m)] = 0.
    X[rng.integers(m), rng.integers(n)] = np.inf
  A, X, B = (jnp.asarray(v) for v in (A, X, B))
  code, error = (np.asarray(v) for v in _jit_columns(A, X, B, transpose))
  code1, error1 = (np.asarray(v) for v in _jit_one(A, X, B, transpose))
  # the Status's reasons: 0 converged, 1 not within tol, 2 non-finite
  ok, finite, ok1, finite1 = code == 0, code != 2, code1 == 0, code1 != 2
  np.testing.assert_array_equal(finite, finite1)
  rounding = n * float(jnp.finfo(jnp.float32).eps)
  np.testing.assert_allclose(error, error1, rtol=1e-5, atol=rounding)
  decided = np.abs(error1 - TOL) > rounding
  np.testing.assert_array_equal(ok[decided], ok1[decided])
  assert ok.shape == finite.shape == error.shape == (m,)
