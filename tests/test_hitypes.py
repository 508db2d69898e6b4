"""Hi types: the type protocol under jit, grad, vmap, scan and (in a subprocess
with 8 CPU devices) shard_map and explicit sharding, plus the misuse errors."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hijax
from hijax import (HiPrim, HiType, MappingSpec, ShapedArray, aval_method,
                   aval_property, register_hitype)

from hitype_examples import (F32, I8, QArray, QArrayTy, QMatmul, QSpec, Rank1, Rank1Ty,
                             Tup, TupSpec, TupTy, dequantize, get, make_tup,
                             qmatmul, quantize, r1matmul, rank1, to_dense)

X = jnp.array([[0.5, -1., 2.], [3., 0.25, -4.]], F32)


def assert_q_equal(a, b):
  assert isinstance(a, QArray) and isinstance(b, QArray)
  np.testing.assert_array_equal(a.values, b.values)
  np.testing.assert_array_equal(a.scale, b.scale)


def reference_quantize(x):
  scale = np.max(np.abs(x), axis=-1, keepdims=True) / 127.
  return np.round(x / scale).astype(np.int8), scale


# --- the type and its protocol ------------------------------------------------------

def test_typeof_returns_the_registered_hi_type():
  q = quantize(X)
  ty = jax.typeof(q)
  assert isinstance(ty, HiType) and isinstance(ty, jax._src.hijax.HiType)
  assert ty == QArrayTy(ShapedArray((2, 3), I8))
  assert ty.str_short() == "q8[2,3]"
  assert jax.typeof(rank1(jnp.ones(4), jnp.ones(3))) == Rank1Ty(4, 3)


def test_protocol_methods_directly():
  q = quantize(X)
  ty = jax.typeof(q)
  assert ty.lo_ty() == [ShapedArray((2, 3), I8), ShapedArray((2, 1), F32)]
  lo = ty.lower_val(q)
  assert [jax.typeof(x) for x in lo] == ty.lo_ty()
  assert_q_equal(ty.raise_val(*lo), q)
  assert ty.to_tangent_aval() == ShapedArray((2, 3), F32)
  assert ty.to_ct_aval() == ty.to_tangent_aval()  # HiType's default
  batched = ty.inc_rank(5, QSpec(0))
  assert batched.str_short() == "q8[5,2,3]"
  assert batched.dec_rank(5, QSpec(0)) == ty
  assert ty.inc_rank(5, QSpec(1)).shape == (2, 5, 3)
  assert ty.leading_axis_spec() == QSpec(0)


def test_base_class_defaults_and_missing_methods_name_the_transformation():
  @dataclasses.dataclass(frozen=True)
  class Bare(HiType):
    pass

  ty = Bare()
  assert ty.str_short() == "Bare"
  for method, args, words in [
      ("lo_ty", (), "Lowering"), ("lower_val", (None,), "Lowering"),
      ("raise_val", (), "Lowering"), ("to_tangent_aval", (), "Autodiff"),
      ("dec_rank", (2, None), "vmap"), ("inc_rank", (2, None), "vmap"),
      ("leading_axis_spec", (), "lax.scan"),
      ("shard", (None, frozenset(), True, None), "shard_map"),
      ("unshard", (None, True, None), "shard_map"),
      ("vspace_zero", (), "tangent"), ("vspace_add", (1, 2), "tangent")]:
    with pytest.raises(NotImplementedError, match=method) as e:
      getattr(ty, method)(*args)
    assert words in str(e.value)
  with pytest.raises(NotImplementedError, match="to_lo"):
    hijax.HiPspec().to_lo()
  assert isinstance(QSpec(0), jax._src.hijax.MappingSpec)


# --- eager, jit, lowering -------------------------------------------------------------

def test_quantize_dequantize_eagerly():
  q = quantize(X)
  values, scale = reference_quantize(np.asarray(X))
  # -1 / (2 / 127) is -63.5: a tie, which a division that is not correctly
  # rounded (a TPU's) may send either way; elsewhere exactly NumPy's
  ratio = np.asarray(X, np.float64) / scale
  tie = np.abs(np.abs(ratio - np.trunc(ratio)) - 0.5) < 1e-4
  assert tie.sum() == 1
  np.testing.assert_array_equal(np.where(tie, 0, q.values),
                                np.where(tie, 0, values))
  assert np.all(np.abs(q.values.astype(int) - values.astype(int)) <= tie)
  np.testing.assert_allclose(q.scale, scale)
  np.testing.assert_allclose(dequantize(q), X, atol=np.max(scale))


def test_under_jit_a_hi_value_is_one_variable_and_each_primitive_one_equation():
  jaxpr = jax.make_jaxpr(lambda x: dequantize(quantize(x)))(X)
  text = str(jaxpr)
  assert ":q8[2,3] = Quantize a" in text and "Dequantize" in text
  assert len(jaxpr.eqns) == 2
  assert jaxpr.eqns[0].outvars[0].aval == QArrayTy(ShapedArray((2, 3), I8))
  q = quantize(X)
  jaxpr = jax.make_jaxpr(dequantize)(q)
  assert str(jaxpr).startswith("{ lambda ; a:q8[2,3]. let")


def test_jit_with_hi_inputs_and_outputs():
  q = quantize(X)
  assert_q_equal(jax.jit(quantize)(X), q)
  np.testing.assert_array_equal(jax.jit(dequantize)(q), dequantize(q))
  out = jax.jit(lambda q: quantize(dequantize(q) * 2))(q)
  assert_q_equal(out, quantize(dequantize(q) * 2))


def test_expand_runs_only_at_lowering(monkeypatch):
  from hitype_examples import Quantize
  calls = []
  original = Quantize.expand
  monkeypatch.setattr(Quantize, "expand",
                      lambda self, x: calls.append(1) or original(self, x))
  jax.make_jaxpr(lambda x: dequantize(quantize(x)))(X)
  assert calls == []
  f = jax.jit(lambda x: dequantize(quantize(x + 1.)))
  f.trace(X)
  assert calls == []
  f(X)
  assert calls == [1]
  quantize(X)  # eagerly, expand runs on every call
  assert calls == [1, 1]


# --- autodiff -------------------------------------------------------------------------

def test_grad_straight_through():
  g = jax.grad(lambda x: (dequantize(quantize(x)) ** 2).sum())(X)
  np.testing.assert_allclose(g, 2 * dequantize(quantize(X)))
  g = jax.jit(jax.grad(lambda x: dequantize(quantize(x)).sum()))(X)
  np.testing.assert_array_equal(g, jnp.ones_like(X))


def test_grad_with_respect_to_a_hi_argument_is_a_float_array():
  q = quantize(X)
  g = jax.grad(lambda q: (dequantize(q) ** 2).sum())(q)
  assert jax.typeof(g) == ShapedArray((2, 3), F32)
  np.testing.assert_allclose(g, 2 * dequantize(q))
  g_jit = jax.jit(jax.grad(lambda q: (dequantize(q) ** 2).sum()))(q)
  np.testing.assert_allclose(g_jit, g)


def test_jvp_through_hi_primitives_and_of_a_hi_argument():
  t = jnp.ones_like(X)
  y, ty = jax.jvp(lambda x: dequantize(quantize(x)), (X,), (t,))
  np.testing.assert_array_equal(ty, t)
  q = quantize(X)
  y, ty = jax.jvp(dequantize, (q,), (2 * t,))
  np.testing.assert_array_equal(y, dequantize(q))
  np.testing.assert_array_equal(ty, 2 * t)


def test_primitive_mixing_hi_and_array_arguments():
  q = quantize(X)
  w = dequantize(q)
  x = jnp.arange(6., dtype=F32).reshape(3, 2)
  np.testing.assert_allclose(qmatmul(q, x), w @ x, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(qmatmul)(q, x), w @ x, rtol=1e-6)
  gq, gx = jax.grad(lambda q, x: (qmatmul(q, x) ** 2).sum(), (0, 1))(q, x)
  rq, rx = jax.grad(lambda w, x: ((w @ x) ** 2).sum(), (0, 1))(w, x)
  np.testing.assert_allclose(gq, rq, rtol=1e-5)
  np.testing.assert_allclose(gx, rx, rtol=1e-5)
  with pytest.raises(TypeError, match="argument 0 has type float32.*declares q8"):
    QMatmul(jax.typeof(q), jax.typeof(x))(w, x)  # an array where q8 is declared


# --- rank-1 matrices ------------------------------------------------------------------

U = jnp.array([1., 2., -1.], F32)
V = jnp.array([0.5, -2.], F32)
XS = jnp.array([[1., 2.], [3., -1.]], F32)


def test_rank1_constructor_accessor_matmul():
  r = rank1(U, V)
  assert isinstance(r, Rank1) and jax.typeof(r).str_short() == "r1[3,2]"
  dense = jnp.outer(U, V)
  np.testing.assert_allclose(to_dense(r), dense)
  np.testing.assert_allclose(r1matmul(r, XS), dense @ XS)
  np.testing.assert_allclose(jax.jit(r1matmul)(r, XS[:, 0]), dense @ XS[:, 0])
  jaxpr = jax.make_jaxpr(lambda u, v, x: r1matmul(rank1(u, v), x))(U, V, XS)
  assert "r1[3,2] = MakeRank1" in str(jaxpr)


def test_rank1_gradient_is_dense_and_lands_on_the_factors():
  loss = lambda r, x: jnp.sum(jnp.tanh(r1matmul(r, x)))
  dense_loss = lambda m, x: jnp.sum(jnp.tanh(m @ x))
  r = rank1(U, V)
  g = jax.grad(loss)(r, XS)
  assert jax.typeof(g) == ShapedArray((3, 2), F32)
  np.testing.assert_allclose(g, jax.grad(dense_loss)(jnp.outer(U, V), XS),
                             rtol=1e-6)
  gu, gv = jax.grad(lambda u, v: loss(rank1(u, v), XS), (0, 1))(U, V)
  ru, rv = jax.grad(lambda u, v: dense_loss(jnp.outer(u, v), XS), (0, 1))(U, V)
  np.testing.assert_allclose(gu, ru, rtol=1e-6)
  np.testing.assert_allclose(gv, rv, rtol=1e-6)
  gu_jit = jax.jit(jax.grad(lambda u, v: loss(rank1(u, v), XS)))(U, V)
  np.testing.assert_allclose(gu_jit, ru, rtol=1e-6)


# --- vmap ---------------------------------------------------------------------------------

XB = jnp.arange(24., dtype=F32).reshape(4, 2, 3) - 11.


def test_vmap_out_axes_spec_and_in_axes_spec_with_axis_size():
  qs = jax.vmap(quantize, out_axes=QSpec(0))(XB)
  assert jax.typeof(qs).str_short() == "q8[4,2,3]"
  assert_q_equal(qs, quantize(XB))  # per-row scales: same as quantizing at once
  ys = jax.vmap(dequantize, in_axes=QSpec(0), axis_size=4)(qs)
  np.testing.assert_allclose(ys, dequantize(qs))
  q0 = jax.vmap(lambda q: q, in_axes=QSpec(0), out_axes=QSpec(0), axis_size=4)(qs)
  assert_q_equal(q0, qs)
  jaxpr = jax.make_jaxpr(jax.vmap(dequantize, in_axes=QSpec(0), axis_size=4))(qs)
  assert "a:q8[4,2,3]" in str(jaxpr) and len(jaxpr.eqns) == 1


def test_vmap_along_a_non_leading_axis():
  qs = jax.vmap(quantize, in_axes=1, out_axes=QSpec(0))(XB)  # maps axis 1 of XB
  assert jax.typeof(qs).shape == (2, 4, 3)
  ys = jax.vmap(dequantize, in_axes=QSpec(1), out_axes=1, axis_size=4)(
      quantize(XB.transpose(1, 0, 2)))
  np.testing.assert_allclose(ys, dequantize(quantize(XB.transpose(1, 0, 2))))


def test_vmap_of_jit_and_of_grad():
  qs = quantize(XB)
  ys = jax.vmap(jax.jit(dequantize), in_axes=QSpec(0), axis_size=4)(qs)
  np.testing.assert_allclose(ys, dequantize(qs))
  ys = jax.jit(jax.vmap(dequantize, in_axes=QSpec(0), axis_size=4))(qs)
  np.testing.assert_allclose(ys, dequantize(qs))
  gs = jax.vmap(jax.grad(lambda q: (dequantize(q) ** 2).sum()),
                in_axes=QSpec(0), axis_size=4)(qs)
  np.testing.assert_allclose(gs, 2 * dequantize(qs))
  gs = jax.vmap(jax.grad(lambda x: dequantize(quantize(x)).sum()))(XB)
  np.testing.assert_array_equal(gs, jnp.ones_like(XB))


def test_vmap_of_a_hi_value_needs_a_spec():
  qs = quantize(XB)
  with pytest.raises(Exception):
    jax.vmap(dequantize)(qs)  # in_axes=0 is an array axis, not a QSpec


class QMatmulDimRule(QMatmul):
  """QMatmul batched by a batch_dim_rule instead of a batch rule."""

  def batch_dim_rule(self, axis_data, dims):
    _, dx = dims
    return None if dx is None else dx


def test_batch_dim_rule_with_unbatched_hi_inputs():
  q = quantize(X)
  xs = jnp.arange(12., dtype=F32).reshape(2, 3, 2)
  f = lambda q, x: QMatmulDimRule(jax.typeof(q), jax.typeof(x))(q, x)
  # the products at full float32 (a TPU's default precision rounds the
  # rule's to bfloat16: 3.488 for 3.496)
  with jax.default_matmul_precision("highest"):
    out = jax.vmap(f, in_axes=(None, 0))(q, xs)
    want = jnp.einsum("ij,bjk->bik", dequantize(q), xs)
    g = jax.vmap(jax.grad(lambda x: f(q, x).sum()))(xs)
  np.testing.assert_allclose(out, want, rtol=1e-6)
  np.testing.assert_allclose(g, jnp.broadcast_to(dequantize(q).sum(0)[:, None],
                                                 xs.shape), rtol=1e-6)


def test_batch_dim_rule_cannot_batch_hi_values():
  qs = quantize(XB)
  f = lambda q, x: QMatmulDimRule(jax.typeof(q), jax.typeof(x))(q, x)
  with pytest.raises(NotImplementedError, match="q8.*implement `batch"):
    jax.vmap(f, in_axes=(QSpec(0), None), axis_size=4)(qs, jnp.ones((3, 2)))


# --- scan ---------------------------------------------------------------------------------

def test_scan_over_hi_values():
  qs = quantize(XB)
  total, ys = jax.lax.scan(lambda c, q: (c + dequantize(q), None),
                           jnp.zeros((2, 3), F32), qs, length=4)
  np.testing.assert_allclose(total, dequantize(qs).sum(0), atol=1e-5)
  with pytest.raises(ValueError, match="length"):
    jax.lax.scan(lambda c, q: (c, None), 0., qs)


def test_scan_carrying_and_stacking_hi_values():
  q = quantize(X)
  double = lambda q, _: (quantize(dequantize(q) * 2), q)
  final, stacked = jax.lax.scan(double, q, None, length=3)
  assert jax.typeof(stacked).str_short() == "q8[3,2,3]"
  np.testing.assert_allclose(dequantize(final), 8 * dequantize(q), rtol=2e-2)
  np.testing.assert_allclose(dequantize(stacked)[2], 4 * dequantize(q),
                             rtol=2e-2)
  _, ys = jax.jit(lambda xs: jax.lax.scan(lambda c, x: (c, quantize(x)), 0., xs))(XB)
  assert_q_equal(ys, quantize(XB))


def test_grad_through_scan_over_hi_values():
  qs = quantize(XB)
  loss = lambda qs: jax.lax.scan(
      lambda c, q: (c + (dequantize(q) ** 2).sum(), None), 0., qs, length=4)[0]
  np.testing.assert_allclose(jax.grad(loss)(qs), 2 * dequantize(qs), rtol=1e-6)


# --- a tuple type, with nesting -------------------------------------------------------

def test_tuple_of_arrays_and_hi_values_through_jit():
  q = quantize(X)
  t = make_tup(jnp.arange(3.), q)
  assert isinstance(t, Tup)
  assert jax.typeof(t).str_short() == "tup(f32[3], q8[2,3])"
  assert jax.typeof(t).lo_ty() == [ShapedArray((3,), F32),
                                   ShapedArray((2, 3), I8),
                                   ShapedArray((2, 1), F32)]
  f = jax.jit(lambda t: make_tup(get(t, 0) * 2, quantize(dequantize(get(t, 1)))))
  out = f(t)
  np.testing.assert_array_equal(out.items[0], 2 * jnp.arange(3.))
  assert_q_equal(out.items[1], q)
  nested = jax.jit(lambda t: make_tup(t, get(t, 0)))(t)
  assert jax.typeof(nested).str_short() == "tup(tup(f32[3], q8[2,3]), f32[3])"
  assert_q_equal(nested.items[0].items[1], q)


def test_tuple_vmap_with_per_component_specs():
  qs = quantize(XB)
  ts = make_tup(jnp.arange(4.), qs, jnp.ones(5))
  spec = TupSpec((0, QSpec(0), None))
  assert jax.typeof(ts).dec_rank(4, spec).str_short() == "tup(f32[], q8[2,3], f32[5])"
  out = jax.vmap(lambda t: get(t, 0) * dequantize(get(t, 1)).sum() + get(t, 2).sum(),
                 in_axes=spec, axis_size=4)(ts)
  np.testing.assert_allclose(
      out, jnp.arange(4.) * dequantize(qs).sum((1, 2)) + 5, rtol=1e-6)
  back = jax.vmap(lambda x, q: make_tup(x, q), in_axes=(0, QSpec(0)),
                  out_axes=TupSpec((0, QSpec(0))))(jnp.arange(4.), qs)
  assert jax.typeof(back).str_short() == "tup(f32[4], q8[4,2,3])"
  assert_q_equal(back.items[1], qs)


def test_scan_over_a_tuple():
  ts = make_tup(jnp.arange(4.), quantize(XB))
  assert jax.typeof(ts).leading_axis_spec() == TupSpec((0, QSpec(0)))
  total, _ = jax.lax.scan(
      lambda c, t: (c + get(t, 0) * dequantize(get(t, 1)), None),
      jnp.zeros((2, 3)), ts, length=4)
  np.testing.assert_allclose(
      total, (jnp.arange(4.)[:, None, None] * dequantize(quantize(XB))).sum(0),
      rtol=1e-5)


# --- misuse -----------------------------------------------------------------------------

def test_reading_a_field_of_a_traced_hi_value_is_an_attribute_error():
  q = quantize(X)
  assert q.values.dtype == I8  # fine on a concrete value
  with pytest.raises(AttributeError, match="values") as e:
    jax.jit(lambda q: q.values)(q)
  assert "opaque" in str(e.value.__cause__)
  with pytest.raises(AttributeError, match="scale"):
    jax.grad(lambda x: quantize(x).scale.sum())(X)


def test_returning_a_value_built_from_tracers_is_a_type_error():
  build = lambda x: QArray(x.astype(I8), x[:, :1])
  for transform in [jax.jit, jax.make_jaxpr]:
    # JAX reports the invalid output in its own words; ours is the context.
    with pytest.raises(TypeError, match="QArray.*not a valid JAX type") as e:
      transform(build)(X)
    ours = e.value.__context__
    assert "built from traced arrays" in str(ours) and "HiPrim" in str(ours)
  with pytest.raises(TypeError, match="QArray.*not a valid JAX type") as e:
    jax.vmap(lambda x: QArray(x.astype(I8), x[:1]), out_axes=QSpec(0))(X)
  assert "built from traced arrays" in str(e.value.__cause__)
  with pytest.raises(TypeError, match="built from traced arrays"):
    jax.grad(lambda x: dequantize(build(x)).sum())(X)


def test_register_hitype_checks_its_arguments():
  class Value:
    pass
  with pytest.raises(TypeError, match="value class first"):
    register_hitype(Value(), lambda v: None)
  with pytest.raises(TypeError, match="callable"):
    register_hitype(Value, 3)
  register_hitype(Value, lambda v: ShapedArray((), F32))
  with pytest.raises(TypeError, match="not a HiType"):
    jax.typeof(Value())


# --- methods attached after the class is created ----------------------------------------

@dataclasses.dataclass(frozen=True)
class Box:
  x: jax.Array


@dataclasses.dataclass(frozen=True)
class BoxTy(HiType):
  inner: ShapedArray


@dataclasses.dataclass(frozen=True)
class BoxSpec(MappingSpec):
  pass


# Every protocol method is attached only now, after class creation.
BoxTy.lo_ty = lambda self: [self.inner]
BoxTy.lower_val = lambda self, b: [b.x]
BoxTy.raise_val = lambda self, x: Box(x)
BoxTy.to_tangent_aval = lambda self: self.inner
BoxTy.str_short = lambda self, *_: "box" + self.inner.str_short(True)[3:]
BoxTy.dec_rank = lambda self, n, spec: BoxTy(self.inner.update(shape=self.inner.shape[1:]))
BoxTy.inc_rank = lambda self, n, spec: BoxTy(self.inner.update(shape=(n, *self.inner.shape)))
BoxTy.leading_axis_spec = lambda self: BoxSpec()
register_hitype(Box, lambda b: BoxTy(jax.typeof(b.x)))


class Unbox(HiPrim):
  def __init__(self, ty):
    self.in_avals, self.out_aval, self.params = (ty,), ty.inner, {}
    super().__init__()

  def expand(self, b):
    return b.x

  def vjp_fwd(self, nzs_in, b):
    return self(b), None

  def vjp_bwd_retval(self, res, g):
    return (g,)

  def batch(self, axis_data, args, dims):
    return unbox(args[0]), 0


def unbox(b):
  return Unbox(jax.typeof(b))(b)


BoxTy.unbox = aval_method(unbox)
BoxTy.doubled = aval_property(lambda b: 2 * unbox(b))


def test_methods_attached_after_class_creation_are_honoured():
  b = Box(jnp.arange(6., dtype=F32).reshape(2, 3))
  assert jax.typeof(b).str_short() == "box[2,3]"
  np.testing.assert_array_equal(jax.jit(unbox)(b), b.x)
  np.testing.assert_array_equal(jax.jit(lambda b: b.unbox())(b), b.x)
  np.testing.assert_array_equal(jax.jit(lambda b: b.doubled)(b), 2 * b.x)
  np.testing.assert_array_equal(
      jax.vmap(lambda b: b.unbox() * 2, in_axes=BoxSpec(), axis_size=2)(b), 2 * b.x)
  total, _ = jax.lax.scan(lambda c, b: (c + unbox(b), None), jnp.zeros(3), b,
                          length=2)
  np.testing.assert_array_equal(total, b.x.sum(0))
  np.testing.assert_array_equal(jax.grad(lambda b: unbox(b).sum())(b),
                                jnp.ones((2, 3)))
  # Attaching a method later also reaches types that already exist.
  ty = jax.typeof(b)
  BoxTy.size_hint = aval_property(lambda b: jax.typeof(b).inner.size)
  try:
    assert jax.jit(lambda b: jnp.float32(b.size_hint))(b) == 6
  finally:
    del BoxTy.size_hint
  assert ty == jax.typeof(b)


# --- 8 CPU devices: explicit sharding and shard_map -------------------------------------

SHARDED_SCRIPT = Path(__file__).with_name("hitypes_sharded.py")


@pytest.fixture(scope="module")
def sharded_results():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, str(SHARDED_SCRIPT)], env=env,
                        capture_output=True, text=True, timeout=600)
  results = {}
  for line in proc.stdout.splitlines():
    if line.startswith(("PASS ", "FAIL ")):
      status, name, *msg = line.split(" ", 2)
      results[name] = (status, msg[0] if msg else "")
  if not results:
    pytest.fail(f"{SHARDED_SCRIPT.name} crashed:\n{proc.stdout}\n{proc.stderr}")
  return results


def _sharded_checks():
  import ast
  tree = ast.parse(SHARDED_SCRIPT.read_text())
  return [n.name for n in tree.body
          if isinstance(n, ast.FunctionDef) and n.name.startswith("check_")]


@pytest.mark.parametrize("name", _sharded_checks())
def test_on_8_cpu_devices(sharded_results, name):
  status, msg = sharded_results.get(name, ("FAIL", "did not run"))
  assert status == "PASS", msg.replace("\\n", "\n")
