"""The kernels of hijax.implicit's checked programs, held: XLA's CPU backend
compiles each fusion of a program on its own (about 14 ms each on the
development machine), so the checks of a solve's result (kept: a returned
number is a promise) cost compile time by their count of kernels more than
by their arithmetic. Each program below is a problem of
``bench/bench_implicit.py``; its fusions and conditionals must not grow
above the numbers recorded (lower them when a change lowers them).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compile_count import opcodes
from hijax.implicit import CG, Dense, MatMul, fixed_point, linear_solve, root
from hijax.implicit._backward_error import _max_last


def _sq(x, a):
  return x * x - a


def _newton_residual(x, p):
  M, c = p
  return M @ x + 0.1 * jnp.tanh(x) - c


def _contraction(x, p):
  return p["A"] @ x + p["c"]


def _programs():
  """name: (function, arguments): the benchmark's problems, value and
  gradient."""
  key = jax.random.key(0)
  A = jax.random.normal(key, (200, 200)) / 200 ** 0.5 + 2 * jnp.eye(200)
  S = A @ A.T
  small = A[:20, :20]
  b = jnp.ones(200)
  a = jnp.linspace(0.5, 4.0, 100)
  M = A[:50, :50] + jnp.eye(50)
  c = jnp.linspace(-1, 1, 50)
  fp = {"A": 0.1 * A[:3, :3], "c": jnp.ones(3)}
  sqrt = lambda a: root(_sq, jnp.ones_like(a), a)
  dense = lambda A, b: linear_solve(MatMul(), b, A, solver=Dense())
  natural = lambda A, b: linear_solve(lambda x, A: A @ x, b, A,
                                      solver=Dense())
  cg = lambda S, b: linear_solve(lambda x, S: S @ x, b, S, solver=CG(tol=1e-5))
  newton = lambda c: root(_newton_residual, jnp.zeros(50), (M, c))
  loss = lambda c: jnp.sum(newton(c) ** 2)
  fixed = lambda c: fixed_point(_contraction, jnp.zeros(3), dict(fp, c=c))
  total = lambda f: jax.grad(lambda *args: f(*args).sum())
  return {
      "scalar-root value": (jax.vmap(sqrt), (a,)),
      "scalar-root grad": (jax.vmap(jax.grad(sqrt)), (a,)),
      "dense-200 value": (dense, (A, b)),
      "dense-200 grad": (total(dense), (A, b)),
      "dense-20 value": (dense, (small, b[:20])),
      "dense-20 grad": (total(dense), (small, b[:20])),
      "dense-natural value": (natural, (A, b)),
      "dense-natural grad": (total(natural), (A, b)),
      "cg-200 value": (cg, (S, b)),
      "cg-200 grad": (total(cg), (S, b)),
      "newton-50 jacrev": (jax.jacrev(newton), (c,)),
      "newton-50 hvp": (lambda c: jax.jvp(jax.grad(loss), (c,), (c,))[1],
                        (c,)),
      "fixed-point value": (fixed, (fp["c"],)),
      "fixed-point grad": (total(fixed), (fp["c"],)),
  }


# name: (fusions, conditionals), at most; on a CPU, jax 0.12 and 0.11 (the
# same counts)
HELD = {
    'scalar-root value': (17, 1),
    'scalar-root grad': (22, 2),
    'dense-200 value': (22, 2),
    'dense-200 grad': (35, 4),
    'dense-20 value': (19, 1),
    'dense-20 grad': (27, 2),
    'dense-natural value': (22, 2),
    'dense-natural grad': (35, 4),
    'cg-200 value': (27, 1),
    'cg-200 grad': (46, 2),
    'newton-50 jacrev': (58, 2),
    'newton-50 hvp': (69, 4),
    'fixed-point value': (12, 1),
    'fixed-point grad': (17, 1),
}


def counts(name):
  fn, args = _programs()[name]
  ops = opcodes(fn, *args)
  return ops["fusion"], ops["conditional"]


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="the counts are of XLA's CPU backend")
@pytest.mark.parametrize("name", list(HELD))
def test_a_checked_program_holds_no_more_kernels_than_recorded(name):
  got, held = counts(name), HELD[name]
  assert got[0] <= held[0] and got[1] <= held[1], (
      f"{name}: (fusions, conditionals) {got}, at most {held} recorded")


@pytest.mark.parametrize("n", [2, 32, 33, 200])
def test_the_checks_maximum_is_jnps_with_nan_and_inf(n):
  """`Dense`'s check takes its maxima by ``lax.top_k`` past 32 entries (a
  maximum there is two kernels, slow to compile): the same values as
  ``jnp.max``, under jit, a NaN anywhere giving NaN and an inf inf."""
  rng = np.random.default_rng(n)
  a = np.abs(rng.standard_normal((3, 5, n))).astype(np.float32)
  a[0, 1, n // 2] = np.nan
  a[1, 2, -1] = np.inf
  a[2, 3, 0] = np.nan
  a[2, 3, 1] = np.inf
  got = np.asarray(jax.jit(_max_last)(a))
  want = np.max(a, axis=-1)
  np.testing.assert_array_equal(got, want)
  assert np.isnan(got[0, 1]) and np.isinf(got[1, 2]) and np.isnan(got[2, 3])


if __name__ == "__main__":  # print the counts, to record them
  for name in _programs():
    print(f"    {name!r}: {counts(name)},")
