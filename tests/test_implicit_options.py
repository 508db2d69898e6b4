"""Options and edge sizes of hijax.implicit's solvers: one spelling of the
bound on iterations (``max_iter``) in every solver, the old one of CG and
GMRES (``maxiter``) still accepted with a DeprecationWarning; a solve of no
unknowns, or a batch of no solves (``vmap`` over an empty axis, ``jacfwd`` or
``jacrev`` of a zero-size solution), returns the empty answer."""
import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.implicit import (CG, GMRES, Dense, FixedPointIteration, MatMul,
                            Newton, fixed_point, linear_solve, root)

SPD = jnp.array([[4., 1., 0.5], [1., 3., -0.2], [0.5, -0.2, 2.]])


def matvec(x, A):
  return A @ x


# --- max_iter, everywhere -----------------------------------------------------

@pytest.mark.parametrize("solver", [FixedPointIteration, Newton, CG, GMRES])
def test_every_solver_bounds_its_iterations_by_max_iter(solver):
  names = [f.name for f in dataclasses.fields(solver)]
  assert "max_iter" in names and "maxiter" not in names
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert solver(max_iter=7).max_iter == 7


@pytest.mark.parametrize("solver", [CG, GMRES])
def test_the_old_spelling_maxiter_warns_and_means_max_iter(solver):
  with pytest.warns(DeprecationWarning, match=rf"{solver.__name__}\(maxiter="
                    rf"\.\.\.\) is deprecated.*write {solver.__name__}"
                    r"\(max_iter=3\)"):
    old = solver(maxiter=3)
  assert old == solver(max_iter=3) and hash(old) == hash(solver(max_iter=3))
  assert "maxiter" not in repr(old) and "max_iter=3" in repr(old)
  with pytest.raises(TypeError, match="pass `max_iter` only"):
    solver(max_iter=3, maxiter=4)


def test_max_iter_bounds_cg_and_gmres():
  """One iteration of CG on 3 unknowns with distinct eigenvalues misses the
  tolerance; the Status says how many steps were allowed."""
  b = jnp.array([1., -2., 0.5])
  for solver in (CG(max_iter=1), GMRES(restart=1, max_iter=1)):
    _, st = linear_solve(matvec, b, SPD, solver=solver, throw=False)
    assert not bool(st.converged) and int(st.steps) == 1, (solver, st)
    x = linear_solve(matvec, b, SPD, solver=dataclasses.replace(
        solver, max_iter=30))
    np.testing.assert_allclose(SPD @ x, b, atol=1e-5)


# --- no unknowns, or no solves ------------------------------------------------

@pytest.mark.parametrize("solver", [Dense(), CG(), GMRES()], ids=repr)
def test_a_system_of_no_unknowns_is_solved_by_the_empty_vector(solver):
  for mv in (matvec, MatMul()):
    if not isinstance(solver, Dense) and isinstance(mv, MatMul):
      continue
    x, st = linear_solve(mv, jnp.zeros(0), jnp.zeros((0, 0)), solver=solver,
                         throw=False)
    assert x.shape == (0,) and bool(st.converged), st
  grad = jax.grad(lambda A: linear_solve(matvec, jnp.zeros(0), A,
                                         solver=solver).sum())
  assert grad(jnp.zeros((0, 0))).shape == (0, 0)


def test_a_root_and_fixed_point_of_no_unknowns():
  for linear_solver in (Dense(), CG(), GMRES()):
    x = root(lambda x, a: x - a, jnp.zeros(0), jnp.zeros(0),
             solver=Newton(linear_solver=linear_solver))
    assert x.shape == (0,)
  assert fixed_point(lambda x, a: x / 2 + a, jnp.zeros(0),
                     jnp.zeros(0)).shape == (0,)


def test_a_batch_of_no_solves_returns_the_empty_batch():
  """vmap over an empty axis, and jacfwd/jacrev of a zero-size solution
  (each a vmap over no directions), raised NumPy's "zero-size array to
  reduction operation max which has no identity" (from the reduction of the
  batch's failure codes)."""
  A = SPD
  lin = jax.vmap(lambda b: linear_solve(matvec, b, A))
  assert lin(jnp.zeros((0, 3))).shape == (0, 3)
  assert jax.jit(lin)(jnp.zeros((0, 3))).shape == (0, 3)
  sqrt = jax.vmap(lambda a: root(lambda x, a: x * x - a, 1., a))
  assert sqrt(jnp.zeros(0)).shape == (0,)
  half = jax.vmap(lambda a: fixed_point(lambda x, a: x / 2 + a, 1., a))
  assert half(jnp.zeros(0)).shape == (0,)
  zero_size = lambda a: root(lambda x, a: x - a, jnp.zeros(0), a)
  for jac in (jax.jacrev, jax.jacfwd):
    assert jac(zero_size)(jnp.zeros(0)).shape == (0, 0)
  # and a batch that is not empty still fails on a failing instance
  with pytest.raises(Exception, match="non-finite"):
    half_or_worse = jax.vmap(lambda a: fixed_point(lambda x, a: a * x + 1.,
                                                   0., a))
    jax.block_until_ready(half_or_worse(jnp.array([0.5, 2.])))
