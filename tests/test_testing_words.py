"""The words by which the checker recognizes others' errors
(hijax/testing/_foreign_words.py): each pattern matches the error it names,
reproduced here where it can be, on the JAX release it lists; and hijax's
own conditions are told by type."""
import re

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import pytest

from hijax.derived import NonlinearBackwardError
from hijax.testing._foreign_words import DECLARED_LIMITS, declares_limit
from hijax.testing._report import declared_limit

_BY_PATTERN = {w.pattern: w for w in DECLARED_LIMITS}


def _error_of(fn):
  with pytest.raises(Exception) as info:
    fn()
  return info.value


@jax.custom_vjp
def _vjp_only(x):
  return jnp.sin(x)


_vjp_only.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (jnp.cos(x) * g,))


def _while(x):
  return jax.lax.while_loop(lambda c: c < 10., lambda c: 2. * c, x)


REPRODUCED = {
    r"can't apply forward-mode autodiff \(jvp\) to a custom_vjp function":
        lambda: jax.jvp(_vjp_only, (1.,), (1.,)),
    r"Reverse-mode differentiation does not work for lax\.while_loop":
        lambda: jax.grad(_while)(1.),
    r"cannot be (?:auto)?differentiated":
        lambda: jax.jvp(eqxi.nondifferentiable, (1.,), (1.,)),
}


@pytest.mark.parametrize("pattern", list(REPRODUCED))
def test_each_reproduced_error_matches_its_pattern_on_the_releases_listed(
    pattern):
  e = _error_of(REPRODUCED[pattern])
  assert re.search(pattern, str(e)), str(e)
  assert declares_limit(e) and declared_limit(e, strict=True)
  words = _BY_PATTERN[pattern]
  if words.raised_by.startswith("JAX"):
    assert f"jax {jax.__version__}" in words.seen_in, words


@pytest.mark.parametrize("message, pattern", [
    ("this solver is not reverse-mode differentiable",
     r"not (?:reverse-mode |forward-mode )?differentiable"),
    ("Linearization failed ... uses an operation that does not support "
     "reverse-mode autodiff.", r"does not support (?:reverse|forward)-mode"),
])
def test_the_patterns_not_reproduced_here_match_their_words(message, pattern):
  assert pattern in _BY_PATTERN
  assert declares_limit(ValueError(message))
  assert re.search(pattern, message)


def test_a_broken_rule_is_not_a_declared_limit():
  assert not declares_limit(ValueError("shapes (3,) and (4,) differ"))
  assert declared_limit(NotImplementedError("no rule"), strict=True) is None
  assert declared_limit(NotImplementedError("no rule")) is not None


def test_hijax_nonlinear_backward_rule_is_told_by_type():
  """A backward rule not linear in g: a limit by design for a surrogate
  only, whatever its message says; raised from another error, too."""
  e = NonlinearBackwardError("any words", None, "vjp_bwd", "g * g")
  assert declared_limit(e, surrogate=True) is not None
  assert declared_limit(e, strict=True) is None
  assert declared_limit(e) is None
  try:
    try:
      raise e
    except NonlinearBackwardError as inner:
      raise TypeError("wrapped") from inner
  except TypeError as outer:
    assert declared_limit(outer, surrogate=True) is not None


def test_a_failure_carries_the_exception_a_rule_raised():
  """A failure says by its `error` that the rule raised (the plugin's retry
  in the inputs' own dtypes reads it), not by its text."""
  from hijax.testing import check_rules

  @jax.custom_jvp
  def raising(x):
    return jnp.sin(x)

  @raising.defjvp
  def _(primals, tangents):
    raise ZeroDivisionError("no jvp here")

  @jax.custom_jvp
  def wrong(x):
    return jnp.sin(x)

  wrong.defjvp(lambda p, t: (jnp.sin(p[0]), 2. * t[0]))
  x = jnp.array([0.3, 1.2])
  report = check_rules(raising, x, modes=("jvp",), raise_on_failure=False)
  assert report.failures and all(
      isinstance(f.error, ZeroDivisionError) for f in report.failures)
  report = check_rules(wrong, x, modes=("jvp",), raise_on_failure=False)
  assert report.failures and all(f.error is None for f in report.failures)
