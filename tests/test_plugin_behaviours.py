"""``pytest --hijax-check-rules``: how a rule's samples make its verdict,
how its budget is spent, the dtypes and JAX settings it is checked under
(pytester runs, like tests/test_plugin.py)."""
import functools
import json

import jax

import pytest

import hijax  # noqa: F401  (imported here, not first inside a pytester run)
from hijax.testing import _plugin  # noqa: F401  (likewise)

pytest_plugins = ("pytester",)

PLUGIN = ("-p", "no:hijax", "-p", "_hijax_pytestplugin", "-p",
          "no:cacheprovider", "--hijax-check-rules", "--hijax-rules-json",
          "rules.json")


@pytest.fixture
def suite(pytester):
  pytester.makeini("[pytest]\n")
  pytester.syspathinsert()
  return pytester


def _rules(pytester, *args):
  """The run's result and its JSON report's rules by name."""
  result = pytester.runpytest(*PLUGIN, *args)
  report = json.loads((pytester.path / "rules.json").read_text())
  return result, {r["rule"]: r for r in report["rules"]}


def test_a_rule_failing_at_one_input_of_two_fails_the_run(suite):
  """Right at the first input checked (|x| < 1), wrong at the second."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def square(x):
  return x * x
square.defjvp(lambda p, t: (square(p[0]), jnp.where(
    jnp.abs(p[0]) < 1, 2 * p[0], 3 * p[0]) * t[0]))
''', test_two='''
import jax.numpy as jnp
from lib import square
def test_small():
  square(jnp.float32(0.5))
def test_large():
  square(jnp.array([2.0, 3.0]))
''')
  result, rules = _rules(suite)
  result.assert_outcomes(passed=2)
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  rule = rules["square"]
  assert rule["verdict"] == "failed"
  assert [(i["types"], i["test"], i["verdict"]) for i in rule["inputs"]] == [
      (["f32[]"], "test_two.py::test_small", "passed"),
      (["f32[2]"], "test_two.py::test_large", "failed")]


def test_the_rule_budget_is_shared_by_its_inputs(suite):
  """A budget the first input's check spends leaves none for the second."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def sin(x):
  return jnp.sin(x)
sin.defjvp(lambda p, t: (sin(p[0]), jnp.cos(p[0]) * t[0]))
''', test_two='''
import jax.numpy as jnp
from lib import sin
def test_calls():
  sin(jnp.float32(0.5))
  sin(jnp.array([0.2, 0.3]))
''')
  result, rules = _rules(suite, "--hijax-rule-budget=0.001")
  first, second = rules["sin"]["inputs"]
  assert first["verdict"] != "skipped for time", first
  assert second["verdict"] == "skipped for time", second


def test_a_rule_raising_only_in_float64_is_checked_in_the_tests_dtypes(
    suite):
  """equinox's closure-converted functions check the dtypes they get: a
  jvp rule that refuses float64 is checked again in float32."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def sin(x):
  return jnp.sin(x)
def sin_jvp(p, t):
  if p[0].dtype != jnp.float32:
    raise TypeError(f"sin_jvp: expected float32, got {p[0].dtype}")
  return sin(p[0]), jnp.cos(p[0]) * t[0]
sin.defjvp(sin_jvp)
''', test_one='''
import jax.numpy as jnp
from lib import sin
def test_calls():
  sin(jnp.array([0.2, 0.3]))
''')
  result, rules = _rules(suite)
  assert result.ret == 0, result.stdout.str()[-3000:]
  (tried,) = rules["sin"]["inputs"]
  assert tried["verdict"] == "passed", tried
  assert "in its own dtypes (its rules raise in float64)" in tried["source"]


def test_a_later_eager_call_replaces_a_sample_of_types(suite):
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def sin(x):
  return jnp.sin(x)
sin.defjvp(lambda p, t: (sin(p[0]), jnp.cos(p[0]) * t[0]))
''', test_two='''
import jax, jax.numpy as jnp
from lib import sin
def test_traced():
  jax.jit(sin)(jnp.ones(3))
def test_eager():
  sin(jnp.array([0.2, 0.3, 0.4]))
''')
  result, rules = _rules(suite)
  (tried,) = rules["sin"]["inputs"]
  assert (tried["source"], tried["test"], tried["verdict"]) == (
      "eager", "test_two.py::test_eager", "passed"), tried


SETTINGS = {
    "strict promotion": 'jax.config.update("jax_numpy_dtype_promotion", '
                        '"strict")',
    "x64 on": 'jax.config.update("jax_enable_x64", True)',
    "debug nans and infs": 'jax.config.update("jax_debug_nans", True)\n'
                           'jax.config.update("jax_debug_infs", True)',
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_checks_work_under_the_suites_settings(suite, setting,
                                                  request):
  """Set in the suite's conftest and left on at the end of the session:
  the checks (which mix float64 references with complex64 values, and
  step to where a function is not finite) still judge the rules."""
  for name in ("jax_numpy_dtype_promotion", "jax_enable_x64",
               "jax_debug_nans", "jax_debug_infs"):  # restored after the run
    request.addfinalizer(functools.partial(jax.config.update, name,
                                           getattr(jax.config, name)))
  suite.makeconftest(f"import jax\n{SETTINGS[setting]}\n")
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def csin(z):
  return jnp.sin(z)
csin.defjvp(lambda p, t: (csin(p[0]), jnp.cos(p[0]) * t[0]))
@jax.custom_jvp
def root(x):  # finite differences step to sqrt(-h) at 0: not finite
  return jnp.sqrt(x)
root.defjvp(lambda p, t: (root(p[0]), t[0] * jnp.where(
    p[0] > 0, 0.5 / jnp.sqrt(jnp.where(p[0] > 0, p[0], 1.0)), 0.0)))
''', test_calls='''
import jax.numpy as jnp
from lib import csin, root
def test_calls():
  csin(jnp.array([0.2 + 0.1j, 0.3 - 0.2j], jnp.complex64))
  root(jnp.array([0.0, 1.0], jnp.float32))
''')
  result, rules = _rules(suite)
  assert result.ret == 0, result.stdout.str()[-3000:]
  assert [rules[n]["verdict"] for n in ("csin", "root")] == [
      "passed", "passed"], rules
