"""What a call of a decorated function traced is kept for the next call with
the same argument types, keyed on what the function computes: a change of a
global array it reads, of a closure cell or of a default of a function it
calls is seen at the next call, eagerly (``grad``, ``jvp``) and under a new
``jit``; and an unchanged function is traced once.
"""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hijax

X = jnp.linspace(0.1, 1.0, 5)
W = jnp.full(5, 2.0)


def _vjp(fun):
  """``fun`` (``sin(x) * w`` for some ``w`` it reads) under hijax.custom_vjp,
  with rules that take ``w`` from ``fun`` itself: fwd's output is ``f(x)``
  and bwd's cotangent ``g * f(x) / tan(x)`` (that is ``g cos(x) w``)."""
  f = hijax.custom_vjp(fun)

  def fwd(x):
    y = f(x)
    return y, (x, y)

  def bwd(res, g):
    x, y = res
    return (g * y / jnp.tan(x),)
  f.defvjp(fwd, bwd)
  return f


def _jvp(fun):
  """The same under hijax.custom_jvp (tangent ``t f(x) / tan(x)``)."""
  f = hijax.custom_jvp(fun)

  @f.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    y = f(x)
    return y, t * y / jnp.tan(x)
  return f


def _value_and_grad(f):
  return jax.value_and_grad(lambda x: jnp.sum(f(x)))(X)


def _fresh_jit_value_and_grad(f):
  return jax.jit(lambda x: jax.value_and_grad(lambda x: jnp.sum(f(x)))(x))(X)


def _jvp_value_and_tangent(f):
  y, t = jax.jvp(f, (X,), (jnp.ones_like(X),))
  return jnp.sum(y), t


WAYS = {"eager grad": _value_and_grad, "jit grad": _fresh_jit_value_and_grad,
        "eager jvp": _jvp_value_and_tangent,
        "jit of f": lambda f: (jnp.sum(jax.jit(lambda x: f(x))(X)), None)}


def _check(ways, f, w):
  """Each way of computing ``f`` gives the values of ``sin(x) * w``."""
  for name in ways:
    value, derivative = WAYS[name](f)
    np.testing.assert_allclose(value, jnp.sum(jnp.sin(X) * w), rtol=1e-6,
                               err_msg=name)
    if derivative is not None:
      np.testing.assert_allclose(derivative, jnp.cos(X) * w, rtol=1e-5,
                                 err_msg=name)


DECORATORS = {"custom_vjp": (_vjp, ["eager grad", "jit grad", "eager jvp",
                                    "jit of f"]),
              "custom_jvp": (_jvp, list(WAYS))}

_global_w = W


def _reads_global(x):
  return jnp.sin(x) * _global_w


@pytest.mark.parametrize("kind", DECORATORS)
def test_a_global_array_changed_between_calls_is_seen(kind):
  global _global_w
  make, ways = DECORATORS[kind]
  f = make(_reads_global)
  try:
    for w in (W, 3.0 * W, -W):
      _global_w = w
      for way in ways:  # each way twice: the second call finds the first's
        _check([way, way], f, w)
  finally:
    _global_w = W


@pytest.mark.parametrize("kind", DECORATORS)
def test_a_closure_cell_changed_between_calls_is_seen(kind):
  make, ways = DECORATORS[kind]
  w = W

  def fun(x):
    return jnp.sin(x) * w
  f = make(fun)
  for new in (W, 3.0 * W, -W):
    w = new
    for way in ways:
      _check([way, way], f, new)


def _scaled(x, w=W):
  return x * w


def _calls_a_function_with_a_default(x):
  return _scaled(jnp.sin(x))


@pytest.mark.parametrize("kind", DECORATORS)
def test_a_default_changed_between_calls_is_seen(kind):
  make, ways = DECORATORS[kind]
  f = make(_calls_a_function_with_a_default)
  try:
    for w in (W, 3.0 * W, -W):
      _scaled.__defaults__ = (w,)
      for way in ways:
        _check([way, way], f, w)
  finally:
    _scaled.__defaults__ = (W,)


def test_a_bound_method_s_object_changed_between_calls_is_seen():
  class Scale:
    def __init__(self, w):
      self.w = w

    def __call__(self, x):
      return jnp.sin(x) * self.w

  scale = Scale(W)
  for make, ways in DECORATORS.values():
    f = make(scale.__call__)
    for w in (W, 3.0 * W):
      scale.w = w
      for way in ways:
        _check([way, way], f, w)


_traced = collections.deque()  # (keyed by identity: appending is no change)


def _counts_its_tracings(x):
  if isinstance(x, jax.core.Tracer):  # (fwd's eager call of f runs fun)
    _traced.append(None)
  return jnp.sin(x) * W


@pytest.mark.parametrize("kind", DECORATORS)
def test_an_unchanged_function_is_traced_once_per_argument_types(kind):
  """Five eager ``grad`` calls and five new ``jit``s trace ``fun`` once for
  these argument types (its rules are called, as JAX calls them, at each
  differentiation), once more for other types."""
  make, _ = DECORATORS[kind]
  f = make(_counts_its_tracings)
  _traced.clear()
  for _ in range(5):
    _check(["eager grad", "jit of f"], f, W)
  assert len(_traced) == 1
  jax.grad(lambda x: jnp.sum(f(x)))(X.astype(jnp.float16))
  assert len(_traced) == 2


def test_a_rule_redefined_is_used_at_the_next_call():
  f = hijax.custom_vjp(_reads_global)
  f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.cos(x) * W,))
  np.testing.assert_allclose(_value_and_grad(f)[1], jnp.cos(X) * W)
  f.defvjp(lambda x: (f(x), x), lambda x, g: (g * 0.0,))
  np.testing.assert_allclose(_value_and_grad(f)[1], 0.0 * X)


# An eager ``grad`` of a custom_jvp keeps, from the second call on, the
# linearization of its rule: a change of what the rule alone reads (the
# function does not) is seen at the next call.
_rule_w = W


def _grad_is(f, w):
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x)))(X),
                             jnp.cos(X) * w, rtol=1e-6)


def test_a_global_array_a_jvp_rule_reads_changed_between_grads_is_seen():
  global _rule_w
  f = hijax.custom_jvp(lambda x: jnp.sin(x) * W)

  @f.defjvp
  def rule(primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x), t * jnp.cos(x) * _rule_w
  try:
    for w in (W, 3.0 * W, -W):
      _rule_w = w
      for _ in range(3):  # the third call runs what the second kept
        _grad_is(f, w)
  finally:
    _rule_w = W


def test_a_closure_cell_a_jvp_rule_reads_changed_between_grads_is_seen():
  w = W
  f = hijax.custom_jvp(lambda x: jnp.sin(x) * W)

  @f.defjvp
  def rule(primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x), t * jnp.cos(x) * w
  for new in (W, 3.0 * W, -W):
    w = new
    for _ in range(3):
      _grad_is(f, new)


def test_a_jvp_rule_branching_on_a_value_is_run_on_the_values_each_grad():
  f = hijax.custom_jvp(lambda x: jnp.sin(x) * W)

  @f.defjvp
  def rule(primals, tangents):
    (x,), (t,) = primals, tangents
    sign = 1.0 if float(x[0]) > 0 else -1.0  # needs the value
    return f(x), sign * t * jnp.cos(x) * W
  for _ in range(3):
    _grad_is(f, W)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x)))(-X),
                             -jnp.cos(-X) * W, rtol=1e-6)


def test_an_unchanged_jvp_rule_runs_no_more_from_the_third_eager_grad():
  """The first eager ``grad`` runs the rule, the second traces it once for
  the kept linearization, the next ones run that (the rule is not called);
  other argument types start over, and the values stay right. Under ``jit``
  nothing is kept: each new trace calls the rule."""
  calls = collections.deque()  # (keyed by identity: appending is no change)
  f = hijax.custom_jvp(lambda x: jnp.sin(x) * W)

  @f.defjvp
  def rule(primals, tangents):
    calls.append(None)
    (x,), (t,) = primals, tangents
    return f(x), t * jnp.cos(x) * W
  counts = []
  for x in (X, X, X, X, X.astype(jnp.float16), X.astype(jnp.float16)):
    before = len(calls)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x)))(x),
                               jnp.cos(x) * W, rtol=2e-3)
    counts.append(len(calls) - before)
  assert counts == [1, 1, 0, 0, 1, 1]
  for _ in range(3):  # under a new jit the rule is traced, as JAX's is
    before = len(calls)
    jax.jit(lambda x: jax.grad(lambda x: jnp.sum(f(x)))(x))(X)
    assert len(calls) - before == 1
