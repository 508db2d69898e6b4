"""`jvp = jvp_from_vjp` traces, checks and transposes the backward rule once
per primitive, flags and residual types: an eager `jax.jvp` called again
compiles and traces nothing, and residuals that are not arrays (Python
numbers, flags) key the transposed rule by value."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import HiPrim, jvp_from_vjp

from compile_count import Compiles


class SinTimesY(HiPrim):
  """sin(x) * y with reverse-mode rules only."""

  def __init__(self, x_aval, y_aval):
    self.in_avals, self.out_aval, self.params = (x_aval, y_aval), x_aval, {}
    super().__init__()

  def expand(self, x, y):
    return jnp.sin(x) * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (jnp.cos(x), jnp.sin(x), y)

  def vjp_bwd_retval(self, res, g):
    cos_x, sin_x, y = res
    return cos_x * g * y, sin_x * g

  jvp = jvp_from_vjp


def sin_times_y(x, y):
  return SinTimesY(jax.typeof(x), jax.typeof(y))(x, y)


def test_an_eager_jvp_called_again_traces_and_compiles_nothing():
  x, y = jnp.linspace(0., 1., 7), jnp.linspace(1., 2., 7)
  t = (jnp.ones(7), jnp.full(7, 0.5))
  jax.jvp(sin_times_y, (x, y), t)
  for shift in (0.5, 1.5):
    xs = jax.block_until_ready(x + shift)
    with Compiles() as c:
      out, tan = jax.block_until_ready(jax.jvp(sin_times_y, (xs, y), t))
    assert c.count == 0
    np.testing.assert_allclose(tan, jnp.cos(xs) * y + jnp.sin(xs) * 0.5,
                               rtol=1e-6)
  # a tangent in x alone is another program (other flags), also kept
  jax.jvp(lambda x: sin_times_y(x, y), (x,), (t[0],))
  with Compiles() as c:
    _, tan = jax.jvp(lambda x: sin_times_y(x, y), (x,), (t[0],))
  assert c.count == 0
  np.testing.assert_allclose(tan, jnp.cos(x) * y, rtol=1e-6)


class TwiceSinTimesY(SinTimesY):
  """The same structure and types as SinTimesY, another backward rule."""

  def expand(self, x, y):
    return 2 * jnp.sin(x) * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (jnp.cos(x), jnp.sin(x), y)

  def vjp_bwd_retval(self, res, g):
    cos_x, sin_x, y = res
    return 2 * cos_x * g * y, 2 * sin_x * g


def test_the_transposed_rule_is_kept_per_class_and_types():
  """Each class and each input type has its own transposed rule, kept: a
  shape seen before compiles nothing, and a class with the same structure
  never receives another class's rule."""
  def jvp(cls, n):
    x, y = jnp.linspace(0., 1., n), jnp.linspace(1., 2., n)
    f = lambda x, y: cls(jax.typeof(x), jax.typeof(y))(x, y)
    tan = jax.jvp(f, (x, y), (jnp.ones(n), jnp.ones(n)))[1]
    scale = 2. if cls is TwiceSinTimesY else 1.
    np.testing.assert_allclose(tan, scale * (jnp.cos(x) * y + jnp.sin(x)),
                               rtol=1e-6)

  for cls in (SinTimesY, TwiceSinTimesY):
    for n in (4, 6):
      jvp(cls, n)
  for cls in (SinTimesY, TwiceSinTimesY):
    for n in (4, 6):
      with Compiles() as c:
        jvp(cls, n)
      assert c.count == 0, (cls.__name__, n, c.count)


class SignedScale(HiPrim):
  """x * s with s = +-2 read eagerly from x: a Python float residual."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return x * jnp.where(jnp.sum(x) > 0, 2., -2.)

  def vjp_fwd(self, nzs_in, x):
    scale = 2.0 if float(jnp.sum(x)) > 0 else -2.0
    return self(x), scale

  def vjp_bwd_retval(self, scale, g):
    return (g * scale,)

  jvp = jvp_from_vjp


def test_python_residuals_key_the_transposed_rule_by_value():
  f = lambda x: SignedScale(jax.typeof(x))(x)
  t = jnp.ones(3)
  for sign in (1., -1., 1.):
    _, tan = jax.jvp(f, (sign * jnp.ones(3),), (t,))
    np.testing.assert_allclose(tan, 2 * sign * t)


class Clipped(HiPrim):
  """A backward rule that is not linear in g."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return x

  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, res, g):
    return (jnp.clip(g, -1., 1.),)

  jvp = jvp_from_vjp


def test_a_nonlinear_rule_is_refused_at_every_call():
  f = lambda x: Clipped(jax.typeof(x))(x)
  for _ in range(2):
    with pytest.raises(TypeError, match="Clipped.vjp_bwd_retval is not linear"):
      jax.jvp(f, (jnp.ones(3),), (jnp.ones(3),))


def test_under_jit_the_transposed_rule_is_traced_in():
  """Under jit the kept jaxpr's equations are traced into the program (no
  nested compiled call), and the values agree with eager ones."""
  x, y = jnp.linspace(0., 1., 5), jnp.linspace(1., 2., 5)
  t = (jnp.ones(5), jnp.ones(5))
  jvp = lambda x, y: jax.jvp(sin_times_y, (x, y), t)[1]
  jaxpr = jax.make_jaxpr(jvp)(x, y)
  assert not any(e.primitive.name in ("jit", "pjit") for e in jaxpr.eqns)
  np.testing.assert_allclose(jax.jit(jvp)(x, y), jvp(x, y), rtol=1e-6)
  np.testing.assert_allclose(jvp(x, y), jnp.cos(x) * y + jnp.sin(x),
                             rtol=1e-6)
