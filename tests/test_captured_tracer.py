"""A primitive's params are static: a traced value captured in one (a function
param closing over it) is an error that names the param and the fix, under
every transformation. Before, JAX raised vague errors ("No constant handler",
"unexpected tracer") and ``jit(grad)`` on jax 0.12 silently returned 0."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import hijax
from hijax import HiPrim


class Apply(HiPrim):
  """``f(x)`` for a function param ``f``, with rules that use ``f``."""

  def __init__(self, x_aval, *, f):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, dict(f=f)
    super().__init__()

  def expand(self, x):
    return self.f(x)

  def jvp(self, primals, tangents):
    return jax.jvp(self.f, primals, tangents)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return (jax.vjp(self.f, x)[1](g)[0],)

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]


def by_closure(c, x=2.):
  return Apply(jax.typeof(x), f=lambda y: y * c)(x)


def by_partial(c, x=2.):
  return Apply(jax.typeof(x), f=functools.partial(jnp.multiply, c))(x)


def by_default(c, x=2.):
  return Apply(jax.typeof(x), f=lambda y, c=c: y * c)(x)


def by_nested_closure(c, x=2.):
  inner = lambda y: y * c
  return Apply(jax.typeof(x), f=lambda y: inner(y) + 1.)(x)


TRANSFORMS = {
    "jit": jax.jit,
    "grad": jax.grad,
    "jit(grad)": lambda f: jax.jit(jax.grad(f)),
    "jvp": lambda f: lambda c: jax.jvp(f, (c,), (1.,)),
    "vmap": lambda f: lambda c: jax.vmap(f)(jnp.stack([c, c])),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("fn", [by_closure, by_partial, by_default,
                                by_nested_closure])
def test_a_traced_value_captured_in_a_param_is_named(transform, fn):
  with pytest.raises(jax.errors.UnexpectedTracerError) as e:
    TRANSFORMS[transform](fn)(3.)
  msg = str(e.value)
  assert "Apply" in msg and "params['f']" in msg
  assert "float32[]" in msg
  assert "closure_convert_params" in msg and "argument" in msg


def test_values_that_are_not_traced_stay_fine():
  c = jnp.float32(3.)
  assert by_closure(c) == 6.
  assert jax.jit(lambda x: Apply(jax.typeof(x), f=lambda y: y * c)(x))(2.) == 6.
  assert jax.grad(lambda x: Apply(jax.typeof(x), f=lambda y: y * c)(x))(2.) == 3.


class ApplyWithParams(HiPrim):
  """``f(x, a)`` for a function param ``f``; ``a`` is differentiated too."""

  def __init__(self, x_aval, a_aval, *, f):
    self.in_avals, self.out_aval = (x_aval, a_aval), x_aval
    self.params = dict(f=f)
    super().__init__()

  def expand(self, x, a):
    return self.f(x, a)

  def jvp(self, primals, tangents):
    tangents = jax.tree.map(hijax.instantiate_zeros, tangents,
                            is_leaf=lambda t: isinstance(t, hijax.Zero))
    return jax.jvp(self.f, primals, tangents)

  vjp_fwd, vjp_bwd_retval = hijax.vjp_from_jvp


@pytest.mark.parametrize("transform", ["grad", "jit(grad)"])
def test_closure_conversion_is_the_fix_the_error_names(transform):
  def converted(c, x=2.):
    f, a = hijax.closure_convert_params(lambda y, a: y * c, x, ())
    return ApplyWithParams(jax.typeof(x), jax.tree.map(jax.typeof, a), f=f)(x, a)
  assert TRANSFORMS[transform](converted)(3.) == 2.
