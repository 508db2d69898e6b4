"""Behaviours of `hijax.custom_vjp` / `hijax.custom_jvp` that a one-token
change of their tracing, output checks or batching (``tools/mutants.py``
over ``hijax/_decorators/``) once changed without any test noticing; each
asserted here against plain JAX, a closed form, or the error a user meets.
"""
import operator
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import config
from jax.custom_derivatives import SymbolicZero

import hijax


def close(a, b):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6), a, b)


def sin_vjp():
  f = hijax.custom_vjp(jnp.sin)
  f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,))
  return f


def sin_jvp():
  f = hijax.custom_jvp(jnp.sin)
  f.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))
  return f


DECORATED = [sin_vjp, sin_jvp]


# --- batching -------------------------------------------------------------------

@pytest.mark.parametrize("make", DECORATED)
def test_a_batched_argument_under_a_named_vmap_is_batched(make):
  """Under a vmap with an axis name, an argument batched along the axis is
  mapped (one value per element), not taken whole as an unbatched one."""
  f, xs = make(), jnp.arange(3.)
  close(jax.vmap(f, axis_name="i")(xs), jnp.sin(xs))
  close(jax.vmap(jax.grad(f), axis_name="i")(xs), jnp.cos(xs))


def test_a_fwd_rule_batched_where_the_function_is_not_is_named_in_the_error():
  """An unbatched call under a named vmap whose custom_vjp fwd rule makes its
  primal output depend on the axis: the error names the fwd rule."""
  @hijax.custom_vjp
  def shift(x):
    return x + 1.
  shift.defvjp(lambda x: (x + 1. + 0. * jax.lax.axis_index("i"), None),
               lambda _, g: (g,))
  with pytest.raises(ValueError, match=r"^under vmap, the fwd rule of shift "
                     r"produced an output batched along the mapped axis"):
    jax.grad(lambda c: jax.vmap(lambda x: x * shift(c), axis_name="i")(
        jnp.ones(3)).sum())(1.)


@pytest.mark.parametrize("make", DECORATED)
@pytest.mark.parametrize("in_axes", [0, 1])
def test_a_batch_rule_sees_a_batched_matrix_with_its_batch_axis_first(
    make, in_axes):
  """vmap over either axis of a 4 x 3 matrix: the defbatch rule receives
  the batch with the mapped axis first, whole, and the result is the
  function's, mapped."""
  f, seen = make(), []

  @f.defbatch
  def _(size, in_batched, x):
    seen.append((size, in_batched, x.shape))
    return jnp.sin(x), True
  xs = jnp.arange(12.).reshape(4, 3)
  out = jax.vmap(f, in_axes=in_axes)(xs)
  close(out, jnp.sin(jnp.moveaxis(xs, in_axes, 0)))
  size = xs.shape[in_axes]
  assert seen == [(size, [True], (size, 12 // size))]


def scaled_sin(kind, c):
  """sin(x) * c, closing over c, with its rules and a defbatch rule."""
  f = getattr(hijax, kind)(lambda x: jnp.sin(x) * c)
  if kind == "custom_vjp":
    f.defvjp(lambda x: (jnp.sin(x) * c, jnp.cos(x) * c), lambda r, g: (r * g,))
  else:
    f.defjvp(lambda p, t: (jnp.sin(p[0]) * c, jnp.cos(p[0]) * c * t[0]))
  f.defbatch(lambda size, in_batched, x: (jnp.sin(x) * c, True))
  return f


@pytest.mark.parametrize("kind", ["custom_vjp", "custom_jvp"])
def test_derivatives_of_a_batch_rule_s_result_with_a_traced_closure(kind):
  """Under jit the function and its rules close over the traced c; vmap
  computes the batch by the defbatch rule, differentiated by the rules:
  grad, jvp and linearize as plain JAX's."""
  xs, c = jnp.array([0.3, -1.2, 2.0]), 2.
  batch = lambda c, xs: jax.vmap(scaled_sin(kind, c))(xs)
  grad = jax.jit(jax.grad(lambda c, xs: batch(c, xs).sum(), 1))
  close(grad(c, xs), c * jnp.cos(xs))
  jvp = jax.jit(lambda c, xs, t: jax.jvp(lambda xs: batch(c, xs), (xs,), (t,)))
  close(jvp(c, xs, 2 * xs), (c * jnp.sin(xs), 2 * xs * c * jnp.cos(xs)))
  lin = jax.jit(lambda c, xs, t: jax.linearize(lambda xs: batch(c, xs), xs)[1](t))
  close(lin(c, xs, xs), xs * c * jnp.cos(xs))


# --- output checks ----------------------------------------------------------------

class Double:
  """A callable object: no source lines for JAX's words to name."""

  def __call__(self, x):
    return 2. * x


def test_a_wrong_cotangent_of_a_callable_object_names_its_class():
  f = hijax.custom_vjp(Double())
  f.defvjp(lambda x: (2. * x, None), lambda _, g: (jnp.ones(2),))
  with pytest.raises(ValueError) as info:
    jax.grad(lambda x: f(x).sum())(jnp.ones(3))
  assert str(info.value).startswith(
      "at output[0] the bwd rule attached to Double produced an output of "
      "type float32[2] which doesn't match expected type float32[3]\n")


def test_a_jvp_rule_s_wrong_primal_output_in_jax_s_words_then_hijax_s():
  """JAX's custom_jvp names the shapes only (no leaf, unlike its custom_vjp's
  fwd rule error), then hijax's words name the rule, the output and the fix."""
  @hijax.custom_jvp
  def double(x):
    return 2. * x

  @double.defjvp
  def double_jvp(p, t):
    return jnp.ones(2), 2. * t[0]
  with pytest.raises(TypeError) as info:
    jax.jvp(double, (jnp.ones(3),), (jnp.ones(3),))
  assert str(info.value) == (
      "Custom JVP rule double_jvp for function double must produce a pair "
      "(list or tuple of length two) where the first element represents the "
      "primal output (equal in value to the output of the custom_jvp-decorated "
      "function double, and in particular with leaves of the same "
      "shape/dtype), but instead the JVP rule output's first element had "
      "shapes/dtypes of:\n    float32[2]\nwhile the custom_jvp-decorated "
      "function double had output shapes/dtypes of:\n    float32[3]\n"
      "hijax.custom_jvp function double: the jvp rule double_jvp returned a "
      "value of type float32[2] as its primal output, but double returns "
      "float32[3] there. Return a value of shape (3,). The primal output must "
      "equal double(*args).")


def test_a_none_tangent_before_another_output_s_tangent():
  """None for the first output's tangent (a zero), a value for the second:
  jvp returns zero and that value, as JAX's decorator does for zeros."""
  f = hijax.custom_jvp(lambda x: (jnp.sin(x), 2. * x))
  f.defjvp(lambda p, t: (f(*p), (None, 2. * t[0])))
  out, tangents = jax.jvp(f, (1.,), (3.,))
  close(out, (jnp.sin(1.), 2.))
  close(tangents, (0., 6.))


@pytest.mark.parametrize("pair_out", [False, True])
def test_a_float0_tangent_of_a_float_output_is_refused(pair_out):
  """float0 is the tangent type of integers: returned as a float output's
  tangent, it is a TypeError, in JAX's words (as JAX's decorator raises),
  then hijax's naming the function and the rule."""
  def double(x):
    return (2. * x, 2. * x) if pair_out else 2. * x
  f = hijax.custom_jvp(double)
  zero = np.zeros((), jax.dtypes.float0)
  f.defjvp(lambda p, t: (f(*p), (zero, t[0]) if pair_out else zero))
  with pytest.raises(TypeError) as info:
    jax.jvp(f, (1.,), (3.,))
  text = str(info.value)
  assert text.startswith(
      "Custom JVP rule must produce primal and tangent outputs with "
      "corresponding shapes and dtypes")
  assert ("primal float32[] with tangent float0[], expecting tangent "
          "float32[]" if pair_out else
          "Expected float32[] (tangent type of float32[]) but got float0[]."
          ) in text
  assert "hijax.custom_jvp function double: the jvp rule" in text
  assert "float0[]" in text.splitlines()[-1]


@pytest.mark.parametrize("tangent", ["two", (jnp.ones(2), "two")])
def test_a_tangent_that_is_not_a_jax_value_is_named_by_its_type(tangent):
  """A str as an output's tangent: the error says so (JAX's words, which
  name types, are left out: a str has none), even where another output's
  tangent is the one of the wrong type."""
  pair_out = isinstance(tangent, tuple)
  double = hijax.custom_jvp(
      (lambda x: (2. * x, 2. * x)) if pair_out else (lambda x: 2. * x))
  double.defjvp(lambda p, t: (double(*p), tangent))
  with pytest.raises(TypeError) as info:
    jax.jvp(double, (1.,), (1.,))
  first = "output[0]" if pair_out else "output"
  got = "a value of type float32[2]" if pair_out else "a str, which is not a JAX value"
  assert str(info.value).startswith(
      "hijax.custom_jvp function <lambda>: the jvp rule <lambda> returned "
      f"{got} as the tangent of {first}")


def test_a_cotangent_of_the_wrong_structure_counts_its_nones_as_leaves():
  """A bwd rule returning three cotangents (two None) for a pair: hijax's
  words show the three leaves it returned, JAX's its own structure."""
  @hijax.custom_vjp
  def total(xy):
    return xy[0] + xy[1]

  def total_fwd(xy):
    return total(xy), None

  def total_bwd(_, g):
    return ((g, None, None),)
  total.defvjp(total_fwd, total_bwd)
  with pytest.raises(TypeError) as info:
    jax.grad(total)((1., 2.))
  assert str(info.value).endswith(
      "but got bwd output structure PyTreeDef((*, None, None)) for primal "
      "input structure PyTreeDef(((*, *),)).\nhijax.custom_vjp function "
      "total: the bwd rule total_bwd returned a cotangent with structure "
      "PyTreeDef((*, *, *)) for argument xy (position 0), whose structure is "
      "PyTreeDef((*, *)): return a cotangent of the argument's structure "
      "(None for zeros)")


def test_zero_cotangents_with_the_bwd_checks_disabled():
  """With ``jax_disable_bwd_checks`` set, a zero array returned for an
  integer argument and a symbolic zero for a float one are zeros, as with
  the checks: the integer's cotangent is float0, the float's 0."""
  f = hijax.custom_vjp(lambda x, n: x * n)
  f.defvjp(lambda x, n: (x * n, n), lambda n, g: (g * n, jnp.zeros(())))
  h = hijax.custom_vjp(lambda x, y: x * y)
  h.defvjp(lambda x, y: (x * y, y), lambda y, g: (
      g * y, SymbolicZero(hijax.ShapedArray((), jnp.float32))))
  with config.disable_bwd_checks(True):
    ct_x, ct_n = jax.vjp(f, 2., 3)[1](1.)
    grads = jax.grad(h, (0, 1))(2., 3.)
  close(ct_x, 3.)
  assert ct_n.dtype == jax.dtypes.float0
  close(grads, (3., 0.))


def scale_with_cotangent(ct):
  """x * 3, whose bwd rule returns ``ct(g)`` as x's cotangent."""
  f = hijax.custom_vjp(lambda x: x * 3.)
  f.defvjp(lambda x: (x * 3., None), lambda _, g: (ct(g),))
  return f


def test_a_weak_float_argument_s_cotangent_of_another_float_dtype_is_cast():
  """A Python float argument (weakly typed float32) may receive a float16
  cotangent, cast to float32 as JAX's decorator does; a float32 array may
  not, nor may the weak float receive an integer or a wrong shape."""
  grad = jax.grad(scale_with_cotangent(lambda g: (3. * g).astype(jnp.float16)))
  assert grad(2.).dtype == jnp.float32
  close(grad(2.), 3.)
  with pytest.raises(hijax.CotangentTypeError, match=r"float16\[\] as the "
                     r"cotangent of argument x \(position 0\), but that "
                     r"argument has type float32\[\]"):
    grad(jnp.float32(2.))
  for wrong, got in [(lambda g: jnp.int32(3), "int32[]"),
                     (lambda g: jnp.ones(2, jnp.float16), "float16[2]")]:
    with pytest.raises(hijax.CotangentTypeError, match=rf"{re.escape(got)} "
                       r"as the cotangent of argument x"):
      jax.grad(scale_with_cotangent(wrong))(2.)


def test_a_hi_type_argument_s_cotangent_of_another_float_dtype_is_refused():
  """A rank-1 matrix argument (a hi type, whose cotangent is a dense
  float32 matrix): a float16 matrix as its cotangent is refused, not cast
  (only a weakly typed float argument's is)."""
  from hitype_examples import rank1, to_dense
  f = hijax.custom_vjp(lambda r: to_dense(r).sum())
  f.defvjp(lambda r: (f(r), None),
           lambda _, g: (jnp.full((2, 3), g, jnp.float16),))
  with pytest.raises(hijax.CotangentTypeError, match=r"float16\[2,3\] as "
                     r"the cotangent of argument r"):
    jax.grad(lambda u, v: f(rank1(u, v)))(jnp.ones(2), jnp.ones(3))


# --- arguments --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["custom_vjp", "custom_jvp"])
def test_a_keyword_only_parameter_is_not_filled_by_position(kind):
  """f(x, *, y) called with two positional arguments: JAX's binding error,
  not a call of f with y in x's place."""
  def f(x, *, y):
    return x * y
  d = getattr(hijax, kind)(f)
  if kind == "custom_vjp":
    d.defvjp(lambda x, *, y: (x * y, y), lambda y, g: (g * y,))
  else:
    d.defjvp(lambda p, t: (p[0], t[0]))
  with pytest.raises(TypeError, match=r"^The input arguments to the "
                     rf"{kind}-decorated function f could not be resolved to "
                     r"positional-only arguments. Binding failed with the "
                     r"error:\ntoo many positional arguments"):
    d(1., 2.)


@pytest.mark.parametrize("kind", ["custom_vjp", "custom_jvp"])
def test_a_function_without_a_signature_is_called_by_position(kind):
  """operator.methodcaller has no signature Python can read: positional
  arguments are passed as they are; a keyword cannot be bound."""
  negate = getattr(hijax, kind)(operator.methodcaller("__neg__"))
  if kind == "custom_vjp":
    negate.defvjp(lambda x: (-x, None), lambda _, g: (-g,))
  else:
    negate.defjvp(lambda p, t: (-p[0], -t[0]))
  close(negate(2.), -2.)
  close(jax.grad(negate)(2.), -1.)
  with pytest.raises(TypeError, match=r"no signature to bind keyword "
                     r"arguments with\n.* pass its arguments by position"):
    negate(x=2.)


@pytest.mark.parametrize("make", ["custom_vjp", "custom_jvp"])
def test_a_call_with_a_hi_type_argument_under_jit(make):
  """A rank-1 matrix argument (a hi type, which a closed call cannot take):
  the call is lowered by evaluating the function, with its value."""
  from hitype_examples import rank1, to_dense
  f = getattr(hijax, make)(lambda r: to_dense(r).sum())
  if make == "custom_vjp":
    f.defvjp(lambda r: (f(r), None), lambda _, g: (None,))
  else:
    f.defjvp(lambda p, t: (f(*p), 0. * f(*p)))
  u, v = jnp.array([1., 2.]), jnp.array([3., 4., 5.])
  close(jax.jit(lambda u, v: f(rank1(u, v)))(u, v), 36.)
