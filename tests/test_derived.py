"""Rules derived from other rules, and the circularity error."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import (HiPrim, Zero, instantiate_zeros, jvp_from_lin,
                   linearize_from_jvp, vjp_from_jvp, vjp_from_lin)


class Base(HiPrim):
  def __init__(self, x_aval, y_aval):
    self.in_avals = (x_aval, y_aval)
    self.out_aval = x_aval
    self.params = {}
    super().__init__()

  def expand(self, x, y):
    return jnp.sin(x) * y


class FromJvp(Base):
  seen = []

  def jvp(self, primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    FromJvp.seen.append(tuple(isinstance(t, Zero) for t in tangents))
    return self(x, y), (jnp.cos(x) * y * instantiate_zeros(dx)
                        + jnp.sin(x) * instantiate_zeros(dy))


class LinFromJvp(FromJvp):
  lin, linearized = linearize_from_jvp


class VjpFromLinFromJvp(LinFromJvp):
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


class VjpFromJvp(FromJvp):
  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


class HandLin(Base):
  def lin(self, nzs_in, x, y):
    return self(x, y), (jnp.cos(x) * y, jnp.sin(x))

  def linearized(self, res, dx, dy):
    a, b = res
    return a * instantiate_zeros(dx) + b * instantiate_zeros(dy)

  jvp = jvp_from_lin
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


def ref(x, y):
  return jnp.sin(x) * y


def bind(cls):
  return lambda x, y: cls(jax.typeof(x), jax.typeof(y))(x, y)


ALL = [VjpFromLinFromJvp, VjpFromJvp, HandLin]


@pytest.mark.parametrize("cls", ALL)
def test_first_and_second_order_match_plain_jax(cls):
  f = bind(cls)
  for argnums in (0, 1, (0, 1)):
    np.testing.assert_allclose(jax.grad(f, argnums)(0.4, 1.7),
                               jax.grad(ref, argnums)(0.4, 1.7), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(jax.grad(f))(0.4, 1.7),
                             jax.grad(jax.grad(ref))(0.4, 1.7), rtol=1e-5)
  np.testing.assert_allclose(jax.jit(jax.grad(f))(0.4, 1.7),
                             jax.grad(ref)(0.4, 1.7), rtol=1e-6)
  _, t = jax.jvp(f, (0.4, 1.7), (1., -2.))
  np.testing.assert_allclose(t, jax.jvp(ref, (0.4, 1.7), (1., -2.))[1], rtol=1e-6)


@pytest.mark.parametrize("cls", [LinFromJvp, HandLin])
def test_linearize(cls):
  y, f_lin = jax.linearize(bind(cls), 0.4, 1.7)
  _, ref_lin = jax.linearize(ref, 0.4, 1.7)
  np.testing.assert_allclose(f_lin(1., 2.), ref_lin(1., 2.), rtol=1e-6)


def test_linearize_from_jvp_sees_symbolic_zeros():
  FromJvp.seen.clear()
  jax.grad(bind(VjpFromLinFromJvp), 1)(0.4, 1.7)
  assert FromJvp.seen == [(True, False)]


def test_vjp_from_jvp_saves_only_primals():
  x, y = jnp.full(2, 0.4), jnp.full(2, 1.7)
  _, f_vjp = jax.vjp(bind(VjpFromJvp), x, y)
  assert f_vjp.opaque_residuals == []
  assert all(a is b for a, b in zip(f_vjp.args_res, (x, y)))
  _, f_vjp = jax.vjp(bind(VjpFromLinFromJvp), x, y)
  np.testing.assert_allclose(f_vjp.opaque_residuals,
                             [jnp.cos(x) * y, jnp.sin(x)], rtol=1e-6)


class NaiveJvp(Base):
  """A jvp rule written for array tangents, as most are."""
  calls = []

  def jvp(self, primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    NaiveJvp.calls.append(1)
    return self(x, y), jnp.cos(x) * y * dx + jnp.sin(x) * dy

  lin, linearized = linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


class NaiveVjpFromJvp(NaiveJvp):
  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


@pytest.mark.parametrize("cls", [NaiveJvp, NaiveVjpFromJvp])
def test_derived_rules_do_not_run_where_no_tangent_flows_in(cls):
  """The primitive applied to constants inside grad or linearize of
  something else: JAX's own module runs the derived rule there, which calls
  jvp with nothing but Zero tangents (a TypeError in a rule written for
  arrays); a derived rule has nothing to compute, so hijax applies the
  primitive and its tangent is zero."""
  x, y = jnp.array([0.4, -1.]), jnp.array([1.7, 2.])
  f = lambda s: (bind(cls)(x, y) * s).sum()
  want = jnp.sum(jnp.sin(x) * y)
  NaiveJvp.calls.clear()
  np.testing.assert_allclose(jax.grad(f)(2.), want, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(f))(2.), want, rtol=1e-6)
  _, f_lin = jax.linearize(f, 2.)
  np.testing.assert_allclose(f_lin(3.), 3 * want, rtol=1e-6)
  assert NaiveJvp.calls == []
  # with tangents flowing in, the rule runs as before
  gx, gy = jax.grad(lambda x, y: bind(cls)(x, y).sum(), (0, 1))(x, y)
  np.testing.assert_allclose(gx, jnp.cos(x) * y, rtol=1e-6)
  np.testing.assert_allclose(gy, jnp.sin(x), rtol=1e-6)
  assert NaiveJvp.calls


def test_deriving_in_a_circle_is_an_error():
  with pytest.raises(TypeError, match=r"Circular sets both `jvp = jvp_from_lin` "
                     r"and `lin, linearized = linearize_from_jvp`"):
    class Circular(Base):
      jvp = jvp_from_lin
      lin, linearized = linearize_from_jvp


def test_pairs_must_be_unpacked():
  with pytest.raises(TypeError, match=r"unpack it in the class body, "
                     r"`vjp_fwd, vjp_bwd_retval = vjp_from_lin`"):
    vjp_from_lin(None, None)
  with pytest.raises(TypeError, match=r"`lin, linearized = linearize_from_jvp`"):
    linearize_from_jvp(None)
