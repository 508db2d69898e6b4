"""hijax.implicit's solvers on what breaks them: non-symmetric and complex
systems in both modes, batch rules with unbatched and non-leading batch
axes, the dtype defaults in use, a matrix handed over as one (`MatMul`),
the scalar path of `Dense`, and eager calls compiled once."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hijax.implicit import (CG, GMRES, Dense, MatMul, fixed_point,
                            linear_solve, root)

from compile_count import BackendCompiles, Compiles

# A TPU has no float64 LU (tests/test_implicit_precision.py::
# test_a_tpu_has_no_float64_lu shows it there); Dense refuses it in words.
NO_FLOAT64_LU = pytest.mark.skipif(
    jax.default_backend() == "tpu",
    reason="a TPU has no float64 LU (XLA: 'Only F32 and C64 types are "
    "implemented in LuDecomposition'), which Dense needs")
# What the compiled program holds is counted by its LAPACK LU calls; on a
# TPU, XLA expands an LU into loops, leaving no call to count.
COUNTS_LAPACK_LUS = pytest.mark.skipif(
    jax.default_backend() == "tpu",
    reason="counts LAPACK LU calls; XLA expands an LU into loops on a TPU")

NONSYM = jnp.array([[3., 1., 0.5], [-1., 2., 0.3], [0.2, -0.7, 1.5]])
B = jnp.array([1., -2., 0.5])


def matvec(x, A):
  return A @ x


def close(a, b, rtol=1e-4, atol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def _count(jaxpr, name):
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == name
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (list, tuple)) else (v,)):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          n += _count(inner, name)
  return n


# --- non-symmetric systems: a transpose left out would show ---------------------

@pytest.mark.parametrize("solver,matvec", [(Dense(), matvec),
                                           (GMRES(), matvec),
                                           (Dense(), MatMul())],
                         ids=["Dense", "GMRES", "Dense-MatMul"])
def test_nonsymmetric_both_modes(solver, matvec):
  ours = jax.jit(lambda A, b: linear_solve(matvec, b, A, solver=solver))
  close(ours(NONSYM, B), jnp.linalg.solve(NONSYM, B))
  for jac in (jax.jacrev, jax.jacfwd):
    close(jax.jit(jac(ours, argnums=(0, 1)))(NONSYM, B),
          jac(jnp.linalg.solve, argnums=(0, 1))(NONSYM, B))


def test_nonsymmetric_transpose_rule():
  f = lambda b: linear_solve(matvec, b, NONSYM)
  (ct,) = jax.linear_transpose(f, B)(B)
  close(ct, jnp.linalg.solve(NONSYM.T, B))


def test_root_with_a_nonsymmetric_jacobian_in_reverse_mode():
  # g(x, p) = A x + x^3/10 - p: dg/dx = A + diag(3x^2/10) is not symmetric.
  g = lambda x, p: NONSYM @ x + x ** 3 / 10 - p
  for linear_solver in (Dense(), GMRES()):
    sol = jax.jit(lambda p: root(g, jnp.zeros(3), p,
                                 linear_solver=linear_solver))
    x = sol(B)
    J = NONSYM + jnp.diag(3 * x ** 2 / 10)
    close(jax.jit(jax.jacrev(sol))(B), jnp.linalg.inv(J))


# --- complex systems, every solver and mode ----------------------------------------

_CA = jnp.array([[2. + 1j, 0.5 - 0.2j], [-0.3j, 1.5 + 0.1j]], jnp.complex64)
_HPD = jnp.array([[3., 1. - 1j], [1. + 1j, 2.]], jnp.complex64)
_CB = jnp.array([1. + 2j, -1j], jnp.complex64)


@pytest.mark.parametrize("solver,A", [(Dense(), _CA), (GMRES(), _CA),
                                      (CG(), _HPD)], ids=["Dense", "GMRES",
                                                          "CG"])
def test_complex_systems(solver, A):
  ours = lambda A, b: linear_solve(matvec, b, A, solver=solver)
  close(jax.jit(ours)(A, _CB), jnp.linalg.solve(A, _CB))
  tA, tb = 0.3 * A.T, jnp.array([1j, 1.], jnp.complex64)
  close(jax.jit(lambda *a: jax.jvp(ours, a, (tA, tb)))(A, _CB),
        jax.jvp(jnp.linalg.solve, (A, _CB), (tA, tb)))
  ct = jnp.array([0.5 - 1j, 2.], jnp.complex64)
  close(jax.jit(lambda A, b: jax.vjp(ours, A, b)[1](ct))(A, _CB),
        jax.vjp(jnp.linalg.solve, A, _CB)[1](ct))


# --- batch rules: unbatched inputs, non-leading and non-square batches -------------------

def test_linear_solve_batched_on_b_only_along_axis_1():
  bs = jnp.arange(15.).reshape(3, 5) - 7  # five right-hand sides, batch axis 1
  for solver in (Dense(), GMRES()):
    f = jax.jit(jax.vmap(lambda b: linear_solve(matvec, b, NONSYM,
                                                solver=solver), in_axes=1))
    close(f(bs), jnp.linalg.solve(NONSYM, bs).T)


def test_linear_solve_batched_on_the_matrix_only():
  As = jnp.stack([NONSYM, NONSYM.T, NONSYM + jnp.eye(3), 2 * NONSYM])
  grad = jax.jit(jax.vmap(jax.grad(
      lambda A: linear_solve(matvec, B, A).sum())))
  close(grad(As), jnp.stack([jax.grad(lambda A: jnp.linalg.solve(A, B).sum())(
      A) for A in As]))


def test_fixed_point_and_root_batched_on_params_axis_1():
  cs = jnp.array([[1., 2., 3., 4., 5.], [0., -1., 1., 0.5, 2.]])  # (2, 5)
  A = jnp.array([[0.2, -0.1], [0.3, 0.1]])  # not symmetric
  fp = lambda c: fixed_point(lambda x, c: A @ x + c, jnp.zeros(2), c)
  explicit = lambda c: jnp.linalg.solve(jnp.eye(2) - A, c)
  close(jax.jit(jax.vmap(fp, in_axes=1))(cs), jax.vmap(explicit, 1)(cs))
  close(jax.jit(jax.vmap(jax.jacrev(fp), in_axes=1))(cs),
        jax.vmap(jax.jacrev(explicit), 1)(cs))
  g = lambda x, c: x ** 3 + x - c
  r = jax.jit(jax.vmap(jax.grad(lambda c: root(g, 0., c)), in_axes=0))
  xs = jax.vmap(lambda c: root(g, 0., c))(cs[0])
  close(r(cs[0]), 1 / (3 * xs ** 2 + 1))


# --- the dtype defaults in use ----------------------------------------------------

def test_cg_default_tolerance_in_float64_and_float32():
  # An SPD system with condition 1e4: 1e-6 would leave a residual ~1e-7.
  Q = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (12, 12)))[0]
  A32 = (Q * jnp.logspace(0, 4, 12)) @ Q.T
  b32 = jnp.ones(12)
  with jax.enable_x64(True):
    A, b = A32.astype(jnp.float64), b32.astype(jnp.float64)
    A = (A + A.T) / 2
    x = linear_solve(matvec, b, A, solver=CG())
    assert x.dtype == jnp.float64
    assert np.linalg.norm(A @ x - b) <= 1e-10 * np.linalg.norm(b)
  x32, st = linear_solve(matvec, b32, (A32 + A32.T) / 2, solver=CG(),
                         throw=False)
  assert x32.dtype == jnp.float32
  if bool(st.converged):
    assert float(st.error) <= 1e-6


# --- CG: the transposed system of a symmetric one -----------------------------

SPD = jnp.array([[4., 1., 0.5], [1., 3., -0.2], [0.5, -0.2, 2.]])


def _untransposable_matvec(x, A):
  """``A @ x`` through a host callback, which JAX can evaluate but not
  differentiate or transpose: a solve that needs ``A.T @ u`` from it fails."""
  out = jax.ShapeDtypeStruct(x.shape, x.dtype)
  return jax.pure_callback(lambda x, A: np.asarray(A) @ np.asarray(x), out,
                           x, A, vmap_method="broadcast_all")


def test_cg_solves_the_transposed_system_with_the_forward_matvec():
  """CG solves symmetric systems only (and tests the matvec for symmetry),
  so the cotangent system of its gradient is solved with the forward matvec:
  ``A @ u``, not the transpose of the matvec (this one has none)."""
  grad_b = jax.grad(lambda b: linear_solve(_untransposable_matvec, b, SPD,
                                           solver=CG()).sum())
  close(jax.jit(grad_b)(B), jnp.linalg.solve(SPD.T, jnp.ones(3)))
  # with check=False nothing tests the symmetry, so the transpose is needed
  unchecked = jax.grad(lambda b: linear_solve(
      _untransposable_matvec, b, SPD, solver=CG(check=False)).sum())
  with pytest.raises(Exception, match="callbacks do not support JVP"):
    jax.jit(unchecked)(B)


def test_cg_derivatives_in_the_matrix_along_nonsymmetric_tangents():
  """The values of the transposed system are the system's, but its
  derivatives in the matrix are the transpose's: along a non-symmetric
  tangent of a symmetric matrix the two differ. Second derivatives (jacfwd
  of jacrev, an HVP) show it; Dense, which transposes exactly, is the
  reference, and so is jnp.linalg.solve."""
  solve = lambda solver: lambda A: linear_solve(matvec, B, A, solver=solver)
  loss = lambda solver: lambda A: jnp.sum(solve(solver)(A) ** 3)
  tangent = jnp.array([[0., 1., 0.], [0., 0., 0.], [0.3, 0., 0.]])
  for f in (lambda s: jax.jacfwd(jax.jacrev(solve(s))),
            lambda s: lambda A: jax.jvp(jax.grad(loss(s)), (A,),
                                        (tangent,))[1]):
    close(jax.jit(f(CG()))(SPD), jax.jit(f(Dense()))(SPD), rtol=2e-3,
          atol=1e-4)
  plain = lambda A: jnp.sum(jnp.linalg.solve(A, B) ** 3)
  close(jax.jit(lambda A: jax.jvp(jax.grad(loss(CG())), (A,),
                                  (tangent,))[1])(SPD),
        jax.jvp(jax.grad(plain), (SPD,), (tangent,))[1], rtol=2e-3,
        atol=1e-4)


def _sin_loss(solver):
  return lambda A, b: jnp.sum(jnp.sin(linear_solve(matvec, b, A, solver=solver)))


# the direction an argument: one program per size and solver, traced once
# for all the examples below
_SPD_DERIVATIVES = [
    (jax.jit(jax.grad(_sin_loss(solver), argnums=(0, 1))),
     jax.jit(lambda A, b, t, solver=solver: jax.jvp(
         lambda A: jax.grad(_sin_loss(solver))(A, b), (A,), (t,))[1]))
    for solver in (CG(), Dense())]


@NO_FLOAT64_LU
@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.integers(2, 6), st.integers(0, 2 ** 16))
def test_cg_matches_dense_to_second_order_on_random_spd_systems(n, seed):
  """Random SPD systems (float64) and random, non-symmetric directions: the
  gradient in the matrix and the right-hand side, and an HVP in the matrix,
  are Dense's (which transposes exactly) when solved by CG."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((n, n))
    A = jnp.asarray(Q @ Q.T + n * np.eye(n))
    b = jnp.asarray(rng.standard_normal(n))
    tangent = jnp.asarray(rng.standard_normal((n, n)))
    (cg_grad, cg_hvp), (dense_grad, dense_hvp) = _SPD_DERIVATIVES
    close(cg_grad(A, b), dense_grad(A, b), rtol=1e-7, atol=1e-9)
    close(cg_hvp(A, b, tangent), dense_hvp(A, b, tangent), rtol=1e-7, atol=1e-9)


def test_root_with_cg_for_its_derivative_systems():
  """A root whose Jacobian dg/dx is symmetric (g the gradient of a convex
  energy), with CG for the tangent and cotangent systems: jacrev and the
  Hessian in the matrix it depends on match Dense's."""
  g = lambda x, p: p[0] @ x + 0.1 * jnp.tanh(x) - p[1]
  sol = lambda solver: lambda p: root(g, jnp.zeros(3), p,
                                      linear_solver=solver)
  p = (SPD, B)
  close(jax.jit(jax.jacrev(sol(CG())))(p), jax.jit(jax.jacrev(sol(Dense())))(p))
  loss = lambda solver: lambda p: jnp.sum(sol(solver)(p) ** 3)
  close(jax.jit(jax.hessian(loss(CG())))(p),
        jax.jit(jax.hessian(loss(Dense())))(p), rtol=2e-3, atol=1e-4)


# --- MatMul, the scalar path and the eager cache --------------------------------------

def test_matmul_factorizes_once_for_value_and_gradient():
  loss = lambda A, b: linear_solve(MatMul(), b, A).sum()
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(NONSYM, B).jaxpr
  assert _count(jaxpr, "lu") == 1, jaxpr
  close(jax.jit(jax.grad(loss, argnums=(0, 1)))(NONSYM, B),
        jax.grad(lambda A, b: jnp.linalg.solve(A, b).sum(),
                 argnums=(0, 1))(NONSYM, B))
  # `A @ x` is recognised as the matrix A (tests/test_implicit_matrix.py);
  # a matvec that is not a product with a params leaf is staged, and its
  # transposed solve is a second LinearSolve
  plain = lambda A, b: linear_solve(lambda x, A: A @ x + 0.5 * x, b, A).sum()
  plain_jaxpr = jax.make_jaxpr(jax.grad(plain))(NONSYM, B).jaxpr
  assert _count(plain_jaxpr, "lu") == 0
  assert _count(plain_jaxpr, "LinearSolve") == 2


def test_dense_checks_a_transposed_solve_against_the_transposed_system():
  """`solve_factored(..., transpose=True)` reports the backward error of
  A.T x = b: |b - A.T x|_inf / (|A.T|_inf |x|_inf + |b|_inf), where |A.T|_inf
  is the largest column sum of |A| (not the largest row sum, that of A)."""
  A = jnp.array([[4., 0., 0.], [3., 1., 0.], [5., 2., 1.]])  # row sums 4, 4, 8
  b = jnp.array([1., 2., 3.])
  solver = Dense()
  factors = solver.factor(A)
  x, st = solver.solve_factored(A, factors, b, True)
  close(x, np.linalg.solve(np.asarray(A).T, b))
  assert bool(st.converged)
  # a wrong x: its error is the closed form with the column-sum norm, 12
  wrong = x + jnp.array([0., 0., 0.1])
  st_wrong = solver._check(A, wrong, b, transpose=True)
  At = np.asarray(A).T
  expected = (np.max(np.abs(b - At @ wrong))
              / (12. * np.max(np.abs(wrong)) + np.max(np.abs(b))))
  close(st_wrong.error, expected)
  assert not bool(st_wrong.converged)
  # one unknown, checked elementwise: |3 - 2 * 1| / (2 * 1 + 3)
  for transpose in (False, True):
    st_one = solver._check(jnp.array([[2.]]), jnp.array([1.]), jnp.array([3.]),
                           transpose=transpose)
    close(st_one.error, 0.2)
    assert not bool(st_one.converged)


def _compiled_lus(fn, *args):
  """The LU factorizations (LAPACK getrf calls) in ``jit(fn)``'s compiled HLO."""
  hlo = jax.jit(fn).lower(*args).compile().as_text()
  return [l for l in hlo.splitlines() if "custom-call" in l and "getrf" in l]


@COUNTS_LAPACK_LUS
def test_jit_grad_of_a_dense_solve_with_a_matvec_factorizes_once():
  """The transposed solve of the gradient builds the matvec's own matrix, as
  the forward solve does, so the compiled gradient has one LU (it had two)."""
  loss = lambda A, b: linear_solve(matvec, b, A).sum()
  grad = jax.grad(loss, argnums=(0, 1))
  lus = _compiled_lus(grad, NONSYM, B)
  assert len(lus) == 1, "\n".join(lus)
  close(jax.jit(grad)(NONSYM, B),
        jax.grad(lambda A, b: jnp.linalg.solve(A, b).sum(),
                 argnums=(0, 1))(NONSYM, B))


@COUNTS_LAPACK_LUS
def test_an_hvp_of_a_root_factorizes_the_jacobian_at_the_solution_once():
  """jvp of grad of a root solves three systems with dg/dx at the solution:
  the tangent one and two transposed ones. `Dense` builds dg/dx (not its
  transpose) for all three, so the compiled program has one LU for them,
  beside the one in Newton's loop; and the HVP is the unrolled reference's."""
  M = NONSYM + 2 * jnp.eye(3)
  g = lambda x, c: M @ x + 0.1 * jnp.tanh(x) - c
  loss = lambda c: jnp.sum(root(g, jnp.zeros(3), c) ** 2)
  hvp = lambda c, v: jax.jvp(jax.grad(loss), (c,), (v,))[1]
  c, v = jnp.array([0.3, -0.2, 0.5]), jnp.array([1., 0.5, -1.])
  lus = _compiled_lus(hvp, c, v)
  assert len(lus) == 2, "\n".join(lus)

  def unrolled(c):
    x = jnp.zeros(3)
    for _ in range(30):
      x = x - jnp.linalg.solve(jax.jacfwd(g)(x, c), g(x, c))
    return jnp.sum(x ** 2)
  close(hvp(c, v), jax.jvp(jax.grad(unrolled), (c,), (v,))[1])


def test_matmul_with_one_unknown_value_and_both_gradients():
  """The 1x1 path of `Dense` with a matrix handed over (a division, forward
  and transposed): x = b / a, dx/da = -b / a**2, dx/db = 1 / a."""
  a, b = jnp.array([[4.]]), jnp.array([3.])
  solve = lambda A, b: linear_solve(MatMul(), b, A)[0]
  close(solve(a, b), 0.75)
  dA, db = jax.jit(jax.grad(solve, argnums=(0, 1)))(a, b)
  close(dA, jnp.array([[-3. / 16.]]))
  close(db, jnp.array([0.25]))


def test_matmul_rejects_a_non_matrix():
  with pytest.raises(TypeError, match=r"MatMul\(\).*\(n, n\) matrix"):
    linear_solve(MatMul(), B, jnp.ones((3, 2)))


def test_dense_solves_one_unknown_by_division():
  step = lambda a: root(lambda x, a: x * x - a, 1., a)
  lowered = jax.jit(jax.vmap(jax.grad(step))).lower(jnp.ones(4)).as_text()
  assert "getrf" not in lowered.lower(), "a 1x1 LU factorization"
  close(jax.jit(jax.vmap(jax.grad(step)))(jnp.array([1., 4.])),
        jnp.array([.5, .25]))


def _newton_step(x, a):
  return 0.5 * (x + a / x)


def _cube(x, a):
  return x ** 3 - a


def test_a_second_eager_call_compiles_nothing():
  calls = [lambda a: fixed_point(_newton_step, a, a),
           lambda a: root(_cube, jnp.ones_like(a), a),
           lambda a: linear_solve(matvec, a * jnp.ones(3), NONSYM),
           lambda a: linear_solve(MatMul(), a * jnp.ones(3), NONSYM),
           lambda a: fixed_point(_newton_step, a, a, throw=False)]
  for call in calls:
    call(jnp.float32(2.))
    with Compiles() as c:
      jax.block_until_ready(call(jnp.float32(3.)))
    assert c.count == 0, call
  # new argument types compile again
  with Compiles() as c:
    fixed_point(_newton_step, jnp.ones(2), jnp.ones(2))
  assert c.count > 0


@pytest.mark.parametrize("transform", ["grad", "jacfwd", "vmap", "hessian"])
def test_eager_transformations_compile_a_few_programs_not_each_op(transform):
  """Eager grad/jacfwd/vmap of a solve run its rules as a few compiled
  programs (the eager jit), not op by op (about 60 compilations for a grad)."""
  def f(a):
    return jnp.sum(fixed_point(_newton_step, a, a))
  t = {"grad": jax.grad, "jacfwd": jax.jacfwd, "hessian": jax.hessian,
       "vmap": lambda f: jax.vmap(jax.grad(f))}[transform]
  a = jnp.linspace(1., 2., 11 * 13).reshape(11, 13)  # shapes no test uses
  if transform == "vmap":
    a = a[:, :7]
  with BackendCompiles() as c:
    got = t(f)(a)
  # op by op: 73 (grad), 46 (jacfwd), 71 (vmap), 132 (hessian) on jax 0.12
  assert c.count <= (40 if transform == "hessian" else 20), c.count
  if transform == "hessian":
    n = a.size
    close(got.reshape(n, n), jnp.diag(-0.25 * a.ravel() ** -1.5))
  else:
    close(got, 0.5 / jnp.sqrt(a))
  with Compiles() as c:
    jax.block_until_ready(t(f)(a))
  assert c.count == 0


def test_under_jit_the_primitive_is_bound_directly():
  """The eager jit does not wrap a staged call: the jaxpr shows FixedPoint."""
  jaxpr = jax.make_jaxpr(jax.grad(lambda a: fixed_point(_newton_step, a, a)))(2.)
  assert "FixedPoint" in {str(e.primitive) for e in jaxpr.jaxpr.eqns}
  assert not any(e.primitive.name in ("jit", "pjit") for e in jaxpr.jaxpr.eqns)


def test_jaxprs_name_the_users_functions():
  """A primitive's params print the user's function by name (the derived
  matvecs too), not its repr with an address."""
  def step(x, a):
    return 0.5 * (x + a / x)
  text = str(jax.make_jaxpr(jax.grad(lambda a: fixed_point(step, a, a)))(2.))
  assert "f=step " in text and "matvec=dx-step/dx^T " in text, text
  assert " at 0x" not in text, text


def test_linear_transpose_of_linear_solve_in_b_and_not_in_params():
  """linear_solve is linear in b: its transpose solves with A^T. It is not
  linear in the matrix: transposing in params is refused, naming why."""
  b = jnp.array([1., 2., 3.])
  got, = jax.linear_transpose(lambda b: linear_solve(MatMul(), b, NONSYM),
                              b)(b)
  close(got, jnp.linalg.solve(NONSYM.T, b))
  with pytest.raises(NotImplementedError, match="linear in b, not in params"):
    jax.linear_transpose(lambda A: linear_solve(MatMul(), b, A), NONSYM)(b)
