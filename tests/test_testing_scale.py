"""check_rules at every scale: the cases of issue 21 (false alarms at large
inputs, float32 hi types, a backward rule wrong only at second order) and the
verdicts on correct and wrong rules from 1e-3 to 1e6 in float32, float64 and
bfloat16."""
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import HiPrim, HiType, ShapedArray, register_hitype
from hijax.testing import InconclusiveCheckError, RuleCheckError, check_rules

import zoo
from unary_prim import UnaryPrim
from zoo import inst

F32 = jnp.dtype("float32")


def _fails(fn, *args, **kwargs) -> RuleCheckError:
  with pytest.raises(RuleCheckError) as info:
    check_rules(fn, *args, **kwargs)
  return info.value


# --- 1 and 2: a correct sin at large inputs --------------------------------------------

def test_case1_float32_sin_at_10_50_100_passes():
  x = jnp.array([10., 50., 100.], jnp.float32)
  report = check_rules(zoo.sin_derived, x, x64=False)
  assert report.passed and report.dtype == "float32"
  assert {"jvp", "vjp", "lin"} <= set(report.modes_run)


class Float32Sin(UnaryPrim):
  """sin with float32 hard-coded in its types: checked in float32 even with
  the default x64=None."""

  def __init__(self, x_aval):
    super().__init__(x_aval.update(dtype=F32))

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), jnp.cos(x)

  def vjp_bwd_retval(self, cos_x, g):
    return (cos_x * g,)


def test_case1_hard_coded_float32_sin_passes():
  x = jnp.array([10., 50., 100.], jnp.float32)
  report = check_rules(lambda x: Float32Sin(jax.typeof(x))(x), x)
  assert report.passed and report.dtype == "float32"


def test_case2_float64_sin_at_1e5_to_1e6_passes():
  x = jnp.array([1e5, 3e5, 1e6])
  report = check_rules(zoo.sin_derived, x)
  assert report.passed and report.dtype == "float64"


class WrongSin(zoo.SinDerived):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), 1.01 * jnp.cos(x) * t  # one per cent off


def test_a_one_per_cent_error_is_caught_at_large_inputs():
  for x, x64 in [(jnp.array([1e5, 3e5, 1e6]), True),
                 (jnp.array([10., 50., 100.], jnp.float32), False)]:
    err = _fails(lambda x: WrongSin(jax.typeof(x))(x), x, x64=x64,
                 modes="jvp")
    assert err.rule == "WrongSin.jvp"


# --- correct rules pass and wrong ones fail, 1e-3 to 1e6, three dtypes -----------------

MAGNITUDES = [1e-3, 1.0, 1e3, 1e6]
DTYPES = ["float64", "float32", "bfloat16"]


def _point(magnitude, dtype):
  """Three numbers of about ``magnitude`` (a NumPy array: float64 without
  x64 enabled)."""
  return (magnitude * np.array([1.0, -2.5, 7.25])).astype(jnp.dtype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("name", ["sin_derived", "cube_lin", "square"])
def test_correct_rules_pass_at_every_scale(name, magnitude, dtype):
  entry = zoo.BY_NAME[name]
  x = _point(magnitude, dtype)
  report = check_rules(entry.fn, x, x64=dtype == "float64",
                       modes=("jvp", "vjp") + (("lin",) if "lin" in
                                              entry.transforms else ()),
                       accept_inconclusive=True)
  if (name, magnitude, dtype) == ("sin_derived", 1e6, "bfloat16"):
    # sin varies faster than bfloat16's steps at 1e6 (see below)
    assert report.verdict == "inconclusive" and not report.failures, report
  else:
    assert report.passed, report
  assert report.dtype == dtype


class CubeWrongJvp(zoo.CubeLin):
  """x ** 3 with a jvp rule 20% off (and vjp derived from it, so both are
  wrong; only finite differences can tell)."""

  def lin(self, nzs_in, x):
    return self(x), 3.6 * x ** 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_wrong_rules_fail_at_every_scale(magnitude, dtype):
  x = _point(magnitude, dtype)
  err = _fails(lambda x: CubeWrongJvp(jax.typeof(x))(x), x,
               x64=dtype == "float64", modes=("jvp", "vjp", "lin"))
  assert err.report.dtype == dtype
  assert "CubeWrongJvp.jvp (jvp_from_lin)" in {f.rule for f in err.failures}


def test_finite_differences_that_cannot_resolve_say_so():
  """sin at 1e6 in bfloat16: neighbouring bfloat16 numbers are 4096 apart, so
  no difference quotient says anything about cos(x); the check neither fails
  nor claims to have compared, and the report says which elements and why."""
  with pytest.raises(InconclusiveCheckError, match="SinDerived.jvp: no "
                     "conclusive comparison") as raised:
    check_rules(zoo.sin_derived, _point(1e6, "bfloat16"), x64=False,
                modes="jvp")
  report = raised.value.report
  assert report.verdict == "inconclusive" and not report.passed
  assert raised.value.rules == ["SinDerived.jvp"]
  # sin varies faster than bfloat16's steps at 1e6 (its period is 6)
  assert report.inconclusive and "not smooth at the scale of the steps" in (
      report.inconclusive[0])
  assert str(report).startswith("check_rules on SinDerived in bfloat16: "
                                "INCONCLUSIVE: 0 conclusive comparisons")
  assert "NOT JUDGED  SinDerived.jvp" in str(report)
  assert "a point away from kinks" in str(raised.value)


# --- 3 and 4: a pipeline through a hi type that declares float32 ------------------------

@dataclass(frozen=True)
class Box:
  x: jax.Array


@dataclass(frozen=True)
class BoxTy(HiType):
  """A box of a float32 array of a given shape."""
  shape: tuple

  def lo_ty(self):
    return [ShapedArray(self.shape, F32)]

  def lower_val(self, b):
    return [b.x]

  def raise_val(self, x):
    return Box(x)

  def to_tangent_aval(self):
    return ShapedArray(self.shape, F32)


register_hitype(Box, lambda b: BoxTy(tuple(b.x.shape)))


class MakeBox(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), BoxTy(
        x_aval.shape), {}
    super().__init__()

  def expand(self, x):
    return Box(x)  # a float64 x would contradict BoxTy: not checkable in f64

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), inst(t)

  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, _, g):
    return (inst(g),)


class Unbox(HiPrim):
  def __init__(self, ty):
    self.in_avals, self.out_aval, self.params = (ty,), ShapedArray(
        ty.shape, F32), {}
    super().__init__()

  def expand(self, b):
    return b.x

  def jvp(self, primals, tangents):
    (b,), (t,) = primals, tangents
    return self(b), inst(t)

  def vjp_fwd(self, nzs_in, b):
    return self(b), None

  def vjp_bwd_retval(self, _, g):
    return (inst(g),)


def _pipeline(unbox=Unbox, make=MakeBox):
  def f(x):
    b = make(jax.typeof(x))(x)
    return unbox(jax.typeof(b))(b)
  return f


X3 = jnp.array([0.5, -1.0, 2.0], jnp.float32)


@pytest.mark.parametrize("x64", [None, False])
def test_case3_pipeline_through_a_float32_hi_type_passes(x64):
  """The checker picks its dtype by running the function (in float64
  MakeBox.expand contradicts BoxTy), and the symbolic-zero check handles the
  hi value Unbox takes."""
  report = check_rules(_pipeline(), X3, x64=x64)
  assert report.passed, report
  assert report.dtype == "float32"
  assert {"expand", "jvp", "vjp"} <= set(report.modes_run)


class UnboxWrongVjp(Unbox):
  def vjp_bwd_retval(self, _, g):
    return (2 * inst(g),)


class MakeBoxLyingNzs(MakeBox):
  def vjp_fwd(self, nzs_in, x):
    return self(x), None, False  # claims the box's tangent is zero


def test_case4_wrong_rules_of_hi_typed_primitives_are_named():
  err = _fails(_pipeline(unbox=UnboxWrongVjp), X3)
  assert {f.rule for f in err.failures} == {
      "MakeBox.vjp_fwd/vjp_bwd_retval, UnboxWrongVjp.vjp_fwd/vjp_bwd_retval"}
  assert "<ȳ, J ṫ> = <vjp(ȳ), ṫ>" in err.check
  err = _fails(_pipeline(make=MakeBoxLyingNzs), X3, modes="vjp")
  assert "MakeBoxLyingNzs.vjp_fwd" in {f.rule for f in err.failures}
  nzs = [f for f in err.failures if f.rule == "MakeBoxLyingNzs.vjp_fwd"][0]
  assert "nzs_out" in nzs.check and "from the jvp rule" in nzs.detail


# --- 5: a backward rule whose second derivative is lost ---------------------------------

class SinStopGradient(zoo.Unary):
  """sin with a first-order-correct backward rule that is not differentiable
  again: jax.hessian is then 0 instead of -sin x."""

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return (g * jax.lax.stop_gradient(jnp.cos(x)),)


def test_case5_backward_rule_wrong_at_second_order_is_caught():
  fn = lambda x: SinStopGradient(jax.typeof(x))(x)
  x = jnp.array([0.3, -1.2, 2.0])
  hess = jax.hessian(lambda x: fn(x).sum())(x)
  np.testing.assert_allclose(hess, 0 * hess)  # the bug
  assert check_rules(fn, x, modes=("jvp", "vjp"), order=1).passed
  err = _fails(fn, x)
  assert {f.rule for f in err.failures} == {
      "SinStopGradient.vjp_fwd/vjp_bwd_retval"}
  assert "backward pass" in err.check and "finite differences" in err.check


def test_second_order_check_passes_correct_rules_and_states_its_cost():
  report = check_rules(zoo.log1pexp, jnp.array([-2.0, 0.5, 3.0]))
  assert report.passed
  assert any("backward pass" in r and "differentiated again" in r
             for r in report.ran), report
  assert report.cost["second-order evaluations"] > 0
  assert "cost" in str(report)
  # opt out
  report = check_rules(zoo.log1pexp, jnp.array([-2.0, 0.5, 3.0]), order=1)
  assert not any("differentiated again" in r for r in report.ran)
  assert "second-order evaluations" not in report.cost
