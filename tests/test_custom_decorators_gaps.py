"""Behaviours of JAX's decorators that hijax's once lacked, found by running
JAX's own tests/custom_api_test.py with hijax's decorators
(tools/jax_custom_api.py), each tested here in our own code against JAX's
decorators or closed forms: ``jax_disable_bwd_checks``, pytree nodes that
refuse None, ``optimize_remat``'s primal output, logs under
``jax.checkpoint``, dead-code elimination of unused outputs, collectives
over a ``vmap`` axis name, and eager results of JAX's Python types.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import config

import hijax


def close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=rtol, atol=atol), a, b)


# --- jax_disable_bwd_checks ---------------------------------------------------

def wrong_shaped_cotangent(api):
  @api.custom_vjp
  def foo(x, y):
    return x
  foo.defvjp(lambda x, y: (x, None), lambda _, g: (jnp.zeros(3), jnp.zeros(3)))
  return jax.grad(lambda x, y: foo(x, y).sum(), 1)


@pytest.mark.parametrize("transform", [lambda g: g, jax.jit])
def test_disable_bwd_checks_lets_a_wrong_cotangent_through(transform):
  """As JAX's flag says, it disables all backward-pass checks: the float32[3]
  cotangent for a float32[4] argument is passed on, as JAX passes it."""
  x, y = jnp.ones(3), jnp.ones(4)
  with pytest.raises(ValueError, match="doesn't match expected type"):
    transform(wrong_shaped_cotangent(hijax))(x, y)
  with config.disable_bwd_checks(True):
    ours = transform(wrong_shaped_cotangent(hijax))(x, y)
    theirs = transform(wrong_shaped_cotangent(jax))(x, y)
  assert ours.shape == theirs.shape == (3,)
  close(ours, theirs)


# --- pytree nodes that refuse None -------------------------------------------

class Box(list):
  """A pytree node whose unflatten refuses None children."""


def _unflatten_box(_, children):
  assert all(c is not None for c in children), children
  return Box(children)


jax.tree_util.register_pytree_node(Box, lambda b: (list(b), None),
                                   _unflatten_box)


@pytest.mark.parametrize("api", [jax, hijax], ids=["jax", "hijax"])
@pytest.mark.parametrize("zero", ["none", "box"])
def test_a_pytree_node_refusing_none(api, zero):
  """A Box argument and its cotangent are never rebuilt with None children:
  hijax did so when reading bwd's cotangents (checking them against the
  argument's structure), and when adding them up with None for the zero of
  another argument, both of which Box's unflatten refuses."""
  @api.custom_vjp
  def f(b, y):
    return b[0] * b[1] * y

  def bwd(res, g):
    (b0, b1), y = res
    if zero == "box":  # the Box's cotangent is zero: None for all of it
      return None, g * b0 * b1
    return Box([g * b1 * y, g * b0 * y]), None
  f.defvjp(lambda b, y: (f(b, y), ((b[0], b[1]), y)), bwd)
  b = Box([2., 3.])
  grads = jax.grad(f, argnums=(0, 1))(b, 5.)
  jit_grads = jax.jit(jax.grad(f, argnums=(0, 1)))(b, 5.)
  for g_b, g_y in (grads, jit_grads):
    assert type(g_b) is Box
    close((list(g_b), g_y), ([0., 0.], 6.) if zero == "box"
          else ([15., 10.], 0.))
