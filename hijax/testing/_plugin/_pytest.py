"""``pytest --hijax-check-rules``: records the custom derivative rules the
tests call, checks each at the end of the run, prints a table, and can
fail the run and write a JSON report.

Registered by the light entry module ``_hijax_pytestplugin`` (which declares
the options) only when the option is given. While the tests run, a
`._recorder.CallRecorder` is installed; at the end of the session it is
removed, and each rule is checked by `._check.check_rule`, in the order the
tests first called them, until the total budget is spent: by default a
share of the CPU time the tests took (``--hijax-rules-budget=25%``), so
that it scales with the suite, counted in CPU time.

Declarations (ini ``hijax_deliberate``, one per line, ``TARGET: WHAT``):
TARGET is a dotted name (``package.module.name``) or where the rule is
defined (``path/to/file.py:LINE`` or ``path/to/file.py::qualname``, the
path matched at its end: a rule defined in a test file); WHAT is
``surrogate``, ``skip MODE[,MODE]`` (modes of `check_rules`: ``batch`` for
``vmap``) or ``output OUT[,OUT]`` (a flat output index or a path as the
failures print it, like ``out[1]``).
"""
from __future__ import annotations

import importlib
import json
import os
import re
import time
from typing import Any

import pytest

from hijax.testing import MODES
from hijax.testing._plugin._check import (Declaration, RuleResult,
                                          check_rule, is_surrogate)
from hijax.testing._plugin._table import summary, table
from hijax.testing._plugin._recorder import CallRecorder
from hijax.testing._plugin._rule_identity import short_path

PLUGIN_NAME = "hijax-check-rules"

# The progress line is rewritten at most this often (seconds).
PROGRESS_EVERY = 1.0

HOW_TO_DECLARE = (
    "if deliberate, declare it in the ini file (hijax_deliberate = "
    "{where}: surrogate, or: skip {mode}, or: output {output}); "
    "--hijax-rules-fail-on=never reports without failing")


def _mode_of(detail: str) -> str:
  """The `check_rules` mode a failure's detail names."""
  for word, mode in (("vmap", "batch"), ("second", "second_order"),
                     ("transpos", "transpose"), ("vjp", "vjp"),
                     ("fwd/bwd", "vjp"), ("jvp", "jvp"), ("lineari", "lin")):
    if word in detail:
      return mode
  return "expand"


def _output_of(detail: str) -> str:
  found = re.search(r"\bout(\[[^\]\s]*\])*", detail)
  return found.group(0) if found else "0"


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
    budget = str(opt("hijax_rules_budget"))
    try:
      self.share = float(budget[:-1]) / 100 if budget.endswith("%") else None
      self.total_budget = 0.0 if self.share is not None else float(budget)
    except ValueError:
      raise pytest.UsageError(
          "--hijax-rules-budget takes seconds (600) or a share of the tests' "
          f"CPU time (25%), not {budget!r}") from None
    self.rule_budget = float(opt("hijax_rule_budget"))
    self.fail_on = str(opt("hijax_rules_fail_on"))
    self.json_path = opt("hijax_rules_json")
    self.recorder = CallRecorder(int(opt("hijax_rules_samples")),
                             bool(opt("hijax_rules_include_jax")))
    self.results: list[RuleResult] = []
    self.unresolved: list[str] = []
    self.check_seconds = self.check_cpu = 0.0
    self.suite_seconds = 0.0  # the CPU time the tests took
    self.test_files: set[str] = set()
    self.declared: list[tuple[str, str]] = []  # (target, what)
    self._cpu_start = time.process_time()
    self.recorder.install()

  # --- while the tests run -------------------------------------------------

  def pytest_runtest_logstart(self, nodeid: str) -> None:
    self.recorder.test = nodeid

  # --- at the end ----------------------------------------------------------

  def pytest_sessionfinish(self, session: pytest.Session,
                           exitstatus: int) -> None:
    self.recorder.remove()
    self.suite_seconds = time.process_time() - self._cpu_start
    if self.share is not None:
      self.total_budget = max(0.0, self.share * self.suite_seconds
                              - self.recorder.seconds)
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

  def _resolved(self, name: str) -> Any:
    try:
      return resolve(name)
    except (ImportError, AttributeError) as e:
      self.unresolved.append(f"{name} ({type(e).__name__}: {e})")
      return None

  def _declarations(self) -> list[tuple[Any, str, str]]:
    """``(object or None, location or "", what)`` per declaration."""
    out = [(obj, "", "surrogate") for name in
           self.config.getini("hijax_surrogates")
           if (obj := self._resolved(name)) is not None]
    for line in self.config.getini("hijax_deliberate"):
      target, _, what = line.rpartition(": ")
      target, what = target.strip(), what.strip()
      word, _, items = what.partition(" ")
      bad = [i for i in items.split(",") if i.strip()
             and word == "skip" and i.strip() not in MODES]
      if not target or word not in ("surrogate", "skip", "output") or bad:
        self.unresolved.append(
            f"{line!r} (hijax_deliberate takes TARGET: surrogate, TARGET: "
            f"skip MODE,... with MODE one of {', '.join(MODES)}, or TARGET: "
            "output OUT,...)")
        continue
      self.declared.append((target, what))
      if ".py:" in target or not re.fullmatch(r"[\w.:]+", target):
        out.append((None, target, what))
      elif (obj := self._resolved(target)) is not None:
        out.append((obj, "", what))
    return out

  def declaration(self, rule, declared) -> Declaration:
    """What the declarations say of ``rule``."""
    file, line = rule.identity.where()
    file = file.replace(os.sep, "/")
    out = Declaration()
    for obj, location, what in declared:
      path, _, at = location.rpartition("::" if "::" in location else ":")
      if obj is not None:
        if not is_surrogate(rule, [obj]):
          continue
      elif not (path and ("/" + file).endswith("/" + path.lstrip("/"))
                and at in (str(line), rule.identity.name)):
        continue
      word, _, items = what.partition(" ")
      names = {i.strip() for i in items.split(",") if i.strip()}
      if word == "surrogate":
        out.surrogate = True
      elif word == "skip":
        out.skip |= names
      elif word == "output":
        out.outputs |= names
    return out

  def _reporter(self):
    return self.config.pluginmanager.get_plugin("terminalreporter")

  def _progress(self, line: str) -> None:
    """One line, rewritten in place, on a terminal only."""
    reporter = self._reporter()
    if reporter is not None and reporter.isatty():
      width = reporter._tw.fullwidth - 1  # pylint: disable=protected-access
      reporter.rewrite(f"hijax: {line}"[:width], erase=True)

  def _check_all(self) -> None:
    declared = self._declarations()
    rules = list(self.recorder.rules.values())
    start, cpu = time.monotonic(), time.process_time()
    for n, rule in enumerate(rules, 1):
      spent = time.process_time() - cpu
      left = min(self.rule_budget, self.total_budget - spent)
      declaration = self.declaration(rule, declared)
      if left <= 0:  # (each of its inputs is listed as skipped for time)
        self.results.append(check_rule(rule, 0, declaration))
        continue
      head = (f"checking rule {n}/{len(rules)} ({spent:.0f} of "
              f"{self.total_budget:.0f} s): {rule.identity.label()}")
      self._progress(head)
      last = [time.monotonic()]
      def progress(line, last=last, head=head):
        if time.monotonic() - last[0] >= PROGRESS_EVERY:
          last[0] = time.monotonic()
          self._progress(f"{head}: {line}")
      self.results.append(check_rule(rule, left, declaration, progress))
    self.check_seconds = time.monotonic() - start
    self.check_cpu = time.process_time() - cpu
    reporter = self._reporter()
    if rules and reporter is not None and reporter.isatty():
      reporter.rewrite("", erase=True)

  def _fails(self) -> bool:
    if self.fail_on == "never":
      return False
    bad = {"failed"} | ({"inconclusive"} if self.fail_on == "inconclusive"
                        else set())
    return any(r.verdict in bad for r in self.results)

  def hint(self, result: RuleResult) -> str:
    """How to declare ``result``'s failure deliberate, or report it
    without failing."""
    detail = result.detail
    return HOW_TO_DECLARE.format(where=self._where(result.rule)[0],
                                 mode=_mode_of(detail),
                                 output=_output_of(detail))

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
             r.verdict, r.detail + (f"; {self.hint(r)}"
                                    if r.verdict == "failed" else ""))
            for r in self.results]
    for line in table(rows, tr._tw.fullwidth):
      tr.write_line(line)
    in_tests = sum(self.in_test_file(r.rule) for r in self.results)
    for line in summary(self.results, self.recorder, self.check_cpu,
                        self.total_budget, self.unresolved, self.fail_on,
                        in_tests, self.share, self.suite_seconds):
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
          "how_to_declare": self.hint(r) if r.verdict == "failed" else None,
          "inputs": [{"types": t.types, "source": t.source, "test": t.test,
                      "verdict": t.verdict, "detail": t.detail,
                      "seconds": round(t.seconds, 3),
                      "by_intent": t.by_intent, "skipped": t.skipped,
                      "failures": t.failures, "advisory": t.advisory}
                     for t in r.tried]})
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
                       "cpu_seconds": round(self.check_cpu, 3),
                       "budget": self.total_budget,
                       "rule_budget": self.rule_budget,
                       "suite_cpu_seconds": round(self.suite_seconds, 3)},
            "declared": [{"target": t, "what": w} for t, w in self.declared],
            "unresolved_surrogates": self.unresolved}
