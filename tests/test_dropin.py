"""Code written for the released jax.experimental.hijax runs on hijax.

Each test writes its classes once, against a module ``m`` that is either
JAX's own ``jax.experimental.hijax`` or ``hijax``, and checks that both give
the same values. Where a form of a rule exists only in one JAX release, the
comparison with JAX runs when the installed JAX has that form (probed, never
by version), and hijax is checked on every supported JAX.
"""
from __future__ import annotations

import inspect

import jax
import jax.experimental.hijax as jax_hijax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import partial_eval as pe

import hijax
from hijax import batching as hijax_batching

X = jnp.linspace(0.1, 1.3, 4, dtype=jnp.float32)


def _public(module) -> set[str]:
  return {n for n in dir(module) if not n.startswith("_")}


# Names whose hijax object is hijax's own implementation, not JAX's object:
# the primitive base class, its derived rules, and the hi-type helpers
# (hijax.hitypes). Their meaning is checked by the tests of each.
OWN = {"HiPrim", "jvp_from_lin", "linearize_from_jvp", "vjp_from_jvp",
       "vjp_from_lin", "HiType", "MappingSpec", "HiPspec", "register_hitype"}


def test_every_public_name_of_jax_hijax_is_in_hijax():
  missing = sorted(n for n in _public(jax_hijax) if not hasattr(hijax, n))
  assert not missing, f"hijax lacks {missing} of jax.experimental.hijax"
  assert _public(jax_hijax) <= set(hijax.__all__)


def test_each_shared_name_is_jax_own_object_or_a_known_counterpart():
  own = {n for n in _public(jax_hijax)
         if getattr(hijax, n) is not getattr(jax_hijax, n)}
  assert own == OWN & _public(jax_hijax), own
  for n in OWN & {"HiType", "MappingSpec", "HiPspec"}:
    assert issubclass(getattr(hijax, n), getattr(jax_hijax, n))


def test_batching_helpers_are_jax_own_where_jax_has_them():
  for name in ("vmap_rule", "bdims_at_front", "unmap_avals"):
    ours = getattr(hijax_batching, f"own_{name}")
    assert getattr(hijax, name) is getattr(jax_hijax, name, ours)


def test_vjphiprimitive_is_the_older_name_of_hiprim():
  assert hijax.VJPHiPrimitive is hijax.HiPrim
  assert not hasattr(jax_hijax, "VJPHiPrimitive")  # gone since 0.11.2


# --- one class, written once, on either module -----------------------------------------

def sin_prim(m, **rules):
  """A ``sin`` primitive of module ``m`` whose class body adds ``rules``."""
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    m.HiPrim.__init__(self)

  body = dict(__init__=__init__, expand=lambda self, x: jnp.sin(x))
  body.update(rules)
  cls = type(f"Sin_{'jax' if m is jax_hijax else 'hijax'}", (m.HiPrim,), body)
  return lambda x: cls(jax.typeof(x))(x)


def fwd(self, nzs_in, x):
  return self(x), jnp.cos(x)


BOTH = [pytest.param(jax_hijax, id="jax"), pytest.param(hijax, id="hijax")]


def jax_form_of(method: str) -> int:
  """How many parameters after ``self`` JAX's own default of ``method`` takes."""
  return len(inspect.signature(getattr(jax_hijax.HiPrim, method)).parameters) - 1


# --- backward-pass logs ------------------------------------------------------------------

def retval_logs(self, cos_x, g):
  return (cos_x * g,), {"cos": cos_x}


@pytest.mark.parametrize("m", BOTH)
def test_vjp_bwd_retval_logs_as_a_method(m):
  f = sin_prim(m, vjp_fwd=fwd, vjp_bwd_retval_logs=retval_logs)
  _, f_vjp = jax.vjp(f, X)
  (ct,), logs = f_vjp.with_logs(jnp.ones_like(X))
  np.testing.assert_allclose(ct, jnp.cos(X), rtol=1e-6)
  np.testing.assert_allclose(logs["cos"], jnp.cos(X), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(X), jnp.cos(X),
                             rtol=1e-6)


def test_vjp_bwd_retval_logs_as_a_flag_works_on_hijax():
  f = sin_prim(hijax, vjp_fwd=fwd, vjp_bwd_retval_logs=True,
               vjp_bwd_retval=lambda self, c, g: ((c * g,), {"cos": c}))
  _, f_vjp = jax.vjp(f, X)
  (ct,), logs = f_vjp.with_logs(jnp.ones_like(X))
  np.testing.assert_allclose(logs["cos"], jnp.cos(X), rtol=1e-6)
  np.testing.assert_allclose(ct, jnp.cos(X), rtol=1e-6)
  # On JAX 0.11.2 and 0.12 the method form replaced the flag: a class that
  # sets it fails in reverse mode.
  if callable(jax_hijax.HiPrim.vjp_bwd_retval_logs):
    g = sin_prim(jax_hijax, vjp_fwd=fwd, vjp_bwd_retval_logs=True,
                 vjp_bwd_retval=lambda self, c, g: ((c * g,), {"cos": c}))
    with pytest.raises(TypeError, match="'bool' object is not callable"):
      jax.grad(lambda x: g(x).sum())(X)


def test_the_default_method_reads_as_false_and_returns_the_pair():
  plain = _instance(hijax, jax.typeof(X), vjp_fwd=fwd,
                    vjp_bwd_retval=lambda self, c, g: (c * g,))
  assert not plain.vjp_bwd_retval_logs  # `if self.vjp_bwd_retval_logs:` reads False
  (ct,), logs = plain.vjp_bwd_retval_logs(jnp.cos(X), jnp.ones_like(X))
  np.testing.assert_allclose(ct, jnp.cos(X), rtol=1e-6)
  assert logs is None


@pytest.mark.parametrize("m", BOTH)
def test_vjp_bwd_retval_logs_of_a_class_with_vjp_bwd(m):
  def vjp_bwd(self, cos_x, g, x_acc):
    x_acc.accum(cos_x * g)
    return {"g": g}

  f32 = jax.typeof(X)
  f = sin_prim(m, vjp_fwd=fwd, vjp_bwd=vjp_bwd)
  np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(X), jnp.cos(X),
                             rtol=1e-6)
  prim = _instance(m, f32, vjp_fwd=fwd, vjp_bwd=vjp_bwd)
  try:
    (ct,), logs = prim.vjp_bwd_retval_logs(jnp.cos(X), jnp.ones_like(X))
  except NotImplementedError:
    # jax 0.11.2's default method calls vjp_bwd_retval only; hijax's, like
    # 0.12's, runs an overriding vjp_bwd.
    assert m is jax_hijax
    return
  np.testing.assert_allclose(ct, jnp.cos(X), rtol=1e-6)
  np.testing.assert_allclose(logs["g"], jnp.ones_like(X))


def _instance(m, aval, **rules):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    m.HiPrim.__init__(self)
  cls = type("Sin", (m.HiPrim,), dict(__init__=__init__,
                                      expand=lambda self, x: jnp.sin(x),
                                      **rules))
  return cls(aval)


def test_a_method_returning_no_logs_is_an_error_naming_it():
  f = sin_prim(hijax, vjp_fwd=fwd,
               vjp_bwd_retval_logs=lambda self, c, g: (c * g,))
  with pytest.raises(TypeError, match=r"Sin_hijax\.vjp_bwd_retval_logs returned "
                     r"a tuple of length 1, but it must return a pair "
                     r"\(cotangents, logs\)"):
    jax.grad(lambda x: f(x).sum())(X)


def test_a_method_and_vjp_bwd_in_one_class_is_an_error():
  with pytest.raises(TypeError, match=r"vjp_bwd_retval_logs would never be "
                     "called"):
    sin_prim(hijax, vjp_fwd=fwd, vjp_bwd_retval_logs=retval_logs,
             vjp_bwd=lambda self, c, g, acc: None)


def test_a_logs_attribute_that_is_neither_flag_nor_method_is_refused():
  with pytest.raises(TypeError, match="vjp_bwd_retval_logs is 'yes'"):
    sin_prim(hijax, vjp_bwd_retval_logs="yes")


# --- remat: (out, rem) and (out, res, rem) ------------------------------------------------

@pytest.fixture
def remat3():
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", True)
  yield
  jax.config.update("jax_remat3", previous)


def remat_saving_cos(form):
  """A ``remat`` rule saving cos(x), in jax 0.11.2's form (two values) or
  0.12's (three)."""
  def remat(self, trace, x):
    seen.append(trace.policy)
    if form == 2:
      return self(x), lambda x: self(x)
    return self(x), jnp.cos(x), lambda c, x: self(x) + 0 * c
  seen: list = []
  return remat, seen


def _remat_forms_of_jax() -> int:
  f32 = jax.typeof(X)
  prim = _instance(jax_hijax, f32)
  return len(jax_hijax.HiPrim.remat(prim, None, X))


@pytest.mark.parametrize("form", [2, 3])
@pytest.mark.parametrize("m", BOTH)
def test_remat_returning_two_or_three_values(remat3, m, form):
  if m is jax_hijax and _remat_forms_of_jax() != form:
    pytest.skip("the installed JAX's remat rules take the other form")
  remat, seen = remat_saving_cos(form)
  f = sin_prim(m, vjp_fwd=fwd, vjp_bwd_retval=lambda self, c, g: (c * g,),
               remat=remat)
  policy = jax.checkpoint_policies.dots_saveable
  g = jax.grad(jax.checkpoint(lambda x: jnp.sum(f(x) ** 2), policy=policy))(X)
  np.testing.assert_allclose(g, 2 * jnp.sin(X) * jnp.cos(X), rtol=1e-6)
  assert seen and seen[0] is policy


def test_remat_returning_something_else_is_an_error(remat3):
  f = sin_prim(hijax, vjp_fwd=fwd, vjp_bwd_retval=lambda self, c, g: (c * g,),
               remat=lambda self, trace, x: self(x))
  with pytest.raises(TypeError, match=r"Sin_hijax\.remat must return \(out, "
                     r"res, rem\).*or \(out, rem\)"):
    jax.grad(jax.checkpoint(lambda x: jnp.sum(f(x))))(X)


# --- dce: (used_outs) and (used_outs, live_ins) -----------------------------------------

def two_outputs(m, arity):
  """``(sin x, cos x)``, whose dce rule keeps only the used output."""
  class Only(m.HiPrim):
    def __init__(self, x_aval, which):
      self.in_avals, self.out_aval = (x_aval,), x_aval
      self.params = dict(which=which)
      super().__init__()

    def expand(self, x):
      return (jnp.sin, jnp.cos)[self.which](x)

  class SinCos(m.HiPrim):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), (x_aval, x_aval), {}
      super().__init__()

    def expand(self, x):
      return jnp.sin(x), jnp.cos(x)

    if arity == 1:  # jax 0.11.2's form
      def dce(self, used_outs):
        return keep_used(self, used_outs)
    else:  # jax 0.12's
      def dce(self, used_outs, live_ins):
        return keep_used(self, used_outs, live_ins)

  def keep_used(self, used_outs, *live_ins):
    calls.append(len(live_ins))
    used_sin, used_cos = used_outs
    if used_sin and used_cos:
      return True, True, self
    if not (used_sin or used_cos):
      return False, False, None
    return True, (used_sin, used_cos), Only(self.in_avals[0], int(used_cos))

  calls: list = []
  return SinCos, calls


@pytest.mark.parametrize("arity", [1, 2])
@pytest.mark.parametrize("m", BOTH)
def test_dce_with_or_without_live_ins(m, arity):
  if m is jax_hijax and jax_form_of("dce") != arity:
    pytest.skip("the installed JAX's dce rules take the other form")
  SinCos, calls = two_outputs(m, arity)
  jaxpr = jax.make_jaxpr(lambda x: SinCos(jax.typeof(x))(x)[1])(X).jaxpr
  used, _ = pe.dce_jaxpr(jaxpr, [True])
  (eqn,) = used.eqns
  assert type(eqn.params["_prim"]).__name__ == "Only"
  assert calls == [arity - 1]
  out = jax.jit(lambda x: SinCos(jax.typeof(x))(x)[1])(X)
  np.testing.assert_allclose(out, jnp.cos(X), rtol=1e-6)


def test_dce_of_another_arity_is_refused_when_the_class_is_made():
  with pytest.raises(TypeError, match=r"Sin_hijax\.dce takes 3 positional "
                     r"parameter\(s\) after self"):
    sin_prim(hijax, dce=lambda self, a, b, c: None)


# --- batch_dim_rule and batch ----------------------------------------------------------------

def batch_with_helpers(m):
  """A jax-0.12-style `batch` rule, written with vmap_rule and bdims_at_front."""
  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    if d == 1:
      x, = m.bdims_at_front(axis_data, (x,), (d,))
      d = 0
    out_aval, = m.unmap_avals(axis_data, (self.out_aval,), (d,))
    out = m.vmap_rule(axis_data, self.expand, (d,), d)(x)
    assert jax.typeof(out).shape == out_aval.shape
    return out, d
  return batch


@pytest.mark.parametrize("m", BOTH)
def test_batch_written_with_jax_helpers(m):
  if not hasattr(m, "vmap_rule"):
    pytest.skip("the installed JAX's module has no vmap_rule")
  f = sin_prim(m, batch=batch_with_helpers(m))
  xs = jnp.arange(12.).reshape(3, 4)
  np.testing.assert_allclose(jax.vmap(f)(xs), jnp.sin(xs), rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(f, in_axes=1)(xs), jnp.sin(xs.T),
                             rtol=1e-6)


@pytest.mark.parametrize("m", BOTH)
def test_batch_dim_rule(m):
  if not hasattr(m.HiPrim, "batch_dim_rule"):
    pytest.skip("the installed JAX's HiPrim has no batch_dim_rule")
  f = sin_prim(m, batch_dim_rule=lambda self, axis_data, dims: dims[0])
  xs = jnp.arange(12.).reshape(3, 4)
  np.testing.assert_allclose(jax.vmap(f, in_axes=1)(xs), jnp.sin(xs.T),
                             rtol=1e-6)


def test_own_batching_helpers_equal_jax_own_or_closed_forms():
  ad = _axis_data(3)
  xs = jnp.arange(12.).reshape(4, 3)
  (moved,) = hijax_batching.own_bdims_at_front(ad, (xs,), (1,))
  np.testing.assert_array_equal(moved, xs.T)
  (spread,) = hijax_batching.own_bdims_at_front(ad, (X,), (None,))
  np.testing.assert_array_equal(spread, jnp.broadcast_to(X, (3, 4)))
  (aval,) = hijax_batching.own_unmap_avals(ad, (jax.typeof(X),), (1,))
  assert aval.shape == (4, 3)
  f = hijax_batching.own_vmap_rule(ad, lambda x, t: (jnp.sin(x), t), (1, 1),
                                   (0, 0))
  out, t = f(xs, hijax.Zero(jax.typeof(xs)))
  np.testing.assert_allclose(out, jnp.sin(xs.T), rtol=1e-6)
  assert isinstance(t, hijax.Zero) and t.aval.shape == (3, 4)
  if hasattr(jax_hijax, "vmap_rule"):
    theirs, t2 = jax_hijax.vmap_rule(
        ad, lambda x, t: (jnp.sin(x), t), (1, 1), (0, 0))(
            xs, hijax.Zero(jax.typeof(xs)))
    np.testing.assert_array_equal(out, theirs)
    assert t2.aval == t.aval


def _axis_data(size):
  """The ``axis_data`` a batch rule receives for a vmap of ``size``."""
  seen = []

  def batch(self, axis_data, args, dims):
    seen.append(axis_data)
    return self.expand(*args), dims[0]
  jax.vmap(sin_prim(hijax, batch=batch))(jnp.zeros((size, 2)))
  return seen[0]


# --- derived pairs are named tuples with JAX's field names -------------------------------

def test_derived_pairs_have_jax_field_names():
  for name in ("linearize_from_jvp", "vjp_from_jvp", "vjp_from_lin"):
    ours, theirs = getattr(hijax, name), getattr(jax_hijax, name)
    assert isinstance(ours, tuple) and ours._fields == theirs._fields
    assert tuple(ours) == tuple(getattr(ours, f) for f in ours._fields)
  assert hijax.linearize_from_jvp.lin is hijax.linearize_from_jvp[0]


def jvp_rule(self, primals, tangents):
  (x,), (t,) = primals, tangents
  return self(x), jnp.cos(x) * t


@pytest.mark.parametrize("m", BOTH)
def test_pairs_by_field_or_unpacked_give_the_same_rules(m):
  by_field = sin_prim(m, jvp=jvp_rule,
                      lin=m.linearize_from_jvp.lin,
                      linearized=m.linearize_from_jvp.linearized,
                      vjp_fwd=m.vjp_from_lin.vjp_fwd,
                      vjp_bwd_retval=m.vjp_from_lin.vjp_bwd_retval)
  lin, linearized = m.linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = m.vjp_from_jvp
  unpacked = sin_prim(m, jvp=jvp_rule, lin=lin, linearized=linearized,
                      vjp_fwd=vjp_fwd, vjp_bwd_retval=vjp_bwd_retval)
  for f in (by_field, unpacked):
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(X), jnp.cos(X),
                               rtol=1e-6)
    _, f_lin = jax.linearize(f, X)
    np.testing.assert_allclose(f_lin(jnp.ones_like(X)), jnp.cos(X), rtol=1e-6)


def test_the_rule_checker_checks_a_vjp_bwd_retval_logs_method():
  from hijax.testing import RuleCheckError, check_rules, defined_rules
  good = sin_prim(hijax, vjp_fwd=fwd, vjp_bwd_retval_logs=retval_logs)
  assert "vjp" in check_rules(good, X).modes_run
  assert defined_rules(_instance(hijax, jax.typeof(X), vjp_fwd=fwd,
                                 vjp_bwd_retval_logs=retval_logs))["vjp"] == (
      "Sin.vjp_fwd/vjp_bwd_retval_logs")
  wrong = sin_prim(hijax, vjp_fwd=fwd,
                   vjp_bwd_retval_logs=lambda self, c, g: ((2 * c * g,), None))
  with pytest.raises(RuleCheckError, match="vjp_bwd_retval_logs: vjp vs finite"):
    check_rules(wrong, X)
