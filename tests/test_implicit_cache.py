"""The eager cache of hijax.implicit keyed on what a function computes: an
inline lambda written again compiles nothing, and a hit never returns a
program traced for other values (closures, globals, defaults, nested
functions, bound objects, solvers)."""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.implicit import Newton, fixed_point, linear_solve, root

from compile_count import Compiles

A3 = jnp.array([[3., 1., 0.5], [-1., 2., 0.3], [0.2, -0.7, 1.5]])
B3 = jnp.array([1., -2., 0.5])
SCALE = 1.0  # a global read by a residual below; the tests rebind it


def close(a, b, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol,
                             atol=atol)


def lambert_w(y):
  """The w with w e^w = y (for the checks)."""
  w = np.log1p(float(y))
  for _ in range(50):
    w -= (w * np.exp(w) - y) / (np.exp(w) * (1 + w))
  return w


# --- an inline lambda, again: nothing compiled ---------------------------------

CALLS = {
    "fixed_point": lambda a: fixed_point(lambda x, a: 0.5 * (x + a / x), a,
                                         a),
    "root": lambda a: root(lambda w, y: w * jnp.exp(w) - y, jnp.float32(1.),
                           a),
    "linear_solve": lambda a: linear_solve(lambda x, A: A @ x, a * B3, A3),
    "linear_solve, captured matrix": lambda a: linear_solve(
        lambda x, _: A3 @ x, a * B3, None),
    "root, throw=False": lambda a: root(lambda w, y: w * w - y,
                                        jnp.float32(1.), a, throw=False),
}


@pytest.mark.parametrize("name", CALLS)
def test_an_inline_lambda_called_again_compiles_nothing(name):
  call = CALLS[name]
  first = call(jnp.float32(2.))
  for a in (3., 4.):
    with Compiles() as c:
      out = jax.block_until_ready(call(jnp.float32(a)))
    assert c.count == 0, (name, c.count)
  assert jax.tree.structure(out) == jax.tree.structure(first)


def test_a_lambda_in_a_loop_under_eager_grad_compiles_once():
  def loss(p):
    return root(lambda w, y: w * jnp.exp(w) - p * y, jnp.float32(1.),
                jnp.float32(2.))
  jax.grad(loss)(jnp.float32(1.))
  for p in (2., 3.):
    with Compiles() as c:
      got = jax.block_until_ready(jax.grad(loss)(jnp.float32(p)))
    assert c.count == 0
    w = lambert_w(2 * p)
    close(got, 2 / (np.exp(w) * (1 + w)), rtol=1e-4)


def test_an_inline_solver_is_keyed_by_its_code():
  call = lambda a: root(lambda w, y: w * w - y, jnp.float32(1.), a,
                        solver=lambda g, x0, p: Newton(tol=1e-6)(g, x0, p))
  call(jnp.float32(2.))
  with Compiles() as c:
    got = jax.block_until_ready(call(jnp.float32(9.)))
  assert c.count == 0
  close(got, 3.)


# --- what the function reads decides the answer ---------------------------------

def solve_w(residual):
  return float(root(residual, jnp.float32(1.), jnp.float32(2.)))


def test_closed_over_python_numbers_give_their_own_answers():
  for c in (1., 2., 3., 2.):
    close(solve_w(lambda w, y: w * jnp.exp(w) - c * y), lambert_w(2 * c))
  # 0.0 and -0.0 are equal in Python, not in what they compute
  for c, sign in ((0.0, 1.), (-0.0, -1.), (0.0, 1.)):
    close(solve_w(lambda w, y: w - jnp.copysign(1., c) * y), 2 * sign)
  for c, want in ((1, 0.5), (True, 1.0)):  # 1 == True, but not the same type
    close(solve_w(lambda w, y: w - y * (0.5 if c is True else 0.25) * 2 * c),
          2 * want)


def test_closed_over_jax_arrays_are_inputs_not_constants():
  for i, c in enumerate(jnp.float32(c) for c in (1., 2., 3.)):
    with Compiles() as count:
      got = solve_w(lambda w, y: w * jnp.exp(w) - c * y)
    assert i == 0 or count.count == 0
    close(got, lambert_w(2 * float(c)))
  # another shape is another program, with its own answer
  c = jnp.full(2, 3.)
  got = root(lambda w, y: w * jnp.exp(w) - c * y, jnp.ones(2), jnp.float32(2.))
  close(got, [lambert_w(6.)] * 2)


def test_closed_over_numpy_arrays_are_keyed_by_value():
  for c in (np.float32(1.), np.array(2., np.float32), np.array(3., np.float32),
            np.array([3.], np.float32), np.array(2., np.float32)):
    got = root(lambda w, y: w * jnp.exp(w) - np.sum(c) * y, jnp.float32(1.),
               jnp.float32(2.))
    close(got, lambert_w(2 * float(np.sum(c))))
  buf = np.array([1.], np.float32)
  residual = lambda w, y: w * jnp.exp(w) - buf[0] * y
  close(solve_w(residual), lambert_w(2.))
  buf[0] = 3.  # the same array, changed in place
  close(solve_w(residual), lambert_w(6.))


def test_an_array_the_function_needs_concrete_is_a_constant():
  """``float(c)`` of a captured array cannot be traced with ``c`` as an
  input: the function is traced again with ``c`` as a constant."""
  for c in (1., 2., 1.):
    arr = jnp.float32(c)
    close(solve_w(lambda w, y: w * jnp.exp(w) - float(arr) * y),
          lambert_w(2 * c))
  arr = jnp.float32(3.)
  residual = lambda w, y: w * jnp.exp(w) - (y if arr.item() > 2 else 0 * y)
  close(solve_w(residual), lambert_w(2.))
  with Compiles() as c:  # remembered: not traced with arr as an input again
    close(solve_w(residual), lambert_w(2.))
  assert c.count == 0


def scaled(w, y):
  return w * jnp.exp(w) - SCALE * y


def test_a_global_rebound_between_calls_is_read_again():
  global SCALE
  try:
    for s in (1., 2., 1.):
      SCALE = s
      close(solve_w(scaled), lambert_w(2 * s))
      close(solve_w(lambda w, y: scaled(w, y)), lambert_w(2 * s))
  finally:
    SCALE = 1.0


def test_default_arguments_are_part_of_the_key():
  for k in (1., 2., 3.):
    close(solve_w(lambda w, y, k=k: w * jnp.exp(w) - k * y), lambert_w(2 * k))
  for k in (1., 2.):
    close(solve_w(lambda w, y, *, k=k: w * jnp.exp(w) - k * y),
          lambert_w(2 * k))
  for k in (jnp.float32(1.), jnp.float32(2.)):
    close(solve_w(lambda w, y, k=k: w * jnp.exp(w) - k * y),
          lambert_w(2 * float(k)))


def test_nested_functions_and_partials():
  def make(c):
    def inner(w):
      return w * jnp.exp(w) * c
    return lambda w, y: inner(w) - y
  for c in (1., 2., jnp.float32(3.), jnp.float32(0.5)):
    close(solve_w(make(c)), lambert_w(2 / float(c)))

  def residual(w, y, c):
    return w * jnp.exp(w) - c * y
  for c in (1., 2., jnp.float32(3.)):
    close(solve_w(functools.partial(residual, c=c)), lambert_w(2 * float(c)))


class Model:
  def __init__(self, k):
    self.k = k

  def residual(self, w, y):
    return w * jnp.exp(w) - self.k * y


def test_a_bound_method_is_keyed_by_its_object():
  m = Model(1.)
  close(solve_w(m.residual), lambert_w(2.))
  m.k = 2.  # the same object, changed
  close(solve_w(m.residual), lambert_w(4.))
  with Compiles() as c:  # an equal object: the same program
    close(solve_w(Model(2.).residual), lambert_w(4.))
  assert c.count == 0
  for k in (jnp.float32(3.), jnp.float32(1.5)):  # arrays: inputs
    close(solve_w(Model(k).residual), lambert_w(2 * float(k)))


class Coeffs(NamedTuple):
  scale: jax.Array
  power: int


def test_pytrees_in_closures():
  for p in (Coeffs(jnp.float32(1.), 1), Coeffs(jnp.float32(2.), 1),
            Coeffs(jnp.float32(2.), 2)):
    got = solve_w(lambda w, y: w * jnp.exp(w) - p.scale ** p.power * y)
    close(got, lambert_w(2 * float(p.scale) ** p.power))
  for d in ({"c": 1.}, {"c": 2.}, [3.], [jnp.float32(4.)]):
    c = d["c"] if isinstance(d, dict) else d[0]
    got = solve_w(lambda w, y: w * jnp.exp(w)
                  - (d["c"] if isinstance(d, dict) else d[0]) * y)
    close(got, lambert_w(2 * float(c)))


def test_a_recursive_function_capturing_arrays_is_keyed_by_identity():
  def make(c):
    def power(w, n):  # c w^n
      return c if n == 0 else w * power(w, n - 1)
    return lambda w, y: power(w, 3) - y
  for c in (jnp.float32(1.), jnp.float32(8.)):
    close(solve_w(make(c)), (2 / float(c)) ** (1 / 3), rtol=1e-4)


def test_solvers_are_keyed_by_their_fields():
  """Equal solvers share a program; a solver with other fields gets its own
  (its tolerance shows in the steps taken)."""
  steps = lambda solver: int(root(lambda w, y: w * w - y, jnp.float32(1.),
                                  jnp.float32(9.), solver=solver,
                                  throw=False)[1].steps)
  loose, tight = steps(Newton(tol=1e-1)), steps(Newton(tol=1e-6))
  assert loose < tight
  with Compiles() as c:
    assert steps(Newton(tol=1e-1)) == loose
  assert c.count == 0
  assert steps(Newton(tol=1e-6)) == tight
