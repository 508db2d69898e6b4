"""The second-order checks (hijax/testing/_second_order.py) on what their
other tests leave out: a third order, and which first derivatives are
differentiated again."""
import jax.numpy as jnp

from hijax.testing import check_rules

import zoo

X = jnp.array([0.3, -1.2, 2.0])


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
  report = check_rules(zoo.tanh, X, modes=("vjp", "second_order"))
  again = [r for r in report.ran if "differentiated again" in r]
  assert again and all("backward pass" in r for r in again), report.ran
  assert not any("on the tangent map" in r for r in report.ran), report.ran
  report = check_rules(zoo.tanh, X, modes=("jvp", "second_order"))
  again = [r for r in report.ran if "differentiated again" in r]
  assert again and all("tangent map" in r for r in again), report.ran
