"""A pass is a promise (issue 46): check_rules' three verdicts, exact finite
differences, surrogate rules, and a report that lists what it counts."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hijax
from hijax.testing import (InconclusiveCheckError, RuleCheckError,
                           check_rules, surrogate)

import zoo

X = jnp.array([0.3, 1.7, -2.2])


def _round_ste():
  @hijax.custom_vjp
  def round_ste(x):
    return jnp.round(x)
  round_ste.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))
  return round_ste


def _jax_round_ste():
  @jax.custom_vjp
  def round_ste(x):
    return jnp.round(x)
  round_ste.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))
  return round_ste


def _clipper(decorator):
  @decorator
  def clip_gradient(x):
    return x
  clip_gradient.defvjp(lambda x: (x, None),
                       lambda _, g: (jnp.clip(g, -1., 1.),))
  return clip_gradient


# --- a straight-through estimator and a clipper are not derivatives ---------

@pytest.mark.parametrize("make", [_round_ste, _jax_round_ste],
                         ids=["hijax", "jax"])
def test_a_straight_through_estimator_fails_against_the_function(make):
  """round is flat at these points: its finite differences are exactly 0 at
  every step, a resolved value, and the rule says 1 (before: every
  comparison inconclusive, "passed")."""
  f = make()
  with pytest.raises(RuleCheckError) as raised:
    check_rules(f, X)
  assert "round_ste" in raised.value.rule
  assert raised.value.max_error >= 0.9
  assert raised.value.report.verdict == "failed"


@pytest.mark.parametrize("decorator", [hijax.custom_vjp, jax.custom_vjp],
                         ids=["hijax", "jax"])
def test_a_gradient_clipper_fails_against_the_function(decorator):
  with pytest.raises(RuleCheckError, match="clip_gradient"):
    check_rules(_clipper(decorator), X)


@pytest.mark.parametrize("make", [_round_ste, _jax_round_ste],
                         ids=["hijax", "jax"])
def test_a_surrogate_passes_its_consistency_checks(make):
  f = make()
  report = check_rules(f, X, surrogates=[f])
  assert report.verdict == "passed" and report.conclusive > 0
  assert report.surrogates == [report.primitives[0]]
  assert "checked as surrogate, not against the function" in (
      report.headline())
  assert not any("finite differences" in r and r.startswith(("jvp", "vjp"))
                 for r in report.ran), report.ran
  # batching is still compared with a loop
  assert any(r.startswith("batch: vmap vs a loop") for r in report.ran)


@pytest.mark.parametrize("decorator", [hijax.custom_vjp, jax.custom_vjp],
                         ids=["hijax", "jax"])
def test_a_clipper_marked_with_the_decorator_is_a_surrogate(decorator):
  """(A mark is by where the function is defined: this clipper is defined
  here, not by _clipper, whose clippers stay unmarked.)"""
  @surrogate
  @decorator
  def clip_gradient(x):
    return x
  clip_gradient.defvjp(lambda x: (x, None),
                       lambda _, g: (jnp.clip(g, -1., 1.),))
  report = check_rules(clip_gradient, X)
  assert report.verdict == "passed" and report.surrogates, report
  assert not report.failures


def test_a_surrogate_over_a_partial_is_the_function_the_program_names():
  """A custom_vjp of a functools.partial: JAX names the partial's function
  in the program; declared or marked, it is that function's surrogate
  (before: surrogates= refused it as not a custom derivative function)."""
  def clip_scaled(x, scale):
    return scale * x

  def make():
    f = jax.custom_vjp(functools.partial(clip_scaled, scale=1.0))
    f.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1., 1.),))
    return f
  f = make()
  with pytest.raises(RuleCheckError, match="clip_scaled"):
    check_rules(f, X)
  report = check_rules(f, X, surrogates=[f])
  assert report.verdict == "passed" and report.surrogates == [
      "clip_scaled (custom_vjp)"], report
  surrogate(make())  # marks the function, so every one made so
  report = check_rules(make(), X)
  assert report.verdict == "passed" and report.surrogates, report


def test_where_a_function_is_defined_under_its_wrappers():
  """hijax._function_key's names for a function under partials,
  functools.wraps and bound methods (the surrogates' and the plugin's)."""
  from hijax._function_key import code_of, definition, unwrap

  def f(x, y=1.):
    return x * y

  @functools.wraps(f)
  def wrapper(*args):
    return f(*args)

  class Obj:
    def method(self, x):
      return x

    def __call__(self, x):
      return x
  partial = functools.partial(wrapper, 2.)
  assert unwrap(partial) is f and unwrap(Obj().method) is (
      Obj.method)
  assert definition(partial) == ("f", f.__code__.co_filename,
                                 f.__code__.co_firstlineno)
  assert definition(Obj().method)[0] == "method"
  assert definition(Obj()) is None
  assert code_of(partial) is f.__code__
  assert code_of(Obj()) is Obj.__call__.__code__
  with pytest.raises(TypeError, match="no code for"):
    code_of(len)


def test_a_surrogate_still_fails_its_own_consistency():
  """Marked a surrogate, a batching rule that is wrong still fails."""
  class ScaledIdentity(hijax.HiPrim):
    def __init__(self, aval):
      self.in_avals, self.out_aval, self.params = (aval,), aval, {}
      super().__init__()

    def expand(self, x):
      return jnp.round(x)

    def jvp(self, primals, tangents):
      return self(primals[0]), tangents[0]

    def vjp_fwd(self, nzs_in, x):
      return self(x), None

    def vjp_bwd_retval(self, _, g):
      return (2 * g,)  # not the transpose of the jvp rule

  f = lambda x: ScaledIdentity(jax.typeof(x))(x)
  with pytest.raises(RuleCheckError) as raised:
    check_rules(f, X, surrogates=[ScaledIdentity])
  assert raised.value.rule.startswith("ScaledIdentity.vjp_fwd")
  assert "vs the jvp rule" in raised.value.check


def test_surrogate_refuses_what_is_neither_a_class_nor_a_rule():
  with pytest.raises(TypeError, match="not a HiPrim subclass"):
    surrogate(int)
  with pytest.raises(TypeError, match=r"surrogate: cannot mark 3, which is "
                     r"not a HiPrim subclass or a custom derivative function "
                     r"\(jax.custom_jvp"):
    surrogate(3)
  with pytest.raises(TypeError, match="surrogates= names 3"):
    check_rules(_round_ste(), X, surrogates=[3])
  with pytest.raises(TypeError, match="surrogates= names int, a class but not "
                     "a HiPrim subclass; pass a HiPrim subclass or a custom"):
    check_rules(_round_ste(), X, surrogates=[int])


# --- the jvp check's verdict, handed to the vjp and lin checks --------------

class _Sin(hijax.HiPrim):
  def __init__(self, aval):
    self.in_avals, self.out_aval, self.params = (aval,), aval, {}
    super().__init__()

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    return self(primals[0]), jnp.cos(primals[0]) * tangents[0]

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return (jnp.cos(x) * g,)


class _JvpRaises(_Sin):
  def jvp(self, primals, tangents):
    raise ZeroDivisionError("no jvp here")


def test_the_vjp_check_takes_the_jvp_rule_as_reference_unless_it_failed():
  """The jvp rule is the vjp check's reference where its own check passed
  or did not run (modes="vjp"); where it raised, finite differences are."""
  ran = check_rules(lambda x: _Sin(jax.typeof(x))(x), X, modes="vjp",
                    order=1).ran
  assert any(r.startswith("vjp: vjp vs the jvp rule") for r in ran), ran
  report = check_rules(lambda x: _JvpRaises(jax.typeof(x))(x), X,
                       modes=("jvp", "vjp"), order=1,
                       raise_on_failure=False)
  assert [f.rule for f in report.failures] == ["_JvpRaises.jvp"], report
  assert any(r.startswith("vjp: vjp vs finite differences of expand")
             for r in report.ran), report.ran
  assert report.compared["_JvpRaises.vjp_fwd/vjp_bwd_retval"] > 0


# --- exact finite differences ------------------------------------------------

def test_exact_zero_finite_differences_are_resolved():
  """A clipper's backward pass does not depend on x: its second-order finite
  differences are exactly 0 and JAX's derivative of it is exactly 0; the
  report says so as a bound, not as "not resolved"."""
  report = check_rules(_clipper(jax.custom_vjp), X, raise_on_failure=False)
  assert not any("not resolved" in line for line in report.inconclusive), (
      report.inconclusive)


def test_a_small_slope_hidden_by_rounding_is_not_confirmed():
  """sin(x) + 1e12 at 0.5: the slope is below what float64 resolves next to
  1e12 at the largest step, so the function is exactly flat there. A rule
  twice the slope stays within the bound: inconclusive, not passed."""
  @jax.custom_jvp
  def lifted(x):
    return jnp.sin(x) + 1e12

  @lifted.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    return lifted(x), 2 * jnp.cos(x) * t
  report = check_rules(lifted, jnp.array([0.5]), modes="jvp",
                       accept_inconclusive=True)
  assert report.verdict != "passed", report


# --- three verdicts ------------------------------------------------------------

def test_a_check_that_compared_nothing_is_not_a_pass():
  f = _round_ste()
  with pytest.warns(UserWarning, match="time budget"):
    with pytest.raises(InconclusiveCheckError) as raised:
      check_rules(f, X, time_budget=0)
  report = raised.value.report
  assert report.verdict == "inconclusive" and not report.passed
  assert report.conclusive == 0
  assert "time_budget" in str(raised.value)
  assert not isinstance(raised.value, RuleCheckError)


def test_all_inconclusive_raises_its_own_error_and_can_be_accepted():
  """relu at its kink: no element can be judged."""
  relu = zoo.right_relu()
  at_kink = jnp.array([0.])
  with pytest.raises(InconclusiveCheckError, match="relu") as raised:
    check_rules(relu, at_kink, modes="jvp")
  assert raised.value.rules == ["relu (custom_jvp): the jvp rule"]
  assert "a point away from kinks" in str(raised.value)
  report = check_rules(relu, at_kink, modes="jvp", accept_inconclusive=True)
  assert report.verdict == "inconclusive"
  assert check_rules(relu, at_kink, modes="jvp",
                     raise_on_failure=False).verdict == "inconclusive"
  assert check_rules(relu, jnp.array([-1., 2.]), modes="jvp").passed


def test_the_hints_follow_why_finite_differences_failed_not_the_words():
  """relu at its kink, its input named "not resolved": the hint is a point
  away from kinks, not float64; floor unresolved at a jump, its input named
  "not smooth": float64 (no hint is read from the report's text)."""
  relu = zoo.right_relu()
  report = check_rules(lambda d: relu(d["not resolved"]),
                       {"not resolved": jnp.array([0.])}, modes="jvp",
                       accept_inconclusive=True)
  assert report.modes_run == ["jvp"], report
  (why,) = report.why_inconclusive()
  assert "away from kinks" in why and "x64" not in why, why

  @jax.custom_jvp
  def floor(x):
    return jnp.floor(x)
  floor.defjvp(lambda primals, tangents: (floor(primals[0]),
                                          0. * tangents[0]))
  # at 1.0 the steps straddle a jump: not resolved, and named "not smooth"
  report = check_rules(lambda d: floor(d["not smooth"]),
                       {"not smooth": jnp.array([1.])}, modes="jvp",
                       order=1, accept_inconclusive=True)
  (why,) = report.why_inconclusive()
  assert "x64=True" in why and "kinks" not in why, why


# --- the report lists what it counts --------------------------------------------

def _clipper_without_jvp():
  """A gradient clipper with hijax.custom_vjp: forward mode cannot be
  derived from a backward rule that is not linear in the cotangent, which
  fails the jvp, lin and batched-jvp checks too."""
  return _clipper(hijax.custom_vjp)


def test_the_report_lists_each_failure_it_counts():
  report = check_rules(_clipper_without_jvp(), X, raise_on_failure=False)
  text = str(report)
  n = len(report.failures)
  assert n > 5
  head = report.headline()
  assert head.startswith("check_rules on CustomVJPCall[fun=clip_gradient] in "
                         "float64: FAILED: ")
  # counts that add up: conclusive = passed + failed
  passed = sum(report.compared.values())
  assert f"{report.conclusive} conclusive comparisons ({passed} passed, {n} " \
         "failed)" in head
  assert report.conclusive == passed + n
  assert text.count("\n  FAILED   ") == 5
  assert f"... and {n - 5} more failure(s)" in text
  for f in report.failures[:5]:
    assert f"FAILED   {f.rule}: {f.check}" in text
  with pytest.raises(RuleCheckError) as raised:
    check_rules(_clipper_without_jvp(), X)
  assert f"{n} rule checks failed" in str(raised.value)
  assert f"... and {n - 5} more" in str(raised.value)


def test_a_passing_report_says_so_first():
  sin = zoo.right_sin()
  report = check_rules(sin, X)
  assert report.verdict == "passed"
  assert str(report).splitlines()[0].startswith(
      "check_rules on sin (custom_jvp) in float64: PASSED: ")
  assert np.all([report.compared.get(r, 0) > 0 for r in report.required])


# --- blame the rule that is wrong first ------------------------------------------

def test_a_wrong_rule_of_an_inner_primitive_is_named_first():
  """SinN's jvp binds CosN, whose jvp has the wrong sign: SinN's second
  derivatives fail because of it, and the error names CosN first (before:
  SinN.vjp_fwd/vjp_bwd_retval)."""
  from hijax import HiPrim
  from hijax.derived import vjp_from_jvp

  class Unary(HiPrim):
    def __init__(self, aval):
      self.in_avals, self.out_aval, self.params = (aval,), aval, {}
      super().__init__()
    vjp_fwd, vjp_bwd_retval = vjp_from_jvp

  class CosN(Unary):
    def expand(self, x):
      return jnp.cos(x)

    def jvp(self, primals, tangents):
      (x,), (t,) = primals, tangents
      return self(x), jnp.sin(x) * t  # the sign is wrong

  class SinN(Unary):
    def expand(self, x):
      return jnp.sin(x)

    def jvp(self, primals, tangents):
      (x,), (t,) = primals, tangents
      return self(x), CosN(jax.typeof(x))(x) * t

  with pytest.raises(RuleCheckError) as raised:
    check_rules(lambda x: SinN(jax.typeof(x))(x), jnp.array([0.3, 1.2]))
  assert raised.value.rule == "CosN.jvp"
  message = str(raised.value)
  assert message.splitlines()[1].startswith("CosN.jvp")
  assert "fix them first" in message
  rules = [f.rule for f in raised.value.failures]
  assert any(r.startswith("SinN") for r in rules)
  assert rules.index("CosN.jvp") < min(
      i for i, r in enumerate(rules) if r.startswith("SinN"))


# --- the time budget is kept ---------------------------------------------------------

# (a compile that would end past the budget: tests/test_testing_budget.py)


def test_no_thread_of_a_run_outlives_it(monkeypatch):
  """The device's program, compiled ahead in a thread of its own, is waited
  for at the end of the run even where the device's half of the checks
  does not run (here made a no-op; in a run, where the budget is spent
  first): no thread of the run outlives the call (before: it ran on, to
  be joined at the process's exit)."""
  import threading
  import time
  from hijax.testing import _flow
  stages = pytest.importorskip("jax.stages")
  compile_ = stages.Lowered.compile

  def slow_in_a_thread(self, *args, **kwargs):
    if threading.current_thread() is not threading.main_thread():
      time.sleep(2.0)
    return compile_(self, *args, **kwargs)
  monkeypatch.setattr(stages.Lowered, "compile", slow_in_a_thread)
  monkeypatch.setattr(_flow, "device_half", lambda *args, **kwargs: None)

  sin = zoo.right_sin()
  before = set(threading.enumerate())
  report = check_rules(sin, X, modes=("jvp",), order=1, time_budget=None,
                       device=jax.devices("cpu")[0])
  assert report.passed
  assert not [t for t in set(threading.enumerate()) - before
              if t.name.startswith("check_rules")]


# --- what the function declares, and where it cannot run ---------------------------------

def test_a_rule_that_refuses_differentiation_by_design_is_not_a_failure():
  """equinox's nondifferentiable: a custom_jvp whose jvp rule raises saying
  it cannot be differentiated. Checked alone, it is reported as refusing,
  not as a failed rule."""
  from refusing_rule import no_grad
  report = check_rules(no_grad, X, accept_inconclusive=True)
  assert not report.failures, report
  assert any("the rule declares it cannot" in why
             for _, why in report.skipped), report.skipped
  assert report.by_intent and "guarded (custom_jvp): the jvp rule" in (
      report.by_intent)


def test_a_function_that_raises_at_the_input_is_named():
  """A function that raises at the point in every dtype (optimistix's
  root_find refusing an input): the failure names it, not a rule it calls
  (before: equinox's _asarray)."""
  inner = zoo.right_sin()

  def refuse(x):
    if np.any(np.asarray(x) > 100):
      raise ValueError("x out of range")
    return np.asarray(x)

  def outer(x):
    y = jax.pure_callback(refuse, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return inner(y)
  with pytest.raises(RuleCheckError) as raised:
    check_rules(outer, jnp.array([1., 200.]))
  assert raised.value.rule == "outer (the function checked)"
  assert "x out of range" in str(raised.value)
  assert all(not f.rule.startswith("sin") for f in raised.value.failures)


# --- behaviours no test held before (issue 61) ----------------------------------------

def test_a_run_whose_modes_require_no_rule_does_not_pass():
  """modes="expand" of a custom function under jit (its types alone), or
  second order alone (no first-order mode runs): nothing is compared, so
  the report is inconclusive, never passed."""
  @jax.custom_jvp
  def sin(x):
    return jnp.sin(x)
  sin.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))
  for modes in ("expand", ("second_order",)):
    report = check_rules(sin, X, modes=modes, accept_inconclusive=True)
    assert report.required == [] and report.conclusive == 0, report
    assert report.verdict == "inconclusive", report
    with pytest.raises(InconclusiveCheckError):
      check_rules(sin, X, modes=modes)


class _SinOfInt(hijax.HiPrim):
  """sin(n) of an integer n: a float output whose jvp (a zero tangent,
  right) finite differences cannot judge."""

  def __init__(self, n_aval):
    self.in_avals = (n_aval,)
    self.out_aval = hijax.ShapedArray(n_aval.shape, jnp.dtype("float32"))
    self.params = {}
    super().__init__()

  def expand(self, n):
    return jnp.sin(n.astype(jnp.float32))

  def jvp(self, primals, tangents):
    return self(*primals), jnp.zeros(primals[0].shape, jnp.float32)


def test_the_jvp_of_a_primitive_of_integers_is_not_required():
  n = jnp.array([1, 2, 3], jnp.int32)
  report = check_rules(lambda n: _SinOfInt(jax.typeof(n))(n), n,
                       x64=False)
  assert report.passed, report
  assert report.required == ["_SinOfInt.expand"], report.required


class _DoubledLog1pExp(hijax.HiPrim):
  """log(1 + e^x) with twice its derivative in jvp and vjp: right for a
  surrogate, wrong for a derivative."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return jnp.log1p(jnp.exp(x))

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), 2 * jax.nn.sigmoid(x) * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return (2 * jax.nn.sigmoid(x) * g,)


@surrogate
class _MarkedDoubled(_DoubledLog1pExp):
  pass


class _UnmarkedSubclass(_MarkedDoubled):
  pass


def test_a_hiprim_class_marked_surrogate_is_honoured_and_not_its_subclass():
  report = check_rules(lambda x: _MarkedDoubled(jax.typeof(x))(x), X,
                       modes=("jvp", "vjp"), accept_inconclusive=True)
  assert not report.failures and report.surrogates, report
  report = check_rules(lambda x: _UnmarkedSubclass(jax.typeof(x))(x), X,
                       modes=("jvp", "vjp"), raise_on_failure=False)
  assert report.failures and not report.surrogates, report


@jax.custom_jvp
def _good(x):
  return jnp.sin(x)


_good.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


@jax.custom_vjp
def _bad(x):
  return x ** 2


_bad.defvjp(lambda x: (x ** 2, x), lambda x, g: (3 * x * g,))


def test_a_function_inside_jit_is_checked_alone_at_its_first_inputs():
  """Beside another, inside jit, called twice: checked alone (named, not
  the other) at the inputs of its first call, 2 x."""
  program = jax.jit(lambda x: _bad(2. * x) + _bad(x) + _good(x))
  report = check_rules(program, X, raise_on_failure=False)
  assert {f.rule for f in report.failures} == {"_bad (custom_vjp): fwd/bwd"}
  assert all("_bad (custom_vjp) alone" in f.check for f in report.failures)
  assert all("[0.6,3.4,-4.4]" in "".join(f.inputs.split())
             for f in report.failures), [
      f.inputs for f in report.failures]


def test_a_function_called_twice_is_one_rule_named_once_with_one_budget():
  lines = []
  report = check_rules(lambda x: _good(_good(x)) + _good(2. * x), X,
                       progress=lines.append, modes=("jvp",))
  assert report.primitives == ["_good (custom_jvp)"], report.primitives
  assert report.required == ["_good (custom_jvp): the jvp rule"]
  assert lines and all(" of 30 s: " in line for line in lines), lines


# --- a jvp rule whose primal output reads the tangent is broken -------------

def test_a_jvp_rule_whose_primal_output_reads_the_tangent_fails():
  """JAX cannot linearize such a rule ("Linearization failed ... does not
  support reverse-mode autodiff"): that is the rule's fault, not a limit it
  declares (before: vjp and lin skipped "by intent", the report passed)."""
  @jax.custom_jvp
  def f(x):
    return jnp.sin(x)

  @f.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.sin(x) + 0. * t, jnp.cos(x) * t

  with pytest.raises(RuleCheckError) as raised:
    check_rules(f, X, modes=("jvp", "vjp", "lin"), order=1)
  report = raised.value.report
  assert not report.by_intent and not report.first_order_only
  assert {x.rule for x in report.failures} == {"f (custom_jvp): the jvp rule"}
  assert {x.check for x in report.failures} == {"vjp", "linearize"}
  detail = report.failures[0].detail
  assert "primal output depends on the tangent" in detail
  assert "compute the primal output from the primals alone" in detail
  assert "Linearization failed" in detail  # JAX's own words, quoted
  # the same rule without the tangent in its primal output passes
  @jax.custom_jvp
  def g(x):
    return jnp.sin(x)
  g.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))
  assert check_rules(g, X, modes=("jvp", "vjp", "lin"), order=1).passed


def test_what_the_functions_checked_alone_cost_is_in_the_report():
  """issue 61 (blame_alone merging fields by hand, dropping cost: refuted):
  the program's report adds what each function checked alone cost to its
  own (here 40 + 80 + 40 second-order evaluations; the program's own are 40
  of them)."""
  key = "second-order evaluations"
  report = check_rules(lambda x: _bad(_good(x) * 2.), X,
                       raise_on_failure=False)
  assert {f.rule for f in report.failures} == {"_bad (custom_vjp): fwd/bwd"}
  alone = [check_rules(f, x, raise_on_failure=False).cost[key]
           for f, x in ((_good, X), (_bad, 2. * _good(X)))]
  assert report.cost[key] > sum(alone), (report.cost, alone)


def test_a_refusal_by_design_excuses_no_other_rule_of_the_program():
  """A silent pass (found for issue 61): in a program with a rule that
  refuses differentiation by design (equinox's nondifferentiable) and a
  wrong backward rule, the refusal excused the mode's rules together, the
  wrong one too, and the report passed. Each function is then checked
  alone: the wrong one fails, named; right ones beside a refusal pass."""
  from refusing_rule import no_grad
  report = check_rules(lambda x: _bad(no_grad(x) * 2.), X,
                       raise_on_failure=False)
  assert {f.rule for f in report.failures} == {"_bad (custom_vjp): fwd/bwd"}
  assert "guarded (custom_jvp): the jvp rule" in report.by_intent
  right = check_rules(lambda x: _good(no_grad(x) * 2.), X)
  assert right.passed and "guarded (custom_jvp): the jvp rule" in (
      right.by_intent), right
  ste = _jax_round_ste()  # a surrogate: the same, declared
  beside = check_rules(lambda x: _bad(ste(x) * 2.), X, surrogates=[ste],
                       raise_on_failure=False)
  assert {f.rule for f in beside.failures} == {"_bad (custom_vjp): fwd/bwd"}


def _sqrt_abs_and_double():
  @jax.custom_vjp
  def f(x):
    return jnp.sqrt(jnp.abs(x)), 2 * x

  def fwd(x):
    return f(x), x

  def bwd(x, g):
    return jax.vjp(lambda x: (jnp.sqrt(jnp.abs(x)), 2 * x), x)[1](g)
  f.defvjp(fwd, bwd)
  return f


def test_an_input_left_out_of_the_identity_gets_a_zero_tangent():
  """At x = 0, sqrt|x|'s cotangent is not finite and its output element not
  judged, but 2x there is: the input element is left out of the identity
  (a zero tangent on both sides, not a tangent on the left alone)."""
  report = check_rules(_sqrt_abs_and_double(), jnp.array([0.0, 1.3, -0.7]),
                       modes="vjp", order=1)
  assert report.passed, report
  assert any("non-finite cotangent at 1 input element" in line
             for line in report.inconclusive), report


class _Lifted(zoo.Unary):
  """sin(x) + 1e12: flat to float64's resolution at 0.5. Its backward rule
  is 1e-6 off the jvp rule's slope, far within what the function's own
  rounding hides there."""

  def expand(self, x):
    return jnp.sin(x) + 1e12

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return (jnp.cos(x) * (1 + 1e-6) * g,)


def test_two_rules_of_a_flat_function_may_differ_by_its_rounding():
  """Compared with each other (the vjp with the jvp rule), two rules of a
  function flat to its rounding may differ by what that rounding hides."""
  report = check_rules(lambda x: _Lifted(jax.typeof(x))(x), jnp.array([0.5]),
                       modes=("jvp", "vjp"), order=1, raise_on_failure=False)
  assert any("vjp vs the jvp rule" in line for line in report.ran), report
  assert not report.failures, report


def test_a_failed_identity_s_max_error_is_the_difference_of_its_sides():
  """A backward rule off the identity: the failure's max_error is
  |<ȳ, J ṫ> - <vjp(ȳ), ṫ>|, the error its message gives."""
  @jax.custom_vjp
  def exp(x):
    return jnp.exp(x)
  exp.defvjp(lambda x: (jnp.exp(x), x), lambda x, g: (g * x,))
  report = check_rules(exp, X, modes="vjp", order=1, raise_on_failure=False)
  (failure,) = report.failures
  lhs, rhs = (float(v) for v in re.findall(r"= (-?[0-9.e+-]+)",
                                           failure.detail)[:2])
  assert failure.max_error == pytest.approx(abs(lhs - rhs), rel=1e-6)
