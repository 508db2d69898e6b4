"""hijax's pytest plugin: ``pytest --hijax-check-rules`` checks every custom
derivative rule the tests call.

pytest loads this module in every run of every project whose environment
has hijax installed (the ``pytest11`` entry point in pyproject.toml), so it
stays light: it declares the options and nothing else. Only when
``--hijax-check-rules`` is given does it import hijax (and JAX) and register
`hijax.testing._plugin`, which records the calls while the tests run and
checks the rules at the end. Without the option nothing is patched,
recorded or imported.

It lives outside the ``hijax`` package because importing any module of a
package runs the package's ``__init__`` first, and ``hijax``'s imports JAX:
a project whose conftest sets ``JAX_ENABLE_X64`` or ``XLA_FLAGS`` before
importing JAX would see them ignored. (Hypothesis ships its plugin the same
way, as ``_hypothesis_pytestplugin``.)
"""
from __future__ import annotations

import pytest

# The defaults, in seconds (the total: a share of the tests' CPU time); each
# is an option below.
TOTAL_BUDGET = "25%"
RULE_BUDGET = 30.0
SAMPLES = 3


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup(
      "hijax", "hijax: check the custom derivative rules the tests call")
  group.addoption(
      "--hijax-check-rules", action="store_true", default=False,
      help="record every call of a jax.custom_jvp / jax.custom_vjp function, "
      "a hijax.custom_jvp / custom_vjp function and a HiPrim while the tests "
      "run, then check each rule with hijax.testing.check_rules at the "
      "recorded inputs and print a table")
  group.addoption(
      "--hijax-rules-budget", default=TOTAL_BUDGET, metavar="SECONDS|N%",
      help="CPU time for all the checks at the end, in seconds or as a "
      "share of the CPU time the tests took (default "
      f"{TOTAL_BUDGET.replace('%', '%%')}); rules not started by then are "
      "reported as skipped for time")
  group.addoption(
      "--hijax-rule-budget", type=float, default=RULE_BUDGET,
      metavar="SECONDS",
      help=f"time for the checks of one rule (default {RULE_BUDGET:g})")
  group.addoption(
      "--hijax-rules-samples", type=int, default=SAMPLES, metavar="N",
      help="calls kept per rule (chosen to differ in input types, tests "
      f"and regions) and checked (default {SAMPLES})")
  group.addoption(
      "--hijax-rules-fail-on", default="failed",
      choices=("failed", "inconclusive", "never"),
      help="fail the test run when a rule fails its checks (default), also "
      "when one is inconclusive, or never (only report)")
  group.addoption(
      "--hijax-rules-json", default=None, metavar="PATH",
      help="write the results as JSON to PATH")
  group.addoption(
      "--hijax-values-inside-jit", action="store_true", default=True,
      help="check a library primitive bound only inside jit at the values "
      "its program ran with (the default): while recording, its bind adds a "
      "jax.debug.callback of its inputs to the tests' programs")
  group.addoption(
      "--hijax-no-values-inside-jit", action="store_false",
      dest="hijax_values_inside_jit",
      help="leave the tests' programs as they are (for a test that reads a "
      "jaxpr or exports a program): a library primitive bound only inside "
      "jit is then not checked")
  group.addoption(
      "--hijax-rules-include-jax", action="store_true", default=False,
      help="also check the rules defined in JAX, jaxlib and hijax themselves "
      "(recorded but not checked by default: their own test suites check "
      "them)")
  parser.addini(
      "hijax_surrogates", type="linelist", default=[],
      help="dotted names (package.module.name) of custom_jvp / custom_vjp "
      "functions or HiPrim classes whose rules are deliberately not the "
      "derivative (straight-through estimators, gradient clipping): "
      "checked only for consistency between their own rules")
  parser.addini(
      "hijax_deliberate", type="linelist", default=[],
      help="rules that are deliberately not the derivative in part, one per "
      "line as TARGET: WHAT, TARGET a dotted name or where the rule is "
      "defined (path/file.py:LINE or path/file.py::name, e.g. in a test "
      "file), WHAT 'surrogate', 'skip MODE[,MODE]' (checks not to run: "
      "jvp, vjp, lin, transpose, batch, second_order, expand) or "
      "'output OUT[,OUT]' (outputs whose tangent is not the derivative by "
      "design: a flat index or a path like out[1])")


def pytest_configure(config: pytest.Config) -> None:
  if not config.getoption("hijax_check_rules"):
    return
  if config.getoption("numprocesses", None):
    raise pytest.UsageError(
        "--hijax-check-rules records the calls in the process that runs the "
        "tests: run it without pytest-xdist's -n")
  from hijax.testing import _plugin as plugin  # JAX only now that it is asked for
  config.pluginmanager.register(plugin.RuleCheckPlugin(config),
                                plugin.PLUGIN_NAME)
