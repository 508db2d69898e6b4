"""Closure conversion: function params that capture differentiated or batched
values, in a primitive of our own and in `hijax.implicit`.

Values are checked against closed forms and plain JAX.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import (ClosureConverted, HiPrim, Zero, closure_convert,
                   closure_convert_params, instantiate_zeros, vjp_from_jvp)
from hijax.implicit import fixed_point, linear_solve, root


def close(a, b, rtol=1e-5):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol,
                                                       atol=1e-6), a, b)


class Apply(HiPrim):
  """fn(x, consts), with fn a static param and consts explicit inputs."""

  def __init__(self, x_aval, consts_avals, fn):
    self.in_avals = (x_aval, consts_avals)
    self.out_aval = x_aval
    self.params = dict(fn=fn)
    super().__init__()

  def expand(self, x, consts):
    return self.fn(x, consts)

  def jvp(self, primals, tangents):
    tangents = jax.tree.map(instantiate_zeros, tangents,
                            is_leaf=lambda t: isinstance(t, Zero))
    return jax.jvp(self.fn, primals, tangents)

  vjp_fwd, vjp_bwd_retval = vjp_from_jvp

  def batch_dim_rule(self, axis_data, in_dims):
    return 0 if any(d is not None for d in jax.tree.leaves(in_dims)) else None


def apply(fn, x):
  converted, consts = closure_convert(fn, x)
  return Apply(jax.typeof(x), [jax.typeof(c) for c in consts],
               converted)(x, consts)


def test_nothing_captured_returns_the_function_itself():
  fn = lambda x: jnp.sin(x) * 3.
  assert closure_convert(fn, 1.) == (fn, [])
  assert closure_convert_params(lambda x, p: x * p, 1., 2.)[1] == 2.


def test_captured_tracers_become_inputs():
  x = jnp.array([0.3, -1.2])

  def f(w):
    return jnp.sum(apply(lambda x: jnp.sin(w * x) + w ** 2, x))

  def ref(w):
    return jnp.sum(jnp.sin(w * x) + w ** 2)
  for w in (0.7, -1.5):
    close(jax.grad(f)(w), jax.grad(ref)(w))
    close(jax.jit(jax.grad(f))(w), jax.grad(ref)(w))
    close(jax.jvp(f, (w,), (2.,)), jax.jvp(ref, (w,), (2.,)))
  ws = jnp.array([0.5, 1., 2.])
  close(jax.vmap(f)(ws), jax.vmap(ref)(ws))
  close(jax.jit(jax.vmap(jax.grad(f)))(ws), jax.vmap(jax.grad(ref))(ws))


def test_converted_function_and_concrete_captures():
  c = jnp.array(3.)  # concrete: stays inside, not hoisted

  def traced(w):
    converted, consts = closure_convert(lambda x: x * w + c, 1.)
    assert isinstance(converted, ClosureConverted) and len(consts) == 1
    assert "lambda" in repr(converted)
    return converted(2., consts)
  close(jax.jit(traced)(5.), 13.)
  with pytest.raises(TypeError, match="traced for arguments with structure"):
    jax.jit(lambda w: closure_convert(lambda x: x * w, 1.)[0]((1., 2.), [w]))(
        1.)


def test_what_cannot_be_converted_is_named():
  def captures_a_ref(w):
    r = jax.new_ref(w)
    return closure_convert(lambda x: x * r[...], 1.)
  with pytest.raises(TypeError, match=r"captures a traced value of type "
                     r"Ref\{float32\[2\]\}, which is not an array"):
    jax.jit(captures_a_ref)(jnp.ones(2))
  with pytest.raises(TypeError, match=r"hijax.implicit.fixed_point: `f`: "
                     r"closure_convert: .* captures a traced value of type Ref"):
    jax.jit(lambda w: fixed_point(
        lambda x, p, r=jax.new_ref(w): 0.5 * x + r[...], jnp.zeros(2), ()))(
            jnp.ones(2))

  def has_effects(w):
    return closure_convert(lambda x: x * jax.new_ref(w)[...], 1.)
  with pytest.raises(TypeError, match=r"has side effects \(InternalMutable"
                     r"ArrayEffect\) and captures traced values"):
    jax.jit(has_effects)(jnp.ones(2))


# --- hijax.implicit -----------------------------------------------------------

def sqrt_by_fixed_point(p, w):
  """x = (x + p w / x) / 2, so x = sqrt(p w); w is captured, p a param."""
  return fixed_point(lambda x, p: 0.5 * (x + p * w / x), jnp.ones_like(w), p)


def test_fixed_point_differentiates_a_captured_value():
  p, w = 2.0, 3.0
  close(sqrt_by_fixed_point(p, w), np.sqrt(6.))
  # d/dw sqrt(p w) = sqrt(p / w) / 2; d2/dw2 = -sqrt(p) w^(-3/2) / 4
  close(jax.grad(sqrt_by_fixed_point, 1)(p, w), np.sqrt(p / w) / 2)
  close(jax.jit(jax.grad(sqrt_by_fixed_point, (0, 1)))(p, w),
        (np.sqrt(w / p) / 2, np.sqrt(p / w) / 2))
  close(jax.jvp(lambda w: sqrt_by_fixed_point(p, w), (w,), (2.,))[1],
        np.sqrt(p / w))
  close(jax.grad(jax.grad(sqrt_by_fixed_point, 1), 1)(p, w),
        -np.sqrt(p) * w ** -1.5 / 4, rtol=1e-4)


def test_fixed_point_batches_a_captured_value():
  ws = jnp.array([1., 4., 9.])
  close(jax.vmap(lambda w: sqrt_by_fixed_point(1., w))(ws), jnp.sqrt(ws))
  close(jax.jit(jax.vmap(jax.grad(lambda w: sqrt_by_fixed_point(1., w))))(ws),
        0.5 / jnp.sqrt(ws))
  w = jnp.array([1., 4.])  # a captured array, not a scalar
  close(jax.jacfwd(lambda w: sqrt_by_fixed_point(1., w))(w),
        jnp.diag(0.5 / jnp.sqrt(w)))


def test_root_and_linear_solve_differentiate_captured_values():
  # root of x^3 - a: x = a^(1/3); linear solve of a x = b: x = b / a
  cube_root = lambda a: root(lambda x, p: x ** 3 - a, 1.0, ())
  close(jax.grad(cube_root)(8.), 1. / 12.)
  solve = lambda a, b: linear_solve(lambda x, p: a * x, b, ())
  close(jax.jit(jax.grad(solve, (0, 1)))(2., 3.), (-3. / 4., 0.5))
