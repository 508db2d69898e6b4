"""``pytest --hijax-check-rules``: records the custom derivative rules the
tests call, checks each at the end of the run, prints a table, and can
fail the run and write a JSON report.

Registered by the light entry module ``_hijax_pytestplugin`` (which declares
the options) only when the option is given. While the tests run, a
`._recorder.CallRecorder` is installed; at the end of the session it is
removed, and each rule is checked by `._check.check_rule`, in the order the tests first
called them, until the total budget is spent.
"""
from __future__ import annotations

import importlib
import json
import os
import time
from typing import Any

import pytest

from hijax.testing._plugin._check import RuleResult, check_rule, is_surrogate
from hijax.testing._plugin._table import summary, table
from hijax.testing._plugin._recorder import CallRecorder
from hijax.testing._plugin._rule_identity import short_path

PLUGIN_NAME = "hijax-check-rules"

# Progress lines from a rule's checks, at most this often (seconds).
PROGRESS_EVERY = 10.0


def resolve(name: str) -> Any:
  """The object a dotted name (``package.module.attr``, or with a colon
  before the attribute path) names: the longest importable module prefix,
  then attributes."""
  if ":" in name:
    module, _, attrs = name.partition(":")
    obj = importlib.import_module(module)
    for attr in attrs.split("."):
      obj = getattr(obj, attr)
    return obj
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      obj = getattr(obj, attr)
    return obj
  raise ImportError(f"no module in {name!r}")


class RuleCheckPlugin:
  """The plugin object: the recorder while the tests run, then the checks."""

  def __init__(self, config: pytest.Config) -> None:
    self.config = config
    def opt(name: str) -> Any:
      return config.getoption(name)
    self.total_budget = float(opt("hijax_rules_budget"))
    self.rule_budget = float(opt("hijax_rule_budget"))
    self.fail_on = str(opt("hijax_rules_fail_on"))
    self.json_path = opt("hijax_rules_json")
    self.recorder = CallRecorder(int(opt("hijax_rules_samples")),
                             bool(opt("hijax_rules_include_jax")))
    self.results: list[RuleResult] = []
    self.unresolved: list[str] = []
    self.check_seconds = 0.0
    self.test_files: set[str] = set()
    self.recorder.install()

  # --- while the tests run -------------------------------------------------

  def pytest_runtest_logstart(self, nodeid: str) -> None:
    self.recorder.test = nodeid

  # --- at the end ----------------------------------------------------------

  def pytest_sessionfinish(self, session: pytest.Session,
                           exitstatus: int) -> None:
    self.recorder.remove()
    self.test_files = {str(item.path) for item in session.items}
    if exitstatus == pytest.ExitCode.INTERRUPTED:
      return
    self._check_all()
    if self.json_path:
      with open(self.json_path, "w", encoding="utf-8") as f:
        json.dump(self.json(), f, indent=1, ensure_ascii=False)
    if self._fails() and session.exitstatus == pytest.ExitCode.OK:
      session.exitstatus = pytest.ExitCode.TESTS_FAILED

  def pytest_unconfigure(self) -> None:
    self.recorder.remove()

  def _surrogates(self) -> list[Any]:
    objects = []
    for name in self.config.getini("hijax_surrogates"):
      try:
        objects.append(resolve(name))
      except (ImportError, AttributeError) as e:
        self.unresolved.append(f"{name} ({type(e).__name__}: {e})")
    return objects

  def _say(self, line: str) -> None:
    reporter = self.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
      reporter.ensure_newline()  # after the last test's progress dots
      reporter.write_line(f"hijax: {line}")

  def _check_all(self) -> None:
    surrogates = self._surrogates()
    rules = list(self.recorder.rules.values())
    start = time.monotonic()
    if rules:
      self._say(f"checking the rules of {len(rules)} custom derivative(s) the "
                f"tests called (budget {self.total_budget:g} s, "
                f"{self.rule_budget:g} s per rule)")
    for n, rule in enumerate(rules, 1):
      spent = time.monotonic() - start
      left = min(self.rule_budget, self.total_budget - spent)
      if left <= 0:  # (each of its inputs is listed as skipped for time)
        self.results.append(check_rule(rule, 0,
                                       is_surrogate(rule, surrogates)))
        continue
      self._say(f"[{n}/{len(rules)}, {spent:.0f} s] {rule.identity.label()} "
                f"at {' '.join(self._where(rule))}")
      last = [time.monotonic()]
      def progress(line, last=last):
        if time.monotonic() - last[0] >= PROGRESS_EVERY:
          last[0] = time.monotonic()
          self._say(f"  {line}")
      self.results.append(check_rule(
          rule, left, is_surrogate(rule, surrogates), progress))
    self.check_seconds = time.monotonic() - start

  def _fails(self) -> bool:
    if self.fail_on == "never":
      return False
    bad = {"failed"} | ({"inconclusive"} if self.fail_on == "inconclusive"
                        else set())
    return any(r.verdict in bad for r in self.results)

  def _where(self, rule) -> list[str]:
    """Where ``rule`` is defined, and the library wrapper it is defined
    through, if any."""
    root = str(self.config.rootpath)
    file, line = rule.identity.where()
    where = [f"{short_path(file, root)}:{line}"]
    via = rule.identity.where_via()
    if via is not None:
      where.append(f"via {short_path(via[0], root)}:{via[1]}")
    return where

  def in_test_file(self, rule) -> bool:
    """Whether ``rule`` is defined in a test module or a conftest.py (a
    fixture of the tests, often deliberately not a derivative)."""
    file = rule.identity.where()[0]
    return file in self.test_files or os.path.basename(file) == "conftest.py"

  # --- reporting -----------------------------------------------------------

  def pytest_terminal_summary(self, terminalreporter) -> None:
    tr = terminalreporter
    tr.write_sep("=", "hijax: custom derivative rules called by the tests")
    rows = [(r.rule.identity.label() + (" [surrogate]" if r.surrogate
                                        else ""),
             self._where(r.rule), [t.describe() for t in r.tried],
             r.verdict, r.detail) for r in self.results]
    for line in table(rows, tr._tw.fullwidth):
      tr.write_line(line)
    in_tests = sum(self.in_test_file(r.rule) for r in self.results)
    for line in summary(self.results, self.recorder, self.check_seconds,
                        self.total_budget, self.unresolved, self.fail_on,
                        in_tests):
      tr.write_line(line)

  def json(self) -> dict[str, Any]:
    """The results as a JSON-serializable dict (``--hijax-rules-json``)."""
    rec = self.recorder
    rules = []
    for r in self.results:
      ident = r.rule.identity
      where = self._where(r.rule)
      rules.append({
          "rule": ident.name, "kind": ident.kind, "defined_at": where[0],
          "via": where[1][len("via "):] if len(where) > 1 else None,
          "in_test_file": self.in_test_file(r.rule),
          "surrogate": r.surrogate, "calls": r.rule.calls,
          "first_test": r.rule.first_test, "verdict": r.verdict,
          "detail": r.detail, "seconds": round(r.seconds, 3),
          "inputs": [{"types": t.types, "source": t.source, "test": t.test,
                      "verdict": t.verdict, "detail": t.detail,
                      "seconds": round(t.seconds, 3),
                      "by_intent": t.by_intent, "skipped": t.skipped,
                      "failures": t.failures} for t in r.tried]})
    counts: dict[str, int] = {}
    for r in self.results:
      counts[r.verdict] = counts.get(r.verdict, 0) + 1
    return {"rules": rules, "counts": counts,
            "recording": {"calls": rec.calls,
                          "seconds": round(rec.seconds, 3),
                          "errors": rec.errors,
                          "rules_in_jax_not_checked":
                              len(rec.skipped_rules)},
            "checks": {"seconds": round(self.check_seconds, 3),
                       "budget": self.total_budget,
                       "rule_budget": self.rule_budget},
            "unresolved_surrogates": self.unresolved}
