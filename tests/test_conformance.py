"""Where JAX's transformations meet hijax: behaviour JAX's own hijax has too.

One section per item of issue 17; each test is a small repro that failed (or
silently computed something else) before the fix.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name

import hijax
from hijax import HiPrim, ShapedArray

cp = jax.checkpoint_policies


@pytest.fixture(params=[False, True], ids=["classic_remat", "remat3"])
def remat3(request):
  """Runs a test with classic remat (JAX's default) and with ``jax_remat3``."""
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", request.param)
  yield request.param
  jax.config.update("jax_remat3", previous)


class Sin(HiPrim):
  """sin, with both a jvp rule and reverse-mode rules."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), jnp.cos(x)

  def vjp_bwd_retval(self, cos_x, g):
    return (cos_x * g,)


def hi_sin(x):
  return Sin(jax.typeof(x))(x)


# --- 1. checkpoint policies, classic remat and jax_remat3 ---------------------------

W = jnp.linspace(-1., 1., 12).reshape(3, 4)
WB = jnp.linspace(0.5, 1.5, 24).reshape(2, 3, 4)


def _layer(sin):
  def f(x):
    y = checkpoint_name(W @ x, "dot")             # a dot without batch dims
    xb = jnp.stack([x, 2 * x])
    yb = jnp.einsum("bij,bj->bi", WB, xb).sum(0)  # a dot with a batch dim
    z = checkpoint_name(sin(y * yb), "sin")
    return jnp.sum(jnp.sin(W.T @ z))
  return f


def _kinds(f, x):
  """What a checkpointed ``f`` saves: shape and kind of each residual, without
  the source location (which differs between the hijax and plain versions)."""
  return sorted((str(aval.str_short()), re.sub(r" from .*", "", desc))
                for aval, desc in saved_residuals(f, x))


POLICIES = {
    "dots_saveable": cp.dots_saveable,
    "checkpoint_dots": cp.checkpoint_dots,
    "dots_with_no_batch_dims_saveable": cp.dots_with_no_batch_dims_saveable,
    "checkpoint_dots_with_no_batch_dims": cp.checkpoint_dots_with_no_batch_dims,
    "save_only_these_names": cp.save_only_these_names("sin"),
    "save_any_names_but_these": cp.save_any_names_but_these("sin"),
    "save_anything_except_these_names": cp.save_anything_except_these_names("sin"),
    "save_from_both_policies": cp.save_from_both_policies(
        cp.dots_with_no_batch_dims_saveable, cp.save_only_these_names("sin")),
    "nothing_saveable": cp.nothing_saveable,
    "everything_saveable": cp.everything_saveable,
    "hijax.save_only_these_names": hijax.save_only_these_names("sin"),
    "hijax.save_any_names_but_these": hijax.save_any_names_but_these("dot"),
}


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_saves_what_it_saves_for_plain_jax(remat3, name):
  policy = POLICIES[name]
  x = jnp.linspace(0.1, 0.9, 4)
  ours = jax.checkpoint(_layer(hi_sin), policy=policy)
  plain = jax.checkpoint(_layer(jnp.sin), policy=policy)
  assert _kinds(ours, x) == _kinds(plain, x)
  np.testing.assert_allclose(jax.grad(ours)(x), jax.grad(plain)(x), rtol=1e-6)


@pytest.mark.parametrize("policy,expected", [
    (cp.dots_saveable, ["output of dot_general"] * 3),
    (cp.dots_with_no_batch_dims_saveable,  # recomputes the batched dot from x
     ["from the argument x"] + ["output of dot_general"] * 2),
    (cp.save_only_these_names("sin"), ["from the argument x", "named 'sin'"]),
    (hijax.save_only_these_names("sin"), ["from the argument x", "named 'sin'"]),
    (cp.save_any_names_but_these("sin"), ["from the argument x", "named 'dot'"]),
])
def test_what_a_policy_saves_around_a_hiprim(remat3, policy, expected):
  x = jnp.linspace(0.1, 0.9, 4)
  kinds = sorted(k for _, k in _kinds(
      jax.checkpoint(_layer(hi_sin), policy=policy), x) if k != "from a constant")
  assert kinds == expected


def test_a_policy_sees_the_hiprim_and_its_params():
  seen = []

  def policy(prim, *avals, **params):
    seen.append((prim.name, avals, sorted(params)))
    return False

  jax.grad(jax.checkpoint(lambda x: hi_sin(x).sum(), policy=policy))(
      jnp.ones(3))
  assert ("Sin", (jax.typeof(jnp.ones(3)),), ["_prim"]) in seen
