"""hijax.implicit never returns a silent wrong number: each case of issue 20
(a failed solve raises, eagerly and under jit and vmap; throw=False returns a
Status and NaN derivatives; tolerances bound what they say, per leaf dtype;
CG's precondition; GMRES on an ill-conditioned system; narrow and complex
dtypes; clear errors for misuse)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.implicit import (CG, GMRES, REASONS, Dense, FixedPointIteration,
                            Newton, SolveError, Status, default_tol,
                            fixed_point, linear_solve, root)

FAILED = "failed: "

# A TPU has no float64 LU (tests/test_implicit_precision.py::
# test_a_tpu_has_no_float64_lu shows it there); Dense refuses it in words.
NO_FLOAT64_LU = pytest.mark.skipif(
    jax.default_backend() == "tpu",
    reason="a TPU has no float64 LU (XLA: 'Only F32 and C64 types are "
    "implemented in LuDecomposition'), which Dense needs")


def slow(x, a):
  return 0.999 * x + a


def divergent(x, a):
  return 2 * x + a


def square_minus(x, a):
  return x * x - a


def matvec(x, A):
  return A @ x


def _raises_solve_error(fn, *args, match=FAILED):
  """``fn(*args)`` raises: SolveError eagerly, JAX's runtime error (with the
  same message) under jit."""
  with pytest.raises(Exception, match=re.escape(match)) as e:
    jax.block_until_ready(fn(*args))
  return e.value


# --- 1, 2: max_iter and non-finite iterates raise -------------------------------

def test_max_iter_reached_raises_eagerly():
  e = _raises_solve_error(fixed_point, slow, 0., 1e-3)
  assert isinstance(e, SolveError)
  assert "FixedPoint" in str(e) and REASONS[1] in str(e)
  assert "throw=False" in str(e)


def test_the_message_names_the_worst_instance_and_its_step_count():
  """Under vmap one instance reaching max_iter (reason 1, after max_iter
  steps) and one diverging (reason 2, after a few steps) report the worst
  reason, with its step count; eagerly and under jit alike."""
  f = lambda x, a: a * x + 1.  # a = 1e10: overflows; a = 0.9999: too slow
  solve = jax.vmap(lambda a: fixed_point(
      f, 0., a, solver=FixedPointIteration(max_iter=50)))
  for call in (solve, jax.jit(solve)):
    e = _raises_solve_error(call, jnp.array([0.9999, 1e10]))
    steps = int(re.search(r"after (\d+) step", str(e)).group(1))
    assert REASONS[2] in str(e) and 0 < steps < 50, str(e)
  e = _raises_solve_error(solve, jnp.array([0.9999, 0.5]))
  assert REASONS[1] in str(e) and "after 50 step(s)" in str(e), str(e)


def test_divergence_and_a_singular_newton_step_raise():
  e = _raises_solve_error(fixed_point, divergent, 0., 1.)
  assert REASONS[2] in str(e)
  e = _raises_solve_error(root, square_minus, 0., 2.)
  assert "Root" in str(e) and REASONS[2] in str(e)
  # grad of the failed root is not 0.0: it raises too
  grad = jax.grad(lambda a: root(square_minus, 0., a))
  _raises_solve_error(grad, 2.)


def test_failure_raises_under_jit_and_jit_of_grad():
  solve = lambda a: root(square_minus, 0., a)
  _raises_solve_error(jax.jit(solve), 2.)
  _raises_solve_error(jax.jit(jax.grad(solve)), 2.)
  ok = jax.jit(lambda a: root(square_minus, 1., a))
  np.testing.assert_allclose(ok(2.), np.sqrt(2.), rtol=1e-6)


# --- 3: tolerances mean what they say ---------------------------------------------

def test_float64_default_tolerance_is_reached_on_a_rate_099_contraction():
  with jax.enable_x64(True):
    x, st = fixed_point(lambda x, a: .99 * x + a, 0., 1., throw=False)
    assert bool(st.converged), st
    assert x.dtype == jnp.float64
    # tol bounds the distance to the fixed point, relative to 1 + |x|
    assert abs(float(x) - 100.) <= default_tol(jnp.float64) * 101
    assert FixedPointIteration().max_iter >= int(st.steps)


def test_float32_tolerance_bounds_the_error_not_the_step():
  # The step of .99x + 1 falls below 1e-6 long before x is within 1e-6 of
  # 100: a step test stops early. The error test either meets it or fails.
  try:
    x = fixed_point(lambda x, a: .99 * x + a, 0., 1.)
  except SolveError:
    return
  assert abs(float(x) - 100.) <= 1e-6 * 101 * 4  # rounding of f itself


def test_fast_contraction_in_float32_converges():
  x, st = fixed_point(lambda x, a: .5 * x + a, 0., 1., throw=False)
  assert bool(st.converged) and abs(float(x) - 2.) <= 1e-6 * 3


def test_default_tolerances_by_dtype():
  assert default_tol(jnp.float64) == 1e-12
  assert default_tol(jnp.complex128) == 1e-12
  assert default_tol(jnp.float32) == 1e-6
  assert default_tol(jnp.complex64) == 1e-6
  assert default_tol(jnp.bfloat16) >= 10 * float(jnp.finfo(jnp.bfloat16).eps)
  assert default_tol(jnp.float16) >= 10 * float(jnp.finfo(jnp.float16).eps)


# --- 4: vmap -------------------------------------------------------------------------

def test_one_failing_instance_under_vmap_fails_the_batch():
  solve = jax.vmap(lambda a: fixed_point(lambda x, a: a * x + 1., 0., a))
  _raises_solve_error(solve, jnp.array([0.5, 2.0, 0.25]))
  _raises_solve_error(jax.jit(solve), jnp.array([0.5, 2.0, 0.25]))
  np.testing.assert_allclose(jax.jit(solve)(jnp.array([0.5, 0.25])),
                             [2., 4 / 3], rtol=1e-5)


def test_one_failing_instance_anywhere_in_a_long_batch_fails_it():
  """The batch's "did any instance fail" is a count (a product with ones):
  one failure among 20,000, first, in the middle or last, under one vmap or
  two, raises; none does not, nor does an empty batch."""
  one = lambda a: fixed_point(lambda x, a: a * x + 1., 0., a)
  solve = jax.jit(jax.vmap(one))
  nested = jax.jit(jax.vmap(jax.vmap(one)))
  a = np.full(20_000, 0.5, np.float32)
  np.testing.assert_allclose(solve(a), 2., rtol=1e-5)
  np.testing.assert_allclose(nested(a.reshape(100, 200)), 2., rtol=1e-5)
  for i in (0, 12_345, 19_999):
    bad = a.copy()
    bad[i] = 2.  # diverges
    _raises_solve_error(solve, bad)
    _raises_solve_error(nested, bad.reshape(100, 200))
  assert solve(np.zeros(0, np.float32)).shape == (0,)


def test_status_under_vmap_says_which_instance_failed():
  solve = jax.vmap(lambda a: fixed_point(lambda x, a: a * x + 1., 0., a,
                                         throw=False))
  x, st = jax.jit(solve)(jnp.array([0.5, 2.0, 0.25]))
  assert st.converged.tolist() == [True, False, True]
  assert st.reason.tolist()[1] == 2  # non-finite
  np.testing.assert_allclose(x[np.array([0, 2])], [2., 4 / 3], rtol=1e-5)


# --- throw=False: the status and NaN derivatives ------------------------------------

def test_throw_false_returns_the_status():
  x, st = fixed_point(slow, 0., 1e-3, throw=False)
  assert isinstance(st, Status)
  assert not bool(st.converged) and int(st.reason) == 1
  assert int(st.steps) == FixedPointIteration().max_iter
  x, st = fixed_point(lambda x, a: .5 * x + a, 0., 1., throw=False)
  assert bool(st.converged) and 0 < int(st.steps) < 100
  assert float(st.error) <= 1e-6


def test_the_derivative_of_a_failed_solve_is_nan():
  loss = lambda a: fixed_point(slow, 0., a, throw=False)[0]
  assert np.isnan(jax.grad(loss)(1e-3))
  assert np.isnan(jax.jvp(loss, (1e-3,), (1.,))[1])
  good = lambda a: fixed_point(lambda x, a: .5 * x + a, 0., a,
                               throw=False)[0]
  np.testing.assert_allclose(jax.grad(good)(1.), 2., rtol=1e-5)
  lin = lambda A: linear_solve(matvec, jnp.ones(2), A, throw=False)[0].sum()
  singular = jnp.array([[1., 2.], [2., 4.]])
  assert np.isnan(jax.grad(lin)(singular)).all()


def test_a_failed_derivative_solve_raises():
  # The forward solve succeeds (a solver that knows the answer); the tangent
  # system has the matrix dg/dx = 2 (x - 1) = 0 at the double root x = 1.
  g = lambda x, a: (x - 1.) ** 2 - a
  exact = lambda g, x0, a: x0
  solve = lambda a: root(g, 1., a, solver=exact)
  np.testing.assert_allclose(solve(0.), 1.)
  _raises_solve_error(jax.grad(solve), 0.)


# --- 5: CG needs a symmetric positive definite matrix ---------------------------------

def test_cg_rejects_a_nonsymmetric_matrix():
  A = jnp.array([[2., 1.], [-1., 2.]])
  e = _raises_solve_error(
      lambda A: linear_solve(matvec, jnp.ones(2), A, solver=CG()), A,
      match=REASONS[3])
  assert "CG" in str(e)
  # negative definite: symmetric but not positive
  _raises_solve_error(
      lambda A: linear_solve(matvec, jnp.ones(2), A, solver=CG()), -jnp.eye(2),
      match=REASONS[3])


def test_cg_residual_is_checked_even_without_the_probe():
  # Indefinite and symmetric, unchecked: CG's answer is tested by its residual.
  A = jnp.diag(jnp.array([1., -1., 2.]))
  solve = lambda A: linear_solve(matvec, jnp.array([1., 1., 1.]), A,
                                 solver=CG(check=False, max_iter=2),
                                 throw=False)
  x, st = solve(A)
  if bool(st.converged):
    np.testing.assert_allclose(A @ x, 1., rtol=1e-5)


# --- 6: GMRES on an ill-conditioned system ----------------------------------------------

def test_gmres_solves_an_8x8_hilbert_system_in_float64():
  with jax.enable_x64(True):
    H = 1. / (jnp.arange(8.)[:, None] + jnp.arange(8.) + 1)
    b = jnp.ones(8)
    x = linear_solve(matvec, b, H, solver=GMRES())
    assert np.all(np.isfinite(x))
    assert np.linalg.norm(H @ x - b) <= 1e-10 * np.linalg.norm(b)


# --- 7: per-leaf default tolerances -----------------------------------------------------

def test_each_leaf_gets_the_tolerance_of_its_dtype():
  with jax.enable_x64(True):
    f = lambda x, a: (.5 * x[0] + a.astype(jnp.float32), .99 * x[1] + a)
    x, st = fixed_point(f, (jnp.float32(0.), jnp.float64(0.)), 1.,
                        throw=False)
    assert bool(st.converged)
    assert abs(float(x[1]) - 100.) <= 1e-12 * 101  # not 1e-6
    assert abs(float(x[0]) - 2.) <= 1e-6 * 3


# --- 8: bfloat16 and complex unknowns ---------------------------------------------------

def test_bfloat16_unknowns_solved_and_differentiated():
  a = jnp.bfloat16(2.)
  sqrt = lambda a: fixed_point(lambda x, a: .5 * (x + a / x), a, a)
  assert sqrt(a).dtype == jnp.bfloat16
  np.testing.assert_allclose(float(sqrt(a)), 2 ** .5, rtol=2e-2)
  np.testing.assert_allclose(float(jax.grad(sqrt)(a)), .5 / 2 ** .5,
                             rtol=3e-2)
  A = jnp.array([[2., 1.], [0., 3.]], jnp.bfloat16)
  b = jnp.array([1., 1.], jnp.bfloat16)
  lin = lambda A: linear_solve(matvec, b, A).astype(jnp.float32).sum()
  ref = lambda A: jnp.linalg.solve(A, b.astype(jnp.float32)).sum()
  np.testing.assert_allclose(jax.grad(lin)(A).astype(np.float32),
                             jax.grad(ref)(A.astype(jnp.float32)), rtol=5e-2,
                             atol=2e-2)


def test_complex_unknowns_for_each_nonlinear_solver():
  a = jnp.complex64(3. + 4j)
  csqrt = lambda a: root(lambda x, a: x * x - a, 1. + 1j, a)
  np.testing.assert_allclose(csqrt(a), 2. + 1j, rtol=1e-5)
  # d sqrt(a) / da = 1 / (2 sqrt(a)), holomorphic
  np.testing.assert_allclose(jax.grad(csqrt, holomorphic=True)(a),
                             1 / (2 * (2. + 1j)), rtol=1e-5)
  fp = lambda a: fixed_point(lambda x, a: .5 * x + a, 0j, a)
  np.testing.assert_allclose(fp(a), 2 * a, rtol=1e-5)
  np.testing.assert_allclose(jax.jacfwd(fp, holomorphic=True)(a), 2.,
                             rtol=1e-5)


# --- 9: clear errors -----------------------------------------------------------------------

def test_a_one_argument_function_names_the_convention():
  with pytest.raises(TypeError, match=r"fixed_point.*`f`.*`f\(x, params\)`"):
    fixed_point(lambda x: .5 * x, 0., ())
  with pytest.raises(TypeError, match=r"root.*`g`.*`g\(x, params\)`"):
    root(lambda x: x, 0., ())


def test_b_as_a_python_list_gets_a_hint():
  A = jnp.eye(2)
  with pytest.raises(TypeError,
                     match=r"linear_solve.*`matvec\(x, params\)`.*jnp.asarray"):
    linear_solve(matvec, [1., 2.], A)


def test_a_solver_closing_over_a_tracer_is_named():
  def bad(a):
    my_solver = lambda f, x0, p: FixedPointIteration(tol=1e-5)(f, x0 * a, p)
    return fixed_point(lambda x, p: .5 * x + p, 1., a, solver=my_solver)
  with pytest.raises(TypeError, match=r"fixed_point.*`solver`.*traced"):
    jax.grad(bad)(1.)
  with pytest.raises(TypeError, match=r"`linear_solver`.*traced"):
    jax.grad(lambda a: root(square_minus, 1., a,
                            linear_solver=CG(tol=a)))(2.)


def test_a_solver_of_your_own_may_return_x_alone():
  def halley_free_newton(g, x0, p):
    return Newton()(g, x0, p)[0]
  x = root(square_minus, 1., 2., solver=halley_free_newton)
  np.testing.assert_allclose(x, 2 ** .5, rtol=1e-6)
  inf_solver = lambda g, x0, p: x0 * jnp.inf
  _raises_solve_error(lambda a: root(square_minus, 1., a, solver=inf_solver),
                      2., match=REASONS[2])


def test_dense_fails_on_a_singular_matrix():
  e = _raises_solve_error(linear_solve, matvec, jnp.ones(2),
                          jnp.array([[1., 2.], [2., 4.]]))
  assert "LinearSolve" in str(e) and "Dense" in str(e)


@NO_FLOAT64_LU
def test_dense_passes_an_ill_conditioned_regular_matrix():
  # ill-conditioned but regular: a backward-stable solve passes
  with jax.enable_x64(True):
    H = 1. / (jnp.arange(8.)[:, None] + jnp.arange(8.) + 1)
    x = linear_solve(matvec, jnp.ones(8), H, solver=Dense())
    np.testing.assert_allclose(H @ x, 1., atol=1e-8)


def test_a_user_solver_returning_x_alone_gets_a_status_of_finiteness():
  """A solver may return x alone: its Status is then converged after 1 step
  with error 0 if x is finite, and NONFINITE with error inf if not."""
  def exact(f, x0, p):  # the fixed point of x = 0.5 x + p is 2 p
    return 2. * p

  def broken(f, x0, p):
    return jnp.full_like(x0, jnp.nan)

  f = lambda x, p: 0.5 * x + p
  x, st = fixed_point(f, 1., 3., solver=exact, throw=False)
  assert float(x) == 6. and bool(st.converged)
  assert (int(st.steps), float(st.error), int(st.reason)) == (1, 0., 0)
  x, st = fixed_point(f, 1., 3., solver=broken, throw=False)
  assert not bool(st.converged) and np.isnan(float(x))
  assert (int(st.steps), float(st.error)) == (1, np.inf)
  assert REASONS[int(st.reason)].startswith("non-finite")


def test_tol_zero_converges_on_an_exact_fixed_point():
  """``tol=0`` is met when the error estimate is exactly 0 (x0 is a fixed
  point as computed: the first step is zero, and that is known at once), not
  only below it."""
  x, st = fixed_point(lambda x, p: p, 5., 5., throw=False,
                      solver=FixedPointIteration(tol=0., max_iter=50))
  assert float(x) == 5. and bool(st.converged) and int(st.steps) == 1, st


# --- eager transformations raise SolveError, as an eager call does -------------------

@pytest.mark.parametrize("transform", [
    jax.grad, jax.jacfwd, jax.hessian,
    lambda f: lambda a: jax.jvp(f, (a,), (1.,))[1],
    lambda f: lambda a: jax.vmap(f)(jnp.stack([a, a])),
], ids=["grad", "jacfwd", "hessian", "jvp", "vmap"])
def test_a_failed_forward_solve_under_an_eager_transformation_is_a_solve_error(
    transform):
  fn = transform(lambda a: fixed_point(slow, 0., a))
  with pytest.raises(SolveError, match=re.escape(REASONS[1])):
    jax.block_until_ready(fn(jnp.float32(1e-3)))


def test_a_failed_derivative_solve_in_an_eager_backward_pass_carries_the_message():
  # JAX runs grad's backward pass (the transposed solve), not hijax: its
  # runtime error carries the SolveError's message, as under jit.
  g = lambda x, a: (x - 1.) ** 2 - a
  solve = lambda a: root(g, 1., a, solver=lambda g, x0, a: x0)
  with pytest.raises(Exception, match="SolveError: hijax.implicit "
                     "LinearSolve") as e:
    jax.block_until_ready(jax.grad(solve)(0.))
  assert not isinstance(e.value, SolveError)
  with pytest.raises(SolveError, match="LinearSolve"):  # forward mode: ours
    jax.jvp(solve, (0.,), (1.,))


# --- a Status's verdict: not converged is a failure, whatever its reason -------

def test_a_users_status_not_converged_with_reason_0_raises():
  """A solver of one's own whose Status says ``converged=False`` with reason
  0 ("converged") failed: ``throw=True`` raises SolveError (eagerly, under
  ``jit``), and with ``throw=False`` the Status says not converged with a
  failure's reason, for `fixed_point`'s solver, `linear_solve`'s and the
  linear solver of a Newton step."""
  def gave_up(f, x0, p):
    return x0, Status(False, 3, 0.5, 0)

  def gave_up_linear(matvec, b):
    return b, Status(jnp.bool_(False), 1, 0.25, jnp.int32(0))

  f = lambda x, p: 0.5 * x + p
  calls = {
      "fixed_point": lambda p, throw: fixed_point(f, jnp.ones(2), p,
                                                  solver=gave_up,
                                                  throw=throw),
      "linear_solve": lambda p, throw: linear_solve(
          matvec, jnp.ones(2), p * jnp.eye(2), solver=gave_up_linear,
          throw=throw),
      "Newton's step": lambda p, throw: root(
          square_minus, jnp.ones(2), p, throw=throw,
          solver=Newton(linear_solver=gave_up_linear)),
  }
  p = jnp.full(2, 2.)
  for name, call in calls.items():
    _, st = call(p, False)
    assert not bool(st.converged), (name, st)
    assert int(st.reason) != 0, (name, st)
    with pytest.raises(SolveError, match=re.escape(FAILED)):
      call(p, True)
    _raises_solve_error(jax.jit(lambda p: call(p, True)), p)


def test_one_non_finite_leaf_among_finite_ones_is_not_converged():
  """A pytree unknown with one non-finite leaf among finite ones is a
  non-finite iterate, not a converged solution: from a solver of one's own
  that returns ``x`` alone, from `FixedPointIteration` (at the start, and
  when one leaf's step turns to NaN) and from `Newton`."""
  def one_nan(f, x0, p):  # the middle leaf of three
    return {"a": jnp.ones(2), "b": jnp.array([1., jnp.nan]),
            "c": jnp.float32(2.)}

  x0 = {"a": jnp.zeros(2), "b": jnp.zeros(2), "c": jnp.float32(0.)}
  half = lambda x, p: jax.tree.map(lambda v: 0.5 * v + p, x)
  nan_b = lambda x, p: {"a": 0.5 * x["a"] + p, "b": x["b"] * jnp.nan + p,
                        "c": 0.5 * x["c"] + p}
  started_nan = dict(x0, c=jnp.float32(jnp.inf))
  # b: no real root, and a singular first Newton step from b = 0
  root_b = lambda x, p: {"a": x["a"] - p, "b": x["b"] ** 2 + p,
                         "c": x["c"] - p}
  cases = {
      "x alone": lambda throw: fixed_point(half, x0, 1., solver=one_nan,
                                           throw=throw),
      "FixedPointIteration, a NaN step": lambda throw: fixed_point(
          nan_b, x0, 1., throw=throw),
      "FixedPointIteration, a start with inf": lambda throw: fixed_point(
          half, started_nan, 1., throw=throw),
      "Newton": lambda throw: root(root_b, x0, 1., throw=throw),
  }
  for name, call in cases.items():
    x, st = call(False)
    assert not bool(st.converged), (name, st)
    assert REASONS[int(st.reason)].startswith("non-finite"), (name, st)
    assert not all(np.all(np.isfinite(v)) for v in jax.tree.leaves(x)), name
    if name in ("x alone", "FixedPointIteration, a NaN step"):
      assert np.all(np.isfinite(x["a"])) and np.isfinite(x["c"]), (name, x)
    with pytest.raises(SolveError, match=re.escape(REASONS[2])):
      call(True)
