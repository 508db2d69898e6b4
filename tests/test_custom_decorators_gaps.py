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
