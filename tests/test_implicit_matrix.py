"""linear_solve recognises a matvec that multiplies x by one of its params
(``A @ x``, ``x @ A``, ``A.T @ x``, ``jnp.dot``, ``jnp.einsum``) and, with
`Dense`, factorizes that matrix as it is, as `MatMul()` does: one LU for the
solve and its gradient. Values and derivatives against jnp.linalg.solve."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hijax.implicit import CG, Dense, MatMul, linear_solve

# A TPU has no float64 LU (tests/test_implicit_precision.py::
# test_a_tpu_has_no_float64_lu shows it there); Dense refuses it in words.
NO_FLOAT64_LU = pytest.mark.skipif(
    jax.default_backend() == "tpu",
    reason="a TPU has no float64 LU (XLA: 'Only F32 and C64 types are "
    "implemented in LuDecomposition'), which Dense needs")

A3 = jnp.array([[3., 1., 0.5], [-1., 2., 0.3], [0.2, -0.7, 1.5]])
B3 = jnp.array([1., -2., 0.5])


def close(a, b, rtol=1e-4, atol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


# name: (matvec, params from A, the system's matrix from A, leaf, transposed)
FORMS = {
    "A @ x": (lambda x, A: A @ x, lambda A: A, lambda A: A, 0, False),
    "x @ A": (lambda x, A: x @ A, lambda A: A, lambda A: A.T, 0, True),
    "A.T @ x": (lambda x, A: A.T @ x, lambda A: A, lambda A: A.T, 0, True),
    "jnp.dot": (lambda x, A: jnp.dot(A, x), lambda A: A, lambda A: A, 0,
                False),
    "einsum ij,j": (lambda x, A: jnp.einsum("ij,j->i", A, x), lambda A: A,
                    lambda A: A, 0, False),
    "einsum j,ji": (lambda x, A: jnp.einsum("j,ji->i", x, A), lambda A: A,
                    lambda A: A.T, 0, True),
    "jitted": (jax.jit(lambda x, A: A @ x), lambda A: A, lambda A: A, 0,
               False),
    "in a tuple": (lambda x, p: p[1] @ x, lambda A: (jnp.ones(3), A),
                   lambda A: A, 1, False),
    "in a dict": (lambda x, p: x @ p["M"], lambda A: {"M": A, "s": 2.},
                  lambda A: A.T, 0, True),
}


def _solve_prim(fn, *args):
  """The LinearSolve primitive that ``fn`` binds first."""
  for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns:
    if eqn.primitive.name == "LinearSolve":
      return eqn.params["_prim"]
  raise AssertionError("no LinearSolve")


def _compiled_lus(fn, *args):
  hlo = jax.jit(fn).lower(*args).compile().as_text()
  return [l for l in hlo.splitlines() if "custom-call" in l and "getrf" in l]


@pytest.mark.parametrize("name", FORMS)
def test_a_product_with_a_params_leaf_is_solved_as_that_matrix(name):
  matvec, params_of, system, leaf, transposed = FORMS[name]
  solve = lambda b, A: linear_solve(matvec, b, params_of(A))
  prim = _solve_prim(solve, B3, A3)
  assert type(prim.matvec).__name__ == "MatrixMatvec"
  assert (prim.matvec.index, prim.matvec.transposed) == (leaf, transposed)
  ref = lambda b, A: jnp.linalg.solve(system(A), b)
  close(jax.jit(solve)(B3, A3), ref(B3, A3))
  loss = lambda f: lambda b, A: jnp.sum(f(b, A) * jnp.arange(1., 4.))
  grad = jax.grad(loss(solve), argnums=(0, 1))
  close(jax.jit(grad)(B3, A3), jax.grad(loss(ref), argnums=(0, 1))(B3, A3))
  # one LU for the solve and the transposed solve of its gradient (counted
  # by its LAPACK call: on a TPU, XLA expands an LU into loops)
  if jax.default_backend() != "tpu":
    assert len(_compiled_lus(grad, B3, A3)) == 1
  # forward mode, and a second derivative, go through the same rules
  tb, tA = jnp.array([0.5, 1., -1.]), jnp.ones((3, 3))
  close(jax.jvp(solve, (B3, A3), (tb, tA))[1],
        jax.jvp(ref, (B3, A3), (tb, tA))[1])
  hess = lambda f: jax.hessian(lambda b: loss(f)(b, A3) ** 2)(B3)
  close(hess(solve), hess(ref))


@pytest.mark.parametrize("matvec", [
    lambda x, A: 2. * (A @ x),            # a scale after the product
    lambda x, A: A @ x + x,               # a sum
    lambda x, A: A @ (A @ x),             # two products
    lambda x, A: (A @ x[:, None])[:, 0],  # a matrix-matrix product
    # a rounding of A to float16's precision: not written as a cast round
    # trip, which XLA may drop as excess precision in one program and keep
    # in another (on a TPU v5e the solve and its reference then differed
    # by float16's 1e-3)
    lambda x, A: jax.lax.reduce_precision(A, exponent_bits=5,
                                          mantissa_bits=10) @ x,
])
def test_anything_else_stays_a_matvec_and_is_still_right(matvec):
  solve = lambda b, A: linear_solve(matvec, b, A)
  assert type(_solve_prim(solve, B3, A3).matvec).__name__ != "MatrixMatvec"
  # the reference at full float32 products: a TPU's default rounds them to
  # bfloat16 (1e-3), where hijax's solve computes its products at "highest"
  with jax.default_matmul_precision("highest"):
    matrix = jax.jacfwd(matvec)(B3, A3)
    want = jnp.linalg.solve(matrix, B3)
  close(jax.jit(solve)(B3, A3), want)


def test_only_dense_uses_the_matrix():
  S = A3 @ A3.T + jnp.eye(3)
  solve = lambda b, S: linear_solve(lambda x, S: S @ x, b, S, solver=CG())
  assert type(_solve_prim(solve, B3, S).matvec).__name__ != "MatrixMatvec"
  close(solve(B3, S), jnp.linalg.solve(S, B3))


def test_a_captured_matrix_is_recognised_once_moved_into_params():
  """Captured under a trace, the matrix is closure-converted into params."""
  solve = lambda b, A: linear_solve(lambda x, _: A @ x, b, None)
  prim = _solve_prim(solve, B3, A3)
  assert type(prim.matvec).__name__ == "MatrixMatvec"
  grad = jax.grad(lambda b, A: solve(b, A).sum(), argnums=(0, 1))
  close(jax.jit(grad)(B3, A3),
        jax.grad(lambda b, A: jnp.linalg.solve(A, b).sum(),
                 argnums=(0, 1))(B3, A3))


def test_the_natural_form_compiles_to_the_program_of_matmul():
  """Up to names, the compiled gradient of ``A @ x`` is that of MatMul()."""
  natural = jax.grad(lambda A, b: linear_solve(lambda x, A: A @ x, b,
                                               A).sum())
  named = jax.grad(lambda A, b: linear_solve(MatMul(), b, A).sum())
  def ops(f):  # the opcodes of the optimized HLO
    hlo = jax.jit(f).lower(A3, B3).compile().as_text()
    return sorted(re.findall(r" = .*? ([a-z][\w\-]*)\(", hlo))
  assert ops(natural) == ops(named)
  assert "custom-call" in ops(named)


@NO_FLOAT64_LU
@settings(max_examples=12, deadline=None)
@given(st.integers(2, 6), st.integers(0, 2 ** 16), st.booleans())
def test_random_systems_match_a_dense_solve(n, seed, transposed):
  with jax.enable_x64(True):
    key = jax.random.key(seed)
    A = jax.random.normal(key, (n, n)) + n * jnp.eye(n)
    b = jax.random.normal(jax.random.fold_in(key, 1), (n,))
    matvec = (lambda x, A: x @ A) if transposed else (lambda x, A: A @ x)
    M = A.T if transposed else A
    loss = lambda f: lambda A, b: jnp.sum(jnp.sin(f(A, b)))
    ours = lambda A, b: linear_solve(matvec, b, A, solver=Dense())
    ref = lambda A, b: jnp.linalg.solve(A.T if transposed else A, b)
    close(ours(A, b), jnp.linalg.solve(M, b), rtol=1e-10, atol=1e-12)
    close(jax.grad(loss(ours), argnums=(0, 1))(A, b),
          jax.grad(loss(ref), argnums=(0, 1))(A, b), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("matvec", [MatMul(), lambda x, A: A @ x])
def test_a_bfloat16_matrix_is_factorized_in_float32(matvec):
  """LU does not take bfloat16: the matrix is factorized in float32 and the
  solution rounded back (MatMul raised in LAPACK's dtype check before)."""
  A = jnp.array([[2., 1.], [0., 3.]], jnp.bfloat16)
  b = jnp.array([1., 1.], jnp.bfloat16)
  x = linear_solve(matvec, b, A)
  assert x.dtype == jnp.bfloat16
  close(x.astype(jnp.float32), [1 / 3, 1 / 3], rtol=1e-2)
  grad = jax.grad(lambda A: linear_solve(matvec, b, A).astype(
      jnp.float32).sum())(A)
  ref = jax.grad(lambda A: jnp.linalg.solve(A, b.astype(jnp.float32)).sum())(
      A.astype(jnp.float32))
  close(grad.astype(jnp.float32), ref, rtol=5e-2, atol=2e-2)
