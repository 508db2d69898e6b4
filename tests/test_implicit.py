"""hijax.implicit: derivatives of fixed points, roots and linear solves, checked
against closed forms, plain JAX, loops and `hijax.testing.assert_rules`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import implicit
from hijax.implicit import (CG, GMRES, Dense, FixedPointIteration, Newton,
                            fixed_point, linear_solve, root)
from hijax.testing import assert_rules

# A TPU has no float64 LU (tests/test_implicit_precision.py::
# test_a_tpu_has_no_float64_lu shows it there); The checker runs in
# float64, where Dense refuses it in words.
NO_FLOAT64_LU = pytest.mark.skipif(
    jax.default_backend() == "tpu",
    reason="a TPU has no float64 LU (XLA: 'Only F32 and C64 types are "
    "implemented in LuDecomposition'), which Dense needs")

SOLVERS = [Dense(), CG(), GMRES()]


def newton_step(x, a):
  return 0.5 * (x + a / x)


def sqrt(a):
  return fixed_point(newton_step, a, a)


def cube(x, a):
  return x ** 3 - a


def cbrt(a):
  return root(cube, jnp.ones_like(a), a)


def affine(x, p):
  return p["A"] @ x + p["c"]


def matvec(x, A):
  return A @ x


def _params():
  A = jnp.array([[0.2, -0.1, 0.0], [0.1, 0.3, 0.1], [0.0, 0.2, -0.1]])
  return {"A": A, "c": jnp.array([1.0, -0.5, 2.0])}


def _spd():
  M = jnp.array([[2.0, 0.3, 0.1], [0.3, 1.5, -0.2], [0.1, -0.2, 1.0]])
  return M, jnp.array([1.0, 2.0, -1.0])


def J(transform):
  """``transform`` under ``jit``: one compilation instead of many eager ops."""
  return lambda *a, **k: jax.jit(transform(*a, **k))


grad, jacfwd, jacrev, hessian = map(J, (jax.grad, jax.jacfwd, jax.jacrev,
                                        jax.hessian))


def close(a, b, rtol=1e-4, atol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


# --- closed forms -------------------------------------------------------------

def test_fixed_point_all_derivatives_of_sqrt():
  a = 2.0
  d1, d2 = 0.5 * a ** -0.5, -0.25 * a ** -1.5
  close(sqrt(a), a ** 0.5)
  close(grad(sqrt)(a), d1)
  close(jacfwd(sqrt)(a), d1)
  close(jacrev(sqrt)(a), d1)
  close(hessian(sqrt)(a), d2)
  close(jax.jit(lambda a: jax.jvp(jax.grad(sqrt), (a,), (1.0,))[1])(a), d2)
  close(grad(jax.grad(jax.grad(sqrt)))(a), 0.375 * a ** -2.5)


def test_root_all_derivatives_of_cbrt():
  a = jnp.array([8.0, 2.0])
  close(cbrt(a), a ** (1 / 3))
  close(jacfwd(cbrt)(a), jnp.diag(a ** (-2 / 3) / 3))
  close(jacrev(cbrt)(a), jnp.diag(a ** (-2 / 3) / 3))
  h = hessian(lambda a: cbrt(a).sum())(a)
  close(h, jnp.diag(-2 / 9 * a ** (-5 / 3)))
  jvp_of_grad = lambda a, t: jax.jvp(jax.grad(lambda a: cbrt(a).sum()), (a,),
                                     (t,))[1]
  close(jax.jit(jvp_of_grad)(a, jnp.ones(2)), -2 / 9 * a ** (-5 / 3))


def test_pytree_params_against_the_explicit_solution():
  p = _params()
  explicit = lambda p: jnp.linalg.solve(jnp.eye(3) - p["A"], p["c"])
  solve = lambda p: fixed_point(affine, jnp.zeros(3), p)
  close(solve(p), explicit(p))
  close(jacfwd(solve)(p), jacfwd(explicit)(p))
  close(jacrev(solve)(p), jacrev(explicit)(p))
  loss = lambda f: lambda p: jnp.sum(f(p) ** 2)
  close(hessian(loss(solve))(p), hessian(loss(explicit))(p))


def test_pytree_unknowns():
  # x = (u, v) with u = a v, v^2 + u = 3a: Newton from (1, 1).
  g = lambda x, a: (x[0] - a * x[1], x[1] ** 2 + x[0] - 3 * a)
  sol = lambda a: root(g, (1.0, 1.0), a)
  explicit = lambda a: (a * (-a + jnp.sqrt(a * a + 12 * a)) / 2,
                        (-a + jnp.sqrt(a * a + 12 * a)) / 2)
  close(sol(1.5), explicit(1.5))
  close(jacfwd(sol)(1.5), jacfwd(explicit)(1.5))
  close(hessian(lambda a: sol(a)[0])(1.5),
        hessian(lambda a: explicit(a)[0])(1.5))


@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
def test_linear_solve_against_jnp_linalg_solve(solver):
  M, b = _spd()
  ours = lambda M, b: linear_solve(matvec, b, M, solver=solver)
  close(ours(M, b), jnp.linalg.solve(M, b))
  slow = isinstance(solver, GMRES)  # slow to compile: reverse mode only
  for jac in (jacrev,) if slow else (jacfwd, jacrev):
    close(jac(ours, argnums=(0, 1))(M, b),
          jac(jnp.linalg.solve, argnums=(0, 1))(M, b))
  if slow:
    return
  loss = lambda f: lambda M: jnp.sum(f(M, b) ** 2)
  close(hessian(loss(ours))(M), hessian(loss(jnp.linalg.solve))(M),
        rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("linear_solver", [Dense(), GMRES()], ids=repr)
def test_tangent_systems_with_each_linear_solver(linear_solver):
  p = _params()
  explicit = lambda p: jnp.linalg.solve(jnp.eye(3) - p["A"], p["c"])
  solve = lambda p: fixed_point(affine, jnp.zeros(3), p,
                                linear_solver=linear_solver)
  close(jacrev(solve)(p), jacrev(explicit)(p))
  close(jax.jit(jax.jvp, static_argnums=0)(solve, (p,), (p,))[1],
        jax.jvp(explicit, (p,), (p,))[1])


def test_cg_for_a_symmetric_jacobian():
  # the gradient of 1/2 x^T M x - b^T x + sum(x^4)/4: its Jacobian is SPD.
  M, b = _spd()
  g = lambda x, p: p[0] @ x - p[1] + x ** 3
  sol = lambda b: root(g, jnp.zeros(3), (M, b), linear_solver=CG())
  x = sol(b)
  close(g(x, (M, b)), jnp.zeros(3), atol=1e-5)
  close(jacrev(sol)(b), jnp.linalg.inv(M + jnp.diag(3 * x ** 2)))


def test_linear_solve_linearize_and_transpose():
  M, b = _spd()
  f = lambda b: linear_solve(matvec, b, M)
  x, f_lin = jax.linearize(f, b)
  close(f_lin(b), x)
  close(jax.linear_transpose(f, b)(b), (jnp.linalg.solve(M.T, b),))



def test_transpose_in_one_leaf_of_a_pytree_right_hand_side():
  # b = {"u": traced, "v": constant}: transposing in "u" only (the "v" leaf
  # reaches the transpose rule as a value, not an accumulator).
  M = jnp.array([[2., 1.], [1., 3.]])
  mv = lambda x, M: {"u": M[0, 0] * x["u"] + M[0, 1] * x["v"],
                     "v": M[1, 0] * x["u"] + M[1, 1] * x["v"]}
  f = lambda bu: linear_solve(mv, {"u": bu, "v": 1.}, M)["u"]
  _, f_lin = jax.linearize(f, 1.)
  (ct,) = jax.linear_transpose(f_lin, 1.)(1.)
  close(ct, jnp.linalg.inv(M)[0, 0])  # d x_u / d b_u

# --- no solver re-run, no solve for zeros -------------------------------------

def _count(jaxpr, name):
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == name
    for v in eqn.params.values():
      if hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
        n += _count(v.jaxpr, name)
  return n


def test_linearization_keeps_the_solution():
  _, f_lin = jax.linearize(sqrt, 2.0)
  jaxpr = jax.make_jaxpr(f_lin)(1.0).jaxpr
  assert _count(jaxpr, "FixedPoint") == 0
  assert _count(jaxpr, "LinearSolve") == 1


def test_no_solve_without_differentiated_params():
  p = _params()
  grad_x0 = jax.grad(lambda x0: fixed_point(affine, x0, p).sum())
  jaxpr = jax.make_jaxpr(grad_x0)(jnp.zeros(3)).jaxpr
  assert _count(jaxpr, "LinearSolve") == 0
  np.testing.assert_array_equal(grad_x0(jnp.zeros(3)), jnp.zeros(3))
  jvp_x0 = lambda t: jax.jvp(lambda x0: fixed_point(affine, x0, p),
                             (jnp.zeros(3),), (t,))
  assert _count(jax.make_jaxpr(jvp_x0)(jnp.ones(3)).jaxpr, "LinearSolve") == 0
  np.testing.assert_array_equal(jvp_x0(jnp.ones(3))[1], jnp.zeros(3))


def test_undifferentiated_params_are_not_differentiated():
  # A parameter that has no derivative at all (a callback without rules):
  # differentiating with respect to the other one must not touch it.
  def host_scale(s):
    return jax.pure_callback(np.asarray, jax.ShapeDtypeStruct((), s.dtype), s)

  def scaled_step(x, p):
    a, s = p
    return 0.5 * (x + a / x) * host_scale(s)

  sol = lambda a, s: fixed_point(scaled_step, a, (a, s))
  close(grad(sol)(2.0, 1.0), 0.5 / np.sqrt(2.0))
  close(hessian(sol)(2.0, 1.0), -0.25 * 2.0 ** -1.5)
  close(jacfwd(sol)(2.0, 1.0), 0.5 / np.sqrt(2.0))
  with pytest.raises(ValueError, match="JVP"):
    jax.grad(sol, argnums=1)(2.0, 1.0)


# --- vmap and jit -------------------------------------------------------------

def test_vmap_matches_a_loop():
  a = jnp.array([1.0, 4.0, 5.0, 9.0])
  for f in (sqrt, jax.grad(sqrt)):
    close(jax.jit(jax.vmap(f))(a), jnp.stack([f(x) for x in a]))
  cs = jnp.array([[1.0, 0.0, 2.0], [0.5, -1.0, 3.0]])
  A = _params()["A"]
  solve = lambda c: fixed_point(affine, jnp.zeros(3), {"A": A, "c": c})
  close(jax.jit(jax.vmap(jax.jacrev(solve)))(cs), jnp.stack([jacrev(solve)(c)
                                                     for c in cs]))
  M, b = _spd()
  Ms = jnp.stack([M, M + 0.5 * jnp.eye(3)])
  lsolve = jax.jit(jax.vmap(lambda M: linear_solve(matvec, b, M)))
  close(lsolve(Ms), jnp.stack([jnp.linalg.solve(m, b) for m in Ms]))


def test_under_jit():
  a = jnp.array([2.0, 3.0])
  close(jax.jit(jax.vmap(jax.grad(sqrt)))(a), 0.5 * a ** -0.5)
  close(jax.jit(jax.hessian(lambda a: cbrt(a).sum()))(a),
        jnp.diag(-2 / 9 * a ** (-5 / 3)))


# --- errors -------------------------------------------------------------------

# A closure over a tracer is closure-converted: tests/test_closure.py.


def test_a_closure_over_a_constant_is_fine():
  c = jnp.float32(3.0)
  close(fixed_point(lambda x, p: 0.5 * (x + c / x), 1.0, ()), 3.0 ** 0.5)


def test_integer_start_and_integer_params():
  # x0 = 1 (an int) is converted to float; n (an int) is not differentiated.
  g = lambda x, p: x ** p[1] - p[0]
  sol = lambda a: root(g, 1, (a, 3))
  close(sol(8.0), 2.0)
  close(grad(sol)(8.0), 1 / 12)


def test_wrong_output_type_is_named():
  with pytest.raises(TypeError,
                     match=r"fixed_point \(FixedPoint\).*`f\(x, params\)`"):
    fixed_point(lambda x, p: jnp.stack([x, x]), 1.0, ())


# --- the rules, checked -------------------------------------------------------

def test_rules_fixed_point():
  report = assert_rules(lambda a: fixed_point(newton_step, a, a), 2.0,
                        eps=1e-5, order=1, batch_in_axes=[(0,)])
  assert {"jvp", "vjp", "lin", "batch"} <= set(report.modes_run)


@NO_FLOAT64_LU
def test_rules_root():
  # x0 is a NumPy constant: hijax.testing's expand check cannot yet evaluate
  # ordinary JAX equations (e.g. jnp.ones) around the primitive.
  report = assert_rules(lambda a: root(cube, np.ones(2), a),
                        jnp.array([8.0, 2.0]), eps=1e-5, order=1,
                        batch_in_axes=[(0,)])
  assert {"jvp", "vjp", "lin", "batch"} <= set(report.modes_run)


@NO_FLOAT64_LU
def test_rules_linear_solve():
  M, b = _spd()
  report = assert_rules(lambda M, b: linear_solve(matvec, b, M), M, b,
                        order=1, batch_in_axes=[(0, None), (None, 0)])
  assert {"jvp", "vjp", "lin", "transpose", "batch"} <= set(report.modes_run)


def test_public_names():
  assert set(implicit.__all__) >= {"fixed_point", "root", "linear_solve",
                                   "Dense", "CG", "GMRES",
                                   "FixedPointIteration", "Newton"}
  assert FixedPointIteration().tol is None and Newton().max_iter == 50
