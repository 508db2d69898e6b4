"""Code in the style of JAX's earlier development API (mid-2026: jax 0.10.2 to
0.11.1, read from those wheels), run on hijax with only the import changed.

The classes below are written as a JAX 301 page of that time would write
them: they subclass ``VJPHiPrimitive``, log from the backward pass with the
``vjp_bwd_retval_logs = True`` flag, batch with ``batch_dim_rule``, eliminate
dead code with ``dce(used_outs)``, rematerialize with a ``remat`` rule
returning ``(out, rem)``, validate with ``check`` and derive rules from the
named pairs. The one line that differs from that page is the import:
``from jax.experimental.hijax import ...`` reads ``from hijax import ...``.
What did change since: a key logged twice now raises instead of keeping the
later value (the last test).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import partial_eval as pe

from hijax import VJPHiPrimitive, linearize_from_jvp, vjp_from_jvp  # the changed line

X = jnp.linspace(0.2, 1.4, 4, dtype=jnp.float32)


# --- the page's classes ----------------------------------------------------------

class Softplus(VJPHiPrimitive):
  """log(1 + e^x), whose backward pass logs the sigmoid it used."""

  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = x_aval
    self.params = {}
    super().__init__()

  def check(self, x_aval):
    if x_aval.dtype != jnp.float32:
      raise TypeError(f"Softplus takes float32, got {x_aval.dtype}")

  def expand(self, x):
    return jnp.logaddexp(x, 0.)

  def vjp_fwd(self, nzs_in, x):
    return self(x), jax.nn.sigmoid(x)

  vjp_bwd_retval_logs = True

  def vjp_bwd_retval(self, s, g):
    return (g * s,), {"softplus sigmoid": s}

  def batch_dim_rule(self, axis_data, dims):
    return dims[0]


def softplus(x):
  return Softplus(jax.typeof(x))(x)


class SinCos(VJPHiPrimitive):
  """(sin x, cos x); its dce rule keeps only the output that is used."""

  def __init__(self, x_aval, keep=(True, True)):
    self.in_avals = (x_aval,)
    self.out_aval = tuple(x_aval for k in keep if k)
    self.params = dict(keep=keep)
    super().__init__()

  def expand(self, x):
    return tuple(f(x) for f, k in zip((jnp.sin, jnp.cos), self.keep) if k)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    fs = [(jnp.cos(x) * t), (-jnp.sin(x) * t)]
    return self(x), tuple(f for f, k in zip(fs, self.keep) if k)

  lin, linearized = linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = vjp_from_jvp

  def dce(self, used_outs):
    if all(used_outs):
      return True, True, self
    if not any(used_outs):
      return False, False, None
    keep = tuple(u for u in used_outs)
    return True, keep, SinCos(self.in_avals[0], keep)


class Exp(VJPHiPrimitive):
  """exp, whose remat rule recomputes it in full, the 0.11 way."""

  remats = []

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return jnp.exp(x)

  def vjp_fwd(self, nzs_in, x):
    y = self(x)
    return y, y

  def vjp_bwd_retval(self, y, g):
    return (g * y,)

  def remat(self, _trace, x):
    Exp.remats.append(x.shape)
    return self(x), self  # the output, and how to recompute it: rem(*args)


# --- the page's cells, as tests ----------------------------------------------------

def test_softplus_gradient_and_its_logs():
  _, f_vjp = jax.vjp(lambda x: softplus(x).sum(), X)
  (grad,), logs = f_vjp.with_logs(1.)
  np.testing.assert_allclose(grad, jax.nn.sigmoid(X), rtol=1e-6)
  np.testing.assert_allclose(logs["softplus sigmoid"], jax.nn.sigmoid(X),
                             rtol=1e-6)
  np.testing.assert_allclose(softplus(100.), 100.)


def test_softplus_check_and_batching():
  with pytest.raises(TypeError, match="Softplus takes float32, got int32"):
    Softplus(jax.typeof(jnp.arange(3)))
  xs = jnp.stack([X, -X, 2 * X])
  np.testing.assert_allclose(jax.vmap(softplus, in_axes=1)(xs),
                             jnp.logaddexp(xs.T, 0.), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda xs: jax.vmap(softplus)(xs).sum())(xs),
                             jax.nn.sigmoid(xs), rtol=1e-6)


def test_sincos_derived_rules_and_dce():
  f = lambda x: SinCos(jax.typeof(x))(x)[1]
  np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(X), -jnp.sin(X),
                             rtol=1e-6)
  _, f_lin = jax.linearize(f, X)
  np.testing.assert_allclose(f_lin(jnp.ones_like(X)), -jnp.sin(X), rtol=1e-6)
  jaxpr = jax.make_jaxpr(f)(X).jaxpr
  (eqn,) = pe.dce_jaxpr(jaxpr, [True])[0].eqns
  assert eqn.params["_prim"].keep == (False, True)
  np.testing.assert_allclose(jax.jit(f)(X), jnp.cos(X), rtol=1e-6)


def test_exp_remat_rule_under_checkpoint():
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", True)
  try:
    Exp.remats.clear()
    f = jax.checkpoint(lambda x: jnp.sum(Exp(jax.typeof(x))(jnp.sin(x))))
    np.testing.assert_allclose(jax.grad(f)(X), jnp.exp(jnp.sin(X)) * jnp.cos(X),
                               rtol=1e-6)
    assert Exp.remats == [X.shape]
  finally:
    jax.config.update("jax_remat3", previous)


def test_a_key_logged_twice_now_raises():
  # In the earlier API the second 'softplus sigmoid' silently replaced the
  # first; from jax 0.11.2 (and on hijax) it is an error: give each logging
  # site its own key.
  _, f_vjp = jax.vjp(lambda x: softplus(softplus(x)).sum(), X)
  with pytest.raises(ValueError, match="'softplus sigmoid'"):
    f_vjp.with_logs(1.)
