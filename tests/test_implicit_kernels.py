"""The kernels of hijax.implicit's checked programs, held: XLA's CPU backend
compiles each fusion of a program on its own, and each matrix product
(``dot``) as one more kernel (about 15-25 ms each on the development
machine), so the checks of a solve's result (kept: a returned
number is a promise) cost compile time by their count of kernels more than
by their arithmetic. Each program below is a problem of
``bench/bench_implicit.py``; its kernels (fusions and dots) and
conditionals must not grow above the numbers recorded (lower them when a
change lowers them).
"""
import jax
import jax.numpy as jnp
import pytest

from compile_count import opcodes
from hijax.implicit import CG, Dense, MatMul, fixed_point, linear_solve, root


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


# name: (kernels, conditionals), at most; on a CPU, jax 0.12 and 0.11 (the
# same counts). A 200-unknown Dense check has one conditional more than it
# had (and a kernel; its gradient's two checks, four): it reads |A| only
# where the residual needs it, a run-time trade (|A|'s row sums took 18 us
# of a 250 us solve) whose compile time stayed under the peer's
# (bench_implicit --compile).
HELD = {
    'scalar-root value': (13, 1),
    'scalar-root grad': (18, 2),
    'dense-200 value': (20, 2),
    'dense-200 grad': (31, 4),
    'dense-20 value': (19, 1),
    'dense-20 grad': (27, 2),
    'dense-natural value': (20, 2),
    'dense-natural grad': (31, 4),
    'cg-200 value': (31, 1),
    'cg-200 grad': (52, 2),
    'newton-50 jacrev': (56, 2),
    'newton-50 hvp': (70, 4),
    'fixed-point value': (10, 1),
    'fixed-point grad': (16, 1),
}


def counts(name):
  fn, args = _programs()[name]
  ops = opcodes(fn, *args)
  return ops["fusion"] + ops["dot"], ops["conditional"]


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="the counts are of XLA's CPU backend")
@pytest.mark.parametrize("name", list(HELD))
def test_a_checked_program_holds_no_more_kernels_than_recorded(name):
  got, held = counts(name), HELD[name]
  assert got[0] <= held[0] and got[1] <= held[1], (
      f"{name}: (kernels, conditionals) {got}, at most {held} recorded")


if __name__ == "__main__":  # print the counts, to record them
  for name in _programs():
    print(f"    {name!r}: {counts(name)},")
