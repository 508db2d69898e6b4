"""custom_remat's static arguments (as jax 0.11.2's jax.custom_remat has) and
the inspectable counterpart of JAX's save-and-offload name policy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import name_p, saved_residuals
from jax.ad_checkpoint import checkpoint_name

import hijax
from hijax import (SaveAndOffloadOnlyTheseNames, custom_remat,
                   save_and_offload_only_these_names)

X = jnp.linspace(0.1, 1.3, 4, dtype=jnp.float32)
cp = jax.checkpoint_policies


@pytest.fixture(autouse=True)
def remat3():
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", True)
  yield
  jax.config.update("jax_remat3", previous)


# --- static arguments ---------------------------------------------------------------

def sin_n(x, n):
  """sin applied ``n`` times (``n`` a Python int: it must be static)."""
  for _ in range(n):
    x = jnp.sin(x)
  return x


def sin_n_rules(log):
  def fwd(policy, x, n):
    log.append(("fwd", n))
    return sin_n(x, n), None

  def rem(res, x, n):
    log.append(("rem", n))
    cosines = []
    for _ in range(n):
      cosines.append(jnp.cos(x))
      x = jnp.sin(x)
    return x, tuple(cosines)

  def bwd(cosines, g):
    for c in reversed(cosines):
      g = g * c
    return g, None  # no cotangent for the static n
  return fwd, rem, bwd


def test_static_positional_parameter_passed_by_keyword():
  log = []
  h = custom_remat(sin_n, *sin_n_rules(log), static_argnames="n")
  ref = jax.grad(lambda x: sin_n(x, 2).sum())(X)
  for call in (lambda x: h(x, n=2), lambda x: h(x, 2), lambda x: h(x=x, n=2)):
    np.testing.assert_allclose(jax.grad(jax.checkpoint(
        lambda x: call(x).sum()))(X), ref, rtol=1e-6)
  assert {e for e in log} == {("fwd", 2), ("rem", 2)}


def test_a_traced_argument_passed_by_keyword_is_positional():
  def f(x, y):
    return jnp.sin(x) * y

  h = custom_remat(f, lambda p, x, y: (f(x, y), None),
                   lambda r, x, y: (f(x, y), (jnp.cos(x), jnp.sin(x), y)),
                   lambda r, g: (g * r[0] * r[2], g * r[1]))
  gx, gy = jax.grad(lambda x, y: h(x, y=y).sum(), (0, 1))(X, 2 * X)
  np.testing.assert_allclose(gx, 2 * X * jnp.cos(X), rtol=1e-6)
  np.testing.assert_allclose(gy, jnp.sin(X), rtol=1e-6)


@pytest.mark.parametrize("static", [dict(static_argnums=1),
                                    dict(static_argnums=-1),
                                    dict(static_argnums=(1,)),
                                    dict(static_argnames="n"),
                                    dict(static_argnames=["n"])])
def test_static_argnums_and_argnames(static):
  log = []
  h = custom_remat(sin_n, *sin_n_rules(log), **static)
  for n in (1, 3):
    ref = jax.grad(lambda x: sin_n(x, n).sum())(X)
    np.testing.assert_allclose(h(X, n), sin_n(X, n), rtol=1e-6)
    for wrap in (lambda f: f, jax.checkpoint, jax.jit):
      np.testing.assert_allclose(
          jax.grad(wrap(lambda x: h(x, n).sum()))(X), ref, rtol=1e-6)
  assert ("fwd", 3) in log and ("rem", 3) in log
  jaxpr = jax.make_jaxpr(lambda x: h(x, 3))(X)
  (eqn,) = jaxpr.jaxpr.eqns
  assert len(eqn.invars) == 1  # n is not an argument of the primitive
  assert "static={1: 3}" in str(jaxpr)


def test_static_keyword_arguments():
  def f(x, *, mode):
    return {"sin": jnp.sin, "cos": jnp.cos}[mode](x)

  def fwd(policy, x, *, mode):
    return f(x, mode=mode), None

  def rem(res, x, *, mode):
    d = jnp.cos(x) if mode == "sin" else -jnp.sin(x)
    return f(x, mode=mode), d

  h = custom_remat(f, fwd, rem, lambda d, g: (d * g,), static_argnames="mode")
  for mode, df in (("sin", jnp.cos), ("cos", lambda x: -jnp.sin(x))):
    g = jax.grad(jax.checkpoint(lambda x: h(x, mode=mode).sum()))(X)
    np.testing.assert_allclose(g, df(X), rtol=1e-6)


def test_static_argument_errors():
  h = custom_remat(sin_n, *sin_n_rules([]), static_argnums=1)
  with pytest.raises(TypeError, match=r"custom_remat function sin_n: static "
                     r"arguments must be hashable .*\['list'\]"):
    h(X, [1])
  with pytest.raises(TypeError, match=r"has static_argnums 1, but was called "
                     r"with 1 positional argument"):
    h(X)
  keyword_only = custom_remat(lambda x, *, n: sin_n(x, n), *sin_n_rules([]))
  with pytest.raises(TypeError, match=r"n is a keyword argument: name it in "
                     "static_argnames if it is static"):
    keyword_only(X, n=2)
  fwd, rem, _ = sin_n_rules([])
  bad = custom_remat(sin_n, fwd, rem, lambda cs, g: (g * cs[0], g),
                     static_argnums=1)
  with pytest.raises(TypeError, match=r"returned a cotangent for argument 1 of "
                     r"sin_n, which is static: return None for it"):
    jax.grad(lambda x: bad(x, 1).sum())(X)
  with pytest.raises(TypeError, match="static_argnums must be ints"):
    custom_remat(sin_n, *sin_n_rules([]), static_argnums="n")


def test_same_values_as_jax_custom_remat_where_jax_has_it():
  if not hasattr(jax, "custom_remat"):
    pytest.skip("the installed JAX has no jax.custom_remat")
  def fwd(policy, x):
    return jnp.sin(x), None

  def rem(res, x):
    return jnp.sin(x), jnp.cos(x)

  def f(x):
    return jnp.sin(x)
  ours = custom_remat(f, fwd, rem, lambda c, g: (g * c,))
  theirs = jax.custom_remat(f, fwd, rem, lambda c, g: (g * c,))  # pyright: ignore[reportAttributeAccessIssue]
  # (jax 0.11.2's own raises NotImplementedError outside jax.checkpoint, or
  # under it with everything_saveable: only its rematerializing path exists.)
  for policy in (None, cp.nothing_saveable, cp.save_only_these_names("s")):
    grads = [jax.grad(jax.checkpoint(lambda x: jnp.sum(h(h(x)) ** 2),
                                     policy=policy))(X)
             for h in (ours, theirs)]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)


# --- the save-and-offload policy --------------------------------------------------------

def named(x):
  a = checkpoint_name(jnp.sin(x), "a")
  b = checkpoint_name(jnp.cos(a), "b")
  return jnp.sum(jnp.sin(b) ** 2)


OFFLOAD = dict(names_which_can_be_saved=["a"], names_which_can_be_offloaded=["b"],
               offload_src="device", offload_dst="pinned_host")


def _residuals(f):
  return sorted((aval.str_short(), desc.split(" from ")[0])
                for aval, desc in saved_residuals(f, X))


@pytest.mark.parametrize("use_remat3", [True, False])
def test_offload_policy_saves_and_offloads_what_jax_policy_does(use_remat3):
  jax.config.update("jax_remat3", use_remat3)
  ours = save_and_offload_only_these_names(**OFFLOAD)
  theirs = cp.save_and_offload_only_these_names(**OFFLOAD)
  mine = _residuals(jax.checkpoint(named, policy=ours))
  assert mine == _residuals(jax.checkpoint(named, policy=theirs))
  # On a CPU "pinned_host" is the same RAM; the value is copied there all the same.
  assert ("float32[4]", "named 'a'") in mine
  assert any(s.startswith("float32<host>") for s, _ in mine)
  for f in (jax.grad(jax.checkpoint(named, policy=ours)),
            jax.jit(jax.grad(jax.checkpoint(named, policy=ours)))):
    np.testing.assert_allclose(f(X), jax.grad(named)(X), rtol=1e-6)


def test_offload_policy_is_an_inspectable_record():
  policy = save_and_offload_only_these_names(**OFFLOAD)
  assert isinstance(policy, SaveAndOffloadOnlyTheseNames)
  assert policy.names_which_can_be_saved == frozenset({"a"})
  assert policy.names_which_can_be_offloaded == frozenset({"b"})
  assert (policy.offload_src, policy.offload_dst) == ("device", "pinned_host")
  theirs = cp.save_and_offload_only_these_names(**OFFLOAD)
  for name in ("a", "b", "c"):
    assert policy(name_p, name=name) == theirs(name_p, name=name)
  assert policy(jax.lax.sin_p) == theirs(jax.lax.sin_p)
  assert hijax.remat.as_inspectable(theirs) == policy
  with pytest.raises(ValueError, match=r"either saved or offloaded, not both: "
                     r"\['a'\]"):
    save_and_offload_only_these_names(**{**OFFLOAD,
                                         "names_which_can_be_offloaded": "ab"})


def test_custom_remat_forward_rule_reads_the_offload_policy():
  seen = []

  def fwd(policy, x):
    seen.append(policy)
    keep = isinstance(policy, SaveAndOffloadOnlyTheseNames) and (
        "cos" in policy.names_which_can_be_saved
        | policy.names_which_can_be_offloaded)
    return jnp.sin(x), jnp.cos(x) if keep else None

  def rem(res, x):
    return jnp.sin(x), jnp.cos(x) if res is None else res

  h = custom_remat(jnp.sin, fwd, rem, lambda c, g: (g * c,))
  policy = cp.save_and_offload_only_these_names(
      names_which_can_be_saved=[], names_which_can_be_offloaded=["cos"],
      offload_src="device", offload_dst="pinned_host")
  g = jax.grad(jax.checkpoint(lambda x: jnp.sum(h(x) ** 2), policy=policy))(X)
  np.testing.assert_allclose(g, 2 * jnp.sin(X) * jnp.cos(X), rtol=1e-6)
  assert seen == [save_and_offload_only_these_names(
      names_which_can_be_saved=[], names_which_can_be_offloaded=["cos"],
      offload_src="device", offload_dst="pinned_host")]
