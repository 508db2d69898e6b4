"""The second-order checks (hijax/testing/_second_order.py) on what their
other tests leave out: a third order, and which first derivatives are
differentiated again."""
import jax
import jax.numpy as jnp

from hijax.testing import check_rules

import zoo

X = jnp.array([0.3, -1.2, 2.0])


class Logistic(zoo.Unary):
  """The logistic function, whose jvp rule is plain JAX (its primal too)."""

  def expand(self, x):
    return jax.nn.sigmoid(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    s = jax.nn.sigmoid(x)
    return s, s * (1 - s) * t


class Softplus(zoo.Unary):
  """log(1 + e^x), whose jvp rule binds Logistic: the chain of rules bound
  ends there (Tanh's does not: Sech2's jvp binds Sech2 again)."""

  def expand(self, x):
    return jnp.logaddexp(x, 0.0)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.logaddexp(x, 0.0), Logistic(jax.typeof(x))(x) * t


def test_order_two_checks_no_second_order_of_the_derived_functions():
  """At order=2 the tangent map's rules (Logistic's jvp) are checked at first
  order only; at order=3 their second order too. (First in this file: with
  an order that does not fall, Tanh's checks below would never end.)"""
  softplus = lambda x: Softplus(jax.typeof(x))(x)
  nested = lambda report: [r for r in report.ran if r.startswith(
      "second_order: second order, on") and ": second_order: " in r]
  report = check_rules(softplus, X, modes=("jvp", "second_order"), order=2)
  assert report.passed, report
  assert any(r.startswith("second_order: second order, on the tangent map")
             for r in report.ran), report.ran
  assert not nested(report), report.ran
  assert nested(check_rules(softplus, X, modes=("jvp", "second_order"),
                            order=3))


def test_order_three_checks_the_second_order_of_the_derived_functions():
  """Tanh's jvp binds Sech2, whose jvp binds Sech2 again: at order=3 the
  derived functions' own second order is checked (at order=2 it is not)."""
  nested = lambda report: [r for r in report.ran if r.startswith(
      "second_order: second order, on") and ": second_order: " in r]
  assert not nested(check_rules(zoo.tanh, X, order=2))
  report = check_rules(zoo.tanh, X, order=3)
  assert report.passed, report
  assert nested(report), report.ran


def test_the_backward_pass_and_the_tangent_map_are_both_differentiated_again():
  report = check_rules(zoo.tanh, X, modes=("jvp", "vjp", "second_order"))
  again = [r for r in report.ran if "differentiated again" in r]
  assert any("backward pass" in r for r in again), report.ran
  assert any("tangent map" in r for r in again), report.ran
  # forward over reverse is the backward pass's fallback, not the tangent map's
  assert not any("tangent map" in r and "forward over reverse" in r
                 for r in again), again


def test_only_the_modes_asked_for_are_differentiated_again():
  """Tanh has a jvp rule, but only vjp was asked for: the backward pass is
  differentiated again, the tangent map is not."""
  report = check_rules(zoo.tanh, X, modes=("vjp", "second_order"), device=False)
  again = [r for r in report.ran if "differentiated again" in r]
  assert again and all("backward pass" in r for r in again), report.ran
  assert not any("on the tangent map" in r for r in report.ran), report.ran
  report = check_rules(zoo.tanh, X, modes=("jvp", "second_order"), device=False)
  again = [r for r in report.ran if "differentiated again" in r]
  assert again and all("tangent map" in r for r in again), report.ran


# --- what a mutation run of _second_order found untested (issue 61) --------

from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from budget_clock import one_second_per_check  # noqa: E402


@jax.custom_jvp
def _halve(n):
  return n.astype(jnp.float32) / 2


_halve.defjvp(lambda p, t: (_halve(p[0]), jnp.zeros(p[0].shape, jnp.float32)))


@jax.custom_jvp
def _first_index(x):
  return jnp.argmax(x)


def _first_index_jvp(primals, tangents) -> tuple[Any, Any]:
  return _first_index(primals[0]), np.zeros((), jax.dtypes.float0)


_first_index.defjvp(_first_index_jvp)


@pytest.mark.parametrize("fn, x", [(_halve, jnp.arange(3)), (_first_index, X)],
                         ids=["integer-input", "integer-output"])
def test_second_order_needs_floating_point_inputs_and_outputs(fn, x):
  report = check_rules(fn, x)
  assert ("second_order", "no floating-point inputs or outputs") in (
      report.skipped), report


class _Cos(zoo.Unary):
  def expand(self, x):
    return jnp.cos(x)

  def jvp(self, primals, tangents):
    return self(primals[0]), -jnp.sin(primals[0]) * tangents[0]


class _SinBwdBindsCos(zoo.Unary):
  """sin; its jvp rule binds no primitive, its backward rule binds _Cos."""

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    return self(primals[0]), jnp.cos(primals[0]) * tangents[0]

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return (g * _Cos(jax.typeof(x))(x),)


class _SinJvpRaises(_SinBwdBindsCos):
  def jvp(self, primals, tangents):
    raise ValueError("this jvp rule always raises")


def _cos_by_callback(x):
  return jax.pure_callback(np.cos, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


class _SinBwdCallback(_SinBwdBindsCos):
  """The backward rule calls NumPy: it cannot be differentiated again (and
  says so in no words of a declared limitation)."""

  def vjp_bwd_retval(self, x, g):
    return (g * _cos_by_callback(x),)


@jax.custom_vjp
def _identity(x):
  return x


_identity.defvjp(lambda x: (x, None), lambda _, g: (g,))


def _looped_cos(x):
  """cos(x) by a while_loop (no reverse mode) of a custom_vjp function (no
  forward mode): neither can differentiate it, each a declared limit."""
  return jax.lax.while_loop(lambda c: c[0] < 1, lambda c: (
      c[0] + 1, jnp.cos(_identity(c[1]))), (0, x))[1]


class _SinBwdLoop(_SinBwdBindsCos):
  def vjp_bwd_retval(self, x, g):
    return (g * _looped_cos(x),)


def _call(cls):
  return lambda x: cls(jax.typeof(x))(x)


def _on(report, what):
  """The checks of the derived function ``what`` that ran or failed."""
  lines = report.ran + [f.check for f in report.failures]
  return [r for r in lines if f"second order, on {what}" in r]


def test_a_tangent_map_binding_no_primitive_leaves_the_backward_pass_checked():
  """The tangent map binds no primitive (skipped, saying so); the backward
  pass, next, binds _Cos: its first-order checks still run."""
  report = check_rules(_call(_SinBwdBindsCos), X)
  assert report.passed, report
  assert any(m == "second_order" and why.startswith("the tangent map") and
             why.endswith("binds no hijax primitive")
             for m, why in report.skipped), report.skipped
  assert _on(report, "the backward pass"), report.ran


def test_a_tangent_map_that_cannot_be_traced_fails_and_the_backward_pass_is_checked():
  report = check_rules(_call(_SinJvpRaises), X, raise_on_failure=False)
  tracing = [f for f in report.failures if f.check.startswith("tracing the "
                                                                "tangent map")]
  assert [f.rule for f in tracing] == ["_SinJvpRaises.jvp"], report.failures
  assert "this jvp rule always raises" in str(tracing[0])
  assert _on(report, "the backward pass"), report


def test_the_derived_functions_are_checked_in_the_modes_asked_for_only():
  """Tanh's tangent map binds Sech2, which has jvp, vjp and lin rules: with
  modes=("jvp", "second_order") only its jvp is checked there."""
  report = check_rules(zoo.tanh, X, modes=("jvp", "second_order"))
  derived = _on(report, "the tangent map")
  assert derived, report.ran
  assert all(": jvp: " in r for r in derived), derived


def test_a_backward_pass_that_cannot_be_differentiated_again_fails():
  """Reverse over reverse of a backward rule that calls NumPy raises, in no
  words of a declared limit: a failure, not a fallback to forward over
  reverse; the tangent map is still differentiated again."""
  report = check_rules(_call(_SinBwdCallback), X, raise_on_failure=False)
  again = [f for f in report.failures if "differentiated again" in f.check]
  assert [f.rule for f in again] == [
      "_SinBwdCallback.vjp_fwd/vjp_bwd_retval"], report.failures
  assert again[0].check.startswith("the backward pass"), again
  assert not any("reverse over reverse is not supported" in why
                 for _, why in report.skipped), report.skipped
  assert any(r.startswith("second_order: the tangent map") and
             "differentiated again" in r for r in report.ran), report.ran


def test_a_backward_pass_no_mode_can_differentiate_is_first_order_only():
  """Reverse mode of a while_loop and forward mode of a custom_vjp function
  are both declared limits: the backward rule is listed first order only,
  the report passes, and the tangent map is still differentiated again."""
  report = check_rules(_call(_SinBwdLoop), X)
  assert report.passed, report
  assert [r.split(":")[0] for r in report.first_order_only] == [
      "_SinBwdLoop.vjp_fwd/vjp_bwd_retval"], report.first_order_only
  assert any(r.startswith("second_order: the tangent map") and
             "differentiated again" in r for r in report.ran), report.ran


def test_the_second_order_cost_adds_up_over_the_modes():
  key = "second-order evaluations"
  cost = lambda *modes: check_rules(zoo.tanh, X, modes=(
      *modes, "second_order")).cost[key]
  assert cost("jvp") + cost("vjp") == cost("jvp", "vjp")


def test_a_budget_spent_in_the_second_order_lists_each_check_it_did_not_start(
    monkeypatch):
  """On a fake clock on which each check takes a second, a budget spent
  when the second order starts: each of its checks (the backward pass and
  the tangent map differentiated again, the rules bound by each of the
  three derived functions) is listed as skipped for time."""
  clock = one_second_per_check(monkeypatch)
  check_rules(zoo.tanh, X, order=1, time_budget=None)
  first_order = clock[0]
  clock[0] = 0.
  with pytest.warns(UserWarning, match="time budget"):
    report = check_rules(zoo.tanh, X, time_budget=first_order + 0.5,
                         accept_inconclusive=True)
  skipped = [s for s in report.skipped_for_time
             if s.startswith("second_order")]
  again = [s for s in skipped if "differentiated again" in s]
  assert len(again) == 2, skipped
  assert len([s for s in skipped if "the rules bound by" in s]) == 3, skipped


class _SinBwdRaises(_SinBwdBindsCos):
  def vjp_bwd_retval(self, x, g):
    raise ValueError("this backward rule always raises")


def test_a_backward_pass_that_cannot_be_evaluated_fails_and_the_tangent_map_is_checked():
  report = check_rules(_call(_SinBwdRaises), X, raise_on_failure=False)
  again = [f for f in report.failures if "differentiated again" in f.check]
  assert [f.rule for f in again] == [
      "_SinBwdRaises.vjp_fwd/vjp_bwd_retval"], report.failures
  assert "this backward rule always raises" in str(again[0])
  assert any(r.startswith("second_order: the tangent map") and
             "differentiated again" in r for r in report.ran), report.ran


_jvp_runs = [0]


def _count(*_):
  _jvp_runs[0] += 1


class _SinCounted(zoo.Unary):
  """sin, its jvp rule counting its runs."""

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    jax.debug.callback(_count, primals[0])
    return self(primals[0]), jnp.cos(primals[0]) * tangents[0]


def test_the_second_order_cost_counts_the_first_derivatives_evaluations():
  """The report's second-order cost is the number of evaluations of the
  first derivative (the tangent map: one run of the jvp rule each) the
  finite differences took, at the point and around it; the second order's
  one more run is the jvp of the tangent map at the point."""
  runs = {}
  for order, modes in ((1, ("jvp",)), (2, ("jvp", "second_order"))):
    _jvp_runs[0] = 0
    report = check_rules(_call(_SinCounted), X, modes=modes, order=order)
    runs[order] = _jvp_runs[0]
  evaluations = report.cost["second-order evaluations"]
  assert evaluations > 2
  assert runs[2] - runs[1] == evaluations + 1, (runs, report.cost)


class _SinFrozenJvp(_SinBwdBindsCos):
  """Right at first order; its tangent map's own derivative is wrong (the
  slope is held constant)."""

  def jvp(self, primals, tangents):
    x, t = primals[0], tangents[0]
    return self(x), jax.lax.stop_gradient(jnp.cos(x)) * t


def test_a_tangent_map_wrong_at_second_order_is_named_in_the_failure():
  report = check_rules(_call(_SinFrozenJvp), X, modes=("jvp", "second_order"),
                       raise_on_failure=False)
  (failure,) = [f for f in report.failures if "differentiated again" in f.check]
  assert failure.rule == "_SinFrozenJvp.jvp"
  assert "jvp of the tangent map gives" in str(failure), str(failure)
