"""The hooks of JAX's HiPrim beyond the rules, on hijax: honoured or refused.

``check``, ``staging``, ``pp_params`` and ``skip_linearization_on_zero_tangents``
do on hijax what they do on ``jax.experimental.hijax`` (each test runs the
same class on both where the installed JAX has the hook); ``physicalize``,
which only JAX's Pallas fuser calls, is refused when the class is made.
Also: the forward-mode error names the fix that fits the class, and hijax's
equality is stricter than JAX's.
"""
from __future__ import annotations

import jax
import jax.experimental.hijax as jax_hijax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

import hijax

X = jnp.linspace(0.1, 1.3, 4, dtype=jnp.float32)
BOTH = [pytest.param(jax_hijax, id="jax"), pytest.param(hijax, id="hijax")]


def prim_class(m, **body):
  """A ``k * sin(x)`` primitive class of module ``m``, with ``body`` added."""
  def __init__(self, x_aval, k=1.):
    self.in_avals, self.out_aval = (x_aval,), x_aval
    self.params = dict(k=k, _note="internal")
    m.HiPrim.__init__(self)

  namespace = dict(__init__=__init__,
                   expand=lambda self, x: self.k * jnp.sin(x))
  namespace.update(body)
  return type(f"KSin_{'jax' if m is jax_hijax else 'hijax'}", (m.HiPrim,), namespace)


def names_of(jaxpr) -> list[str]:
  return [e.primitive.name for e in jaxpr.jaxpr.eqns]


# --- check ------------------------------------------------------------------------------

@pytest.mark.parametrize("m", BOTH)
def test_check_runs_when_an_instance_is_made(m):
  def check(self, *in_avals):
    (x_aval,) = in_avals
    if x_aval.ndim != 1:
      raise ValueError(f"{type(self).__name__} takes a vector, got "
                       f"{x_aval.str_short()}")
  cls = prim_class(m, check=check)
  np.testing.assert_allclose(cls(jax.typeof(X))(X), jnp.sin(X), rtol=1e-6)
  with pytest.raises(ValueError, match=r"KSin_\w+ takes a vector, got float32\[2,2\]"):
    cls(jax.typeof(jnp.ones((2, 2))))


@pytest.mark.parametrize("m", BOTH)
def test_check_runs_again_when_jax_type_checks_a_jaxpr(m):
  seen = []
  cls = prim_class(m, check=lambda self, *in_avals: seen.append(in_avals))
  jaxpr = jax.make_jaxpr(lambda x: cls(jax.typeof(x))(x))(X)
  assert seen == [(jax.typeof(X),)]  # from __init__
  seen.clear()
  jex.check_jaxpr(jaxpr.jaxpr)
  # JAX's own type check calls `check()` with no arguments; hijax passes the
  # argument types again, as __init__ does.
  assert seen == [() if m is jax_hijax else (jax.typeof(X),)]
  seen.clear()
  with jax.enable_checks(True):
    jax.jit(lambda x: 2 * cls(jax.typeof(x))(x))(X)
  assert len(seen) == 2  # once made, once checked


def test_a_hijax_check_that_needs_its_argument_types_works_under_checks():
  cls = prim_class(hijax, check=lambda self, x_aval: None)
  with jax.enable_checks(True):
    out = jax.jit(lambda x: cls(jax.typeof(x))(x))(X)
  np.testing.assert_allclose(out, jnp.sin(X), rtol=1e-6)


# --- staging ----------------------------------------------------------------------------

def inline_expand(self, trace, source_info, *args):
  return self.expand(*args)


@pytest.mark.parametrize("m", BOTH)
def test_staging_may_record_something_else(m):
  cls = prim_class(m, staging=inline_expand)
  f = lambda x: cls(jax.typeof(x), k=2.)(x)
  assert names_of(jax.make_jaxpr(f)(X)) == ["sin", "mul"]
  np.testing.assert_allclose(jax.jit(f)(X), 2 * jnp.sin(X), rtol=1e-6)
  np.testing.assert_allclose(f(X), 2 * jnp.sin(X), rtol=1e-6)  # eager: expand


@pytest.mark.parametrize("m", BOTH)
def test_staging_may_call_the_default(m):
  seen = []

  def staging(self, trace, source_info, *args):
    seen.append(source_info is not None)
    return m.HiPrim.staging(self, trace, source_info, *args)
  cls = prim_class(m, staging=staging)
  jaxpr = jax.make_jaxpr(lambda x: cls(jax.typeof(x))(x))(X)
  assert len(jaxpr.jaxpr.eqns) == 1 and seen == [True]
  np.testing.assert_allclose(jax.jit(lambda x: cls(jax.typeof(x))(x))(X),
                             jnp.sin(X), rtol=1e-6)


def test_staging_returning_the_wrong_type_is_an_error_naming_it():
  cls = prim_class(hijax, staging=lambda self, t, s, x: x.astype(jnp.int32))
  with pytest.raises(TypeError, match=r"KSin_hijax\.staging returned a value "
                     r"of type int32\[4\] for the output, but out_aval declares "
                     r"float32\[4\]"):
    jax.make_jaxpr(lambda x: cls(jax.typeof(x))(x))(X)


# --- pp_params ----------------------------------------------------------------------------

@pytest.mark.parametrize("m", BOTH)
def test_pp_params_choose_what_a_jaxpr_shows(m):
  if not hasattr(m.HiPrim, "pp_params"):
    pytest.skip("the installed JAX's HiPrim has no pp_params")
  default = prim_class(m)
  shown = prim_class(m, pp_params=lambda self: {"scale": self.k})
  for cls, text in ((default, "[k=2.0]"), (shown, "[scale=2.0]")):
    jaxpr = jax.make_jaxpr(lambda x: cls(jax.typeof(x), k=2.)(x))(X)
    assert f"{cls.__name__}{text} a" in str(jaxpr)
    assert repr(cls(jax.typeof(X), k=2.)) == f"{cls.__name__}{text}"


def test_pp_params_that_is_not_a_dict_is_an_error_naming_it():
  cls = prim_class(hijax, pp_params=lambda self: ["k"])
  with pytest.raises(TypeError, match=r"KSin_hijax\.pp_params must return a "
                     "dict of the params to print, got list"):
    repr(cls(jax.typeof(X)))


# --- skip_linearization_on_zero_tangents -------------------------------------------------------

@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("m", BOTH)
def test_skip_linearization_on_zero_tangents(m, skip):
  calls = []

  def vjp_fwd(self, nzs_in, x):
    calls.append(nzs_in)
    return self(x), jnp.cos(x)
  cls = prim_class(m, vjp_fwd=vjp_fwd, skip_linearization_on_zero_tangents=skip,
                   vjp_bwd_retval=lambda self, c, g: (self.k * c * g,))
  c = jnp.float32(0.5)
  # The primitive is applied to a constant inside a differentiated function:
  # no tangent flows into it.
  g = jax.grad(lambda x: x * cls(jax.typeof(c))(c))(2.)
  np.testing.assert_allclose(g, jnp.sin(c), rtol=1e-6)
  assert len(calls) == (0 if skip else 1)
  calls.clear()
  g = jax.grad(lambda x: cls(jax.typeof(x))(x))(c)  # a tangent flows in
  np.testing.assert_allclose(g, jnp.cos(c), rtol=1e-6)
  assert calls == [(True,)]


# --- physicalize ------------------------------------------------------------------------

def test_physicalize_is_refused_when_the_class_is_made():
  with pytest.raises(TypeError, match=r"KSin_hijax defines `physicalize`, the "
                     r"hook through which the Pallas fuser.*hijax does not "
                     r"support the Pallas fuser"):
    prim_class(hijax, physicalize=lambda self, ctx, *args: None)
  # JAX's own module has it, as the default that binds the primitive.
  assert callable(jax_hijax.HiPrim.physicalize)


# --- the forward-mode error names the fix that fits (issue 36) -----------------------------

def test_no_jvp_with_reverse_rules_suggests_jvp_from_vjp():
  cls = prim_class(hijax, vjp_fwd=lambda self, nzs, x: (self(x), x),
                   vjp_bwd_retval=lambda self, x, g: (jnp.cos(x) * g,))
  with pytest.raises(NotImplementedError) as e:
    jax.jvp(lambda x: cls(jax.typeof(x))(x), (X,), (X,))
  assert "`jvp = jvp_from_vjp`" in str(e.value)
  assert "jvp_from_lin" not in str(e.value)


def test_no_jvp_with_lin_suggests_jvp_from_lin():
  cls = prim_class(hijax, lin=lambda self, nzs, x: (self(x), jnp.cos(x)),
                   linearized=lambda self, c, t: c * t)
  with pytest.raises(NotImplementedError) as e:
    jax.jvp(lambda x: cls(jax.typeof(x))(x), (X,), (X,))
  assert "`jvp = jvp_from_lin`" in str(e.value)
  assert "jvp_from_vjp" not in str(e.value)


def test_no_rules_at_all_asks_for_jvp_only():
  cls = prim_class(hijax)
  with pytest.raises(NotImplementedError) as e:
    jax.jvp(lambda x: cls(jax.typeof(x))(x), (X,), (X,))
  assert str(e.value).splitlines()[0] == (
      "KSin_hijax has no forward-mode rule: implement `jvp(self, primals, "
      "tangents)`")


# --- equality -------------------------------------------------------------------------------

@pytest.mark.parametrize("m", BOTH)
def test_equality_of_instances_with_other_argument_types(m):
  cls = prim_class(m)
  f32, f16 = jax.typeof(X), jax.typeof(X.astype(jnp.float16))
  assert cls(f32, k=2.) == cls(f32, k=2.) and cls(f32, k=2.) != cls(f32, k=3.)
  # JAX compares class, params and effects; hijax the argument and output
  # types too, so that two applications are never confused under jit.
  assert (cls(f32, k=2.) == cls(f16, k=2.)) == (m is jax_hijax)
