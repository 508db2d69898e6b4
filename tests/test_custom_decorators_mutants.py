"""Behaviours of `hijax.custom_vjp` / `hijax.custom_jvp` that a one-token
change of their tracing, output checks or batching (``tools/mutants.py``
over ``hijax/_decorators/``) once changed without any test noticing; each
asserted here against plain JAX, a closed form, or the error a user meets.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
