"""What rules return is checked against the declared types (issue 11).

Each test makes one rule return something that does not match the primitive's
declared types and checks that the error is raised where the mistake is (once
per trace, not per element) and that it names the class, the method, the
declared type, the returned type and the fix.
"""
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import (HiPrim, HiType, MappingSpec, ShapedArray, Zero, custom_remat,
                   instantiate_zeros, register_hitype, vjp_from_jvp,
                   linearize_from_jvp, vjp_from_lin)

X = jnp.arange(3.) / 3
F32_3 = ShapedArray((3,), jnp.float32)


class Unary(HiPrim):
  """x -> sin(x) with every rule correct; tests override one rule at a time."""

  def __init__(self, x_aval, out_aval=None):
    self.in_avals = (x_aval,)
    self.out_aval = x_aval if out_aval is None else out_aval
    self.params = {}
    super().__init__()

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * instantiate_zeros(t)

  def vjp_fwd(self, nzs_in, x):
    return self(x), jnp.cos(x)

  def vjp_bwd_retval(self, cos_x, g):
    return (cos_x * g,)

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]


def apply(cls):
  return lambda x: cls(jax.typeof(x))(x)


def assert_names(excinfo, *parts):
  message = str(excinfo.value)
  for part in parts:
    assert part in message, f"{part!r} not in {message!r}"


# --- 1. expand, eagerly and when lowered ---------------------------------------------

class ExpandF16(Unary):
  def expand(self, x):
    return jnp.sin(x).astype(jnp.float16)


class ExpandSum(Unary):
  def expand(self, x):
    return jnp.sum(x)


@pytest.mark.parametrize("jit", [False, True])
def test_expand_wrong_dtype(jit):
  f = apply(ExpandF16)
  with pytest.raises(TypeError) as e:
    (jax.jit(f) if jit else f)(X)
  assert_names(e, "ExpandF16.expand", "float16[3]", "out_aval declares float32[3]",
               ".astype(jnp.float32)")


@pytest.mark.parametrize("jit", [False, True])
def test_expand_wrong_shape(jit):
  f = apply(ExpandSum)
  with pytest.raises(TypeError) as e:
    (jax.jit(f) if jit else f)(X)
  assert_names(e, "ExpandSum.expand", "float32[]", "declares float32[3]",
               "shape (3,)")


def test_expand_weak_type_is_converted_to_the_declared_one():
  # Only the weak type differs: the value is converted (no data changes), so
  # the eager result has the declared type, like the jit result.
  x = jnp.float32(1.0)  # a strong float32[]

  class ReturnsWeak(Unary):
    def expand(self, x):
      return jnp.asarray(2.0)  # weakly typed

  f = apply(ReturnsWeak)
  plus_bf16 = lambda x: f(x) + jnp.bfloat16(1)
  assert jax.typeof(f(x)) == jax.typeof(jax.jit(f)(x)) == jax.typeof(x)
  assert plus_bf16(x).dtype == jax.jit(plus_bf16)(x).dtype == jnp.float32


def test_correct_expand_still_runs_eagerly_and_jitted():
  f = apply(Unary)
  np.testing.assert_allclose(f(X), jnp.sin(X), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(f)(X), jnp.sin(X), rtol=1e-6)
  # a weakly typed declared type with a weakly typed result is fine
  assert f(1.0).dtype == jnp.float32


# --- 2. jvp ----------------------------------------------------------------------

class JvpF16(Unary):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), (jnp.cos(x) * t).astype(jnp.float16)


class JvpTangentShape(Unary):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.sum(jnp.cos(x) * t)


class JvpPrimalShape(Unary):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.sum(self(x)), jnp.cos(x) * t


@pytest.mark.parametrize("jit", [False, True])
def test_jvp_tangent_wrong_dtype_or_shape(jit):
  for cls, got, fix in ((JvpF16, "float16[3]", ".astype(jnp.float32)"),
                        (JvpTangentShape, "float32[]", "shape (3,)")):
    f = lambda x: jax.jvp(apply(cls), (x,), (jnp.ones(3),))
    with pytest.raises(TypeError) as e:
      (jax.jit(f) if jit else f)(X)
    assert_names(e, f"{cls.__name__}.jvp", "tangent", got, "declares float32[3]",
                 fix)


def test_jvp_primal_wrong_shape():
  with pytest.raises(TypeError) as e:
    jax.jvp(apply(JvpPrimalShape), (X,), (jnp.ones(3),))
  assert_names(e, "JvpPrimalShape.jvp", "float32[]", "out_aval declares float32[3]")


class Floor(Unary):
  """float32[3] -> int32[3]: the output's tangent type is float0."""

  def __init__(self, x_aval):
    super().__init__(x_aval, x_aval.update(dtype=jnp.int32, weak_type=False))

  def expand(self, x):
    return jnp.floor(x).astype(jnp.int32)

  def jvp(self, primals, tangents):
    (x,), _ = primals, tangents
    return self(x), jnp.zeros(3)  # must be None (or float0)


def test_jvp_float_tangent_for_integer_output():
  with pytest.raises(TypeError) as e:
    jax.jvp(apply(Floor), (X,), (jnp.ones(3),))
  assert_names(e, "Floor.jvp", "float32[3]", "float0[3]", "return None")
  # jax.custom_jvp wants a float0 zero there, not None; custom_vjp's bwd
  # (like hijax) takes None
  assert "custom_jvp" not in str(e.value) and "custom_vjp's bwd" in str(e.value)


def test_jvp_none_tangent_for_integer_output_is_fine():
  class FloorOk(Floor):
    def jvp(self, primals, tangents):
      return self(primals[0]), None
  out, t = jax.jvp(apply(FloorOk), (X,), (jnp.ones(3),))
  assert out.dtype == jnp.int32 and t.dtype == jax.dtypes.float0


# --- 3. linearized -----------------------------------------------------------------

class LinWrongShape(Unary):
  def lin(self, nzs_in, x):
    return self(x), jnp.cos(x)

  def linearized(self, cos_x, t):
    return jnp.sum(cos_x * t)


def test_linearized_wrong_shape():
  with pytest.raises(TypeError) as e:  # raised when the map is traced
    jax.linearize(apply(LinWrongShape), X)[1](jnp.ones(3))
  assert_names(e, "LinWrongShape.linearized", "float32[]", "declares float32[3]",
               "shape (3,)")


def test_linearized_wrong_shape_through_vjp_from_lin():
  class Derived(LinWrongShape):
    vjp_fwd, vjp_bwd_retval = vjp_from_lin
  with pytest.raises(TypeError) as e:
    jax.grad(lambda x: apply(Derived)(x).sum())(X)
  assert_names(e, "Derived.linearized", "float32[]", "declares float32[3]")


# --- 4. cotangents: vjp_bwd_retval and acc.accum --------------------------------------

class RetvalF16(Unary):
  def vjp_bwd_retval(self, cos_x, g):
    return ((cos_x * g).astype(jnp.float16),)


class AccumInt(Unary):
  def vjp_bwd(self, cos_x, g, x_acc):
    x_acc.accum(jnp.ones(3, jnp.int32))


@pytest.mark.parametrize("jit", [False, True])
def test_cotangent_wrong_dtype_is_rejected(jit):
  for cls, method, got in ((RetvalF16, "vjp_bwd_retval", "float16[3]"),
                           (AccumInt, "vjp_bwd", "int32[3]")):
    g = jax.grad(lambda x: apply(cls)(x).sum())
    with pytest.raises(TypeError) as e:
      (jax.jit(g) if jit else g)(X)
    assert_names(e, f"{cls.__name__}.{method}", "cotangent", got,
                 "float32[3]", ".astype(jnp.float32)")


def test_cotangent_of_integer_input_may_be_none():
  class IntScale(HiPrim):
    def __init__(self, x_aval, n_aval):
      self.in_avals, self.out_aval, self.params = (x_aval, n_aval), x_aval, {}
      super().__init__()

    def expand(self, x, n):
      return x * n

    def vjp_fwd(self, nzs_in, x, n):
      return self(x, n), n

    def vjp_bwd_retval(self, n, g):
      return g * n, None

  f = lambda x, n: IntScale(jax.typeof(x), jax.typeof(n))(x, n).sum()
  np.testing.assert_allclose(jax.grad(f)(X, 3), 3 * jnp.ones(3))


# --- 6. lower_val ------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
  a: jax.Array
  b: jax.Array


@dataclass(frozen=True)
class PairSpec(MappingSpec):
  axis: int = 0


@dataclass(frozen=True)
class PairTy(HiType):
  n: int

  def lo_ty(self):
    return [ShapedArray((self.n,), jnp.float32)] * 2

  def lower_val(self, p):
    return [p.a, p.b]

  def raise_val(self, a, b):
    return Pair(a, b)

  def to_tangent_aval(self):
    return ShapedArray((2, self.n), jnp.float32)

  def str_short(self, short_dtypes=False, mesh_axis_types=False):
    return f"pair[{self.n}]"

  def dec_rank(self, size, spec):
    return self

  def inc_rank(self, size, spec):
    return self


register_hitype(Pair, lambda p: PairTy(p.a.shape[0]))


@dataclass(frozen=True)
class ShortPair:
  a: jax.Array
  b: jax.Array


@dataclass(frozen=True)
class ShortPairTy(PairTy):
  def lower_val(self, p):
    return [p.a]  # forgets p.b


register_hitype(ShortPair, lambda p: ShortPairTy(p.a.shape[0]))


def test_lower_val_wrong_count():
  with pytest.raises(ValueError) as e:
    jax.jit(lambda p: p)(ShortPair(X, X))
  assert_names(e, "ShortPairTy.lower_val", "1 array", "lo_ty", "2")


# --- 7. batching rules ----------------------------------------------------------------

def dim_rule(value):
  class DimRule(Unary):
    def batch_dim_rule(self, axis_data, in_dims):
      return value
  DimRule.__name__ = DimRule.__qualname__ = "DimRule"
  return DimRule


XS = jnp.arange(6.).reshape(2, 3) / 6


@pytest.mark.parametrize("dim", [2, -3, 1.0, "0"])
def test_batch_dim_rule_illegal_dim(dim):
  with pytest.raises(TypeError) as e:
    jax.vmap(apply(dim_rule(dim)))(XS)
  assert_names(e, "DimRule.batch_dim_rule", repr(dim), "or an int from",
               "-2", "1")


def test_batch_dim_rule_negative_dim_counts_from_the_end():
  np.testing.assert_allclose(jax.vmap(apply(dim_rule(-1)))(XS), jnp.sin(XS),
                             rtol=1e-6)


def test_batch_dim_rule_none_for_a_batched_output():
  with pytest.raises(ValueError) as e:
    jax.vmap(apply(dim_rule(None)))(XS)
  assert_names(e, "DimRule.batch_dim_rule", "None", "batched")


def batch_rule(result):
  class BatchRule(Unary):
    def batch(self, axis_data, args, dims):
      (x,), (d,) = args, dims
      return result(jnp.sin(jnp.moveaxis(x, d, 0)))
  return BatchRule


@pytest.mark.parametrize("result,got", [
    (lambda y: (y, 2), "2"), (lambda y: (y, None), "None"),
    (lambda y: (y, 1), "float32[3,2]"), (lambda y: (y[0], 0), "float32[3]"),
    (lambda y: (y, PairSpec(0)), "PairSpec")])
def test_batch_rule_illegal_output(result, got):
  with pytest.raises(TypeError) as e:
    jax.vmap(apply(batch_rule(result)))(XS)
  assert_names(e, "BatchRule.batch", got)


class MakePair(HiPrim):
  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = PairTy(x_aval.shape[0])
    self.params = {}
    super().__init__()

  def expand(self, x):
    return Pair(x, 2 * x)

  def batch(self, axis_data, args, dims):
    return args[0], 0  # a plain int for a hi-typed output


def test_batch_rule_int_dim_for_hi_output():
  with pytest.raises(TypeError) as e:
    jax.vmap(lambda x: MakePair(jax.typeof(x))(x), out_axes=PairSpec(0),
             axis_size=2)(XS)
  assert_names(e, "MakePair.batch", "MappingSpec", "pair[3]")


# --- 8. vjp_bwd_retval_logs ----------------------------------------------------------

class Logs2(HiPrim):
  vjp_bwd_retval_logs = True

  def __init__(self, x_aval, y_aval):
    self.in_avals, self.out_aval, self.params = (x_aval, y_aval), x_aval, {}
    super().__init__()

  def expand(self, x, y):
    return x * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (x, y)

  def vjp_bwd_retval(self, res, g):
    x, y = res
    return g * y, g * x  # forgot the logs


def test_logs_flag_set_but_only_cotangents_returned():
  f = lambda x, y: Logs2(jax.typeof(x), jax.typeof(y))(x, y).sum()
  with pytest.raises(TypeError) as e:
    jax.grad(f)(X, X)
  assert_names(e, "Logs2.vjp_bwd_retval", "vjp_bwd_retval_logs = True",
               "(cotangents, logs)")


# --- 9. acc.accum shape ---------------------------------------------------------------

class AccumShape(Unary):
  def vjp_bwd(self, cos_x, g, x_acc):
    x_acc.accum(jnp.ones(5))


def test_accum_wrong_shape_names_primitive_and_method():
  with pytest.raises(TypeError) as e:
    jax.grad(lambda x: apply(AccumShape)(x).sum())(X)
  assert_names(e, "AccumShape.vjp_bwd", "accum", "float32[5]", "float32[3]",
               "shape (3,)")


# --- 10. arithmetic on a symbolic zero ---------------------------------------------------

class ZeroArith(HiPrim):
  def __init__(self, x_aval, y_aval):
    self.in_avals, self.out_aval, self.params = (x_aval, y_aval), x_aval, {}
    super().__init__()

  def expand(self, x, y):
    return x * y

  def jvp(self, primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return self(x, y), tx * y + x * ty  # fails when one tangent is Zero


def test_zero_arithmetic_in_a_rule_gets_advice():
  f = lambda x, y: ZeroArith(jax.typeof(x), jax.typeof(y))(x, y)
  with pytest.raises(TypeError) as e:
    jax.jvp(lambda x: f(x, X), (X,), (jnp.ones(3),))
  assert_names(e, "ZeroArith.jvp", "Zero", "instantiate_zeros",
               "isinstance(t, hijax.Zero)", "nzs_in")


# --- 11. custom_remat's f_rem -------------------------------------------------------------

def my_f(x):
  return jnp.sin(x)


def my_fwd(policy, x):
  return jnp.sin(x), None


def my_rem(res, x):
  return jnp.sum(jnp.sin(x)), jnp.cos(x)  # wrong shape


def my_bwd(cos_x, g):
  return (cos_x * g,)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_custom_remat_f_rem_wrong_shape(checkpoint):
  f = custom_remat(my_f, my_fwd, my_rem, my_bwd)
  loss = lambda x: f(x).sum()
  with _remat3():
    g = jax.grad(jax.checkpoint(loss) if checkpoint else loss)
    with pytest.raises(TypeError) as e:
      g(X)
  assert_names(e, "custom_remat", "my_f", "f_rem", "my_rem", "float32[]",
               "float32[3]")
  assert "Rematerialize" not in str(e.value)


def _remat3():
  from contextlib import contextmanager

  @contextmanager
  def ctx():
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", True)
    try:
      yield
    finally:
      jax.config.update("jax_remat3", old)
  return ctx()


# --- 12. deriving the wrong pair ---------------------------------------------------------

@pytest.mark.parametrize("pair,targets", [
    (vjp_from_jvp, "vjp_fwd, vjp_bwd_retval"),
    (vjp_from_lin, "vjp_fwd, vjp_bwd_retval"),
    (linearize_from_jvp, "lin, linearized")])
def test_wrong_pair_rejected_at_class_creation(pair, targets):
  wrong = "jvp, linearized" if targets.startswith("vjp") else "vjp_fwd, vjp_bwd_retval"
  with pytest.raises(TypeError) as e:
    exec(f"class Wrong(Unary):\n  {wrong} = pair", dict(Unary=Unary, pair=pair))
  assert_names(e, "Wrong", repr(pair), targets, wrong.split(",")[0])


def test_accum_wrong_dtype_under_vmap_of_grad():
  g = jax.vmap(jax.grad(lambda x: apply(AccumInt)(x).sum()))
  with pytest.raises(TypeError) as e:
    g(XS)
  assert_names(e, "AccumInt.vjp_bwd", "acc.accum", "int32[3]", "float32[3]")


class MakeShortPair(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), ShortPairTy(3), {}
    super().__init__()

  def expand(self, x):
    return ShortPair(x, 2 * x)


def test_lower_val_wrong_count_for_a_value_built_by_a_primitive():
  f = jax.jit(lambda x: MakeShortPair(jax.typeof(x))(x))
  with pytest.raises(ValueError) as e:
    f(X)
  assert_names(e, "ShortPairTy.lower_val", "1 array", "lo_ty lists 2")


class _WeakThenWrong(HiPrim):
  """expand returns a weakly typed first output (converted) and a second of
  the wrong shape (an error), eagerly as under jit."""

  def __init__(self, aval):
    self.in_avals = (aval,)
    self.out_aval = (ShapedArray((), jnp.float32), ShapedArray((2,), jnp.float32))
    self.params = {}
    super().__init__()

  def expand(self, x):
    return jnp.asarray(2.0), jnp.zeros(3, jnp.float32)


def test_an_output_after_a_converted_weak_one_is_still_checked():
  x = jnp.ones(2, jnp.float32)
  assert jax.typeof(jnp.asarray(2.0)).weak_type  # what the first output is
  with pytest.raises(TypeError) as e:
    _WeakThenWrong(jax.typeof(x))(x)
  assert_names(e, "_WeakThenWrong.expand", "output 1", "float32[3]", "float32[2]")


class _InnerVmapOutAxesNone(Unary):
  """A right batch_dim_rule; expand's own inner vmap has out_axes=None for a
  batched output, which JAX refuses with a ValueError of its own."""

  def expand(self, x):
    return jax.vmap(jnp.sin, out_axes=None)(x)

  def batch_dim_rule(self, axis_data, in_dims):
    return 0


def test_expand_s_own_out_axes_error_is_not_blamed_on_batch_dim_rule():
  """Only an output that batch_dim_rule says is unbatched but that vmapping
  expand batches is the rule's error; JAX's same-worded error from inside
  expand reaches the caller as JAX raised it."""
  with pytest.raises(ValueError) as e:
    jax.vmap(apply(_InnerVmapOutAxesNone))(XS)
  assert "batch_dim_rule" not in str(e.value)
  assert "out_axes" in str(e.value)
