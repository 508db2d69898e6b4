"""Newton's failures keep their reasons: each failure that the check of a
Newton step's linear solve reports (a solve that misses its tolerance, CG on
a matrix that is not symmetric positive definite, CG or GMRES out of
iterations, a solver of your own that says it failed) is still reported, with
the same reason and step count, eagerly, under ``jit`` and under ``vmap``,
and with ``throw=False`` in the Status; a singular Jacobian is still a
non-finite iterate. Written before Newton's loop was changed (to check only
its last step's solve, which measured slower and was not kept, then to
carry its flags in one integer)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.implicit import (CG, GMRES, REASONS, Dense, Newton, SolveError,
                            Status, root)

NONSYM = jnp.array([[3., 1., 0.5], [-1., 2., 0.3], [0.2, -0.7, 1.5]])
SPD = jnp.array([[4., 1., 0.5], [1., 3., -0.2], [0.5, -0.2, 2.]])
C = jnp.array([1., -2., 0.5])
LINEAR_FAILED = REASONS.index("the linear solve of a Newton step failed")
NONFINITE = REASONS.index("non-finite iterate (inf or nan)")


def tanh_system(x, p):
  """``M x + tanh(x) / 10 = c``: Jacobian ``M + diag(1 - tanh^2) / 10``."""
  M, c = p
  return M @ x + 0.1 * jnp.tanh(x) - c


def says_it_failed(matvec, b):
  """A linear solver of one's own whose solution is right but whose Status
  says it failed."""
  x, _ = Dense()(matvec, b)
  return x, Status(False, 1, 0.5, 1)


# name: (the system's matrix, Newton's linear solver), each failing at step 1
FAILING = {
    "Dense below rounding": (NONSYM, Dense(tol=1e-12)),
    "Dense with tol 0": (NONSYM, Dense(tol=0.)),
    "CG, not symmetric": (NONSYM, CG()),
    "CG, negative definite": (-SPD, CG()),
    "CG out of iterations": (SPD, CG(max_iter=1)),
    "GMRES out of iterations": (NONSYM, GMRES(restart=1, max_iter=1)),
    "a solver of your own": (SPD, says_it_failed),
}


def _message(e):
  return re.sub(r"\s+", " ", str(e))


@pytest.mark.parametrize("name", FAILING)
def test_a_failed_step_solve_is_reported_with_its_reason_and_step(name):
  M, linear_solver = FAILING[name]
  solver = Newton(linear_solver=linear_solver)
  x, st = root(tanh_system, jnp.zeros(3), (M, C), solver=solver, throw=False)
  assert (bool(st.converged), int(st.reason), int(st.steps)) == (
      False, LINEAR_FAILED, 1), st
  assert np.all(np.isfinite(x))
  for call in (lambda p: root(tanh_system, jnp.zeros(3), p, solver=solver),
               jax.jit(lambda p: root(tanh_system, jnp.zeros(3), p,
                                      solver=solver))):
    with pytest.raises(Exception) as e:
      jax.block_until_ready(call((M, C)))
    text = _message(e.value)
    assert (f"hijax.implicit Root (solver={solver!r}) failed: "
            f"{REASONS[LINEAR_FAILED]} (after 1 step(s)") in text, text


def test_under_vmap_the_failing_instance_is_named_and_the_others_solved():
  Ms = jnp.stack([SPD, NONSYM, SPD + jnp.eye(3)])
  solve = jax.vmap(lambda M: root(tanh_system, jnp.zeros(3), (M, C),
                                  solver=Newton(linear_solver=CG()),
                                  throw=False))
  for call in (solve, jax.jit(solve)):
    xs, st = call(Ms)
    assert st.converged.tolist() == [True, False, True], st
    assert st.reason.tolist() == [0, LINEAR_FAILED, 0], st
    assert int(st.steps[1]) == 1, st
    for i in (0, 2):
      np.testing.assert_allclose(tanh_system(xs[i], (Ms[i], C)), 0.,
                                 atol=1e-5)
  with pytest.raises(SolveError, match=re.escape(
      f"{REASONS[LINEAR_FAILED]} (after 1 step(s); under vmap")):
    jax.vmap(lambda M: root(tanh_system, jnp.zeros(3), (M, C),
                            solver=Newton(linear_solver=CG())))(Ms)


def test_a_step_solve_failing_after_good_ones_names_its_step():
  """The cube root of 3 from 1.3 with `Dense(tol=0)`: the first step's
  division is exact, a later one's is not, and the message names that step
  (on a CPU step 2; a TPU v5e divides differently, and failed at step 3)."""
  cube = lambda x, a: x * x * x - a
  solver = Newton(linear_solver=Dense(tol=0.))
  _, st = root(cube, 1.3, 3., solver=solver, throw=False)
  step = int(st.steps)
  assert int(st.reason) == LINEAR_FAILED and step >= 2, st
  if jax.default_backend() == "cpu":
    assert step == 2, st
  with pytest.raises(SolveError, match=re.escape(
      f"{REASONS[LINEAR_FAILED]} (after {step} step(s)")):
    root(cube, 1.3, 3., solver=solver)
  # with exact divisions every step, the same solver converges; a TPU's
  # division is not correctly rounded, and tol=0 refuses its step 3 too
  x, st = root(cube, 1.3, 2., solver=solver, throw=False)
  if jax.default_backend() == "cpu":
    assert bool(st.converged), st
    np.testing.assert_allclose(x, 2. ** (1 / 3), rtol=1e-6)
  else:
    assert bool(st.converged) or int(st.reason) == LINEAR_FAILED, st


@pytest.mark.parametrize("linear_solver", [Dense(), CG(), GMRES()], ids=repr)
def test_a_singular_jacobian_is_a_non_finite_iterate(linear_solver):
  """x^2 - 2 from 0 (scalar) and a system whose Jacobian at 0 is singular:
  the step is infinite or NaN, reported as a non-finite iterate."""
  e_scalar = _raises(lambda a: root(lambda x, a: x * x - a, 0., a,
                                    solver=Newton(linear_solver=Dense())), 2.)
  assert REASONS[NONFINITE] in e_scalar
  g = lambda x, c: x * x - c  # Jacobian diag(2x): zero at x = 0
  _, st = root(g, jnp.zeros(3), jnp.array([1., 2., 3.]),
               solver=Newton(linear_solver=linear_solver), throw=False)
  assert int(st.reason) in (NONFINITE, LINEAR_FAILED), st
  assert not bool(st.converged)


def _raises(fn, *args):
  with pytest.raises(SolveError) as e:
    fn(*args)
  return _message(e.value)


@pytest.mark.parametrize("linear_solver", [Dense(), CG(), GMRES()], ids=repr)
def test_newton_with_each_linear_solver_converges_where_each_step_passes(
    linear_solver):
  x, st = root(tanh_system, jnp.zeros(3), (SPD, C),
               solver=Newton(linear_solver=linear_solver), throw=False)
  assert bool(st.converged), st
  np.testing.assert_allclose(tanh_system(x, (SPD, C)), 0., atol=1e-5)
  assert 1 < int(st.steps) < 10
