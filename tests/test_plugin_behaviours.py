"""``pytest --hijax-check-rules``: how a rule's samples make its verdict,
how its budget is spent, the dtypes and JAX settings it is checked under
(pytester runs, like tests/test_plugin.py)."""
import functools
import json
import re

import jax

import pytest

import hijax  # noqa: F401  (imported here, not first inside a pytester run)
from hijax.testing import _plugin  # noqa: F401  (likewise)

pytest_plugins = ("pytester",)

PLUGIN = ("-p", "no:hijax", "-p", "_hijax_pytestplugin", "-p",
          "no:cacheprovider", "--hijax-check-rules", "--hijax-rules-json",
          "rules.json", "--hijax-rules-budget=600")


@pytest.fixture
def suite(pytester, monkeypatch):
  # the inner runs load no installed plugin but ours (hypothesis's, for
  # one, imports a module at each run's end: 0.4 s a run)
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
  pytester.makeini("[pytest]\n")
  pytester.syspathinsert()
  return pytester


# a right custom_jvp rule, the library of several suites below
SIN = '''
import jax, jax.numpy as jnp
@jax.custom_jvp
def sin(x):
  return jnp.sin(x)
sin.defjvp(lambda p, t: (sin(p[0]), jnp.cos(p[0]) * t[0]))
'''


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
  suite.makepyfile(lib=SIN, test_two='''
import jax.numpy as jnp
from lib import sin
def test_calls():
  sin(jnp.float32(0.5))
  sin(jnp.array([0.2, 0.3]))
''')
  result, rules = _rules(suite, "--hijax-rule-budget=0.001")
  first, second = rules["sin"]["inputs"]
  # the first ran out (in its checks, calling the function, stopped by the
  # CPU-time stop, or before, its estimate over the budget; which depends on
  # the machine's speed: a TPU machine's run was stopped); the second found
  # nothing left (what the second is given once the first ran:
  # test_a_check_is_given_only_...)
  assert first["detail"].startswith((
      "the budget ran out during its checks",
      "calling the function spent the rule's budget", "its call took",
      "stopped where the rule's budget ran out")), first
  assert (second["verdict"], second["seconds"]) == (
      "skipped for time", 0), second
  assert second["detail"] in ("", first["detail"]) or second[
      "detail"].startswith("its call took"), second


def test_a_stop_dropped_in_a_gc_callback_warns_nothing(suite):
  """The rule's budget ends inside a ``__del__`` (as inside a weakref
  callback of the garbage collector), where Python drops the stop and
  reports it as unraisable: the user's run shows no warning of it and
  passes under ``-W error::pytest.PytestUnraisableExceptionWarning``."""
  suite.makepyfile(lib='''
import time
import jax, jax.numpy as jnp
SLOW = []  # set once the test ran: slow only while checked
def _spin(seconds):
  end = time.process_time() + seconds
  while time.process_time() < end:
    pass
class _SlowToCollect:
  def __del__(self):
    _spin(0.6 if SLOW else 0)
@jax.custom_jvp
def slowly(x):
  _SlowToCollect()  # collected at once: the 0.3 s budget ends in __del__
  _spin(4.0 if SLOW else 0)
  return jnp.sin(x)
slowly.defjvp(lambda p, t: (slowly(p[0]), jnp.cos(p[0]) * t[0]))
''', test_slow='''
import jax.numpy as jnp
import lib
def test_calls():
  lib.slowly(jnp.array([0.3, 0.7]))
  lib.SLOW.append(True)
''')
  result, rules = _rules(suite, "--hijax-rule-budget=0.3", "-W",
                         "error::pytest.PytestUnraisableExceptionWarning")
  assert rules["slowly"]["inputs"][0]["detail"] == (
      "stopped where the rule's budget ran out"), rules["slowly"]
  assert result.ret == pytest.ExitCode.OK, result.stdout.str()
  assert "Unraisable" not in result.stdout.str() + result.stderr.str()


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
  suite.makepyfile(lib=SIN, test_two='''
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
    "x64 off": 'jax.config.update("jax_enable_x64", False)',
    "debug nans and infs": 'jax.config.update("jax_debug_nans", True)\n'
                           'jax.config.update("jax_debug_infs", True)',
    "jit disabled": 'jax.config.update("jax_disable_jit", True)',
    "tracer leaks checked": 'jax.config.update("jax_check_tracer_leaks", '
                            'True)',
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_checks_work_under_the_suites_settings(suite, setting,
                                                  request):
  """Set in the suite's conftest and left on at the end of the session:
  the checks (which mix float64 references with complex64 values, and
  step to where a function is not finite) still judge the rules."""
  for name in ("jax_numpy_dtype_promotion", "jax_enable_x64",
               "jax_debug_nans", "jax_debug_infs", "jax_disable_jit",
               "jax_check_tracer_leaks"):  # restored after the run
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


SCALE = '''
import jax, jax.numpy as jnp
from hijax import HiPrim
class Scale(HiPrim):  # its batch rule is wrong where c is batched
  def __init__(self, c_aval, x_aval):
    self.in_avals, self.out_aval, self.params = (c_aval, x_aval), x_aval, {}
    super().__init__()
  def expand(self, c, x):
    return c * x
  def jvp(self, primals, tangents):
    (c, x), (dc, dx) = primals, tangents
    zero = lambda t: type(t).__name__ == "Zero"
    return self(c, x), ((jnp.zeros_like(x) if zero(dc) else dc * x)
                        + (0.0 if zero(dx) else c * dx))
  def batch(self, axis_data, args, dims):
    (c, x), (c_dim, x_dim) = args, dims
    n = axis_data.size
    c_b = jnp.broadcast_to(c, (n,)) if c_dim is None else c
    x_b = (jnp.broadcast_to(x, (n,) + x.shape) if x_dim is None
           else jnp.moveaxis(x, x_dim, 0))
    return c_b[:, None] * x_b + (0.0 if c_dim is None else 1.0), 0
def scale(c, x):
  return Scale(jax.typeof(c), jax.typeof(x))(c, x)
'''


@pytest.mark.parametrize("in_axes, verdict, advisory", [
    ("(None, 0)", "passed", False),  # the tests batch x only
    ("(0, 0)", "failed", False),  # they batch c too: the rule is wrong there
    (None, "passed", True)])  # they never batch it: an advisory
def test_vmap_is_checked_at_the_in_axes_the_tests_used(suite, in_axes,
                                                       verdict, advisory):
  call = ("s = scale(jnp.float32(2.0), jnp.ones(3, jnp.float32))"
          if in_axes is None else
          f"s = jax.vmap(scale, in_axes={in_axes})(jnp.full(2, 2.0), "
          "jnp.ones((2, 3)))")
  suite.makepyfile(lib=SCALE, test_scale=f'''
import jax, jax.numpy as jnp
from lib import scale
def test_calls():
  scale(jnp.float32(2.0), jnp.array([1.0, 2.0, 3.0]))
  {call}
''')
  result, rules = _rules(suite)
  rule = rules["Scale"]
  assert rule["verdict"] == verdict, rule
  assert result.ret == (0 if verdict == "passed" else 1)
  advisories = [a for i in rule["inputs"] for a in i["advisory"]]
  assert bool(advisories) == advisory, rule
  if advisory:
    assert "vmap vs a loop over the batch" in advisories[0], advisories
    assert "in_axes=(0, None)" in advisories[0], advisories
    result.stdout.fnmatch_lines([
        "hijax: advisory (not failing): Scale (HiPrim) fail the vmap check "
        "at batched arguments no test used (the JSON's \"advisory\" lists "
        "them)"])


def test_an_input_that_is_not_finite_is_not_checked(suite):
  """optax's simplex projection at -inf: no finite difference steps from
  it; the rule is inconclusive there, not failed."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def soft(x):
  return jax.nn.softmax(x)
soft.defjvp(lambda p, t: jax.jvp(jax.nn.softmax, p, t))
''', test_inf='''
import jax.numpy as jnp
from lib import soft
def test_calls():
  soft(jnp.array([0.0, 0.0, -jnp.inf]))
''')
  result, rules = _rules(suite)
  assert result.ret == 0
  rule = rules["soft"]
  assert (rule["verdict"], rule["detail"]) == (
      "inconclusive", "an input is not finite (a test passed inf or nan): "
      "finite differences cannot step from it"), rule


RESIDUAL = '''
import jax, jax.numpy as jnp
@jax.custom_jvp
def solve(x):  # (root, (residual, state)): their tangents zero by design
  return jnp.sqrt(x), (x - 2.0, 2 * x)
solve.defjvp(lambda p, t: (solve(p[0]), (t[0] / (2 * jnp.sqrt(p[0])), (
    jnp.zeros_like(t[0]), jnp.zeros_like(t[0])))))
'''


@pytest.mark.parametrize("declaration, verdict", [
    (None, "failed"),
    ("lib.solve: output out[1]", "passed"),
    ("lib.solve: output 1,2", "passed"),
    ("lib.solve: output 1", "failed"),
    ("lib.solve: output out[1][0],out[1][1]", "passed"),
    ("lib.py:2: output out[1]", "passed"),  # by where it is defined
    ("ib.py:2: output out[1]", "failed"),  # a path's end is whole names
    ("lib.py::solve: skip jvp,vjp,lin,transpose", "passed"),  # vmap's
    ("lib.solve: surrogate", "passed"),
])
def test_deliberate_rules_are_declared_per_output_check_or_location(
    suite, declaration, verdict):
  if declaration is not None:
    suite.makeini(f"[pytest]\nhijax_deliberate =\n  {declaration}\n")
  suite.makepyfile(lib=RESIDUAL, test_solve='''
import jax.numpy as jnp
from lib import solve
def test_calls():
  solve(jnp.array([4.0, 9.0]))
''')
  result, rules = _rules(suite)
  rule = rules["solve"]
  assert rule["verdict"] == verdict, rule
  assert (result.ret == 0) == (verdict == "passed")
  # the message says how to declare it (the failing output by its path,
  # where another is declared too)
  if verdict == "failed":
    assert rule["how_to_declare"] == (
        "if deliberate, declare it in the ini file (hijax_deliberate = "
        "lib.py:2: surrogate, or: surrogate module:function (a reference "
        "to check it against), or: skip jvp, or: output out[1][1]); "
        "--hijax-rules-fail-on=never reports without failing"), rule
    assert rule["how_to_declare"] in " ".join(result.stdout.str().split())


# out (a, b, c) or (a, (b, c)): a's and c's tangents wrong, b's right
@pytest.mark.parametrize("nested, declared, hint", [
    (False, "0", "out[2]"),
    (True, "out[0]", "out[1][1]"),
    (True, "0", "out[1][1]"),  # (a flat index)
])
def test_the_hint_names_the_failing_output_by_its_own_path(
    suite, nested, declared, hint):
  """With a declared deliberate, the hint names c by its path in the
  rule's output (not among the outputs left), and declaring what it says
  makes the run pass."""
  pack = "{}, ({}, {})" if nested else "{}, {}, {}"
  suite.makepyfile(lib=f'''
import jax, jax.numpy as jnp
@jax.custom_jvp
def f(x):
  return {pack.format("x + 1.0", "jnp.sin(x)", "x * x")}
f.defjvp(lambda p, t: (f(p[0]), ({pack.format(
    "2 * t[0]", "jnp.cos(p[0]) * t[0]", "3 * p[0] * t[0]")})))
''', test_f='''
import jax.numpy as jnp
from lib import f
def test_calls():
  f(jnp.array([0.5, 1.5]))
''')
  ini = f"[pytest]\nhijax_deliberate =\n  lib.f: output {declared}\n"
  suite.makeini(ini)
  result, rules = _rules(suite)
  assert rules["f"]["verdict"] == "failed", rules["f"]
  said = re.search(r"hijax_deliberate = (\S+): surrogate, or: surrogate "
                   r"module:function \(a reference to check it against\), "
                   r"or: skip \w+, "
                   r"or: (output \S+)\); ", rules["f"]["how_to_declare"])
  assert said is not None and said.group(2) == f"output {hint}", rules["f"]
  suite.makeini(f"{ini}  {said.group(1)}: {said.group(2)}\n")
  result, rules = _rules(suite)
  assert (rules["f"]["verdict"], result.ret) == ("passed", 0), rules["f"]


def test_the_hint_names_no_output_where_the_failure_names_none(suite):
  """A vjp rule wrong for out[0] and out[2], out[0] declared: its check
  (<ȳ, J ṫ> = <vjp(ȳ), ṫ>) cannot tell which output is wrong, so the hint
  names none (it named output 0, the one declared)."""
  suite.makeini("[pytest]\nhijax_deliberate =\n  lib.f: output 0\n")
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_vjp
def f(x):
  return x + 1.0, jnp.sin(x), x * x
f.defvjp(lambda x: (f(x), x),
         lambda x, g: (2 * g[0] + jnp.cos(x) * g[1] + 3 * x * g[2],))
''', test_f='''
import jax.numpy as jnp
from lib import f
def test_calls():
  f(jnp.array([0.5, 1.5]))
''')
  result, rules = _rules(suite)
  assert rules["f"]["verdict"] == "failed", rules["f"]
  assert rules["f"]["how_to_declare"] == (
      "if deliberate, declare it in the ini file (hijax_deliberate = "
      "lib.py:2: surrogate, or: surrogate module:function (a reference to "
      "check it against), or: skip vjp); --hijax-rules-fail-on=never "
      "reports without failing"), rules["f"]
  assert rules["f"]["how_to_declare"] in " ".join(result.stdout.str().split())


def test_a_rule_in_a_test_file_is_declared_by_its_location(suite):
  suite.makeini("[pytest]\nhijax_deliberate =\n"
                "  test_ste.py::round_ste: surrogate\n")
  suite.makepyfile(test_ste='''
import jax, jax.numpy as jnp
@jax.custom_vjp
def round_ste(x):
  return jnp.round(x)
round_ste.defvjp(lambda x: (round_ste(x), None), lambda _, g: (g,))
def test_calls():
  round_ste(jnp.array([0.3, 1.7]))
''')
  result, rules = _rules(suite)
  assert result.ret == 0
  assert (rules["round_ste"]["verdict"], rules["round_ste"]["surrogate"],
          rules["round_ste"]["in_test_file"]) == ("passed", True, True)


# rules defined in the test file, each wrong in its one output
WRONG_IN_A_TEST_FILE = '''
import jax, jax.numpy as jnp
@jax.custom_jvp
def sin2(x):
  return jnp.sin(x)
sin2.defjvp(lambda p, t: (sin2(p[0]), 2 * jnp.cos(p[0]) * t[0]))
@jax.custom_vjp
def cube(x):
  return x ** 3
cube.defvjp(lambda x: (cube(x), x), lambda x, g: (2 * x * x * g,))
def test_calls():
  sin2(jnp.array([0.5, 1.5]))
  cube(jnp.array([0.5, 1.5]))
'''


@pytest.mark.parametrize("form", ["surrogate", "skip"])
def test_each_form_the_hint_gives_for_a_rule_in_a_test_file_passes(
    suite, form):
  """The hint names the rule by its place in the test file, and the check
  that failed; declared as it says, the rule passes. A rule of one output
  is not offered the output form (its only output left out, nothing would
  be checked)."""
  suite.makepyfile(test_wrong=WRONG_IN_A_TEST_FILE)
  result, rules = _rules(suite)
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  lines = []
  for name, line, mode in (("sin2", 2, "jvp"), ("cube", 6, "vjp")):
    assert rules[name]["in_test_file"] and rules[name]["how_to_declare"] == (
        f"if deliberate, declare it in the ini file (hijax_deliberate = "
        f"test_wrong.py:{line}: surrogate, or: surrogate module:function (a "
        f"reference to check it against), or: skip {mode}); "
        "--hijax-rules-fail-on=never reports without failing"), rules[name]
    lines.append(f"test_wrong.py:{line}: "
                 + ("surrogate" if form == "surrogate" else f"skip {mode}"))
  suite.makeini("[pytest]\nhijax_deliberate =\n" + "".join(
      f"  {line}\n" for line in lines))
  result, rules = _rules(suite)
  assert result.ret == 0, result.stdout.str()[-3000:]
  assert [rules[n]["verdict"] for n in ("sin2", "cube")] == [
      "passed", "passed"], rules


def test_a_rule_of_an_installed_library_is_shown_from_its_package(
    suite, tmp_path_factory):
  """Defined outside the rootdir, under site-packages: its location is
  relative to site-packages, with its line number (not the absolute path,
  cut)."""
  package = (tmp_path_factory.mktemp("env") / "lib" / "python3.12"
             / "site-packages" / "farlib")
  package.mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "rules.py").write_text(SIN)
  suite.syspathinsert(package.parent)
  suite.makepyfile(test_far='''
import jax.numpy as jnp
from farlib.rules import sin
def test_calls():
  sin(jnp.float32(0.5))
''')
  result, rules = _rules(suite)
  assert rules["sin"]["defined_at"] == "farlib/rules.py:3", rules["sin"]
  result.stdout.fnmatch_lines(["sin (jax.custom_jvp)  farlib/rules.py:3 *"])


def test_json_details_hold_no_traceback(suite):
  """A callback's error reaches the checks as a JaxRuntimeError holding a
  Python traceback: the detail names the exception, the traceback has a
  field of its own."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp, numpy as np
def refuse(x):
  if np.ndim(x) > 1:
    raise ValueError("refused: a batch")
  return x
@jax.custom_jvp
def f(x):
  return jax.pure_callback(refuse, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                           vmap_method="broadcast_all")
f.defjvp(lambda p, t: (f(p[0]), t[0]))
''', test_f='''
import jax, jax.numpy as jnp, pytest
from lib import f
def test_calls():
  f(jnp.array([1.0, 1.2]))
  with pytest.raises(Exception, match="refused"):  # vmap is checked
    jax.vmap(f)(jnp.ones((3, 2)))
''')
  result, rules = _rules(suite)
  assert rules["f"]["verdict"] == "failed"
  (failure,) = [f for i in rules["f"]["inputs"] for f in i["failures"]]
  assert rules["f"]["detail"].endswith(
      "raised JaxRuntimeError: INTERNAL: CpuCallback error calling "
      "callback: ValueError: refused: a batch [input args[0] = f64[2] "
      "[1. , 1.2]]"), rules["f"]["detail"]
  assert failure["detail"].endswith("ValueError: refused: a batch")
  assert "Traceback" not in failure["detail"]
  assert failure["traceback"].startswith("Traceback (most recent call last)")


def test_a_rule_wrong_only_in_float32_fails_where_the_tests_ran_float32(
    suite):
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def sin(x):
  return jnp.sin(x)
def sin_jvp(p, t):
  d = jnp.cos(p[0])
  if p[0].dtype == jnp.float32:  # a float32-only branch, 1% off
    d = d * 1.01
  return sin(p[0]), d * t[0]
sin.defjvp(sin_jvp)
''', test_sin='''
import jax.numpy as jnp
from lib import sin
def test_calls():
  sin(jnp.array([0.2, 0.5], jnp.float32))
''')
  result, rules = _rules(suite)
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  assert rules["sin"]["verdict"] == "failed"
  assert "in float32 vs the host's float64" in rules["sin"]["detail"]


def test_an_integer_input_is_drawn_nonzero_where_no_value_was_seen(suite):
  """The jvp's primal output adds an integer the function ignores: wrong
  unless it is 0; the test passes it traced, so no value was seen. Where
  the function is not finite there, the integers are drawn 0."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def second(n, x):
  return x
second.defjvp(lambda p, t: (p[0] + p[1], t[1]))
@jax.custom_jvp
def pick(n, x):  # not finite unless n is 0 (for x of one element)
  return jnp.take(x, n, mode="fill", fill_value=jnp.nan)
pick.defjvp(lambda p, t: (pick(*p), pick(p[0], t[1])))
''', test_second='''
import jax, jax.numpy as jnp
from lib import second, pick
def test_calls():
  jax.jit(second)(jnp.int32(3), jnp.float32(0.5))
  jax.jit(pick)(jnp.int32(0), jnp.ones(1))
''')
  result, rules = _rules(suite)
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  assert rules["second"]["verdict"] == "failed", rules["second"]
  assert rules["second"]["inputs"][0]["source"] == "traced; drawn"
  assert rules["pick"]["verdict"] == "passed", rules["pick"]  # then at 0
  assert rules["pick"]["inputs"][0]["source"] == "traced; drawn, integers 0"


def test_samples_represent_distinct_tests_and_regions(suite):
  """A smoke test fills the three slots with three types; a later test at
  negative inputs, where the rule is wrong, takes one of them."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def square(x):
  return x * x
square.defjvp(lambda p, t: (square(p[0]), 2 * jnp.abs(p[0]) * t[0]))
''', test_square='''
import jax.numpy as jnp
from lib import square
def test_smoke():
  square(jnp.float32(0.5))
  square(jnp.array([1.0, 2.0]))
  square(jnp.array([0.3, 0.2, 0.1]))
def test_domain():
  square(jnp.array([-1.0, -2.0]))
''')
  result, rules = _rules(suite)
  assert rules["square"]["verdict"] == "failed"
  assert sorted((i["test"], i["types"][0]) for i in
                rules["square"]["inputs"]) == [
      ("test_square.py::test_domain", "f32[2]"),
      ("test_square.py::test_smoke", "f32[3]"),
      ("test_square.py::test_smoke", "f32[]")]


def test_the_default_budget_is_a_share_of_the_tests_cpu_time(suite):
  """The tests spin 0.4 s of CPU: a quarter of it is more than what
  recording took (wall-clock time: on a loaded machine it outgrew a
  quarter of a test that spent nothing, and the budget was 0)."""
  suite.makepyfile(lib=SIN, test_sin='''
import time
from lib import sin
def test_calls():
  start = time.process_time()
  while time.process_time() - start < 0.4:
    pass
  sin(0.5)
''')
  result, rules = _rules(suite, "--hijax-rules-budget=25%")
  report = json.loads((suite.path / "rules.json").read_text())
  checks, recording = report["checks"], report["recording"]
  assert checks["budget"] == pytest.approx(
      0.25 * checks["suite_cpu_seconds"] - recording["seconds"], abs=2e-3)
  result, rules = _rules(suite, "--hijax-rules-budget=0%")
  assert result.ret == 0 and rules["sin"]["verdict"] == "skipped for time"
  result.stdout.fnmatch_lines([
      "hijax: recording: 1 call(s), * s; checks: 0.0 s CPU time of a 0.0 s "
      "budget (0% of the tests' * s CPU time)",
      "hijax: skipped for time: sin (jax.custom_jvp) (a larger "
      "--hijax-rules-budget, in seconds or a % of the tests' CPU time, "
      "checks them)"])


def test_a_declaration_that_cannot_be_read_is_reported(suite):
  suite.makeini("[pytest]\nhijax_deliberate =\n  lib.solve: skip vamp\n"
                "  lib.solve: ignore\n  lib.solve: surrogate lib:a, lib:b\n"
                "  lib.solve: surrogate lib:no_such_reference\n")
  suite.makepyfile(lib=RESIDUAL, test_solve='''
import jax.numpy as jnp
from lib import solve
def test_calls():
  solve(jnp.array([4.0, 9.0]))
''')
  result, rules = _rules(suite)
  assert rules["solve"]["verdict"] == "failed"
  result.stdout.fnmatch_lines([
      "hijax: hijax_surrogates / hijax_deliberate: cannot use "
      "'lib.solve: skip vamp' (hijax_deliberate takes TARGET: surrogate "
      "[REFERENCE], TARGET: skip MODE,... with MODE one of expand, jvp, vjp, "
      "lin, transpose, batch, second_order, or TARGET: output OUT,...)",
      "*cannot use 'lib.solve: ignore' (hijax_deliberate takes*",
      "*cannot use 'lib.solve: surrogate lib:a, lib:b' (hijax_deliberate*",
      "*cannot use lib.solve (AttributeError: *no_such_reference*"])


IMPLICIT = '''
import functools
import jax, jax.numpy as jnp
@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def implicit(primal, condition, x):  # primal(x) solves condition(y, x) = 0
  return primal(x)
@implicit.defjvp
def _jvp(primal, condition, p, t):
  y = implicit(primal, condition, p[0])
  dy, dx = jax.grad(condition, (0, 1))(y, p[0])
  return y, SIGN(dx / dy) * t[0]
def cbrt(x):
  return x ** (1 / 3)
def half(x):  # not a root of cube
  return x / 2
def cube(y, x):
  return y ** 3 - x
'''


@pytest.mark.parametrize("sign, tests, verdict", [
    ("-", ("cbrt",), "passed"),
    ("-", ("cbrt", "half"), "passed"),  # the root passed, half not judged
    ("-", ("half",), "inconclusive"),
    ("+", ("cbrt", "half"), "failed"),  # wrong at the root
])
def test_an_implicit_rule_called_at_a_primal_that_is_not_a_root(
    suite, sign, tests, verdict):
  """An implicit rule's derivative holds at roots of its condition only:
  a test calling it elsewhere is said to, not blamed on the rule."""
  suite.makepyfile(lib=IMPLICIT.replace("SIGN", sign), test_called_off_a_root=(
      "import jax.numpy as jnp\nfrom lib import implicit, cube, cbrt, half\n"
      + "".join(f"def test_{f}():\n  implicit({f}, cube, jnp.array(8.0))\n"
                for f in tests)))
  result, rules = _rules(suite)
  rule = rules["implicit"]
  assert rule["verdict"] == verdict, rule
  assert result.ret == (1 if verdict == "failed" else 0)
  outside = [t for t in rule["inputs"] if t["test"].endswith("test_half")]
  for t in outside:
    assert t["verdict"] == "not checked", t
    assert t["detail"].startswith(
        "the outputs are not a root of cube at these inputs "
        "(|cube(outputs, inputs)| = 56): an implicit rule's derivative "
        "holds at roots only, so this input judges nothing"), t
  if verdict == "inconclusive":
    assert rule["detail"] == outside[0]["detail"]


@pytest.mark.parametrize("load", [0.0, 1000.0])
def test_a_check_is_given_only_what_it_may_overrun_within_the_budget(
    suite, load, monkeypatch):
  """check_rules may run over its time budget (up to 1.5 times, a compile
  abandoned at 1.4): each check gets what is left of the rule's budget
  divided by 1.5 (the first input the whole 30 s / 1.5, the second what
  the first left), so that a started check ends within the budget. Its
  budget is wall-clock, the plugin's CPU time: on a loaded machine (the
  tests' wall-clock time over their CPU time, and the load per core, both
  above 1) it is given the wall-clock time the CPU time takes. (The
  pytester run is in this process: the load and check_rules are replaced
  by monkeypatch, so that both are restored for the tests after this one.)"""
  import hijax.testing  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  given = []
  check_rules = hijax.testing.check_rules

  def recording(*args, time_budget, **kwargs):
    given.append(time_budget)
    return check_rules(*args, time_budget=time_budget, **kwargs)

  monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
  monkeypatch.setattr(hijax.testing, "check_rules", recording)
  suite.makepyfile(lib=SIN, test_sin='''
import time
import jax.numpy as jnp
from lib import sin
def test_calls():
  time.sleep(2)  # (on a loaded machine, wall-clock time exceeds CPU time)
  sin(jnp.float32(0.5))
  sin(jnp.array([1.0, 2.0]))
''')
  _rules(suite, "--hijax-rule-budget=30")
  assert len(given) == 2 and 0 < given[1] < given[0], given
  assert 18 < given[0] <= 30 / 1.5 if not load else given[0] > 30 / 1.5, given


def test_the_checks_keep_to_a_share_of_the_tests_cpu_time(suite):
  """Two rules whose checks never end, the default share of the tests' CPU
  time (the tests spin 4 s): the first is stopped where the session's
  budget runs out, the second gets what is left (a CPU timer's tick at
  most); recording and checks together stay within the share."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
def stuck_jvp(p, t):
  while True:
    pass
@jax.custom_jvp
def stuck(x):
  return jnp.sin(x)
stuck.defjvp(stuck_jvp)
@jax.custom_jvp
def stuck_too(x):
  return jnp.cos(x)
stuck_too.defjvp(stuck_jvp)
''', test_stuck='''
import time
import jax.numpy as jnp
from lib import stuck, stuck_too
def test_calls():
  start = time.process_time()
  while time.process_time() - start < 4:
    pass
  stuck(jnp.float32(0.5))
  stuck_too(jnp.float32(0.5))
''')
  result, rules = _rules(suite, "--hijax-rules-budget=25%")
  report = json.loads((suite.path / "rules.json").read_text())
  checks, recording = report["checks"], report["recording"]
  assert result.ret == 0 and checks["budget"] > 0.5, checks
  assert checks["cpu_seconds"] <= checks["budget"] + 0.2, checks
  assert (recording["seconds"] + checks["cpu_seconds"]
          <= 0.25 * checks["suite_cpu_seconds"] + 0.2), report
  assert [rules[n]["verdict"] for n in ("stuck", "stuck_too")] == [
      "skipped for time", "skipped for time"], rules
  assert rules["stuck_too"]["seconds"] < 0.2, rules  # (what was left)
  result.stdout.fnmatch_lines(["hijax: skipped for time: stuck "
                               "(jax.custom_jvp); stuck_too (jax.custom_jvp)*"])


def test_a_sample_whose_checks_would_overrun_the_budget_is_not_started(
    suite):
  """A call that took 0.5 s of CPU time in the test: its checks (about
  five times that) would overrun a 2 s rule budget: they do not start."""
  suite.makepyfile(lib='''
import time
import jax, jax.numpy as jnp
@jax.custom_jvp
def slow(x):
  start = time.process_time()
  while time.process_time() - start < 0.5:
    pass
  return jnp.sin(x)
slow.defjvp(lambda p, t: (slow(p[0]), jnp.cos(p[0]) * t[0]))
''', test_slow='''
import jax.numpy as jnp
from lib import slow
def test_calls():
  slow(jnp.float32(0.5))
''')
  result, rules = _rules(suite, "--hijax-rule-budget=2")
  (tried,) = rules["slow"]["inputs"]
  assert (tried["verdict"], tried["seconds"]) == ("skipped for time", 0)
  assert re.fullmatch(
      r"its call took 0\.\d+ s CPU in the test; its checks, about 5 times "
      r"that, would overrun the rule's budget", tried["detail"]), tried
  assert rules["slow"]["detail"] == tried["detail"] and result.ret == 0


def test_a_check_that_would_run_past_the_budget_is_stopped(suite):
  """A jvp rule that never returns (as tracing a large function can take
  minutes, which check_rules' own budget cannot stop): the check stops
  where the rule's CPU time runs out."""
  suite.makepyfile(lib='''
import jax, jax.numpy as jnp
@jax.custom_jvp
def stuck(x):
  return jnp.sin(x)
@stuck.defjvp
def _jvp(p, t):
  while True:
    pass
''', test_stuck='''
import jax.numpy as jnp
from lib import stuck
def test_calls():
  stuck(jnp.float32(0.5))
''')
  result, rules = _rules(suite, "--hijax-rule-budget=2")
  (tried,) = rules["stuck"]["inputs"]
  assert (tried["verdict"], tried["detail"]) == (
      "skipped for time", "stopped where the rule's budget ran out"), tried
  assert result.ret == 0


# a library's own primitives (like lineax's linear_solve_p): sin with a jvp
# rule of the given slope (1: right), and twice with a transpose rule of
# the given factor (2: right)
PRIMITIVES = '''
import jax, jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

def sin_primitive(name, slope):
  p = Primitive(name)
  p.def_impl(jnp.sin)
  p.def_abstract_eval(lambda x: x)
  mlir.register_lowering(p, mlir.lower_fun(jnp.sin, multiple_results=False))
  def sin_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return p.bind(x), slope * jnp.cos(x) * ad.instantiate_zeros(t)
  ad.primitive_jvps[p] = sin_jvp
  batching.primitive_batchers[p] = lambda a, d: (p.bind(*a), d[0])
  return p

def twice_primitive(name, factor):
  p = Primitive(name)
  p.def_impl(lambda x: 2 * x)
  p.def_abstract_eval(lambda x: x)
  mlir.register_lowering(p, mlir.lower_fun(lambda x: 2 * x,
                                           multiple_results=False))
  def twice_jvp(primals, tangents):
    return p.bind(primals[0]), p.bind(ad.instantiate_zeros(tangents[0]))
  ad.primitive_jvps[p] = twice_jvp
  ad.primitive_transposes[p] = lambda ct, x: [factor * ct]
  batching.primitive_batchers[p] = lambda a, d: (p.bind(*a), d[0])
  return p

# x * s, whose jvp rule refuses a tangent of s (like lineax's solver state)
times_p = Primitive("times")
times_p.def_impl(lambda x, s: x * s)
times_p.def_abstract_eval(lambda x, s: x)
mlir.register_lowering(times_p, mlir.lower_fun(lambda x, s: x * s,
                                               multiple_results=False))
def times_jvp(primals, tangents):
  assert type(tangents[1]) is ad.Zero, "s takes no tangent"
  return times_p.bind(*primals), times_p.bind(tangents[0], primals[1])
ad.primitive_jvps[times_p] = times_jvp
ad.primitive_transposes[times_p] = lambda ct, x, s: [times_p.bind(ct, s),
                                                  None]

# not differentiable on purpose (like equinox's nontraceable_p)
def refuse(primals, tangents):
  raise TypeError("refused_p cannot be differentiated")
refused_p = sin_primitive("refused", 1.0)
ad.primitive_jvps[refused_p] = refuse

# not reverse-differentiable on purpose (equinox's nondifferentiable_backward)
one_way_p = twice_primitive("one_way", 2.0)
def no_transpose(ct, x):
  raise RuntimeError("one_way_p cannot be transposed")
ad.primitive_transposes[one_way_p] = no_transpose

right_sin_p = sin_primitive("right_sin", 1.0)
wrong_sin_p = sin_primitive("wrong_sin", 1.5)
right_twice_p = twice_primitive("right_twice", 2.0)
wrong_twice_p = twice_primitive("wrong_twice", -2.0)
'''


def test_a_library_primitive_is_checked_by_its_registered_rules(suite):
  """A primitive whose jvp (and transpose) rule a library registers is
  recorded at its binds and checked against its impl: the right rules
  pass, a wrong jvp and a wrong transpose fail, named."""
  suite.makepyfile(primlib=PRIMITIVES, test_prims='''
import jax, jax.numpy as jnp, pytest
import primlib
def test_binds():
  x = jnp.array([0.2, 0.3])
  for p in (primlib.right_sin_p, primlib.wrong_sin_p, primlib.right_twice_p,
            primlib.wrong_twice_p):
    p.bind(x)
    jax.grad(lambda x: p.bind(x).sum())(x)
  jax.eval_shape(jax.jit(primlib.right_sin_p.bind), jnp.ones((2, 2)))
  jax.jvp(lambda x: primlib.times_p.bind(x, jnp.float32(3)), (x,), (x,))
  jax.jvp(primlib.one_way_p.bind, (x,), (x,))
  with pytest.raises(TypeError, match="cannot be differentiated"):
    jax.jvp(primlib.refused_p.bind, (x,), (x,))
''')
  result, rules = _rules(suite)
  assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
  verdicts = {name: (r["kind"], r["verdict"]) for name, r in rules.items()}
  assert verdicts == {"right_sin": ("Primitive", "passed"),
                      "wrong_sin": ("Primitive", "failed"),
                      "right_twice": ("Primitive", "passed"),
                      "wrong_twice": ("Primitive", "failed"),
                      "times": ("Primitive", "passed"),
                      "refused": ("Primitive", "inconclusive"),
                      "one_way": ("Primitive", "inconclusive")}, verdicts
  assert rules["one_way"]["detail"].startswith("its rules raised ("), rules[
      "one_way"]
  assert "one_way_p cannot be transposed" in rules["one_way"]["detail"]
  assert rules["refused"]["detail"].startswith(
      "differentiating it raised in the tests too"), rules["refused"]
  assert rules["wrong_sin"]["defined_at"].startswith("primlib.py:"), rules
  assert "jvp" in rules["wrong_sin"]["detail"], rules["wrong_sin"]
  assert re.search("vjp|transpose", rules["wrong_twice"]["detail"]), rules[
      "wrong_twice"]
  assert re.search(r"wrong_sin \(Primitive\).*failed", result.stdout.str())
  # traced in a program that never ran, its inputs are types only: not
  # drawn (they may depend on each other, as a solver's state on its
  # operator)
  assert [(i["types"], i["verdict"]) for i in rules["right_sin"][
      "inputs"]] == [(["f32[2]"], "passed"), (["f32[2,2]"], "not checked")]
  assert "bound inside jit" in rules["right_sin"]["inputs"][1]["detail"]


def test_a_library_primitive_bound_only_inside_jit_is_checked_at_run_time(
    suite):
  """Bound only inside jit, a primitive's inputs are types; at the defaults
  (as with --hijax-values-inside-jit), while recording, the program sends
  the values it runs with back (a debug callback), and the primitive is
  checked at them: the wrong jvp fails, named, the right one passes."""
  suite.makepyfile(primlib=PRIMITIVES, test_jitted='''
import jax, jax.numpy as jnp
import primlib
def test_solves():
  for p in (primlib.right_sin_p, primlib.wrong_sin_p):
    grad = jax.jit(jax.grad(lambda x: p.bind(x).sum()))
    assert grad(jnp.array([0.2, 0.3])).shape == (2,)
''')
  for flag in ((), ("--hijax-values-inside-jit",)):
    result, rules = _rules(suite, *flag)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert {name: r["verdict"] for name, r in rules.items()} == {
        "right_sin": "passed", "wrong_sin": "failed"}, rules
    for rule in rules.values():
      assert [(i["types"], i["source"]) for i in rule["inputs"]] == [
          (["f32[2]"], "traced, values at run time")], rule
    assert "jvp" in rules["wrong_sin"]["detail"], rules["wrong_sin"]
    assert re.search(r"wrong_sin \(Primitive\).*failed",
                     result.stdout.str())


def test_the_tests_programs_are_left_as_they_are(suite):
  """With --hijax-no-values-inside-jit recording adds nothing to what the
  tests trace: a test that reads a jitted bind's jaxpr passes with the
  plugin on, and the primitive is not checked, with the reason and the
  option that checks it. The defaults add a callback to the tests'
  programs: the same test then fails (its jaxpr has the callback too)."""
  suite.makepyfile(primlib=PRIMITIVES, test_jaxpr='''
import jax, jax.numpy as jnp
import primlib
def test_one_equation():
  f = jax.jit(lambda x: primlib.right_sin_p.bind(x))
  inner = jax.make_jaxpr(f)(jnp.ones(2)).eqns[0].params["jaxpr"]
  assert [e.primitive.name for e in inner.eqns] == ["right_sin"], inner
  f(jnp.array([0.2, 0.3]))
''')
  result, rules = _rules(suite, "--hijax-no-values-inside-jit")
  assert result.ret == pytest.ExitCode.OK, result.stdout.str()
  (sample,) = rules["right_sin"]["inputs"]
  assert sample["verdict"] == "not checked", sample
  assert sample["detail"].startswith("bound inside jit (values unknown)")
  assert "--hijax-no-values-inside-jit" in sample["detail"], sample
  result, rules = _rules(suite)
  assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
  result.stdout.fnmatch_lines(["FAILED*test_one_equation*"])
  assert "debug_callback" in result.stdout.str()


# a solve whose impl reads a state computed from its operator (as lineax's
# linear_solve_p): state * b (= b / a, state = 1 / a), its jvp rule that of
# b / a, with b's term of the given slope (1: right)
SOLVES = '''
import jax, jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

def solve_primitive(name, b_slope):
  p = Primitive(name)
  impl = lambda a, state, b: state * b
  p.def_impl(impl)
  p.def_abstract_eval(lambda a, state, b: b)
  mlir.register_lowering(p, mlir.lower_fun(impl, multiple_results=False))
  def jvp(primals, tangents):
    a, state, b = primals
    ta, _, tb = map(ad.instantiate_zeros, tangents)
    return p.bind(a, state, b), -state * state * b * ta + b_slope * state * tb
  ad.primitive_jvps[p] = jvp
  return p

def solve(p, a, b):
  return p.bind(a, jax.lax.stop_gradient(1 / a), b)

right_p = solve_primitive("right_solve", 1.0)
wrong_p = solve_primitive("wrong_solve", 2.0)
'''


def test_a_primitive_input_that_reaches_its_impl_through_another_is_held(
    suite):
  """The impl of a solve reads the state computed from its operator, not
  the operator: finite differences in the operator alone see nothing, so
  the operator is held fixed (no false alarm) and the solve is checked in
  its right-hand side, where a wrong term fails (bound inside jit: checked
  at its programs' values)."""
  suite.makepyfile(solvelib=SOLVES, test_solves='''
import jax, jax.numpy as jnp
import solvelib
def test_solves():
  a, b = jnp.array([2.0, 4.0]), jnp.array([1.0, 3.0])
  for p in (solvelib.right_p, solvelib.wrong_p):
    f = jax.jit(jax.grad(lambda a, b: solvelib.solve(p, a, b).sum(), (0, 1)))
    da, db = f(a, b)
    assert jnp.allclose(da, -b / a**2)
''')
  result, rules = _rules(suite)
  assert {name: r["verdict"] for name, r in rules.items()} == {
      "right_solve": "passed", "wrong_solve": "failed"}, rules
  assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
  assert "args[0]" in rules["wrong_solve"]["detail"], rules["wrong_solve"]
