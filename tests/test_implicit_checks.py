"""Dense's check gives the verdicts of the backward-error check written out,
|b - A x| <= tol (|A| |x| + |b|): the verdict, the reason and the reported
error, alone and under vmap with instances that need |A| (a residual over
tol (|A x| + |b|) but within the bound) beside ones that do not."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hijax.implicit import Dense, MatMul, linear_solve
N = 70
BIG = 160  # from DEFER_NORM_FROM unknowns |A| is read only where needed


def reference(A, x, b, tol, transpose=False):
  """The backward-error check, written out: (converged, error)."""
  ax = x @ A if transpose else A @ x
  r = jnp.max(jnp.abs(b - ax))
  norm = jnp.max(jnp.sum(jnp.abs(A), axis=0 if transpose else 1))
  scale = norm * jnp.max(jnp.abs(x)) + jnp.max(jnp.abs(b))
  ok = jnp.isfinite(r) & jnp.all(jnp.isfinite(x)) & (r <= tol * scale)
  return ok, r / scale


def system(seed, log_cond, n=N):
  """A matrix with singular values from 1 to 10**-log_cond, a solution and
  its right-hand side, in float32."""
  rng = np.random.default_rng(seed)
  U, _ = np.linalg.qr(rng.standard_normal((n, n)))
  V, _ = np.linalg.qr(rng.standard_normal((n, n)))
  A = (U * np.logspace(0, -log_cond, n)) @ V.T
  x = rng.standard_normal(n)
  return (jnp.asarray(A, jnp.float32), jnp.asarray(x, jnp.float32),
          jnp.asarray(A @ x, jnp.float32))


# one program per shape and side, traced once for all the examples below
_check = jax.jit(lambda A, x, b, transpose: Dense()._check(A, x, b, transpose),
                 static_argnums=3)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2 ** 16), st.floats(0., 7.), st.floats(-8., 0.),
       st.booleans(), st.sampled_from([N, BIG]))
def test_the_verdict_and_error_are_the_full_checks(seed, log_cond, log_err,
                                                   transpose, n):
  A, x, b = system(seed, log_cond, n)
  if transpose:
    b = x @ A
  # a solution off by a relative 10**log_err: passes or fails by the bound
  x_off = x * (1 + 10. ** log_err * jnp.cos(jnp.arange(n, dtype=jnp.float32)))
  tol = float(jnp.finfo(jnp.float32).eps) ** 0.5
  st_ = _check(A, x_off, b, transpose)
  ok, err = reference(A, x_off, b, tol, transpose)
  assume(abs(float(err) / tol - 1) > 1e-3)  # not at the bound, to rounding
  assert bool(st_.converged) == bool(ok)
  np.testing.assert_allclose(st_.error, err, rtol=1e-4, atol=1e-7)


def test_under_vmap_easy_hard_and_failing_instances_get_their_verdicts():
  """Instance 0 passes on |A x| + |b| alone, instance 1 needs |A| (a large x
  for a small b, as for an ill-conditioned matrix) and passes, instance 2
  fails: each verdict is the full check's."""
  A, x, b = system(0, 1.)
  big = 1e4 * jnp.cos(jnp.arange(N, dtype=jnp.float32))
  # A @ big is far smaller than |A| |big|: pick b so that x is big, and put
  # the residual between the cheap bound and the full one
  A = A.at[:, 0].set(1e-3 * A[:, 0])
  xs = jnp.stack([x, big, x])
  bs = jnp.stack([A @ x, A @ big, A @ x])
  tol = float(jnp.finfo(jnp.float32).eps) ** 0.5
  norm = jnp.max(jnp.sum(jnp.abs(A), axis=1))
  r1 = 0.5 * tol * norm * jnp.max(jnp.abs(big))  # within the full bound only
  bs = bs.at[1, 0].add(r1).at[2, 0].add(1.)
  sts = jax.jit(jax.vmap(lambda x, b: Dense()._check(A, x, b)))(xs, bs)
  refs = [reference(A, xs[i], bs[i], tol) for i in range(3)]
  assert [bool(c) for c in sts.converged] == [bool(r[0]) for r in refs]
  assert [bool(r[0]) for r in refs] == [True, True, False]
  # and instance 1 did need |A|: the cheap bound alone would fail it
  cheap = tol * (jnp.max(jnp.abs(A @ big)) + jnp.max(jnp.abs(bs[1])))
  assert float(jnp.max(jnp.abs(bs[1] - A @ big))) > float(cheap)
  np.testing.assert_allclose(sts.error, [r[1] for r in refs], rtol=1e-4,
                             atol=1e-7)


@pytest.mark.parametrize("transpose", [False, True])
def test_a_large_system_reads_its_norm_where_the_residual_needs_it(transpose):
  """From DEFER_NORM_FROM unknowns, |A| is read only where the residual is
  over half of tol (|A x| + |b|), behind a conditional: a solution within
  that passes, one within the full bound only passes, one outside fails,
  each with the full check's error (jitted: the conditional compiled)."""
  from hijax.implicit._backward_error import DEFER_NORM_FROM
  assert BIG >= DEFER_NORM_FROM
  A, x, _ = system(0, 1., BIG)
  A = A.at[:, 0].set(1e-3 * A[:, 0])
  big = 1e4 * jnp.cos(jnp.arange(BIG, dtype=jnp.float32))
  product = (lambda v: v @ A) if transpose else (lambda v: A @ v)
  tol = float(jnp.finfo(jnp.float32).eps) ** 0.5
  norm = jnp.max(jnp.sum(jnp.abs(A), axis=0 if transpose else 1))
  r1 = 0.5 * tol * norm * jnp.max(jnp.abs(big))  # within the full bound only
  cases = [(x, product(x)), (big, product(big).at[0].add(r1)),
           (x, product(x).at[0].add(1.))]
  check = jax.jit(lambda x, b: Dense()._check(A, x, b, transpose))
  verdicts = []
  for x_i, b_i in cases:
    st_ = check(x_i, b_i)
    ok, err = reference(A, x_i, b_i, tol, transpose)
    assert bool(st_.converged) == bool(ok)
    np.testing.assert_allclose(st_.error, err, rtol=1e-4, atol=1e-7)
    verdicts.append(bool(ok))
  assert verdicts == [True, True, False]
  # case 1 did need |A|: half the cheap bound alone would fail it
  x1, b1 = cases[1]
  cheap = tol / 2 * (jnp.max(jnp.abs(product(x1))) + jnp.max(jnp.abs(b1)))
  assert float(jnp.max(jnp.abs(b1 - product(x1)))) > float(cheap)


def test_a_singular_system_still_fails_and_a_good_one_solves():
  A, x, b = system(1, 2.)
  singular = A.at[:, 1].set(A[:, 0])
  _, st_ = linear_solve(MatMul(), b, singular, throw=False)
  ok, _ = reference(singular, linear_solve(MatMul(), b, singular,
                                           throw=False)[0], b, 3.4526698e-4)
  assert bool(st_.converged) == bool(ok)
  x_got, st_ = linear_solve(MatMul(), b, A, throw=False)
  assert bool(st_.converged)
  np.testing.assert_allclose(x_got, x, rtol=1e-3, atol=1e-3)


def _verdict_of(r, x_max, b_max, norm=2.):
  """`_verdict` at given maxima (exact binary numbers), tol 2**-10, for a
  matrix whose largest row sum of |M| is ``norm``."""
  from hijax.implicit._backward_error import _verdict
  maxima = jnp.array([r, x_max, b_max, norm], jnp.float32)
  code, error = _verdict(maxima, 2. ** -10)
  return int(code) == 0, int(code) != 2, float(error)


def test_the_bound_at_its_edges():
  """|b - M x| <= tol (|M| |x| + |b|), equality passing; the error is the
  residual over the bound's scale, and 0 for a zero column (nothing to
  divide)."""
  tol = 2. ** -10
  x_max, b_max = 4., 8.  # scale = 2 * 4 + 8 = 16
  assert _verdict_of(tol * 16, x_max, b_max) == (True, True, tol)
  assert not _verdict_of(tol * 17, x_max, b_max)[0]
  # within the bound only thanks to |b|, and only thanks to |M|
  assert _verdict_of(tol * 12, x_max, b_max)[0]
  assert not _verdict_of(tol * 12, x_max, b_max, norm=0.5)[0]
  assert _verdict_of(0., 0., 0.) == (True, True, 0.)
  # a scale under 1: the error is still residual / scale
  assert _verdict_of(tol / 8, 2. ** -4, 2. ** -3)[2] == tol / 2
  assert _verdict_of(float("nan"), x_max, b_max)[:2] == (False, False)
  assert _verdict_of(tol, float("inf"), b_max)[:2] == (False, False)


@pytest.mark.parametrize("n", [50, N])
def test_right_hand_sides_batched_beside_one_solution(n):
  """vmap over b alone (x and the matrix the same for every instance), at
  two sizes: each instance's verdict and error are its own check's."""
  from hijax.implicit._backward_error import backward_error
  A, x, b = system(1, 1., n)
  tol = float(jnp.finfo(jnp.float32).eps) ** 0.5
  bs = jnp.stack([b, b + 1e-8, b + 1e-1, 0 * b])
  got = jax.jit(jax.vmap(lambda b: backward_error(A, x, b, tol)))(bs)
  for i, bi in enumerate(bs):
    code, error = backward_error(A, x, bi, tol)
    assert int(got[0][i]) == int(code)
    np.testing.assert_allclose(got[1][i], error, rtol=1e-5, atol=1e-6)  # rounding
  # (the reasons: 0 converged, 1 not within tol)
  assert [int(v) for v in got[0]] == [0, 0, 1, 1]
