"""custom_remat, the inspectable name policies, and the HiPrim remat/dce methods."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name

import hijax
from hijax import (HiPrim, SaveAnyNamesButThese, SaveOnlyTheseNames,
                   custom_remat, save_any_names_but_these, save_only_these_names)

from unary_prim import UnaryPrim

nothing_saveable = jax.checkpoint_policies.nothing_saveable
everything_saveable = jax.checkpoint_policies.everything_saveable
X = jnp.linspace(-1., 2., 5, dtype=jnp.float32)


@pytest.fixture
def remat3():
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", True)
  yield
  jax.config.update("jax_remat3", previous)


@pytest.fixture
def classic_remat():
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", False)
  yield
  jax.config.update("jax_remat3", previous)


def residual_descriptions(f, *args):
  return [desc for _, desc in saved_residuals(f, *args)]


# --- name policies ------------------------------------------------------------------

def test_save_only_these_names_is_an_inspectable_policy():
  policy = save_only_these_names("cos", "sin")
  assert isinstance(policy, SaveOnlyTheseNames)
  assert policy.saveable_names == frozenset({"cos", "sin"})
  assert policy == save_only_these_names("sin", "cos") and hash(policy)
  from jax._src.ad_checkpoint import name_p
  assert policy(name_p, name="cos") and not policy(name_p, name="tan")
  assert not policy(jax.lax.sin_p)
  assert not isinstance(nothing_saveable, SaveOnlyTheseNames)
  assert not isinstance(jax.checkpoint_policies.save_only_these_names("cos"),
                        SaveOnlyTheseNames)
  any_but = save_any_names_but_these("cos")
  assert isinstance(any_but, SaveAnyNamesButThese)
  assert any_but.names_not_saveable == frozenset({"cos"})
  assert any_but(name_p, name="sin") and not any_but(name_p, name="cos")
  with pytest.raises(TypeError, match="strings"):
    save_only_these_names(["cos"])


def _named(x):
  a = checkpoint_name(jnp.sin(x), "a")
  b = checkpoint_name(jnp.cos(a), "b")
  return jnp.sin(b).sum()


@pytest.mark.parametrize("use_remat3", [True, False])
@pytest.mark.parametrize("ours,theirs", [
    (save_only_these_names("a"), jax.checkpoint_policies.save_only_these_names("a")),
    (save_any_names_but_these("a"),
     jax.checkpoint_policies.save_any_names_but_these("a")),
])
def test_name_policies_save_what_jax_policies_save(use_remat3, ours, theirs):
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", use_remat3)
  try:
    mine = residual_descriptions(jax.checkpoint(_named, policy=ours), X)
    jaxs = residual_descriptions(jax.checkpoint(_named, policy=theirs), X)
    assert mine == jaxs and len(mine) == 2
    np.testing.assert_allclose(jax.grad(jax.checkpoint(_named, policy=ours))(X),
                               jax.grad(_named)(X), rtol=1e-6)
  finally:
    jax.config.update("jax_remat3", previous)


# --- custom_remat -------------------------------------------------------------------

def make_sin(log):
  """A sin that saves its cosine only when the policy allows the name 'cos'."""

  def sin_fwd(policy, x):
    log.append(("fwd", policy))
    if isinstance(policy, SaveOnlyTheseNames) and "cos" in policy.saveable_names:
      return jnp.sin(x), jnp.cos(x)
    return jnp.sin(x), None

  def sin_rem(cos, x):
    log.append(("rem", cos is None))
    return jnp.sin(x), jnp.cos(x) if cos is None else cos

  def sin_bwd(cos, g):
    log.append(("bwd",))
    return (g * cos,)

  return custom_remat(jnp.sin, sin_fwd, sin_rem, sin_bwd)


def chain(sin):
  return lambda x: jnp.sum(sin(sin(x)) ** 2)


REFERENCE = jax.grad(chain(jnp.sin))(X)


def test_custom_remat_evaluates_f():
  log = []
  sin = make_sin(log)
  np.testing.assert_array_equal(sin(X), jnp.sin(X))
  np.testing.assert_array_equal(jax.jit(sin)(X), jnp.sin(X))
  assert log == []  # f_fwd, f_rem and f_bwd are for differentiation only
  assert sin.__name__ == "sin"
  jaxpr = jax.make_jaxpr(sin)(X)
  assert "CustomRemat" in str(jaxpr) and len(jaxpr.eqns) == 1


def test_custom_remat_under_plain_grad_runs_fwd_then_rem(remat3):
  log = []
  g = jax.grad(chain(make_sin(log)))(X)
  np.testing.assert_allclose(g, REFERENCE, rtol=1e-6)
  assert [e[0] for e in log] == ["fwd", "rem", "fwd", "rem", "bwd", "bwd"]
  assert log[0][1] is everything_saveable


@pytest.mark.parametrize("policy", [save_only_these_names("cos"), nothing_saveable,
                                    None, everything_saveable])
def test_custom_remat_under_checkpoint_matches_the_chain_rule(remat3, policy):
  log = []
  f = jax.checkpoint(chain(make_sin(log)), policy=policy)
  np.testing.assert_allclose(jax.grad(f)(X), REFERENCE, rtol=1e-6)
  fwd_policies = [e[1] for e in log if e[0] == "fwd"]
  expected = nothing_saveable if policy is None else policy
  assert fwd_policies and all(p is expected or p == expected
                              for p in fwd_policies)
  np.testing.assert_allclose(jax.jit(jax.grad(f))(X), REFERENCE, rtol=1e-6)


def test_the_policy_decides_what_custom_remat_saves(remat3):
  sin = make_sin([])
  saves_cos = residual_descriptions(
      jax.checkpoint(chain(sin), policy=save_only_these_names("cos")), X)
  saves_nothing = residual_descriptions(
      jax.checkpoint(chain(sin), policy=nothing_saveable), X)
  assert saves_nothing == ["from the argument x"]
  assert saves_cos[0] == "from the argument x"
  assert len(saves_cos) == 3 and all("cos" in d for d in saves_cos[1:])


def test_f_rem_runs_on_the_backward_pass_under_checkpoint(remat3):
  # The backward pass of a checkpointed function recomputes what was not
  # saved: with nothing saved, f_rem's cosines are in the backward jaxpr.
  def backward_jaxpr(policy, log):
    _, f_vjp = jax.vjp(jax.checkpoint(chain(make_sin(log)), policy=policy), X)
    return str(jax.make_jaxpr(f_vjp)(jnp.float32(1.)))

  log = []
  bwd = backward_jaxpr(nothing_saveable, log)
  assert bwd.count("= cos ") == 2 and bwd.count("= sin ") == 2
  assert [e for e in log if e[0] == "rem"] == [("rem", True)] * 2
  log.clear()
  bwd = backward_jaxpr(save_only_these_names("cos"), log)
  assert bwd.count("= cos ") == 0 and bwd.count("= sin ") == 2
  assert [e for e in log if e[0] == "rem"] == [("rem", False)] * 2


def test_custom_remat_several_arguments_pytree_residuals_and_none_cotangents(remat3):
  def f(x, y, n):
    return jnp.sin(x) * y

  def f_fwd(policy, x, y, n):
    return f(x, y, n), {"s": jnp.sin(x)}

  def f_rem(res, x, y, n):
    return res["s"] * y, (jnp.cos(x), res["s"], y)

  def f_bwd(res2, g):
    cos, s, y = res2
    return g * y * cos, g * s, None

  h = custom_remat(f, f_fwd, f_rem, f_bwd)
  n = jnp.arange(5)
  ref = jax.grad(lambda x, y: jnp.sum(f(x, y, n) ** 2), (0, 1))(X, 2 * X)
  for wrap in [lambda g: g, jax.checkpoint]:
    got = jax.grad(wrap(lambda x, y: jnp.sum(h(x, y, n) ** 2)), (0, 1))(X, 2 * X)
    for a, b in zip(got, ref):
      np.testing.assert_allclose(a, b, rtol=1e-6)


def test_custom_remat_inside_a_checkpointed_scan(remat3):
  sin = make_sin([])
  def loop(x):
    return jax.lax.scan(lambda c, _: (sin(c), None), x, None, length=3)[0].sum()
  ref = jax.grad(lambda x: jnp.sin(jnp.sin(jnp.sin(x))).sum())(X)
  for policy in [save_only_these_names("cos"), nothing_saveable]:
    g = jax.grad(jax.checkpoint(loop, policy=policy))(X)
    np.testing.assert_allclose(g, ref, rtol=1e-6)


def test_forward_mode_through_custom_remat_is_a_clear_error(remat3):
  sin = make_sin([])
  for attempt in [lambda: jax.jvp(sin, (X,), (X,)),
                  lambda: jax.linearize(sin, X),
                  lambda: jax.jacfwd(sin)(X)]:
    with pytest.raises(TypeError, match="reverse-mode rules only.*forward mode"):
      attempt()


def test_classic_checkpoint_error_points_to_remat3(classic_remat):
  with pytest.raises(TypeError, match="jax_remat3"):
    jax.grad(jax.checkpoint(chain(make_sin([]))))(X)


def test_custom_remat_checks_what_the_rules_return(remat3):
  bad_fwd = custom_remat(jnp.sin, lambda p, x: jnp.sin(x),
                         lambda r, x: (jnp.sin(x), None), lambda r, g: (g,))
  with pytest.raises(TypeError, match=r"must return a pair \(out, res\)"):
    jax.grad(lambda x: bad_fwd(x).sum())(X)
  bad_bwd = custom_remat(jnp.sin, lambda p, x: (jnp.sin(x), None),
                         lambda r, x: (jnp.sin(x), None), lambda r, g: (g, g))
  with pytest.raises(TypeError, match="one cotangent per argument"):
    jax.grad(lambda x: bad_bwd(x).sum())(X)
  with pytest.raises(TypeError, match="callable"):
    custom_remat(jnp.sin, None, None, None)
  with pytest.raises(TypeError, match="positional"):
    make_sin([])(x=X)
  with pytest.raises(NotImplementedError, match="cannot be vmapped"):
    jax.vmap(make_sin([]))(X[:, None])


# --- the HiPrim methods custom_remat is built on --------------------------------------

class Exp(UnaryPrim):
  """exp whose remat method saves its output when the policy allows 'exp'."""

  log: list = []

  def expand(self, x):
    return jnp.exp(x)

  def vjp_fwd(self, nzs_in, x):
    y = self(x)
    return y, y

  def vjp_bwd_retval(self, y, g):
    return (g * y,)

  def remat(self, trace, x):
    Exp.log.append(trace.policy)
    y = self(x)
    if isinstance(trace.policy, SaveOnlyTheseNames) and "exp" in trace.policy.saveable_names:
      return y, y, lambda y, x: ExpGivenOutput(self.in_avals[0])(y, x)
    return y, (), lambda _, x: self(x)


class ExpGivenOutput(HiPrim):
  """exp(x), given y = exp(x) already computed: reuses y, differentiates in x."""

  def __init__(self, aval):
    self.in_avals, self.out_aval, self.params = (aval, aval), aval, {}
    super().__init__()

  def expand(self, y, x):
    return y

  def vjp_fwd(self, nzs_in, y, x):
    return y, y

  def vjp_bwd_retval(self, y, g):
    return None, g * y


def exp(x):
  return Exp(jax.typeof(x))(x)


def test_hiprim_remat_method_receives_the_policy(remat3):
  f = lambda x: jnp.sum(exp(jnp.sin(x)))
  ref = jax.grad(lambda x: jnp.sum(jnp.exp(jnp.sin(x))))(X)
  for policy, n_saved in [(save_only_these_names("exp"), 2), (None, 1)]:
    Exp.log.clear()
    g = jax.grad(jax.checkpoint(f, policy=policy))(X)
    np.testing.assert_allclose(g, ref, rtol=1e-6)
    assert Exp.log and Exp.log[0] is policy
    assert len(saved_residuals(jax.checkpoint(f, policy=policy), X)) == n_saved


def test_default_hiprim_remat_recomputes(remat3):
  class Sq(UnaryPrim):
    def expand(self, x):
      return x * x

    def vjp_fwd(self, nzs_in, x):
      return self(x), x

    def vjp_bwd_retval(self, x, g):
      return (2 * x * g,)

  f = jax.checkpoint(lambda x: jnp.sum(Sq(jax.typeof(x))(jnp.sin(x))))
  np.testing.assert_allclose(jax.grad(f)(X), 2 * jnp.sin(X) * jnp.cos(X),
                             rtol=1e-6)
  assert residual_descriptions(f, X) == ["from the argument x"]


def test_hiprim_dce_method_can_drop_unused_outputs():
  from jax._src.interpreters import partial_eval as pe
  calls = []

  class SinCos(HiPrim):
    def __init__(self, aval, outs=(True, True)):
      self.in_avals = (aval,)
      self.out_aval = tuple(aval for o in outs if o)
      self.params = dict(outs=outs)
      super().__init__()

    def expand(self, x):
      return tuple(f(x) for f, o in zip((jnp.sin, jnp.cos), self.outs) if o)

    def dce(self, used_outs, live_ins):
      calls.append(used_outs)
      if not any(used_outs):
        return False, False, None
      return True, used_outs, SinCos(self.in_avals[0], tuple(used_outs))

  jaxpr = jax.make_jaxpr(lambda x: SinCos(jax.typeof(x))(x)[1])(X).jaxpr
  dced, used_inputs = pe.dce_jaxpr(jaxpr, [True])
  assert calls == [(False, True)]
  (eqn,) = dced.eqns
  assert eqn.params["_prim"].outs == (False, True) and len(eqn.outvars) == 1
  out = jax.jit(lambda x: SinCos(jax.typeof(x))(x)[1])(X)
  np.testing.assert_allclose(out, jnp.cos(X), rtol=1e-6)
