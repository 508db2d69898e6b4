"""Taylor mode (``jax.experimental.jet``) on hijax primitives.

jet has no way to apply a primitive's first-order rules, so it would
differentiate `HiPrim.expand` instead, and the series could disagree with
the primitive's own ``jvp``: a straight-through rule, a safe rule at a
singularity. A primitive therefore refuses jet unless its class says that
``expand``'s derivatives are the ones wanted (``jet_from_expand = True``).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.jet import jet

from hijax import vjp_from_jvp
import zoo
from unary_prim import UnaryPrim, unary


class RoundStraightThrough(UnaryPrim):
  """round(x), with the straight-through derivative 1 (not round's 0)."""

  def expand(self, x):
    return jnp.round(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), t

  vjp_fwd, vjp_bwd_retval = vjp_from_jvp

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]


class Sin(zoo.SinDerived):
  """sin(x), whose rules are expand's derivatives: jet may expand it."""
  jet_from_expand = True


ste = unary(RoundStraightThrough)
sin = unary(Sin)


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit, jax.vmap],
                         ids=["eager", "jit", "vmap"])
def test_jet_refuses_a_primitive_whose_rules_it_cannot_use(wrap):
  x = jnp.array([1.3, -0.4])
  assert np.allclose(jax.jvp(ste, (x,), (jnp.ones(2),))[1], 1.0)  # its rule
  with pytest.raises(TypeError) as info:
    jet(wrap(ste), (x,), ((jnp.ones(2), jnp.zeros(2)),))
  msg = str(info.value)
  for part in ["RoundStraightThrough", "jax.experimental.jet",
               "RoundStraightThrough.expand", "RoundStraightThrough.jvp",
               "jet_from_expand = True", "jax.jvp"]:
    assert part in msg, (part, msg)


def test_jet_from_expand_gives_the_taylor_coefficients_of_expand():
  x = 0.7
  out, series = jet(sin, (x,), ((1.0, 0.0, 0.0),))
  want = [np.cos(x), -np.sin(x), -np.cos(x)]  # d/dx, d2/dx2, d3/dx3
  np.testing.assert_allclose(out, np.sin(x), rtol=1e-6)
  np.testing.assert_allclose(series, want, rtol=1e-5)
  # the same as nested jvp through the primitive's own rule
  d1 = lambda x: jax.jvp(sin, (x,), (1.0,))[1]
  d2 = lambda x: jax.jvp(d1, (x,), (1.0,))[1]
  np.testing.assert_allclose(series[:2], [d1(x), d2(x)], rtol=1e-5)
  _, series_jit = jet(jax.jit(sin), (x,), ((1.0, 0.0, 0.0),))
  np.testing.assert_allclose(series_jit, want, rtol=1e-5)


def test_eager_calls_and_other_transformations_are_unchanged():
  x = jnp.array([1.3, -0.4])
  np.testing.assert_allclose(ste(x), [1.0, -0.0])
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(ste(x)))(x), 1.0)
  np.testing.assert_allclose(jax.jit(jax.vmap(ste))(x), [1.0, -0.0])
