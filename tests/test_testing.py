"""Tests of hijax.testing.check_rules: it passes every primitive of the zoo and
catches a deliberately wrong rule of each kind, naming the rule."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

from hijax import HiPrim, ShapedArray, vjp_from_jvp
from hijax.testing import (MODES, RuleCheckError, RuleReport, assert_rules,
                           check_rules, defined_rules)

import zoo
from unary_prim import UnaryPrim
from zoo import inst


# --- every zoo primitive passes, and the checks its rules call for run --------------------

EXPECTED_MODES = {
    "jvp": "jvp", "vjp": "vjp", "lin": "lin", "vmap": "batch",
}


@pytest.mark.parametrize("entry", zoo.ENTRIES, ids=lambda e: e.name)
def test_zoo_passes(entry):
  report = assert_rules(entry.fn, *entry.args(), **entry.check_kwargs)
  assert report.passed
  assert report.dtype == "float64"
  expected = {"expand"} | {EXPECTED_MODES[t] for t in entry.transforms}
  if entry.name in ("matvec", "scale"):
    expected.add("transpose")
  assert expected <= set(report.modes_run), report


@pytest.mark.parametrize("name, second_order", [
    ("tanh", True),          # its jvp binds Sech2
    ("newton_sqrt", True),   # its backward rule binds FixedPoint again
    ("sech2", True),         # its jvp binds Sech2 itself (the primal)
    ("log1pexp", False),     # rules in plain JAX: nothing to check there
])
def test_second_order_runs_where_rules_bind_primitives(name, second_order):
  entry = zoo.BY_NAME[name]
  prim = jax.make_jaxpr(entry.fn)(*entry.args()).jaxpr.eqns[0].params["_prim"]
  modes = [m for m in ("jvp", "vjp", "lin") if m in defined_rules(prim)]
  report = check_rules(entry.fn, *entry.args(), modes=modes + ["second_order"])
  rule_by_rule = any(r.startswith("second_order: second order, on")
                     for r in report.ran)
  assert rule_by_rule == second_order, report
  if not second_order:
    assert any(m == "second_order" and "binds no hijax primitive" in why
               for m, why in report.skipped)
  # the second derivative against finite differences runs either way
  assert any("differentiated again" in r for r in report.ran), report



class Sech2Bare(zoo.Unary):  # no derivative rule
  def expand(self, x):
    return 1 / jnp.cosh(x) ** 2


class TanhBindsBare(zoo.Tanh):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), Sech2Bare(jax.typeof(x))(x) * t


def test_a_derived_function_whose_primitives_define_no_derivative_rule():
  """The tangent map binds Sech2Bare, which has no derivative rule: the
  second-order mode says so, and lists the jvp rule as first order only
  (its second derivative needs Sech2Bare's)."""
  x = zoo._vec(0.3, -1.2)
  report = check_rules(lambda x: TanhBindsBare(jax.typeof(x))(x), x,
                       modes=("jvp", "second_order"))
  assert report.passed, report
  assert ("second_order", "the tangent map x, ṫ -> jvp(f, x, ṫ)[1]: its "
          "primitives (Sech2Bare) define no derivative rule") in report.skipped
  assert [r.split(":")[0] for r in report.first_order_only] == [
      "TanhBindsBare.jvp"], report

def test_zoo_covers_every_kind_of_rule():
  kinds = {}
  for e in zoo.ENTRIES:
    prims = jax.make_jaxpr(e.fn)(*e.args()).jaxpr.eqns
    for eqn in prims:
      for mode, name in defined_rules(eqn.params["_prim"]).items():
        kinds.setdefault(mode, set()).add(name.split(".", 1)[1])
  assert set(kinds) == {"expand", "jvp", "vjp", "lin", "transpose", "batch"}
  assert {"vjp_fwd/vjp_bwd_retval", "vjp_fwd/vjp_bwd",
          "vjp_fwd/vjp_bwd_retval (vjp_from_lin)",
          "vjp_fwd/vjp_bwd_retval (vjp_from_jvp)"} <= kinds["vjp"]
  assert {"jvp", "jvp (jvp_from_lin)"} <= kinds["jvp"]
  assert {"lin/linearized", "lin/linearized (linearize_from_jvp)"} <= kinds["lin"]
  assert {"batch", "batch_dim_rule"} <= kinds["batch"]


def test_defined_rules():
  assert defined_rules(zoo.Log1pExp) == {
      "expand": "Log1pExp.expand", "jvp": "Log1pExp.jvp",
      "vjp": "Log1pExp.vjp_fwd/vjp_bwd_retval",
      "batch": "Log1pExp.batch_dim_rule"}
  assert defined_rules(zoo.Scale) == {
      "expand": "Scale.expand", "transpose": "Scale.transpose",
      "batch": "Scale.batch_dim_rule"}
  assert defined_rules(zoo.CubeSres)["vjp"] == "CubeSres.vjp_fwd/vjp_bwd"


# --- each kind of wrong rule is caught, and named ----------------------------------------

def _fails(fn, *args, **kwargs) -> RuleCheckError:
  with pytest.raises(RuleCheckError) as info:
    check_rules(fn, *args, **kwargs)
  err = info.value
  assert isinstance(err, AssertionError)
  assert err.failures and str(err).startswith(f"{len(err.failures)} rule check")
  return err


def _rules(err):
  return [f.rule for f in err.failures]


class BadJvp(zoo.Log1pExp):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.exp(x) / (1 + jnp.exp(x)) ** 2 * t  # the 2nd derivative


def test_catches_wrong_jvp():
  err = _fails(lambda x: BadJvp(jax.typeof(x))(x), zoo._vec(-2., 0.5, 3.))
  assert err.rule == "BadJvp.jvp"
  assert "finite differences" in err.check
  assert err.max_error > 0.1
  assert set(_rules(err)) == {"BadJvp.jvp"}  # the vjp is checked against FD
  assert "BadJvp.jvp: jvp vs central finite differences of expand" in str(err)
  assert "input args[0] = f64[3] [-2. ,  0.5,  3. ]" in str(err)
  assert "max abs error" in str(err)


class BadVjp(zoo.Log1pExp):
  def vjp_bwd_retval(self, x, g):
    return (jax.nn.sigmoid(-x) * g,)  # sign error in the exponent


def test_catches_wrong_vjp():
  err = _fails(lambda x: BadVjp(jax.typeof(x))(x), zoo._vec(-2., 0.5, 3.))
  assert err.rule == "BadVjp.vjp_fwd/vjp_bwd_retval"
  assert "vjp vs the jvp rule" in err.check
  assert set(_rules(err)) == {"BadVjp.vjp_fwd/vjp_bwd_retval"}


class VjpNotTransposed(zoo.MatVec):
  """The backward rule applies J instead of its transpose."""

  def vjp_bwd_retval(self, res, g):
    A, x = res
    g = inst(g)
    return jnp.outer(x, g), A @ g  # should be outer(g, x), A.T @ g


def test_catches_vjp_that_is_not_the_transpose_of_jvp():
  A = jnp.array([[1., 2., 0.], [-1., 0.5, 3.], [0., 1., 1.]])
  x = zoo._vec(1., -2., 0.5)
  err = _fails(lambda A, x: VjpNotTransposed(jax.typeof(A), jax.typeof(x))(A, x),
               A, x, modes=("jvp", "vjp"))
  assert err.rule == "VjpNotTransposed.vjp_fwd/vjp_bwd_retval"
  assert "<ȳ, J ṫ> = <vjp(ȳ), ṫ>" in err.check
  # each input alone pins down which cotangent is wrong
  assert any("args[1] only" in f.inputs for f in err.failures)
  assert any("args[0] only" in f.inputs for f in err.failures)


class BadLin(UnaryPrim):
  """sin, with a correct jvp and a wrong lin (it saves sin x, not cos x)."""

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * t

  def lin(self, nzs_in, x):
    return self(x), jnp.sin(x)

  def linearized(self, slope, t):
    return slope * t

  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


def test_catches_wrong_lin():
  err = _fails(lambda x: BadLin(jax.typeof(x))(x), zoo._vec(0.3, -1.2, 2.))
  assert err.rule == "BadLin.lin/linearized"
  assert "linearized vs the jvp rule" in err.check
  assert set(_rules(err)) == {"BadLin.lin/linearized"}


class BadLinearized(zoo.CubeLin):
  def linearized(self, slope, t):
    return slope * t + 0.01 * t ** 2  # not even linear


def test_catches_wrong_linearized_without_a_jvp_to_compare_with():
  # jvp_from_lin and vjp_from_jvp both derive from the wrong rule; finite
  # differences catch all three
  err = _fails(lambda x: BadLinearized(jax.typeof(x))(x), zoo._vec(0.3, -1.2, 2.))
  assert err.rule == "BadLinearized.jvp (jvp_from_lin)"
  assert "BadLinearized.lin/linearized" in _rules(err)


class BadTranspose(zoo.Scale):
  def transpose(self, ct, c, x_acc):
    x_acc.accum(inst(ct))  # forgot the factor c


def test_catches_wrong_transpose():
  err = _fails(lambda c, x: BadTranspose(jax.typeof(c), jax.typeof(x))(c, x),
               jnp.float32(1.5), zoo._vec(1., -2., 0.5), linear_argnums=[1])
  assert err.rule == "BadTranspose.transpose"
  assert "transpose vs the linear map" in err.check
  assert "transposed in args[1]" in err.inputs


def test_a_transpose_that_handles_only_some_linear_arguments():
  # c * x is linear in c too, but Scale.transpose handles only x. Detected
  # numerically (not declared), transposing in c raises: that is the rule
  # being partial, not wrong; it is skipped with the reason and the fix, and
  # the transpose in x is checked (the pytest plugin cannot pass
  # linear_argnums, and reported correct rules such as Scale as failed).
  report = check_rules(zoo.scale, jnp.float32(1.5), zoo._vec(1., -2., 0.5),
                       modes="transpose")
  assert report.verdict == "passed", report
  (why,) = [why for mode, why in report.skipped if mode == "transpose"]
  assert "transposed in args[0]" in why and "raised AttributeError" in why, why
  assert "linear_argnums=" in why, why
  assert any("linear map (<ȳ, A ṫ> = <Aᵀ ȳ, ṫ>) (in args[1])" in c
             for c in report.ran), report.ran
  # declared, the same failure is the rule's
  err = _fails(zoo.scale, jnp.float32(1.5), zoo._vec(1., -2., 0.5),
               modes="transpose", linear_argnums=[0])
  assert err.rule == "Scale.transpose" and "args[0]" in err.inputs
  assert "raised AttributeError" in err.failures[0].detail
  # a wrong transpose in the argument it handles still fails, undeclared
  err = _fails(lambda c, x: BadTranspose(jax.typeof(c), jax.typeof(x))(c, x),
               jnp.float32(1.5), zoo._vec(1., -2., 0.5), modes="transpose")
  assert err.rule == "BadTranspose.transpose" and "args[1]" in err.inputs


def test_a_transpose_that_raises_in_every_linear_argument_fails():
  class RaisingTranspose(zoo.Scale):
    def transpose(self, ct, c, x_acc):
      raise NotImplementedError("not yet")
  err = _fails(lambda c, x: RaisingTranspose(jax.typeof(c), jax.typeof(x))(c, x),
               jnp.float32(1.5), zoo._vec(1., -2., 0.5), modes="transpose")
  assert err.rule == "RaisingTranspose.transpose"
  assert "raised NotImplementedError: not yet" in err.failures[0].detail


class BadBatch(zoo.MatVec):
  """Assumes the batch dimension of x is its first axis."""

  def batch(self, axis_data, args, dims):
    A, x = args
    A_dim, x_dim = dims
    if A_dim is None and x_dim is not None:
      return x @ A.T, 0  # forgot jnp.moveaxis(x, x_dim, 0)
    return super().batch(axis_data, args, dims)


def test_catches_wrong_batch_rule():
  A = jnp.array([[1., 2., 0.], [-1., 0.5, 3.]])
  x = zoo._vec(1., -2., 0.5)  # length 3 = the batch size: shapes still agree
  err = _fails(lambda A, x: BadBatch(jax.typeof(A), jax.typeof(x))(A, x), A, x,
               modes=("batch",))
  assert err.rule == "BadBatch.batch"
  assert "vmap vs a loop over the batch" in err.check
  assert "in_axes=(None, 1)" in err.inputs  # only the trailing axis exposes it
  assert len(err.failures) == 1


class BadBatchDimRule(zoo.SinTimesY):
  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]  # None when only y is batched


def test_catches_wrong_batch_dim_rule():
  err = _fails(lambda x, y: BadBatchDimRule(jax.typeof(x), jax.typeof(y))(x, y),
               zoo._vec(0.3, -1.2), zoo._vec(2., 0.5), modes="batch")
  assert err.rule == "BadBatchDimRule.batch_dim_rule"
  assert all("in_axes=(None, " in f.inputs for f in err.failures)


class LyingNzsOut(zoo.FPt):
  def vjp_fwd(self, nzs_in, pt):
    # claims out['b'][1] = cos(pt.y) has a zero tangent
    return self(pt), pt, {"a": True, "b": (True, False)}


def test_catches_lying_nzs_out():
  pt = zoo.Point(zoo._vec(0.5, 1.5), zoo._vec(-1., 2.))
  err = _fails(lambda pt: LyingNzsOut(jax.tree.map(jax.typeof, pt))(pt), pt)
  assert err.rule == "LyingNzsOut.vjp_fwd"
  assert "nzs_out" in err.check
  assert "out['b'][1]" in str(err)
  # the dropped cotangent also breaks <ȳ, J ṫ> = <vjp(ȳ), ṫ>
  assert "LyingNzsOut.vjp_fwd/vjp_bwd_retval" in _rules(err)


@pytest.mark.parametrize("wrap", [jax.jit, jax.checkpoint],
                         ids=["jit", "checkpoint"])
def test_catches_lying_nzs_out_inside_a_call(wrap):
  """A primitive bound inside jax.jit or jax.checkpoint has its nzs_out
  checked too, with its own arguments (before: only the primitives at the
  top level were, while their argument values were looked up by position
  among all the applications, those inside calls included)."""
  pt = zoo.Point(zoo._vec(0.5, 1.5), zoo._vec(-1., 2.))
  lying = lambda pt: LyingNzsOut(jax.tree.map(jax.typeof, pt))(pt)
  err = _fails(lambda pt: wrap(lying)(pt), pt, modes=("vjp",))
  nzs = [f for f in err.failures if "nzs_out" in f.check]
  assert [f.rule for f in nzs] == ["LyingNzsOut.vjp_fwd"], err
  assert "out['b'][1]" in nzs[0].detail


class ValuedNzsOut(zoo.FPt):
  def vjp_fwd(self, nzs_in, pt):
    # a flag computed from the values: nzs_out must be static bools
    return self(pt), pt, {"a": True, "b": (True, jnp.all(pt.y > 100.))}


def test_an_nzs_out_flag_computed_from_values_is_reported_as_called():
  """The nzs_out check reads the flags from a trace of vjp_fwd; a flag that
  is a value of that trace is reported as the rule returns it when called
  (an array), not as a tracer of the checker's."""
  pt = zoo.Point(zoo._vec(0.5, 1.5), zoo._vec(-1., 2.))
  err = _fails(lambda pt: ValuedNzsOut(jax.tree.map(jax.typeof, pt))(pt), pt,
               modes=("vjp",))
  nzs = [f for f in err.failures if "nzs_out" in f.check]
  assert [f.rule for f in nzs] == ["ValuedNzsOut.vjp_fwd"], err
  assert "nzs_out returned by ValuedNzsOut.vjp_fwd must be" in nzs[0].detail
  assert "Array(False" in nzs[0].detail and "Tracer" not in nzs[0].detail

class BadSech2(zoo.Sech2):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    s = self(x)
    return s, 2 * s * jnp.tanh(x) * t  # sign error


class TanhBadSecondOrder(zoo.Tanh):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), BadSech2(jax.typeof(x))(x) * t


def test_catches_wrong_second_order():
  fn = lambda x: TanhBadSecondOrder(jax.typeof(x))(x)
  x = zoo._vec(0.3, -1.2, 2.)
  assert check_rules(fn, x, order=1).passed  # first order is right
  err = _fails(fn, x)
  by_rule = {f.rule: f for f in err.failures}
  # the rule-by-rule check names the wrong rule ...
  assert any(f.rule == "BadSech2.jvp"
             and f.check.startswith("second order, on the tangent map")
             for f in err.failures)
  # ... and the second derivative of tanh itself is wrong (vs finite
  # differences of its first derivative)
  assert all(f.rule.startswith(("BadSech2", "TanhBadSecondOrder"))
             for f in err.failures)
  assert any("differentiated again" in f.check for f in err.failures)


# --- other mistakes ---------------------------------------------------------------------

class SymbolicZerosUnhandled(zoo.SinTimesY):
  def jvp(self, primals, tangents):
    (x, y), (x_dot, y_dot) = primals, tangents
    return self(x, y), jnp.cos(x) * x_dot * y + jnp.sin(x) * y_dot


def test_catches_jvp_that_cannot_take_symbolic_zeros():
  err = _fails(lambda x, y: SymbolicZerosUnhandled(jax.typeof(x),
                                                    jax.typeof(y))(x, y),
               zoo._vec(0.3, -1.2), zoo._vec(2., 0.5), modes="jvp")
  assert err.rule == "SymbolicZerosUnhandled.jvp"
  assert "Zero" in str(err) and "symbolic zeros" in err.inputs


class WrongExpandType(UnaryPrim):
  def expand(self, x):
    return jnp.sum(x)  # out_aval says the shape of x


def test_catches_expand_disagreeing_with_out_aval():
  err = _fails(lambda x: WrongExpandType(jax.typeof(x))(x), zoo._vec(1., 2.))
  assert err.rule == "WrongExpandType.expand"
  assert "expand returned float64[], but out_aval declares float64[2]" in str(err)


class PythonBranchExpand(zoo.Unary):
  def expand(self, x):
    return jnp.sin(x) if x > 0 else jnp.cos(x)


def test_catches_expand_that_cannot_be_jitted():
  err = _fails(lambda x: PythonBranchExpand(jax.typeof(x))(x), 1.0,
               modes="expand", jit=False)
  assert err.rule == "PythonBranchExpand.expand"
  assert "jitted call" in err.check


# --- dtypes: a tangent has its output's dtype, a cotangent its input's -------------------

class Float32Cotangents(zoo.Log1pExp):
  def vjp_bwd_retval(self, x, g):
    return ((jax.nn.sigmoid(x) * g).astype(jnp.float32),)  # right values, f32


def test_catches_cotangents_of_the_wrong_dtype():
  """Under x64 the gradient would be float32 for a float64 input: the values
  agree to float32 precision, so only the dtype shows the slip."""
  err = _fails(lambda x: Float32Cotangents(jax.typeof(x))(x),
               zoo._vec(-2., 0.5, 3.), modes=("jvp", "vjp"), x64=True)
  assert err.report.dtype == "float64"
  assert err.rule == "Float32Cotangents.vjp_fwd/vjp_bwd_retval"
  assert "float32" in str(err.failures[0]) and "float64" in str(err.failures[0])


class Float32Tangents(zoo.Log1pExp):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), (jax.nn.sigmoid(x) * t).astype(jnp.float32)


def test_catches_tangents_of_the_wrong_dtype():
  err = _fails(lambda x: Float32Tangents(jax.typeof(x))(x),
               zoo._vec(-2., 0.5, 3.), modes="jvp", x64=True)
  assert err.rule == "Float32Tangents.jvp"
  assert "float32" in str(err.failures[0]) and "float64" in str(err.failures[0])


@jax.custom_vjp
def _f32_gradient(x):
  return x


_f32_gradient.defvjp(lambda x: (x, None),
                     lambda _, g: (g.astype(jnp.float32),))


def test_compares_dtypes_of_what_jax_returns():
  """jax.custom_vjp passes a float32 cotangent on unconverted: hijax's own
  checks never see it, check_rules must (it compares the whole prim_fn)."""
  err = _fails(lambda x: zoo.log1pexp(_f32_gradient(x)),
               zoo._vec(-2., 0.5, 3.), modes="vjp", x64=True)
  assert [f.check for f in err.failures] == [
      "vjp's cotangent types vs the inputs' types"]
  assert err.rule == "Log1pExp.vjp_fwd/vjp_bwd_retval"
  assert ("args[0]: vjp gives float32[3], but the input is float64[3]"
          in err.failures[0].detail)
  assert err.max_error == float("inf")


# --- options and reporting --------------------------------------------------------------

def test_report():
  report = check_rules(zoo.log1pexp, zoo._vec(-2., 0.5, 3.))
  assert isinstance(report, RuleReport) and report.passed
  assert report.primitives == ["Log1pExp"]
  assert report.modes_run == ["expand", "jvp", "vjp", "batch", "second_order"]
  assert ("lin", "rule not defined") in report.skipped
  text = str(report)
  assert text.startswith("check_rules on Log1pExp in float64:")
  assert "batch: vmap vs a loop over the batch (in_axes=(1,))" in text


def test_a_failure_shows_and_compares_without_the_error_it_carries():
  from hijax.testing import RuleFailure
  a = RuleFailure("r", "c", "i", "d", 1.0, error=ValueError("x"))
  assert a == RuleFailure("r", "c", "i", "d", 1.0, error=KeyError("y"))
  assert repr(a) == ("RuleFailure(rule='r', check='c', inputs='i', "
                     "detail='d', max_error=1.0)")
  assert isinstance(a.error, ValueError)


def test_a_report_that_requires_and_compares_nothing_says_so():
  report = RuleReport(["P"], "float64")
  assert report.verdict == "inconclusive" and not report.passed
  assert str(report).splitlines()[1:] == [
      "  NOT JUDGED  no rule was compared with anything"]


def test_a_report_shows_and_compares_its_fields_only():
  """What the checks record for `modes_run` and the hints stays out of a
  report's repr and equality: a report equals one with the same fields."""
  relu = zoo.right_relu()
  report = check_rules(relu, jnp.array([0., 1.]), modes="jvp")  # a kink
  assert report.modes_run == ["jvp"] and report.inconclusive, report
  same = RuleReport(**{f.name: getattr(report, f.name)
                       for f in dataclasses.fields(report) if f.init})
  assert same.modes_run == [] and same == report
  assert not report.complete and report.passed  # the kink: not conclusive
  assert check_rules(relu, jnp.array([-1., 1.]), modes="jvp").complete
  assert repr(same) == repr(report) and "_modes" not in repr(report)
  (hint,), (none,) = report.why_inconclusive(), same.why_inconclusive()
  assert "kinks" in hint and "kinks" not in none, (hint, none)


def test_the_error_shows_five_failures_in_full_and_counts_the_rest():
  from hijax.testing import RuleFailure
  fails = [RuleFailure(f"r{i}", "c", "i", "d", 1.0) for i in range(6)]
  five = str(RuleCheckError(RuleReport(["P"], "float64", failures=fails[:5])))
  assert five.endswith("r4: c\n  i\n  d") and "more" not in five
  six = str(RuleCheckError(RuleReport(["P"], "float64", failures=fails)))
  assert "r4: c" in six and "r5" not in six
  assert six.endswith("r4: c\n  i\n  d\n\n... and 1 more (the report's "
                      "failures list them all)")


def test_modes_option():
  report = check_rules(zoo.log1pexp, zoo._vec(-2., 0.5, 3.), modes=("jvp",))
  assert report.modes_run == ["jvp"]
  with pytest.raises(ValueError, match="unknown mode"):
    check_rules(zoo.log1pexp, 1.0, modes=("grad",))
  with pytest.raises(ValueError, match="Log1pExp define.* no lin rule"):
    check_rules(zoo.log1pexp, 1.0, modes=("lin",))
  assert set(MODES) >= {"expand", "jvp", "vjp", "lin", "transpose", "batch",
                        "second_order"}


def test_negative_tolerance_is_refused_naming_the_argument():
  for name in ("atol", "rtol"):
    with pytest.raises(ValueError, match=(
        rf"check_rules: {name}=-1e-06 is not a tolerance \(a number >= 0\); "
        r"pass a value >= 0, or None for the dtype's default")):
      check_rules(zoo.log1pexp, 1.0, **{name: -1e-6})
  with pytest.raises(ValueError, match=r"atol=nan is not a tolerance"):
    check_rules(zoo.log1pexp, 1.0, atol=float("nan"))


def test_raise_on_failure_false_returns_the_failures():
  report = check_rules(lambda x: BadJvp(jax.typeof(x))(x), 0.5,
                       raise_on_failure=False)
  assert not report.passed
  assert report.failures[0].rule == "BadJvp.jvp"


def test_float32_without_x64():
  report = check_rules(zoo.log1pexp, zoo._vec(-2., 0.5, 3.), x64=False)
  assert report.passed and report.dtype == "float32"
  err = _fails(lambda x: BadJvp(jax.typeof(x))(x), zoo._vec(-2., 0.5, 3.),
               x64=False)
  assert err.rule == "BadJvp.jvp"


class Float32Only(zoo.Unary):
  """Hard-codes its output type, so it cannot be traced in float64."""

  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = ShapedArray(x_aval.shape, jnp.float32)
    self.params = {}
    HiPrim.__init__(self)

  def expand(self, x):
    return jnp.sin(x).astype(jnp.float32)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), (jnp.cos(x) * t).astype(jnp.float32)


def _float32_only(x):
  if x.dtype != jnp.float32:
    raise TypeError("float32 only")
  return Float32Only(jax.typeof(x))(x)


def test_falls_back_to_the_given_dtype():
  report = check_rules(_float32_only, zoo._vec(0.5, 1.))
  assert report.dtype == "float32" and report.passed
  with pytest.raises(TypeError, match="float32 only"):
    check_rules(_float32_only, zoo._vec(0.5, 1.), x64=True)


def test_eager_mode():
  assert check_rules(zoo.sin_times_y, zoo._vec(0.3, -1.2), zoo._vec(2., 0.5),
                     jit=False).passed


def test_batch_in_axes_for_a_partial_batch_rule():
  """A batch rule that raises for some combinations of batched arguments and
  runs for others supports only those: checked without batch_in_axes, the
  others are listed as skipped, with the fix; with it, only those run, and a
  combination it names that the rule refuses fails."""
  fn = lambda A, x: zoo.MatVecXOnly(jax.typeof(A), jax.typeof(x))(A, x)
  A, x = zoo.BY_NAME["matvec"].args()
  report = check_rules(fn, A, x, modes="batch")
  assert report.verdict == "passed", report
  skipped = [why for mode, why in report.skipped if mode == "batch"]
  assert any(why.startswith("vmap with in_axes=(0, None): ") for why in skipped)
  assert any(why.startswith("jvp of vmap vs a loop: ") for why in skipped)
  for why in skipped:
    assert ("MatVecXOnly.batch raised AssertionError: only x may be batched"
            in why and "batch_in_axes=" in why), why
  assert {"batch: vmap vs a loop over the batch (in_axes=(None, 0))",
          "batch: vmap vs a loop over the batch (in_axes=(None, 1))"} <= set(
              report.ran)
  assert check_rules(fn, A, x, modes="batch",
                     batch_in_axes=[(None, 0), (None, 1)]).passed
  err = _fails(fn, A, x, modes="batch", batch_in_axes=[(None, 0), (0, None)])
  assert "only x may be batched" in str(err)


def test_a_batch_rule_that_raises_for_every_combination_fails():
  class MatVecNever(zoo.MatVec):
    def batch(self, axis_data, args, dims):
      raise ValueError("no batching here")

  fn = lambda A, x: MatVecNever(jax.typeof(A), jax.typeof(x))(A, x)
  err = _fails(fn, *zoo.BY_NAME["matvec"].args(), modes="batch")
  assert "no batching here" in str(err)
  assert set(_rules(err)) == {"MatVecNever.batch"}


def test_a_partial_batch_rule_whose_output_is_wrong_fails():
  """Where hijax's check of what the rule returned raises (a wrong type for
  one combination), the rule is wrong there, not partial, though it runs
  for the others."""
  class MatVecWrongForA(zoo.MatVec):
    def batch(self, axis_data, args, dims):
      if dims[0] is not None:
        return jnp.zeros(3), 0  # no batch axis
      return super().batch(axis_data, args, dims)

  fn = lambda A, x: MatVecWrongForA(jax.typeof(A), jax.typeof(x))(A, x)
  err = _fails(fn, *zoo.BY_NAME["matvec"].args(), modes="batch")
  assert "MatVecWrongForA.batch" in _rules(err)
  assert any("in_axes=(0, None)" in f.inputs for f in err.failures)


def test_a_partial_batch_dim_rule_is_partial_too():
  class SinTimesXBatchedOnly(zoo.SinTimesY):
    def batch_dim_rule(self, axis_data, in_dims):
      if in_dims[1] is not None:
        raise NotImplementedError("y must not be batched")
      return in_dims[0]

  fn = lambda x, y: SinTimesXBatchedOnly(jax.typeof(x), jax.typeof(y))(x, y)
  report = check_rules(fn, zoo._vec(0.3, -1.2), zoo._vec(2., 0.5),
                       modes="batch")
  assert report.verdict == "passed", report
  skipped = [why for mode, why in report.skipped if mode == "batch"]
  assert skipped and all(
      "SinTimesXBatchedOnly.batch_dim_rule raised NotImplementedError" in why
      for why in skipped), skipped
  assert "batch: vmap vs a loop over the batch (in_axes=(0, None))" in report.ran


def test_a_rule_error_inside_a_batch_rule_is_hijax_s_not_a_refusal():
  """A batch rule vmapping a primitive whose batch_dim_rule is wrong: the error
  is the inner one's (under jit, raised where it is lowered, outside any rule:
  no rule's mark), so the outer rule is not taken for partial."""
  class Outer(zoo.SinTimesY):
    def batch(self, axis_data, args, dims):
      x, y = (jnp.moveaxis(a, d, 0) if d is not None else a
              for a, d in zip(args, dims))
      inner = lambda x, y: BadBatchDimRule(jax.typeof(x), jax.typeof(y))(x, y)
      return jax.vmap(inner, in_axes=tuple(None if d is None else 0
                                           for d in dims))(x, y), 0

  fn = lambda x, y: Outer(jax.typeof(x), jax.typeof(y))(x, y)
  err = _fails(fn, zoo._vec(0.3, -1.2), zoo._vec(2., 0.5), modes="batch")
  assert all("in_axes=(None, " in f.inputs for f in err.failures), err


def test_pytree_and_integer_inputs():
  report = check_rules(zoo.gather, zoo._vec(1., -2., 0.5, 4.), jnp.int32(2))
  # only the float input is differentiated
  assert all("args[1]" not in r for r in report.ran if r.startswith("jvp"))
  report = check_rules(zoo.fpt, *zoo.BY_NAME["fpt"].args())
  assert any("args[0].y only" in r for r in report.ran)


def test_only_integer_inputs():
  class CountPositive(HiPrim):
    def __init__(self, x_aval):
      self.in_avals = (x_aval,)
      self.out_aval = ShapedArray((), jnp.dtype("int32"))
      self.params = {}
      super().__init__()

    def expand(self, x):
      return jnp.sum(x > 0).astype(jnp.int32)

    def batch_dim_rule(self, axis_data, in_dims):
      return None if in_dims[0] is None else 0

  report = check_rules(lambda x: CountPositive(jax.typeof(x))(x),
                       jnp.array([1, -2, 3]))
  assert report.passed and report.modes_run == ["expand", "batch"]


def test_prim_fn_must_bind_a_primitive():
  with pytest.raises(ValueError, match="binds no hijax primitive and calls "
                     "no jax.custom_jvp"):
    check_rules(jnp.sin, 1.0)


def test_several_primitives_in_one_function():
  fn = lambda x, y: zoo.sin_times_y(zoo.log1pexp(x), y)
  report = check_rules(fn, zoo._vec(0.3, -1.2), zoo._vec(2., 0.5))
  assert report.primitives == ["Log1pExp", "SinTimesY"]
  assert report.modes_run == ["expand", "jvp", "vjp", "batch", "second_order"]
  err = _fails(lambda x: zoo.sin_times_y(BadJvp(jax.typeof(x))(x), x),
               zoo._vec(0.3, -1.2), modes="jvp")
  assert err.rule == "BadJvp.jvp, SinTimesY.jvp"


def test_assert_rules_hides_its_frames():
  import hijax.testing as ht
  assert ht.assert_rules.__code__.co_varnames[0] == "prim_fn"
  with pytest.raises(RuleCheckError):
    assert_rules(lambda x: BadJvp(jax.typeof(x))(x), 0.5, modes="jvp")


# --- the primitives of the custom-derivatives pages ---------------------------------------

_DOCS_RUNNER = r'''
import contextlib, io, json, os, sys
os.environ.setdefault("MPLBACKEND", "Agg")
# A page's breakpoint() in a backward rule is a demo: the checker calling that
# rule must not stop in a debugger (the default hook reads this at each call).
os.environ["PYTHONBREAKPOINT"] = "0"
import jax, jax.numpy as jnp, jupytext
from hijax.primitive import HiPrim
from hijax.testing import check_rules
import time
from hijax.testing import _compiled
_compiled._clock = time.process_time  # as in the tests' own process (conftest.py)

pages, points, options = (json.loads(a) for a in sys.argv[1:4])
# One process runs every page: the second page's own request for two CPU
# devices is a no-op if made before JAX first uses its devices, here.
jax.config.update("jax_num_cpu_devices", 2)
first_call = {}
call = HiPrim.__call__

recording = [True]

def recording_call(self, *args):
  if (recording[0] and type(self).__name__ != "Batched" and type(self) not in first_call
      and not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args))):
    first_call[type(self)] = (self, args, page)
  return call(self, *args)

HiPrim.__call__ = recording_call
for page in pages:  # each in a fresh namespace, as in its own kernel
  ns = {"__name__": "__main__"}
  for cell in jupytext.read(page).cells:
    if cell.cell_type != "code":
      continue
    # A cell meant to fail still defines what later cells use; the primitives
    # it applies are not checked (they are wrong on purpose).
    failing = "raises-exception" in cell.metadata.get("tags", [])
    recording[0] = not failing
    with contextlib.redirect_stdout(io.StringIO()):
      try:
        exec(cell.source, ns)
      except Exception:
        if not failing:
          raise
HiPrim.__call__ = call

results = {}
for cls, (prim, args, page) in first_call.items():
  name = cls.__name__
  # a primitive that a later page defines again is checked again, too
  key = name if name not in results else f"{name} ({os.path.basename(page)})"
  if name in points:
    args = eval(points[name], {"jnp": jnp})
  report = check_rules(lambda *a, prim=prim: prim(*a), *args,
                       raise_on_failure=False,
                       **eval(options.get(name, "{}")))
  results[key] = dict(name=name, modes=report.modes_run,
                       failures=sorted({f.rule for f in report.failures}),
                       message=[str(f) for f in report.failures[:2]])
print("RESULTS" + json.dumps(results))
'''

# The page calls these at an edge of their domain on purpose (overflow, the
# boundary of the half line); check them at an interior point.
_DOCS_POINTS = {"Log1pExp": "(jnp.float32(3.0),)",
                "HalfLine": "(jnp.float32(0.5),)",
                "Step": "(jnp.float32(-0.5),)"}
_DOCS_OPTIONS = {"Step": "dict(jit=False, modes=('vjp',))"}  # branches in Python

# Examples that depart from the math on purpose, or demonstrate an error.
_DOCS_INTENTIONAL = {
    "ClipCotangent": {"ClipCotangent.vjp_fwd/vjp_bwd_retval"},  # clips on purpose
    "Step": {"Step.vjp_fwd/vjp_bwd_retval"},  # a surrogate gradient
    "ListLogger": {"ListLogger.vjp_fwd/vjp_bwd"},  # logs that are not a dict
    "RetvalWithSres": {"RetvalWithSres.vjp_fwd/vjp_bwd_retval"},  # misuse error
    # vjp_from_jvp on a jvp that binds a primitive without a transpose rule:
    # the page shows the error
    "ScaleNoTranspose": {
        "ScaleNoTranspose.vjp_fwd/vjp_bwd_retval (vjp_from_jvp)"},
    # jvp_from_vjp of a backward rule that clips g: the page shows the error
    "ClippedLogSumExp": {"ClippedLogSumExp.jvp (jvp_from_vjp)"},
    # a backward rule affine in g: the page shows the linearity check's error
    "AddsOne": {"AddsOne.jvp (jvp_from_vjp)", "AddsOne.vjp_fwd/vjp_bwd_retval"},
    # ... one that multiplies g by itself, and one that branches on g
    "Squares": {"Squares.jvp (jvp_from_vjp)", "Squares.vjp_fwd/vjp_bwd_retval"},
    "Branches": {"Branches.jvp (jvp_from_vjp)"},
}
# Known shortcomings of examples on the page (reported to its author).
_DOCS_KNOWN_ISSUES: dict[str, set[str]] = {}


@pytest.mark.pages
def test_custom_derivatives_page_primitives():
  """check_rules on each primitive the two custom-derivatives pages apply, at
  the first point a page applies it to (in float32, since the instances are
  built for float32 arguments), in one process for both pages."""
  import json
  import os
  import subprocess
  import sys
  from pathlib import Path
  pytest.importorskip("jupytext")
  docs = Path(__file__).resolve().parent.parent / "docs"
  pages = [docs / "custom-derivatives.md", docs / "custom-derivatives-advanced.md"]
  if not all(page.exists() for page in pages):
    pytest.skip("no custom-derivatives pages")
  proc = subprocess.run(
      [sys.executable, "-c", _DOCS_RUNNER, json.dumps([str(p) for p in pages]),
       json.dumps(_DOCS_POINTS), json.dumps(_DOCS_OPTIONS)],
      capture_output=True, text=True, timeout=600,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(proc.stdout.split("RESULTS", 1)[1])
  assert len(results) >= 20 and "FixedPoint" in results
  # from the second page, and the first page's primitive it defines again
  assert {"Scale", "ToCartesian", "Cube", "ExpSaved"} <= set(results), sorted(results)
  assert sum(r["name"] == "Hypot" for r in results.values()) == 2, sorted(results)
  expected = {**_DOCS_INTENTIONAL, **_DOCS_KNOWN_ISSUES}
  wrong = {key: r for key, r in results.items()
           if set(r["failures"]) != expected.get(r["name"], set())}
  assert not wrong, "\n\n".join(
      f"{key}: failing rules {r['failures']}, expected "
      f"{sorted(expected.get(r['name'], set()))}\n" + "\n".join(r["message"])
      for key, r in wrong.items())
  # the checks that matter ran
  assert "second_order" in results["FixedPoint"]["modes"]
  assert {"jvp", "vjp", "lin"} <= set(results["Sigmoid"]["modes"])


def test_hi_types_are_rejected_clearly():
  """(Complex numbers are checked: tests/test_testing_jax_rules.py.)"""
  import hitype_examples as H
  x = jnp.array([[1., -2., 0.5], [0.3, 0.2, -1.]])
  with pytest.raises(TypeError, match=r"output out is q8\[2,3\]; hi types"):
    check_rules(H.quantize, x)
  with pytest.raises(TypeError, match=r"argument args\[0\] is q8\[2,3\]"):
    check_rules(H.dequantize, H.quantize(x))


# --- plain JAX operations around the primitive are evaluated as they are -----------------

@pytest.mark.parametrize("around", [
    lambda p, x: p(x)[..., 0] + jnp.ones(()),
    lambda p, x: jnp.sin(p(jnp.ones(3) * x)),
    lambda p, x: jax.nn.relu(p(x)),  # a custom_jvp call: its params hold functions
], ids=["index-and-ones", "sin-of-broadcast", "custom-jvp"])
def test_plain_jax_around_the_primitive(around):
  x = zoo._vec(-2., 0.5, 3.)
  report = check_rules(lambda x: around(zoo.log1pexp, x), x)
  assert report.passed and report.primitives == ["Log1pExp"]
  assert {"expand", "jvp", "vjp", "batch"} <= set(report.modes_run), report
  err = _fails(lambda x: around(lambda y: BadJvp(jax.typeof(y))(y), x), x)
  assert set(_rules(err)) == {"BadJvp.jvp"}


class _Float32Declared(Float32Only):
  """Declares a float32 output but returns the input's dtype: it traces in
  float64 and fails only where it runs (lowered) there."""

  def expand(self, x):
    return jnp.sin(x)


@pytest.mark.parametrize("jit", [True, False])
def test_falls_back_where_float64_traces_but_does_not_run(jit):
  report = check_rules(lambda x: _Float32Declared(jax.typeof(x))(x),
                       zoo._vec(0.5, 1.), modes=("jvp",), order=1, jit=jit)
  assert report.dtype == "float32" and report.passed


def test_many_arguments_batch_each_alone_and_all_together():
  """40 arguments: 41 combinations, without listing the 2**40 subsets
  first (that never ended: the plugin on diffrax's backsolve adjoint)."""
  import types  # pylint: disable=import-outside-toplevel
  from hijax.testing import _batching  # pylint: disable=import-outside-toplevel
  combos = _batching._batch_combinations(
      types.SimpleNamespace(args=[0.0] * 40),
      types.SimpleNamespace(batch_in_axes=None))
  assert len(combos) == 41 and combos[-1] == (0,) * 40
  assert combos[3] == (None,) * 3 + (0,) + (None,) * 36
