"""check_rules on JAX's own custom rules (issue 36): no failure where the
rule is right, at smooth points and at kinks, domain boundaries, float32 at
large arguments and values that are zero to rounding (reported inconclusive
where finite differences cannot judge); and each real defect found in JAX
still caught. Also: several custom rules in one program, rules that cannot
be differentiated twice, complex inputs, and the time budget."""
import jax
import jax.numpy as jnp
import jax.scipy.special as sp
import numpy as np
import pytest

from hijax.testing import InconclusiveCheckError, check_rules

from budget_clock import one_second_per_check

F32 = jnp.float32


def _report(fn, *args, **kwargs):
  return check_rules(fn, *args, raise_on_failure=False, **kwargs)


def _inconclusive(report, words):
  return [str(i) for i in report.inconclusive if words in str(i)]


# --- right rules: pass, and say where finite differences cannot judge -------------------

def test_entr_fails_nowhere_and_still_judges_the_smooth_elements():
  """entr(-h) = -inf beside 0: only that element is left out."""
  x = jnp.array([0., .5, 2.])
  report = _report(sp.entr, x)
  assert report.passed, report
  (line,) = {s.split(": ", 1)[1] for s in _inconclusive(report, "(at out(0,))")
             if "not finite" in s}
  assert "1 output element(s) not finite on one side" in line

  @jax.custom_jvp
  def entr_wrong_at_2(x):
    return sp.entr(x)

  @entr_wrong_at_2.defjvp
  def _jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    slope = -jnp.log(x) - 1
    return entr_wrong_at_2(x), jnp.where(x > 1, 1.1 * slope, slope) * t
  report = _report(entr_wrong_at_2, x, order=1)
  jvp = [f for f in report.failures if f.rule.endswith("the jvp rule")]
  assert jvp and "at index (2,)" in jvp[0].detail, report


@pytest.mark.parametrize("fn, x, kinks", [
    (jax.nn.relu, jnp.array([-1., 0., 2.]), ["out(1,)"]),
    (jax.nn.relu6, jnp.array([0., 3., 6.]), ["out(0,)", "out(2,)"]),
])
def test_kinks_are_inconclusive_not_failures(fn, x, kinks):
  report = _report(fn, x)
  assert report.passed, report
  kinked = _inconclusive(report, "not smooth")
  assert kinked and all(k in kinked[0] for k in kinks), report


def _has_custom_rule(fn, *args) -> bool:
  text = str(jax.make_jaxpr(fn)(*args))
  return "custom_jvp_call" in text or "custom_vjp_call" in text


def test_hypot_at_the_origin():
  if not _has_custom_rule(jnp.hypot, 0., 0.):  # JAX 0.11
    pytest.skip("jnp.hypot has no custom rule in this JAX")
  report = _report(jnp.hypot, 0., 0.)
  # a kink at the only output element: nothing fails, and the jvp rule
  # cannot be judged there, so the verdict is inconclusive (not passed)
  assert report.verdict == "inconclusive" and not report.failures, report
  assert _inconclusive(report, "not smooth"), report
  assert "the jvp rule" in " ".join(report.not_judged), report


def test_rel_entr_at_zero():
  """(JAX 0.11 builds rel_entr from two custom rules, xlogx and xlogy, each
  then checked alone at the inputs rel_entr gives it.)"""
  report = _report(sp.rel_entr, jnp.array([0., 1.]), jnp.array([1., 2.]))
  assert report.passed and report.inconclusive, report
  if report.primitives == ["_rel_entr (custom_jvp)"]:
    assert _inconclusive(report, "not finite"), report


@pytest.mark.parametrize("fn, x", [
    (sp.sici, [3.7e5, 1e6, 2.9e6]),     # float32 finite differences say -2.3e-5
    (sp.sici, [370., 1000., 2900.]),    # second order: off by 2% at 2900
    (sp.fresnel, [370., 1000., 2900.]),
], ids=["sici-large", "sici", "fresnel"])
def test_float32_at_large_arguments_is_differenced_in_float64(fn, x):
  report = _report(fn, jnp.array(x, F32), x64=False)
  assert report.passed and report.dtype == "float32", report


@pytest.mark.parametrize("fn", [sp.i0, sp.i1, sp.expi],
                         ids=["i0", "i1", "expi"])
def test_tangents_do_not_overflow_float32(fn):
  """Near 88 the derivative is close to float32's largest number: a tangent
  of the size of x (64) made the rules overflow."""
  report = _report(fn, jnp.array([85., 87., -88.], F32), x64=False,
                   modes=("jvp", "vjp", "lin", "second_order"))
  assert report.passed, report


@pytest.fixture
def softmax_custom_jvp():
  old = jax.config.jax_softmax_custom_jvp
  jax.config.update("jax_softmax_custom_jvp", True)
  yield
  jax.config.update("jax_softmax_custom_jvp", old)


def test_softmax_with_a_mask_and_a_dominant_logit(softmax_custom_jvp):
  """exp(-40) next to 1: the rules' tangent of the dominant output is a
  difference that cancels to rounding."""
  del softmax_custom_jvp
  where = jnp.array([True, False, True, True])
  fn = lambda x: jax.nn.softmax(x, where=where)
  for x in ([0.5, -1., 2., 0.1], [50., 10., -30., 3.]):
    report = _report(fn, jnp.array(x))
    assert report.primitives == ["_softmax (custom_jvp)"]
    assert report.passed, report


def test_det_of_a_singular_matrix():
  """The determinant is zero to rounding (JAX gives -9.5e-16, its jvp 0):
  compared with an absolute floor. Its Hessian there is NaN in JAX (a real
  defect, below), so only the first order is checked here."""
  a = jnp.arange(1., 10.).reshape(3, 3)
  assert check_rules(jnp.linalg.det, a, order=1).passed


# --- real defects in JAX's rules: still caught ------------------------------------------

def _second_order_failures(report):
  return [f for f in report.failures if "differentiated again" in f.check]


def test_det_hessian_is_nan_at_a_singular_matrix():
  a = jnp.arange(1., 10.).reshape(3, 3)
  # on the host CPU: a TPU has no float64 LU
  with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
    assert np.isnan(jax.hessian(jnp.linalg.det)(a.astype(jnp.float64))).all()
  report = _report(jnp.linalg.det, a)
  assert report.failures and report.failures == _second_order_failures(
      report), report
  assert any("nan" in f.detail for f in report.failures)


def test_log1mexp_second_derivative_is_nan_at_1000():
  x = jnp.array([0.5, 1000.])
  with jax.enable_x64(True):
    assert np.isnan(jax.grad(jax.grad(jax.nn.log1mexp))(1000.))
  report = _report(jax.nn.log1mexp, x)
  fails = _second_order_failures(report)
  assert fails and fails == report.failures, report
  assert any("nan" in f.detail for f in fails)


def test_erfcx_hessian_raises():
  """On JAX 0.12 (not 0.11) the Hessian of erfcx of an array raises."""
  x = jnp.array([-2., .5, 3.])
  try:
    jax.hessian(lambda x: sp.erfcx(x).sum())(x)
    broken = False
  except TypeError as e:
    broken = "select" in str(e)
  report = _report(sp.erfcx, x)
  if not broken:
    assert report.passed, report
    return
  fails = _second_order_failures(report)
  assert fails and fails == report.failures, report
  assert all("raised TypeError" in f.detail for f in fails)
  assert not report.first_order_only  # a shape error is not a declared limit


@pytest.mark.parametrize("fn, want", [
    (sp.dawsn, -1.73e-7),      # float32 gives 0
    (sp.log_ndtr, 1700.0),     # float32 gives 1808
], ids=["dawsn", "log_ndtr"])
def test_float32_gradients_wrong_at_minus_1700(fn, want):
  x = jnp.array([-1700., 1.], F32)
  with jax.enable_x64(True):
    np.testing.assert_allclose(jax.grad(fn)(jnp.float64(-1700.)), want,
                               rtol=2e-3)
  got = float(jax.grad(fn)(x[0]))
  assert abs(got - want) > 0.05 * abs(want)  # the defect
  report = _report(fn, x, x64=False, modes=("jvp",), device=False)  # the host's float32
  (fail,) = report.failures
  assert fail.rule.endswith("the jvp rule") and "index (0,)" in fail.detail


# --- several custom rules: each checked alone ------------------------------------------

@jax.custom_jvp
def good(x):
  return jnp.sin(x)


good.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


@jax.custom_vjp
def bad(x):
  return x ** 2


bad.defvjp(lambda x: (x ** 2, x), lambda x, g: (3 * x * g,))


def test_the_rule_at_fault_is_named_alone():
  report = _report(lambda x: bad(good(x) * 2.), jnp.array([0.3, 1.2, -0.7]))
  assert report.primitives == ["good (custom_jvp)", "bad (custom_vjp)"]
  assert {f.rule for f in report.failures} == {"bad (custom_vjp): fwd/bwd"}
  # good's jvp rule, which bad lacks, was checked (alone)
  assert any(r.startswith("jvp: good (custom_jvp) alone:")
             for r in report.ran), report
  assert any(mode == "all modes" and "replaced by those of each function "
             "alone" in why for mode, why in report.skipped), report


def test_a_rule_inside_a_loop_stays_named_with_the_others():
  """A function called only inside a scan is not taken out: where the
  functions taken out pass alone, the program's failure stands."""
  def program(x):
    def body(c, xi):
      return c, bad(xi)
    return good(jax.lax.scan(body, 0., x)[1])
  report = _report(program, jnp.array([0.3, 1.2, -0.7]), order=1)
  assert not report.passed
  assert any("the functions checked alone passed" in why
             for _, why in report.skipped), report
  assert any(r.startswith("jvp: good (custom_jvp) alone:")
             for r in report.ran), report


def test_right_rules_together_are_not_checked_alone():
  """A library's rule may rely on a relation the program keeps between its
  inputs, which checking it alone would break: where the program passes,
  no rule is checked alone."""
  report = check_rules(lambda x: jax.nn.relu(x) + good(x),
                       jnp.array([-2., .5, 3.]))
  assert report.passed and not any(" alone: " in r for r in report.ran)


# --- rules that cannot be differentiated twice ------------------------------------------

@jax.custom_vjp
def _opaque(x):
  return x


_opaque.defvjp(lambda x: (x, None), lambda _, g: (g,))


@jax.custom_vjp
def looped(x):
  return jnp.sin(x)


def _looped_bwd(x, g):
  # a while loop (no reverse mode) and a custom_vjp (no forward mode)
  n = jnp.int32(3) + jnp.int32(jnp.sum(x) * 0)
  c = jax.lax.fori_loop(0, n, lambda i, c: 0.5 * c + 0.5 * jnp.cos(x),
                        jnp.cos(x))  # cos(x), exactly
  return (_opaque(c) * g,)


looped.defvjp(lambda x: (looped(x), x), _looped_bwd)


def test_a_rule_that_cannot_be_differentiated_again_is_first_order_only():
  x = jnp.array([0.3, 1.2, -0.7])
  report = check_rules(looped, x)
  assert report.passed and report.first_order_only, report
  assert "cannot be differentiated again" in report.first_order_only[0]
  strict = _report(looped, x, require_second_order=True)
  assert _second_order_failures(strict), strict


# --- complex inputs ----------------------------------------------------------------------

@jax.custom_jvp
def csin(z):
  return jnp.sin(z)


csin.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


@jax.custom_jvp
def csin_conj(z):
  return jnp.sin(z)


csin_conj.defjvp(lambda p, t: (jnp.sin(p[0]),
                               jnp.conj(jnp.cos(p[0])) * t[0]))


def _vjp_like_jax(z, w):
  return jax.vjp(lambda z: jnp.sin(z) * jnp.conj(z), z)[1](w)


@jax.custom_vjp
def sin_conj(z):  # not holomorphic
  return jnp.sin(z) * jnp.conj(z)


sin_conj.defvjp(lambda z: (sin_conj(z), z), _vjp_like_jax)


@jax.custom_vjp
def sin_conj_adjoint(z):  # the backward rule of the other convention
  return jnp.sin(z) * jnp.conj(z)


sin_conj_adjoint.defvjp(lambda z: (sin_conj_adjoint(z), z),
                        lambda z, w: (jnp.conj(_vjp_like_jax(z, w)[0]),))

Z = jnp.array([1.5 - 0.5j, -0.3 + 0.8j, 2.0 + 0.1j], jnp.complex64)


def test_complex_rules_in_jax_s_convention_pass():
  for fn in (csin, sin_conj, lambda z: jnp.abs(csin(z)) ** 2):
    report = check_rules(fn, Z, order=1)
    assert report.passed


@pytest.mark.parametrize("fn, rule", [
    (csin_conj, "csin_conj (custom_jvp): the jvp rule"),
    (sin_conj_adjoint, "sin_conj_adjoint (custom_vjp): fwd/bwd"),
])
def test_complex_rules_conjugated_fail(fn, rule):
  report = _report(fn, Z, order=1)
  assert rule in {f.rule for f in report.failures}, report


# --- the time budget ---------------------------------------------------------------------

def test_a_spent_time_budget_skips_the_rest_and_says_so():
  lines = []
  with pytest.warns(UserWarning, match="time budget"):
    with pytest.raises(InconclusiveCheckError, match="time_budget"):
      check_rules(csin, Z, time_budget=0, progress=lines.append)
  with pytest.warns(UserWarning, match="time budget"):
    report = check_rules(csin, Z, time_budget=0, progress=lines.append,
                         accept_inconclusive=True)
  # nothing was compared: never a pass
  assert report.verdict == "inconclusive" and not report.passed
  assert not report.ran and not report.complete and report.conclusive == 0
  assert any(s.startswith("expand") for s in report.skipped_for_time)
  assert "skipped for time" in str(report)
  report = check_rules(csin, Z, order=1, progress=lines.append)
  assert report.skipped_for_time == [] and report.seconds > 0
  assert any(line.startswith("check_rules: ") and "jvp" in line
             for line in lines)


def test_no_check_starts_once_the_budget_is_spent(monkeypatch):
  """A fake clock on which each check takes one second spends a budget of
  3.5 s part way: every check started within the budget, the rest are
  listed as skipped for time, and the report says it is incomplete."""
  # (on the machine's own clocks a loaded machine's slow compiles left no
  # check room to start: seen in CI)
  one_second_per_check(monkeypatch)
  lines = []
  full = check_rules(csin, Z, order=1, time_budget=None, progress=lines.append)
  lines.clear()
  with pytest.warns(UserWarning, match=r"time budget \(3.5 s\)"):
    report = check_rules(csin, Z, order=1, time_budget=3.5,
                         progress=lines.append, accept_inconclusive=True)
  assert report.ran and report.skipped_for_time and not report.complete
  assert len(report.ran) < len(full.ran)
  mode = lambda line: line.split(":")[0]
  # nothing dropped silently: each mode of the full run ran or is listed
  assert {mode(r) for r in full.ran} == {
      mode(r) for r in report.ran + report.skipped_for_time}, report
  started = [float(line.split()[1]) for line in lines]
  assert started == [0., 1., 2., 3.], lines
  assert report.seconds == 4.


def test_a_checkpointed_rule_at_fault_is_named_alone():
  """A custom function called under jax.checkpoint (JAX's `remat2`
  primitive) is taken out and checked alone as one under jit is: the wrong
  one is named, not the right one beside it."""
  x = jnp.array([0.3, 1.2, -0.7])
  for wrap in (jax.checkpoint, lambda f: jax.checkpoint(
      f, policy=jax.checkpoint_policies.nothing_saveable)):
    report = _report(lambda x: wrap(bad)(x) + good(x), x)
    assert {f.rule for f in report.failures} == {"bad (custom_vjp): fwd/bwd"}
    assert any(r.startswith("jvp: good (custom_jvp) alone:")
               for r in report.ran), report


def test_the_checks_alone_keep_their_cost_and_their_rules_left_by_intent():
  """What the functions checked alone cost and leave unjudged by intent is
  in the report (it was dropped: blame_alone copied fields one by one)."""
  from refusing_rule import no_grad
  x = jnp.array([0.3, 1.2, -0.7])
  report = _report(lambda x: bad(x) + no_grad(jax.lax.stop_gradient(x)), x,
                   accept_inconclusive=True)
  assert {f.rule for f in report.failures} == {"bad (custom_vjp): fwd/bwd"}
  # guarded, called with a stopped tangent, refuses only when checked alone
  assert "guarded (custom_jvp): the jvp rule" in report.by_intent, report
  report = _report(lambda x: bad(x) + good(x), x)
  key = "second-order evaluations"
  alone = _report(good, x).cost[key] + _report(bad, x).cost[key]
  assert report.cost[key] > alone, (report.cost, alone)  # and the program's
