"""hijax.implicit where a matrix product is less precise than its dtype: on
a TPU at JAX's default precision a float32 matrix product rounds its
operands to bfloat16, and batched solves (``vmap``, the many right-hand
sides of ``jacfwd`` and ``jacrev``) turn matrix-vector products into matrix
products. Right answers pass, wrong ones fail, and a float64 solve that a
TPU cannot factorize is refused in words.

Two kinds of test: on the backend the tests run on (a CPU in CI, a TPU when
run there), at its default precision, against float64 references computed
by NumPy; and on a simulated TPU (any backend): `_precision`'s backend says
"tpu" and its probe's product rounds as a TPU's does, and the functions
solved compute their products with `tpu_matmul`, which rounds its operands
to bfloat16 unless ``jax.default_matmul_precision`` is "highest" (or
"float32"), as a TPU's matrix products do."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.implicit import (CG, GMRES, Dense, MatMul, Newton, _precision,
                            default_tol, fixed_point, linear_solve, root)

SOLVERS = [Dense(), CG(), GMRES()]
SPD = np.array([[4., 1., 0.5], [1., 3., -0.2], [0.5, -0.2, 2.]])
B = np.array([1., -2., 0.5])
EXACT = (None, "highest", "float32")  # what a TPU computes as float32's


def rounded(a):
  """``a`` rounded to bfloat16's precision, in its own dtype. Not written
  ``a.astype(jnp.bfloat16).astype(a.dtype)``: XLA may drop such a round trip
  as excess precision (``xla_allow_excess_precision``), the likely reason
  why on a TPU v5e a GMRES solve of a function meant to round converged,
  where the test expects it not to (not yet run there since)."""
  return jax.lax.reduce_precision(a, exponent_bits=8, mantissa_bits=7)


def tpu_matmul(a, b):
  """``a @ b`` as a TPU computes a matrix product of float32 operands: at
  the default precision (or "bfloat16") with both rounded to bfloat16."""
  if jax.config.jax_default_matmul_precision not in EXACT[1:]:
    a, b = rounded(a), rounded(b)
  return jnp.matmul(a, b, precision="highest")


def product(simulate):
  """The matrix product of the functions solved: this backend's own, or
  `tpu_matmul` on a simulated TPU."""
  return tpu_matmul if simulate else jnp.matmul


@pytest.fixture
def simulated_tpu(monkeypatch):
  monkeypatch.setattr(_precision, "backend", lambda: "tpu")
  monkeypatch.setattr(_precision, "_product", tpu_matmul)
  monkeypatch.setattr(_precision, "_MEASURED", {})
  jax.clear_caches()  # no program traced before the patch is reused
  yield
  jax.clear_caches()


def close(a, b, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=rtol,
                             atol=atol)


# --- the probe ------------------------------------------------------------------

def test_the_probe_of_a_simulated_tpu(simulated_tpu):
  f32 = jnp.float32
  # both operands rounded to bfloat16: about 2**-9 of |A| |B|
  assert 2. ** -12 <= _precision.matmul_roundoff(f32) <= 2. ** -7
  assert _precision.coarse_products(f32)
  assert _precision.iteration_precision(f32) == "highest"
  assert _precision.check_precision(f32) == "highest"
  with jax.default_matmul_precision("highest"):
    assert _precision.matmul_roundoff(f32) <= 32 * 2. ** -24
    assert not _precision.coarse_products(f32)
    assert _precision.iteration_precision(f32) is None
    assert _precision.check_precision(f32) is None
  with jax.default_matmul_precision("bfloat16"):  # coarse, though chosen
    assert _precision.iteration_precision(f32) == "highest"
  assert default_tol(f32) == 1e-6


def test_the_probe_of_this_backend_bounds_its_products():
  """Measured here (on a TPU v5e a random 256x256 float32 product at the
  default precision was off by 8277 units of float32's epsilon relative to
  |A| |B|, 45 under "high", 0.5 under "highest"): every product of a
  float32 matrix product is within it."""
  rng = np.random.default_rng(1)
  a, b = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
  got = np.asarray(jax.jit(jnp.matmul)(a, b), np.float64)
  scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
  error = np.max(np.abs(got - a.astype(np.float64) @ b) / scale)
  roundoff = _precision.matmul_roundoff(jnp.float32)
  print(f"{jax.default_backend()}: float32 matmul_roundoff {roundoff:.3g}, "
        f"a 64x64 product's error {error:.3g}")
  assert error <= roundoff + 64 * 2. ** -24
  with jax.default_matmul_precision("highest"):
    assert _precision.matmul_roundoff(jnp.float32) <= 32 * 2. ** -24
    assert not _precision.coarse_products(jnp.float32)
  if jax.default_backend() == "cpu":
    assert roundoff <= 32 * 2. ** -24 and not _precision.coarse_products(
        jnp.float32)
  else:  # a TPU at the default precision: bfloat16 operands
    assert _precision.coarse_products(jnp.float32)


def _dots(fn, *args):
  """The precisions of the dot_generals of ``jit(fn)``'s program."""
  text = jax.jit(fn).lower(*args).as_text()
  return re.findall(r"stablehlo\.dot_general.*?precision = \[(\w+), ",
                    text)


@pytest.mark.parametrize("solver", [Dense(), CG()], ids=repr)
def test_programs_change_only_where_products_are_coarse(solver):
  """Where this backend's products are exact to float32 (a CPU), the
  programs are what they were: no precision is set. (JAX's GMRES sets
  "highest" in its own products.)"""
  A = jnp.asarray(SPD, jnp.float32)
  fn = jax.jacrev(lambda b: linear_solve(lambda x, A: A @ x + 0.1 * x, b, A,
                                         solver=solver))
  precisions = _dots(fn, jnp.asarray(B, jnp.float32))
  assert precisions
  if not _precision.coarse_products(jnp.float32):
    assert set(precisions) <= {"DEFAULT"}, precisions


@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
def test_on_a_simulated_tpu_every_product_of_a_solve_is_exact(simulated_tpu,
                                                              solver):
  """The user's matvec (evaluated by the solver and in its checks) and
  hijax's own products, in a solve and its derivatives: all "highest"."""
  A = jnp.asarray(SPD, jnp.float32)
  fn = jax.jacrev(lambda b: linear_solve(lambda x, A: A @ x + 0.1 * x, b, A,
                                         solver=solver))
  precisions = _dots(fn, jnp.asarray(B, jnp.float32))
  assert precisions and set(precisions) == {"HIGHEST"}, precisions


# --- right answers pass ---------------------------------------------------------

def _systems():
  A = SPD + 0.1 * np.eye(3)
  return A, np.linalg.inv(A)


@pytest.mark.parametrize("simulate", [False, True], ids=["here", "sim-tpu"])
@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
def test_derivatives_of_a_solve_at_the_default_precision(request, simulate,
                                                         solver):
  """jacfwd and jacrev of a 3x3 solve (the issue's case: on a TPU, refused as
  "max_iter reached" by Dense, "not symmetric positive definite" by CG)."""
  if simulate:
    request.getfixturevalue("simulated_tpu")
  A, inverse = _systems()
  matmul = product(simulate)
  matvec = lambda x, A: matmul(A, x[:, None])[:, 0] + 0.1 * x
  solve = lambda b: linear_solve(matvec, b, jnp.asarray(SPD, jnp.float32),
                                 solver=solver)
  b = jnp.asarray(B, jnp.float32)
  close(jax.jit(solve)(b), inverse @ B)
  for jac in (jax.jacfwd, jax.jacrev):
    close(jax.jit(jac(solve))(b), inverse, rtol=1e-4, atol=1e-5)
  # and batched over right-hand sides, each checked
  bs = jnp.asarray(np.stack([B, -B, 2 * B]), jnp.float32)
  # the reference in NumPy: `bs @ inverse.T` with bs a jax array is a
  # product on the device, at its default precision (bfloat16's on a TPU)
  close(jax.jit(jax.vmap(solve))(bs), np.asarray(bs, np.float64) @ inverse.T,
        rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("simulate", [False, True], ids=["here", "sim-tpu"])
def test_roots_and_fixed_points_batched_at_the_default_precision(request,
                                                                 simulate):
  """Newton and fixed-point iteration under vmap, whose functions' products
  are then matrix products: the float32 tolerance is met."""
  if simulate:
    request.getfixturevalue("simulated_tpu")
  M = jnp.asarray(SPD, jnp.float32)
  matmul = product(simulate)
  g = lambda x, c: matmul(M, x[:, None])[:, 0] + 0.1 * jnp.tanh(x) - c
  cs = jnp.asarray(np.stack([B, -B, 0.5 * B]), jnp.float32)
  xs = jax.jit(jax.vmap(lambda c: root(g, jnp.zeros(3), c)))(cs)
  xs64, cs64 = np.asarray(xs, np.float64), np.asarray(cs, np.float64)
  np.testing.assert_allclose(xs64 @ SPD.T + 0.1 * np.tanh(xs64) - cs64, 0.,
                             atol=2e-6)
  jac = jax.jit(jax.vmap(jax.jacrev(lambda c: root(g, jnp.zeros(3), c))))(cs)
  for x, J in zip(xs64, jac):
    exact = np.linalg.inv(SPD + 0.1 * np.diag(1 - np.tanh(x) ** 2))
    close(J, exact, rtol=1e-4, atol=1e-5)
  contraction = jnp.asarray(SPD / 8, jnp.float32)
  f = lambda x, c: matmul(contraction, x[:, None])[:, 0] + c
  fixed = jax.jit(jax.vmap(lambda c: fixed_point(f, jnp.zeros(3), c)))(cs)
  exact = np.linalg.solve(np.eye(3) - SPD / 8, np.asarray(cs, np.float64).T).T
  close(fixed, exact, rtol=1e-5, atol=1e-5)


# --- a coarse precision, chosen or written into the function -----------------

@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
def test_under_a_chosen_coarse_precision_a_solve_is_still_float32s(
    simulated_tpu, solver):
  """Under jax.default_matmul_precision("bfloat16") the solvers still
  evaluate the matvec at "highest": the float32 tolerances hold, and too few
  iterations still fail."""
  _, inverse = _systems()
  matvec = lambda x, A: tpu_matmul(A, x[:, None])[:, 0] + 0.1 * x
  As = jnp.asarray(SPD, jnp.float32)
  bs = jnp.asarray(np.stack([B, -B, 2 * B]), jnp.float32)
  solve = jax.jit(jax.vmap(lambda b, solver: linear_solve(
      matvec, b, As, solver=solver, throw=False), in_axes=(0, None)),
      static_argnums=1)
  with jax.default_matmul_precision("bfloat16"):
    xs, st = solve(bs, solver)
    assert all(st.converged.tolist()), st
    close(xs, np.asarray(bs, np.float64) @ inverse.T, rtol=1e-5, atol=1e-5)
    if not isinstance(solver, Dense):
      short = type(solver)(max_iter=1, **({"restart": 1} if isinstance(
          solver, GMRES) else {}))
      _, st = solve(bs, short)
      assert not any(st.converged.tolist()), st


@pytest.mark.parametrize("solver", [CG(), GMRES()], ids=repr)
def test_products_rounded_in_the_function_itself_need_a_tolerance_to_match(
    simulated_tpu, solver):
  """A matvec whose products are rounded whatever the precision in force
  (an explicit ``precision=`` argument does this on a TPU) cannot give a
  float32 residual: the default tolerance refuses it, in words (CG: the
  operator is not symmetric to float32's precision either); a tolerance it
  can meet passes an answer right to it."""
  _, inverse = _systems()
  matvec = lambda x, A: rounded(A) @ rounded(x) + 0.1 * x
  As, b = jnp.asarray(SPD, jnp.float32), jnp.asarray(B, jnp.float32)
  _, st = linear_solve(matvec, b, As, solver=solver, throw=False)
  assert not bool(st.converged), st
  assert int(st.reason) == (3 if isinstance(solver, CG) else 1), st
  x, st = linear_solve(matvec, b, As, solver=type(solver)(tol=3e-2),
                       throw=False)
  assert bool(st.converged), st
  close(x, inverse @ B, rtol=0.1, atol=3e-2)


def test_dense_builds_its_matrix_exactly_whatever_the_precision(
    simulated_tpu):
  """The matrix Dense builds from matvecs is exact (its columns are the
  matvecs of unit vectors), also under a coarse precision you chose."""
  _, inverse = _systems()
  matvec = lambda x, A: tpu_matmul(A, x[:, None])[:, 0] + 0.1 * x
  with jax.default_matmul_precision("bfloat16"):
    x = jax.jit(lambda b: linear_solve(
        matvec, b, jnp.asarray(SPD, jnp.float32)))(jnp.asarray(B, jnp.float32))
  close(x, inverse @ B)


# --- what a TPU cannot do -----------------------------------------------------------

F64_LU = ("a TPU has no float64 LU: XLA's 'Only F32 and C64 types are "
          "implemented in LuDecomposition'")


@pytest.mark.skipif(jax.default_backend() != "tpu",
                    reason="shows a limit of a TPU, on a TPU")
def test_a_tpu_has_no_float64_lu():
  with jax.enable_x64(True):
    A = jnp.asarray(SPD)
    with pytest.raises(Exception, match="LuDecomposition"):
      jax.block_until_ready(jax.jit(jnp.linalg.solve)(A, jnp.asarray(B)))


@pytest.mark.skipif(jax.default_backend() != "tpu",
                    reason="shows a limit of a TPU, on a TPU")
def test_a_tpu_cannot_round_float64():
  """What the float64 case of the simulated TPU needs (`rounded` of a
  float64 matrix), which a TPU v5e refused: "UNIMPLEMENTED: While rewriting
  computation to not contain X64 element types ... reduce-precision"."""
  with jax.enable_x64(True):
    with pytest.raises(Exception, match="reduce.precision"):
      jax.block_until_ready(jax.jit(rounded)(jnp.asarray(SPD)))


@pytest.mark.parametrize("simulate", [False, True], ids=["here", "sim-tpu"])
def test_a_float64_dense_solve_on_a_tpu_is_refused_naming_the_fixes(
    request, simulate):
  if simulate and jax.default_backend() == "tpu":
    # test_a_tpu_cannot_round_float64 shows the limit
    pytest.skip("the real TPU runs the 'here' case; the simulation rounds "
                "float64 with reduce_precision, which a TPU cannot compile")
  if simulate:
    request.getfixturevalue("simulated_tpu")
  elif jax.default_backend() != "tpu":
    pytest.skip("on a TPU (simulated here by the sim-tpu case)")
  with jax.enable_x64(True):
    A, b = jnp.asarray(SPD), jnp.asarray(B)
    for call in (lambda: linear_solve(MatMul(), b, A),
                 lambda: linear_solve(lambda x, A: A @ x, b, A),
                 lambda: root(lambda x, c: x ** 3 + x - c, jnp.zeros(3), b)):
      with pytest.raises(NotImplementedError) as e:
        call()
      text = str(e.value)
      assert "Dense: a TPU has no float64 LU" in text, text
      assert all(fix in text for fix in ("float32", "GMRES()",
                                         "jax.devices('cpu')")), text
    # what needs no LU works: one unknown, and the matrix-free solvers
    np.testing.assert_allclose(root(lambda x, c: x ** 3 - c, 1., 8.), 2.)
    x = linear_solve(lambda x, A: A @ x, b, A, solver=GMRES())
    np.testing.assert_allclose(SPD @ np.asarray(x), B, atol=1e-10)


def test_the_cpu_fix_the_message_names_solves_in_float64():
  """On a TPU, the solve the message refuses runs on the CPU beside it
  (here, on a CPU, it runs anyway)."""
  with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
    assert _precision.backend() == "cpu"
    x = linear_solve(lambda x, A: A @ x, jnp.asarray(B), jnp.asarray(SPD))
    assert x.dtype == jnp.float64
    np.testing.assert_allclose(SPD @ np.asarray(x), B, atol=1e-12)
