"""``pytest --hijax-check-rules``: run with pytester on small test files.

Each test writes a test file into a temporary directory and runs pytest on
it in this process with the plugin loaded (``-p``, since the entry point
exists only where hijax is installed), then reads the table, the exit
code and the JSON report.
"""
import json
import pathlib
import re
import subprocess
import sys
import tomllib
from importlib import util

import jax
import pytest

import hijax  # noqa: F401  (imported here, not first inside a pytester run)
from hijax.testing import _plugin  # noqa: F401  (likewise)

pytest_plugins = ("pytester",)

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLUGIN = ("-p", "no:hijax", "-p", "_hijax_pytestplugin")

RULES = '''
import jax, jax.numpy as jnp
import hijax
from hijax import HiPrim

@jax.custom_jvp
def sin_ok(x):
  return jnp.sin(x)
sin_ok.defjvp(lambda p, t: (sin_ok(p[0]), jnp.cos(p[0]) * t[0]))

@jax.custom_jvp
def sin_twice(x):  # its jvp rule is twice the derivative
  return jnp.sin(x)
sin_twice.defjvp(lambda p, t: (sin_twice(p[0]), 2 * jnp.cos(p[0]) * t[0]))

@hijax.custom_vjp
def cube(x):
  return x ** 3
cube.defvjp(lambda x: (cube(x), x), lambda x, g: (2 * x * x * g,))  # not 3

class Square(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()
  def expand(self, x):
    return x * x
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), 2 * x * t

def square(x):
  return Square(jax.typeof(x))(x)

@jax.custom_vjp
def round_ste(x):  # a straight-through estimator: round, gradient 1
  return jnp.round(x)
round_ste.defvjp(lambda x: (round_ste(x), None), lambda _, g: (g,))
'''


@pytest.fixture
def rules(pytester, monkeypatch):
  # the inner runs load no installed plugin but ours (hypothesis's, for
  # one, imports a module at each run's end: 0.4 s a run)
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
  # An ini file of its own: the rootdir (and the paths the table shows) is
  # the test's directory, also where the temporary directory is inside a
  # checkout whose pyproject.toml configures pytest (nox's TMPDIR).
  pytester.makeini("[pytest]\n")
  pytester.makepyfile(rules=RULES)
  pytester.syspathinsert()
  return pytester


def _run(pytester, *args):
  """pytest with the plugin, and a budget in seconds (the default, a
  share of the tests' CPU time, is next to nothing for these tests)."""
  return pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider",
                            "--hijax-rules-budget=600", *args)


def _row(result, name):
  """The table's line for the rule called ``name``."""
  lines = [line for line in result.outlines if line.startswith(name + " (")]
  assert len(lines) == 1, result.outlines
  return lines[0]


def _json(pytester, result):
  del result
  return json.loads((pytester.path / "rules.json").read_text())


def test_off_wraps_nothing_and_prints_nothing(rules):
  original = jax.custom_jvp.__dict__["__call__"]
  rules.makepyfile(test_off=f'''
import jax
from rules import sin_ok
def test_unwrapped():
  call = jax.custom_jvp.__dict__["__call__"]
  assert call.__code__.co_filename == "{original.__code__.co_filename}"
  sin_ok(1.0)
''')
  result = _run(rules)
  result.assert_outcomes(passed=1)
  assert not any(line.startswith("hijax") or "hijax:" in line
                 for line in result.outlines)
  assert jax.custom_jvp.__dict__["__call__"] is original


def test_off_imports_neither_hijax_nor_jax(pytester):
  """The entry module is light: without the option, a run whose tests do
  not import JAX does not import it either (a subprocess, whose modules
  are its own)."""
  pytester.makepyfile(test_light='''
import sys
def test_nothing_heavy():
  assert "jax" not in sys.modules and "hijax" not in sys.modules
''')
  result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider")
  result.assert_outcomes(passed=1)


def test_on_wraps_while_the_tests_run_and_restores(rules):
  original = jax.custom_jvp.__dict__["__call__"]
  rules.makepyfile(test_on='''
import jax
def test_wrapped():
  wrapper = jax.custom_jvp.__dict__["__call__"]
  assert wrapper.__code__.co_filename.endswith("_recorder.py")
''')
  _run(rules, "--hijax-check-rules").assert_outcomes(passed=1)
  assert jax.custom_jvp.__dict__["__call__"] is original


def test_eager_and_traced_calls_are_recorded_and_checked(rules):
  rules.makepyfile(test_calls='''
import jax, jax.numpy as jnp
from rules import sin_ok, square
def test_eager():
  sin_ok(jnp.array([0.1, 0.2, 0.3]))
def test_traced():
  jax.jit(sin_ok)(jnp.ones((2, 2)))        # types only
  jax.jvp(square, (jnp.ones(4),), (jnp.ones(4),))  # values JAX knows
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-json",
                "rules.json")
  result.assert_outcomes(passed=2)
  assert result.ret == 0
  assert "test_calls.py" not in _row(result, "sin_ok")
  assert _row(result, "sin_ok").split()[2:] == [
      "rules.py:5", "f32[3]", "(eager)", "passed"]
  assert "f32[2,2] (traced; values of another call)" not in result.stdout.str()
  assert "f32[2,2] (traced; drawn in the range seen)" in result.stdout.str()
  assert _row(result, "Square").split()[2:] == [
      "rules.py:20", "f32[4]", "(traced,", "values", "known)", "passed"]
  report = _json(rules, result)
  by_name = {r["rule"]: r for r in report["rules"]}
  assert set(by_name) == {"sin_ok", "Square"}
  sin = by_name["sin_ok"]
  assert sin["kind"] == "jax.custom_jvp" and sin["calls"] == 2
  assert [(i["types"], i["source"], i["verdict"]) for i in sin["inputs"]] == [
      (["f32[3]"], "eager", "passed"),
      (["f32[2,2]"], "traced; drawn in the range seen", "passed")]
  assert sin["first_test"] == "test_calls.py::test_eager"
  assert report["counts"] == {"passed": 2}


def test_calls_made_under_x64_are_checked_under_x64(rules):
  """A primitive built from float64 types refuses float32 arguments: the
  values a test passed in float64 are checked in float64."""
  rules.makepyfile(test_x64='''
import jax, jax.numpy as jnp
from rules import square
def test_calls():
  with jax.enable_x64(True):
    square(jnp.array([1.0, 2.0], jnp.float64))
''')
  result = _run(rules, "--hijax-check-rules")
  assert _row(result, "Square").split()[2:] == [
      "rules.py:20", "f64[2]", "(eager)", "passed"]


def test_a_failed_rule_fails_the_run_and_is_named(rules):
  rules.makepyfile(test_bad='''
import jax, jax.numpy as jnp
from rules import sin_twice, cube
def test_calls():
  jax.vmap(sin_twice)(jnp.ones(3))
  cube(jnp.array([1.0, 2.0]))
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-json",
                "rules.json")
  result.assert_outcomes(passed=1)
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  assert _row(result, "sin_twice").endswith(" failed")
  assert _row(result, "cube").split()[1:3] == ["(hijax.custom_vjp)",
                                               "rules.py:15"]
  result.stdout.fnmatch_lines([
      "*sin_twice (custom_jvp): the jvp rule: jvp vs central finite*",
      "hijax: 2 rule(s): 2 failed",
      "hijax: the test run fails: sin_twice (jax.custom_jvp); cube "
      "(hijax.custom_vjp)"])
  report = _json(rules, result)
  failure = report["rules"][0]["inputs"][0]["failures"][0]
  assert failure["rule"] == "sin_twice (custom_jvp): the jvp rule"
  assert failure["max_error"] > 0.1


def test_a_function_that_raises_at_the_recorded_inputs(rules):
  """Not checked there (a test may call it where it raises on purpose),
  unless what raised is hijax's check of a rule's output."""
  rules.makepyfile(odd='''
import jax, jax.numpy as jnp
from hijax import HiPrim

@jax.custom_jvp
def checked_log(x):
  if (x <= 0).any():
    raise ValueError("checked_log: x must be positive")
  return jnp.log(x)
checked_log.defjvp(lambda p, t: (checked_log(p[0]), t[0] / p[0]))

class WrongType(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()
  def expand(self, x):
    return jnp.sum(x)  # out_aval says the shape of x
''', test_odd='''
import jax, jax.numpy as jnp, pytest
from odd import checked_log, WrongType
def test_calls():
  with pytest.raises(ValueError):
    checked_log(jnp.array([-1.0, 2.0]))
  with pytest.raises(TypeError):
    WrongType(jax.typeof(jnp.ones(2)))(jnp.ones(2))
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-json",
                "rules.json")
  by_name = {r["rule"]: r for r in _json(rules, result)["rules"]}
  log = by_name["checked_log"]
  assert log["verdict"] == "inconclusive"
  assert log["detail"] == ("the function raises at these inputs: ValueError: "
                           "checked_log: x must be positive")
  wrong = by_name["WrongType"]
  assert wrong["verdict"] == "failed"
  assert "RuleTypeError: WrongType.expand returned" in wrong["detail"]


def test_a_rule_that_refuses_differentiation_by_design_passes(rules):
  """equinox's nondifferentiable: a jvp rule that raises saying it cannot be
  differentiated. The rule passes, and the JSON lists those checks as left
  unjudged by intent, for the input they were tried at."""
  rules.makepyfile(guard=(pathlib.Path(__file__).parent
                          / "refusing_rule.py").read_text(), test_guard='''
import jax.numpy as jnp
from guard import no_grad
def test_calls():
  assert float(no_grad(jnp.float32(2.0))) == 2.0
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-json",
                "rules.json")
  assert result.ret == 0
  (guard,) = [r for r in _json(rules, result)["rules"] if r["rule"] == "guarded"]
  assert guard["verdict"] == "passed", guard
  (tried,) = guard["inputs"]
  assert tried["verdict"] == "passed" and tried["types"] == ["f32[]"], tried
  assert "guarded (custom_jvp): the jvp rule" in tried["by_intent"], tried


def test_a_partial_batch_rule_passes_with_its_refusals_listed(rules):
  """A batch rule that supports batching x only (and asserts so): the
  plugin cannot pass batch_in_axes=, so check_rules takes the rule for
  partial; it passes, and the JSON lists the refused combinations as
  skipped, with the fix."""
  rules.makepyfile(xonly='''
import jax, jax.numpy as jnp
from hijax import HiPrim
class ScaleXOnly(HiPrim):
  def __init__(self, c_aval, x_aval):
    self.in_avals, self.out_aval, self.params = (c_aval, x_aval), x_aval, {}
    super().__init__()
  def expand(self, c, x):
    return c * x
  def jvp(self, primals, tangents):
    (c, x), (dc, dx) = primals, tangents
    return self(c, x), (jnp.zeros_like(x) if type(dc).__name__ == "Zero"
                        else dc * x) + (0. if type(dx).__name__ == "Zero"
                                        else c * dx)
  def batch(self, axis_data, args, dims):
    (c, x), (c_dim, x_dim) = args, dims
    assert c_dim is None, "only x may be batched"
    return c * jnp.moveaxis(x, x_dim, 0), 0
def scale(c, x):
  return ScaleXOnly(jax.typeof(c), jax.typeof(x))(c, x)
''', test_xonly='''
import jax.numpy as jnp
from xonly import scale
def test_calls():
  assert float(scale(jnp.float32(2.), jnp.ones(3, jnp.float32))[0]) == 2.
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-json",
                "rules.json")
  assert result.ret == 0, result.stdout.str()[-3000:]
  (rule,) = [r for r in _json(rules, result)["rules"]
             if r["rule"] == "ScaleXOnly"]
  assert rule["verdict"] == "passed", rule
  (tried,) = rule["inputs"]
  refused = [s for s in tried["skipped"] if s.startswith("batch: ")]
  assert any("in_axes=(0, None)" in s for s in refused), tried["skipped"]
  assert all("ScaleXOnly.batch raised AssertionError: only x may be batched"
             in s and "batch_in_axes=" in s for s in refused), refused


def test_fail_on_never_only_reports(rules):
  rules.makepyfile(test_bad='''
from rules import sin_twice
def test_calls():
  sin_twice(0.5)
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-fail-on=never")
  assert result.ret == 0
  assert _row(result, "sin_twice").endswith(" failed")


def test_surrogates_listed_in_the_ini_are_checked_for_consistency_only(
    rules):
  rules.makepyfile(test_ste='''
import jax.numpy as jnp
from rules import round_ste
def test_calls():
  round_ste(jnp.array([0.3, 1.7, -2.2]))
''')
  result = _run(rules, "--hijax-check-rules")
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  assert _row(result, "round_ste").endswith(" failed")
  rules.makeini("[pytest]\nhijax_surrogates =\n  rules.round_ste\n")
  result = _run(rules, "--hijax-check-rules")
  assert result.ret == 0
  assert _row(result, "round_ste").startswith(
      "round_ste (jax.custom_vjp) [surrogate]")
  assert _row(result, "round_ste").endswith(" passed")


def test_surrogates_marked_where_they_are_defined(rules):
  rules.makepyfile(marked='''
import jax, jax.numpy as jnp
from hijax.testing import surrogate

@surrogate
@jax.custom_vjp
def clip_gradient(x):
  return x
clip_gradient.defvjp(lambda x: (x, None),
                     lambda _, g: (jnp.clip(g, -0.1, 0.1),))
''', test_clip='''
import jax.numpy as jnp
from marked import clip_gradient
def test_calls():
  clip_gradient(jnp.array([0.5, 2.0]))
''')
  result = _run(rules, "--hijax-check-rules")
  assert result.ret == 0
  assert _row(result, "clip_gradient").startswith(
      "clip_gradient (jax.custom_vjp) [surrogate]")
  assert _row(result, "clip_gradient").endswith(" passed")


def test_a_surrogate_with_a_reference_is_checked_against_it(rules):
  """Gradients scaled by 0.5, and a copy whose bwd flips the sign: their
  consistency alone cannot tell them apart; the declared reference, plain
  JAX of the same value with the intended derivative, can."""
  rules.makepyfile(scaled='''
import jax, jax.numpy as jnp
@jax.custom_vjp
def half_grad(x):
  return x
half_grad.defvjp(lambda x: (x, None), lambda _, g: (0.5 * g,))
@jax.custom_vjp
def flipped(x):
  return x
flipped.defvjp(lambda x: (x, None), lambda _, g: (-0.5 * g,))
def reference(x):
  return 0.5 * x + jax.lax.stop_gradient(x - 0.5 * x)
''', test_scaled='''
import jax.numpy as jnp
from scaled import half_grad, flipped
def test_calls():
  half_grad(jnp.array([0.3, 1.7], jnp.float32))
  flipped(jnp.array([0.3, 1.7]))
''')
  rules.makeini("[pytest]\nhijax_surrogates =\n  scaled.half_grad\n"
                "  scaled.flipped\n")
  result = _run(rules, "--hijax-check-rules")
  assert result.ret == 0
  rules.makeini("[pytest]\nhijax_deliberate =\n  scaled.half_grad: "
                "surrogate scaled:reference\n  scaled.flipped: surrogate "
                "scaled:reference\n")
  result = _run(rules, "--hijax-check-rules")
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  assert _row(result, "half_grad").endswith(" passed")
  assert _row(result, "flipped").endswith(" failed")
  result.stdout.fnmatch_lines(["    against the reference scaled:reference "
                               "(the difference checked): *"])

def test_a_surrogate_name_that_is_not_found_is_reported(rules):
  rules.makepyfile(test_x="def test_nothing():\n  pass\n")
  rules.makeini("[pytest]\nhijax_surrogates =\n  rules.no_such_thing\n")
  result = _run(rules, "--hijax-check-rules")
  result.stdout.fnmatch_lines([
      "hijax: hijax_surrogates / hijax_deliberate: cannot use "
      "rules.no_such_thing "
      "(AttributeError*"])


def test_a_spent_budget_skips_the_rules_and_passes(rules):
  rules.makepyfile(test_bad='''
from rules import sin_twice, sin_ok
def test_calls():
  sin_twice(0.5)
  sin_ok(0.5)
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-budget=0")
  assert result.ret == 0
  assert _row(result, "sin_twice").endswith(" skipped for time")
  assert _row(result, "sin_ok").endswith(" skipped for time")
  result.stdout.fnmatch_lines(["hijax: 2 rule(s): 2 skipped for time"])


def test_the_rule_budget_bounds_each_rule(rules):
  """With a per-rule budget of zero, each rule's first sample is not
  started (the budget is checked before each sample)."""
  rules.makepyfile(test_ok='''
from rules import sin_ok
def test_calls():
  sin_ok(0.5)
''')
  result = _run(rules, "--hijax-check-rules", "--hijax-rule-budget=0",
                "--hijax-rules-json", "rules.json")
  assert _row(result, "sin_ok").endswith(" skipped for time")
  assert _json(rules, result)["checks"]["rule_budget"] == 0


def test_progress_is_one_line_on_a_terminal_and_none_elsewhere(rules):
  rules.makepyfile(test_ok='''
from rules import sin_ok
def test_calls():
  sin_ok(0.5)
''')
  result = _run(rules, "--hijax-check-rules")
  assert "checking rule" not in result.stdout.str()
  rules.makeconftest('''
import pytest
@pytest.hookimpl(trylast=True)
def pytest_configure(config):  # as on a terminal; rewrites made visible
  reporter = config.pluginmanager.get_plugin("terminalreporter")
  reporter.isatty = lambda: True
  reporter.rewrite = lambda line, **kw: reporter.write(f"<rewrite>{line}|")
''')
  result = _run(rules, "--hijax-check-rules")
  out = result.stdout.str()
  # rewritten in place (a check taking over a second adds where it is to
  # the same line), then erased; nothing of it on a line of its own
  head = re.escape("<rewrite>hijax: checking rule 1/1 (0 of 600 s): sin_ok "
                   "(jax.custom_jvp)")
  assert re.search(f"{head}\\|({head}: [^|]*\\|)*<rewrite>\\|", out), out
  assert out.count("checking rule") == out.count("<rewrite>hijax: checking")


def test_a_budget_that_is_not_a_number_is_refused(rules):
  result = _run(rules, "--hijax-check-rules", "--hijax-rules-budget=lots")
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  result.stderr.fnmatch_lines([
      "*--hijax-rules-budget takes seconds (600) or a share of the tests' "
      "CPU time (25%), not 'lots'"])


def test_xdist_is_refused(rules):
  pytest.importorskip("xdist")
  result = _run(rules, "-p", "xdist", "--hijax-check-rules", "-n", "2")
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  result.stderr.fnmatch_lines(["*without pytest-xdist's -n*"])


def test_the_entry_point_names_the_light_module():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())
  assert project["project"]["entry-points"]["pytest11"] == {
      "hijax": "_hijax_pytestplugin"}
  assert "_hijax_pytestplugin" in project["tool"]["setuptools"]["py-modules"]
  assert pathlib.Path(util.find_spec("_hijax_pytestplugin").origin) == (
      ROOT / "_hijax_pytestplugin.py")


def test_the_entry_module_imports_only_pytest():
  code = ("import sys, _hijax_pytestplugin; "
          "print(sorted(m for m in ('jax', 'hijax', 'numpy') "
          "if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True, cwd=ROOT).stdout
  assert out.strip() == "[]"
