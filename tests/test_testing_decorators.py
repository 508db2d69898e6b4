"""check_rules on jax.custom_jvp and jax.custom_vjp functions: their rules
against finite differences, reverse against forward mode, vmap against a
loop, and the second derivative."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.testing import RuleCheckError, check_rules

import zoo

X = jnp.array([-2.0, 0.5, 3.0])


@jax.custom_jvp
def softplus(x):
  return jnp.logaddexp(x, 0.0)


@softplus.defjvp
def _softplus_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return softplus(x), jax.nn.sigmoid(x) * t


@jax.custom_jvp
def softplus_bad(x):
  return jnp.logaddexp(x, 0.0)


@softplus_bad.defjvp
def _softplus_bad_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return softplus_bad(x), jax.nn.sigmoid(-x) * t  # sign slip


def _fwd(x):
  return softplus_vjp(x), x


def _bwd(x, g):
  return (jax.nn.sigmoid(x) * g,)


@jax.custom_vjp
def softplus_vjp(x):
  return jnp.logaddexp(x, 0.0)


softplus_vjp.defvjp(_fwd, _bwd)


def test_a_correct_custom_jvp_passes_every_check():
  report = check_rules(softplus, X)
  assert report.passed, report
  assert report.primitives == ["softplus (custom_jvp)"]
  assert report.modes_run == ["expand", "jvp", "vjp", "lin", "batch",
                              "second_order"]


def test_a_wrong_custom_jvp_rule_is_named():
  with pytest.raises(RuleCheckError) as info:
    check_rules(lambda x: 2 * softplus_bad(x), X)
  err = info.value
  assert err.rule == "softplus_bad (custom_jvp): the jvp rule"
  assert "finite differences" in err.check
  assert err.report.primitives == ["softplus_bad (custom_jvp)"]


def test_a_correct_custom_vjp_passes_and_has_no_forward_mode():
  report = check_rules(softplus_vjp, X)
  assert report.passed, report
  assert report.modes_run == ["expand", "vjp", "batch", "second_order"]
  assert ("jvp", "rule not defined") in report.skipped
  assert any("vjp vs finite differences" in r for r in report.ran)


def _custom_vjp(fwd, bwd, name="f"):
  f = jax.custom_vjp(lambda x: jnp.logaddexp(x, 0.0))
  f.__name__ = name
  f.defvjp(lambda x: fwd(f, x), bwd)
  return f


def _vjp_failures(f):
  with pytest.raises(RuleCheckError) as info:
    check_rules(f, X)
  return info.value.failures


def test_a_custom_vjp_backward_rule_that_drops_g_fails():
  f = _custom_vjp(lambda f, x: (f(x), x), lambda x, g: (jax.nn.sigmoid(x),))
  fails = _vjp_failures(f)
  assert {fl.rule for fl in fails} >= {"<lambda> (custom_vjp): fwd/bwd"}
  assert any("<ȳ, J ṫ> = <vjp(ȳ), ṫ>" in fl.check for fl in fails)


def test_a_custom_vjp_fwd_with_another_primal_fails():
  f = _custom_vjp(lambda f, x: (jnp.log1p(x ** 2), x),
                  lambda x, g: (jax.nn.sigmoid(x) * g,))
  fails = _vjp_failures(f)
  assert any(fl.check == "vjp's primal output vs the primitive's output"
             for fl in fails)


def test_a_custom_vjp_not_differentiable_again_fails_at_second_order():
  f = _custom_vjp(lambda f, x: (f(x), x),
                  lambda x, g: (jax.lax.stop_gradient(jax.nn.sigmoid(x)) * g,))
  assert check_rules(f, X, order=1).passed  # right at first order
  fails = _vjp_failures(f)
  assert [fl.check for fl in fails] == [
      "the backward pass x -> vjp(f, x)[1](ȳ), differentiated again, vs its "
      "finite differences"]
  h = jax.jacrev(jax.grad(lambda x: f(x).sum()))(X)
  np.testing.assert_array_equal(h, np.zeros((3, 3)))  # what it means


def test_hijax_primitives_come_first():
  """A function binding a hijax primitive has that primitive's rules
  checked; the jax.custom_jvp functions around it (here relu) are plain
  JAX."""
  report = check_rules(lambda x: jax.nn.relu(zoo.log1pexp(x)), X)
  assert report.primitives == ["Log1pExp"]
  report = check_rules(lambda x: jax.nn.relu(x) + softplus(x), X)
  assert report.primitives == ["relu (custom_jvp)", "softplus (custom_jvp)"]
  assert report.passed, report
