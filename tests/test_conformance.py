"""Where JAX's transformations meet hijax: behaviour JAX's own hijax has too.

One section per item of issue 17; each test is a small repro that failed (or
silently computed something else) before the fix.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import core as jax_core
from jax._src import effects as jax_effects
from jax._src.ad_checkpoint import saved_residuals
from jax._src.interpreters import partial_eval as pe
from jax.ad_checkpoint import checkpoint_name

import hijax
from hijax import HiPrim, ShapedArray

from unary_prim import UnaryPrim

cp = jax.checkpoint_policies


@pytest.fixture(params=[False, True], ids=["classic_remat", "remat3"])
def remat3(request):
  """Runs a test with classic remat (JAX's default) and with ``jax_remat3``."""
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", request.param)
  yield request.param
  jax.config.update("jax_remat3", previous)


class Sin(UnaryPrim):
  """sin, with both a jvp rule and reverse-mode rules."""

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


# --- 2. two instances are equal exactly when they behave the same -------------------

class Reshape(HiPrim):
  """The target shape lives only in ``out_aval``, not in ``params``."""

  def __init__(self, x_aval, shape):
    self.in_avals = (x_aval,)
    self.out_aval = ShapedArray(shape, x_aval.dtype)
    self.params = {}
    super().__init__()

  def expand(self, x):
    return x.reshape(self.out_aval.shape)

  vjp_fwd, vjp_bwd_retval = hijax.vjp_from_jvp

  def jvp(self, primals, tangents):
    return self(*primals), tangents[0].reshape(self.out_aval.shape)


def _reshape(x, shape):
  return Reshape(jax.typeof(x), shape)(x)


def _two_reshapes(x):
  return _reshape(x, (2, 3)).sum(), _reshape(x, (3, 2))[:, :1].sum(0)


def test_instances_differing_only_in_out_aval_are_not_mixed_up_under_jit():
  x = jnp.arange(6.)
  eager = _two_reshapes(x)
  jitted = jax.jit(_two_reshapes)(x)
  assert jitted[1].shape == eager[1].shape == (1,)
  np.testing.assert_allclose(jitted[1], [0. + 2. + 4.])
  eqns = jax.make_jaxpr(_two_reshapes)(x).jaxpr.eqns
  assert [e.outvars[0].aval.shape for e in eqns if e.primitive.name == "Reshape"
          ] == [(2, 3), (3, 2)]
  g = jax.grad(lambda x: _two_reshapes(x)[1].sum())(x)
  np.testing.assert_allclose(g, [1., 0., 1., 0., 1., 0.])


def test_static_argument_instances_each_keep_their_shape():
  x = jnp.arange(6.)
  apply = jax.jit(lambda p, x: p(x), static_argnums=0)
  a, b = Reshape(jax.typeof(x), (2, 3)), Reshape(jax.typeof(x), (3, 2))
  assert apply(a, x).shape == (2, 3) and apply(b, x).shape == (3, 2)


class Affine(UnaryPrim):
  def expand(self, x):
    return self.a * x + self.b


def test_equality_and_hash_cover_types_params_and_effects():
  f32, f16 = jax.typeof(jnp.ones(3)), jax.typeof(jnp.ones(3, jnp.float16))
  p, q = Affine(f32, a=2., b=1.), Affine(f32, b=1., a=2.)
  assert p == q and hash(p) == hash(q)  # the same params in another order
  assert Affine(f16, a=2., b=1.) != p  # other argument types
  assert Affine(f32, a=2., b=0.) != p
  assert Reshape(f32, (3,)) != Reshape(f32, (1, 3))
  assert Reshape(ShapedArray((6,), jnp.float32), (2, 3)) == Reshape(
      ShapedArray((6,), jnp.float32), (2, 3))
  assert len({p, q, Affine(f16, a=2., b=1.)}) == 2


# --- 7. effects given as any collection -------------------------------------------------

class _Logged(jax_effects.Effect):
  """An effect for the tests (never lowered)."""


LOGGED = _Logged()


class WithEffects(HiPrim):
  def __init__(self, x_aval, effects):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    self.effects = effects
    super().__init__()

  def expand(self, x):
    return x


@pytest.mark.parametrize("effects", [{LOGGED}, [LOGGED], (LOGGED,),
                                     frozenset({LOGGED})], ids=type)
def test_effects_may_be_any_collection(effects):
  x = jnp.ones(2)
  p = WithEffects(jax.typeof(x), effects)
  assert p.effects == frozenset({LOGGED})
  assert p == WithEffects(jax.typeof(x), frozenset({LOGGED})) and hash(p)
  jaxpr = jax.make_jaxpr(lambda x: (p(x), x)[1])(x)
  assert LOGGED in jaxpr.effects
  assert [e.primitive.name for e in jaxpr.eqns] == ["WithEffects"]  # kept by dce


def test_effects_must_be_a_collection_of_effects():
  x_aval = jax.typeof(jnp.ones(2))
  with pytest.raises(TypeError, match=r"WithEffects\.effects must be"):
    WithEffects(x_aval, LOGGED)
  with pytest.raises(TypeError, match=r"WithEffects\.effects must be"):
    WithEffects(x_aval, {"io"})


# --- 3. a linear primitive whose jvp applies itself to the tangent ------------------

class Scale3(UnaryPrim):
  """Multiplication by 3: linear, so its jvp is itself and it transposes to itself."""

  def expand(self, x):
    return 3. * x

  def jvp(self, primals, tangents):
    return self(*primals), self(*tangents)

  def transpose(self, ct, acc):
    acc.accum(self(ct))

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]

  lin, linearized = hijax.linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = hijax.vjp_from_lin


def _scale3(x):
  return Scale3(jax.typeof(x))(x)


def test_linear_primitive_whose_jvp_applies_itself():
  x = jnp.float32(2.)
  assert jax.grad(_scale3)(x) == 3.
  assert jax.jit(jax.grad(_scale3))(x) == 3.
  out, f_lin = jax.linearize(_scale3, x)
  assert out == 6. and f_lin(x) == 6.
  assert jax.jvp(_scale3, (x,), (x,)) == (6., 6.)
  np.testing.assert_allclose(jax.vmap(jax.grad(_scale3))(jnp.ones(2)), [3., 3.])
  assert jax.grad(jax.grad(lambda x: _scale3(x) * x))(x) == 6.


# --- 6. float0 tangents under linearize_from_jvp -----------------------------------

class Round(UnaryPrim):
  """Not differentiable: its jvp returns a float0 tangent."""

  def expand(self, x):
    return jnp.round(x)

  def jvp(self, primals, tangents):
    (x,), _ = primals, tangents
    return self(x), np.zeros(x.shape, jax.dtypes.float0)

  lin, linearized = hijax.linearize_from_jvp


def _round(x):
  return Round(jax.typeof(x))(x)


def test_float0_tangent_means_zero_under_jvp_and_linearize():
  x = jnp.array([0.4, 1.6, 2.5])
  out, t = jax.jvp(_round, (x,), (x,))
  assert t.dtype == jnp.float32 and not t.any()
  out_lin, f_lin = jax.linearize(_round, x)
  t_lin = f_lin(x)
  assert t_lin.dtype == jnp.float32 and t_lin.shape == (3,) and not t_lin.any()
  np.testing.assert_array_equal(out_lin, out)
  with jax.enable_checks(True):
    assert jax.linearize(_round, x)[1](x).dtype == jnp.float32


# --- 4. hi-typed cotangents under jit --------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Diag:
  """A diagonal matrix, stored as its diagonal."""
  d: jax.Array


@dataclasses.dataclass(frozen=True)
class DiagTy(hijax.HiType):
  """Its own tangent type: the tangent of a diagonal matrix is diagonal."""
  d_ty: ShapedArray

  def lo_ty(self):
    return [self.d_ty]

  def lower_val(self, diag):
    return [diag.d]

  def raise_val(self, d):
    return Diag(d)

  def to_tangent_aval(self):
    return self

  def vspace_zero(self):
    return MakeDiag(self.d_ty)(jnp.zeros(self.d_ty.shape, self.d_ty.dtype))

  def vspace_add(self, x, y):
    return AddDiags(self)(x, y)


hijax.register_hitype(Diag, lambda diag: DiagTy(jax.typeof(diag.d)))


class MakeDiag(HiPrim):
  def __init__(self, d_aval):
    self.in_avals, self.out_aval, self.params = (d_aval,), DiagTy(d_aval), {}
    super().__init__()

  def expand(self, d):
    return Diag(d)

  def vjp_fwd(self, nzs_in, d):
    return self(d), None

  def vjp_bwd_retval(self, res, g):
    return (DiagonalOf(self.out_aval)(g),)


class DiagonalOf(HiPrim):
  def __init__(self, diag_aval):
    self.in_avals, self.out_aval = (diag_aval,), diag_aval.d_ty
    self.params = {}
    super().__init__()

  def expand(self, diag):
    return diag.d


class AddDiags(HiPrim):
  def __init__(self, diag_aval):
    self.in_avals, self.out_aval = (diag_aval, diag_aval), diag_aval
    self.params = {}
    super().__init__()

  def expand(self, a, b):
    return Diag(a.d + b.d)

  def vjp_fwd(self, nzs_in, a, b):
    return self(a, b), None

  def vjp_bwd_retval(self, res, g):
    return g, g  # hi-typed cotangents


class AddDiagsAccum(AddDiags):
  vjp_fwd = AddDiags.vjp_fwd

  def vjp_bwd(self, res, g, a_acc, b_acc):
    a_acc.accum(g)
    b_acc.accum(g)


@pytest.mark.parametrize("cls", [AddDiags, AddDiagsAccum])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_hi_typed_cotangents_returned_by_a_backward_rule(cls, jit):
  w = Diag(jnp.array([1., 2., 3.]))
  f = lambda w: cls(jax.typeof(w))(w, w)
  f = jax.jit(f) if jit else f
  out, f_vjp = jax.vjp(f, w)
  (ct,) = f_vjp(Diag(jnp.array([1., 10., 100.])))
  assert isinstance(ct, Diag)
  np.testing.assert_allclose(ct.d, [2., 20., 200.])
  np.testing.assert_allclose(out.d, [2., 4., 6.])


# --- 5. jax.typeof of a hi value does not lower it -----------------------------------

@dataclasses.dataclass(frozen=True)
class Pair:
  """Two arrays, of a hi type without lowering (usable eagerly only)."""
  a: jax.Array
  b: jax.Array


@dataclasses.dataclass(frozen=True)
class PairTy(hijax.HiType):
  a_ty: ShapedArray
  b_ty: ShapedArray


hijax.register_hitype(Pair, lambda p: PairTy(jax.typeof(p.a), jax.typeof(p.b)))


class MakePair(HiPrim):
  def __init__(self, a_aval, b_aval):
    self.in_avals = (a_aval, b_aval)
    self.out_aval, self.params = PairTy(a_aval, b_aval), {}
    super().__init__()

  def expand(self, a, b):
    return Pair(a, b)


class PairSum(HiPrim):
  def __init__(self, pair_aval):
    self.in_avals, self.out_aval, self.params = (pair_aval,), pair_aval.a_ty, {}
    super().__init__()

  def expand(self, pair):
    return pair.a + pair.b


def test_a_hi_type_without_lowering_works_eagerly():
  a, b = jnp.ones(2), jnp.arange(2.)
  pair = MakePair(jax.typeof(a), jax.typeof(b))(a, b)
  assert jax.typeof(pair) == PairTy(jax.typeof(a), jax.typeof(b))
  np.testing.assert_allclose(PairSum(jax.typeof(pair))(pair), [1., 2.])


@dataclasses.dataclass(frozen=True)
class LeadingAxis(hijax.MappingSpec):
  pass


def test_missing_method_error_names_what_the_transformation_needs():
  a = jnp.ones((3, 2))
  pair = MakePair(jax.typeof(a), jax.typeof(a))(a, a)
  with pytest.raises(NotImplementedError, match="vmap needs") as e:
    jax.vmap(lambda p: PairSum(jax.typeof(p))(p), in_axes=LeadingAxis(),
             axis_size=3)(pair)
  assert "PairTy" in str(e.value) and "`dec_rank`" in str(e.value)


class CountingPairTy(PairTy):
  lowered = 0

  def lo_ty(self):
    return [self.a_ty, self.b_ty]

  def lower_val(self, p):
    CountingPairTy.lowered += 1
    return [p.a, p.b]

  def raise_val(self, a, b):
    return CountingPair(a, b)


class CountingPair(Pair):
  pass


hijax.register_hitype(CountingPair,
                      lambda p: CountingPairTy(jax.typeof(p.a), jax.typeof(p.b)))


def test_typeof_does_not_call_lower_val():
  p = CountingPair(jnp.ones(2), jnp.zeros(2))
  CountingPairTy.lowered = 0
  for _ in range(3):
    jax.typeof(p)
  assert CountingPairTy.lowered == 0


def test_a_value_built_from_tracers_is_still_rejected_without_lowering():
  with pytest.raises(TypeError) as e:
    jax.jit(lambda a: Pair(a, a))(jnp.ones(2))
  assert "built from traced arrays" in str(e.value) + str(e.value.__context__)
  with pytest.raises(TypeError) as e:
    jax.jit(lambda a: Pair(jnp.ones(1), a))(jnp.ones(2))
  assert "built from traced arrays" in str(e.value) + str(e.value.__context__)


# --- 8. custom_remat receives JAX's own name policies as hijax policy objects ----------

def _sin_saving_cos_if_asked(seen):
  def fwd(policy, x):
    seen.append(policy)
    asked = (isinstance(policy, hijax.SaveOnlyTheseNames)
             and "cos" in policy.saveable_names)
    return jnp.sin(x), jnp.cos(x) if asked else None

  def rem(cos, x):
    return jnp.sin(x), jnp.cos(x) if cos is None else cos

  return hijax.custom_remat(jnp.sin, fwd, rem, lambda cos, g: (g * cos,))


@pytest.mark.parametrize("jax_policy,expected", [
    (cp.save_only_these_names("cos", "a"),
     hijax.SaveOnlyTheseNames(frozenset({"cos", "a"}))),
    (cp.save_any_names_but_these("cos"),
     hijax.SaveAnyNamesButThese(frozenset({"cos"}))),
])
def test_custom_remat_gets_jax_name_policies_as_hijax_policies(jax_policy,
                                                                expected):
  previous = jax.config.jax_remat3
  jax.config.update("jax_remat3", True)
  try:
    seen = []
    f = jax.checkpoint(lambda x: _sin_saving_cos_if_asked(seen)(x).sum(),
                       policy=jax_policy)
    x = jnp.linspace(0., 1., 3)
    np.testing.assert_allclose(jax.grad(f)(x), jnp.cos(x), rtol=1e-6)
    assert seen and all(p == expected for p in seen)
    saved = [d for _, d in saved_residuals(f, x)]
    assert any("cos" in d for d in saved) == isinstance(
        expected, hijax.SaveOnlyTheseNames)
  finally:
    jax.config.update("jax_remat3", previous)


# --- 9. misuse: clear errors at class creation, construction and call ------------------

def test_overriding_both_backward_rules_is_rejected_at_class_creation():
  with pytest.raises(TypeError, match=r"Both\.vjp_bwd.*vjp_bwd_retval") as e:
    class Both(HiPrim):  # noqa: F841 - the class statement is the test
      def vjp_bwd_retval(self, cos_x, g):
        return (cos_x * g,)

      def vjp_bwd(self, cos_x, g, acc):
        acc.accum(cos_x * g)
  assert "never be called" in str(e.value)
  with pytest.raises(TypeError, match=r"Derived\.vjp_bwd"):
    class Derived(Sin):  # noqa: F841
      vjp_fwd, vjp_bwd_retval = hijax.vjp_from_jvp

      def vjp_bwd(self, res, g, acc):
        pass
  with pytest.raises(TypeError, match=r"Later\.vjp_bwd"):
    class Later(AddDiagsAccum):  # noqa: F841 - would hide its own retval rule
      def vjp_bwd_retval(self, res, g):
        return g, g

  class Overrides(AddDiags):  # a subclass's vjp_bwd replaces an inherited
    def vjp_bwd(self, res, g, a_acc, b_acc):  # vjp_bwd_retval: fine
      a_acc.accum(g)
      b_acc.accum(g)


class Forgetful(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}

  def expand(self, x):
    return x


def test_init_without_super_init_is_a_clear_error():
  p = Forgetful(jax.typeof(jnp.ones(2)))
  for use in (lambda: p(jnp.ones(2)), lambda: hash(p),
              lambda: jax.jit(lambda x: p(x))(jnp.ones(2))):
    with pytest.raises(AttributeError,
                       match=r"Forgetful\.__init__.*super\(\)\.__init__\(\)"):
      use()


@pytest.mark.parametrize("name", ["batch", "expand", "jvp", "in_avals",
                                  "effects", "check_args"])
def test_a_param_may_not_shadow_a_method_or_attribute(name):
  with pytest.raises(TypeError, match=rf"Affine\.params\[{name!r}\].*rename"):
    Affine(jax.typeof(jnp.ones(2)), **{name: 4})


def test_param_keys_must_be_strings():
  class Keyed(Affine):
    def __init__(self, x_aval, params):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, params
      HiPrim.__init__(self)

  with pytest.raises(TypeError, match=r"Keyed\.params.*strings.*got 1"):
    Keyed(jax.typeof(jnp.ones(2)), {1: 2.})


class Transpose2d(HiPrim):
  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = ShapedArray(x_aval.shape[::-1], x_aval.dtype)
    self.params = {}
    super().__init__()

  def expand(self, x):
    return x.T


def test_eager_call_with_numpy_arguments_returns_a_jax_array():
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  out = Transpose2d(jax.typeof(x))(x)
  assert isinstance(out, jax.Array) and not isinstance(out, np.ndarray)
  np.testing.assert_array_equal(out, x.T)
  assert isinstance(hi_sin(np.float32(1.)), jax.Array)


# --- 10. default dce of a multi-output primitive; logs from transpose ----------------

class SinCos(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), (x_aval, x_aval), {}
    super().__init__()

  def expand(self, x):
    return jnp.sin(x), jnp.cos(x)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    gs, gc = g
    return (jnp.cos(x) * instantiate(gs) - jnp.sin(x) * instantiate(gc),)


def instantiate(t):
  return hijax.instantiate_zeros(t)


def test_default_dce_keeps_a_multi_output_primitive_whole():
  x = jnp.linspace(0., 1., 3)
  first = lambda x: SinCos(jax.typeof(x))(x)[0]
  np.testing.assert_allclose(jax.jit(first)(x), jnp.sin(x), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda x: first(x).sum()))(x),
                             jnp.cos(x), rtol=1e-6)
  jaxpr = jax.make_jaxpr(first)(x).jaxpr
  dced, used_inputs = pe.dce_jaxpr(jaxpr, [True])
  jax_core.check_jaxpr(dced)
  (eqn,) = dced.eqns
  assert used_inputs == [True] and len(eqn.outvars) == 2
  assert dced.outvars[0] is eqn.outvars[0]
  nothing, _ = pe.dce_jaxpr(jaxpr, [False])
  assert nothing.eqns == []


class LoggedScale(HiPrim):
  """Linear in x; its transpose logs the cotangent it saw."""

  def __init__(self, x_aval, logs="dict"):
    self.in_avals, self.out_aval = (x_aval,), x_aval
    self.params = dict(logs=logs)
    super().__init__()

  def expand(self, x):
    return 2. * x

  def transpose(self, ct, acc):
    acc.accum(2. * ct)
    return {"scale_ct": ct} if self.logs == "dict" else [ct]


def _doubling(logs):
  """2x, whose jvp applies LoggedScale to the tangent: reverse mode transposes
  that equation with LoggedScale.transpose."""
  @jax.custom_jvp
  def double(x):
    return 2. * x

  double.defjvp(lambda primals, tangents: (
      2. * primals[0], LoggedScale(jax.typeof(tangents[0]), logs)(tangents[0])))
  return double


def test_logs_returned_by_transpose_reach_with_logs():
  x = jnp.float32(3.)
  _, f_vjp = jax.vjp(_doubling("dict"), x)
  cts, logs = f_vjp.with_logs(jnp.float32(5.))
  assert cts == (10.,) and logs == {"scale_ct": 5.}
  with pytest.raises(TypeError,
                     match=r"LoggedScale\.transpose must return None or a dict"):
    jax.grad(_doubling("list"))(x)
