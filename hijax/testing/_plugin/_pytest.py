"""``pytest --hijax-check-rules``'s hooks: record the rules the tests call,
check each at the end (first called first) within the budget, print a
table, fail the run, write JSON; read the ini's declarations."""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import pkgutil
import re
import textwrap
import time
from typing import Any

import pytest

from hijax.testing import MODES
from hijax.testing._plugin._check import (Declaration, RuleResult,
                                          check_rule, is_surrogate)
from hijax.testing._plugin._recorder import CallRecorder

PLUGIN_NAME = "hijax-check-rules"
PROGRESS_EVERY = 1.0  # seconds between rewrites of the progress line
HOW_TO_DECLARE = (
    "if deliberate, declare it in the ini file (hijax_deliberate = "
    "{where}: surrogate, or: surrogate module:function (a reference to "
    "check it against), or: skip {mode}{output}); "
    "--hijax-rules-fail-on=never reports without failing")
HEADER = ("rule", "defined at", "inputs tried", "verdict")
MAX_WIDTHS = (44, 48, 50)  # the widest a column gets (longer: cut, "…")
VERDICTS = ("passed", "failed", "inconclusive", "skipped for time")
# the words of a failure's detail naming the `check_rules` mode, in order
MODE_WORDS = (("transposed by JAX", "vjp"), ("vmap", "batch"),
              ("second", "second_order"), ("transpos", "transpose"),
              ("vjp", "vjp"), ("fwd/bwd", "vjp"), ("jvp", "jvp"),
              ("lineari", "lin"))


def table(rows: list[tuple[str, list[str], list[str], str, str]],
          width: int = 120) -> list[str]:
  """One row per rule ``(rule, [defined at], [inputs], verdict, detail)``,
  the detail of a verdict other than "passed" below, indented."""
  if not rows:
    return ["no custom derivative rule was called by the tests"]
  columns = ([r[0] for r in rows], [w for r in rows for w in r[1]],
             [i for r in rows for i in r[2]])
  widths = [min(m, max(map(len, [h, *col])))
            for h, col, m in zip(HEADER, columns, MAX_WIDTHS)]

  def line(cells):
    parts = [c if len(c) <= w else  # a location is cut at its start
             "…" + c[len(c) - w + 1:] if k == 1 else c[:w - 1] + "…"
             for k, (c, w) in enumerate(zip(cells, widths))]
    return "  ".join([p.ljust(w) for p, w in zip(parts, widths)]
                     + [cells[3]]).rstrip()
  out = [line(HEADER), line(["-" * w for w in widths] + ["-" * 7])]
  for rule, where, inputs, verdict, detail in rows:
    n = max(len(where), len(inputs), 1)
    where, inputs = where + [""] * n, inputs + [""] * n
    out += [line([rule if k == 0 else "", where[k], inputs[k],
                  verdict if k == 0 else ""]) for k in range(n)]
    if detail and verdict != "passed":
      out += textwrap.wrap(detail, max(40, width - 4), initial_indent="    ",
                           subsequent_indent="      ",
                           break_on_hyphens=False, break_long_words=False)
  return out


class RuleCheckPlugin:
  """The plugin object: the recorder while the tests run, then the checks."""

  def __init__(self, config: pytest.Config) -> None:
    self.config, opt = config, config.getoption
    budget = str(opt("hijax_rules_budget"))
    try:
      self.share = float(budget[:-1]) / 100 if budget.endswith("%") else None
      self.total_budget = 0.0 if self.share is not None else float(budget)
    except ValueError:
      raise pytest.UsageError(
          "--hijax-rules-budget takes seconds (600) or a share of the tests' "
          f"CPU time (25%), not {budget!r}") from None
    self.rule_budget = float(str(opt("hijax_rule_budget")))
    self.fail_on = str(opt("hijax_rules_fail_on"))
    self.recorder = CallRecorder(int(str(opt("hijax_rules_samples"))),
                                 bool(opt("hijax_rules_include_jax")),
                                 bool(opt("hijax_values_inside_jit")))
    self.results: list[RuleResult] = []
    self.unresolved: list[str] = []
    self.declared: list[tuple[str, str]] = []  # (target, what)
    self.test_files: set[str] = set()
    self.check_seconds = self.check_cpu = self.suite_seconds = 0.0
    self.suite_wall = self._shown = 0.0
    self._cpu_start, self._wall_start = time.process_time(), time.perf_counter()
    self.recorder.install()

  def pytest_runtest_logstart(self, nodeid: str) -> None:
    self.recorder.test = nodeid
    self.recorder.watch()

  def pytest_sessionfinish(self, session: pytest.Session,
                           exitstatus: int) -> None:
    self.recorder.remove()
    self.suite_seconds = time.process_time() - self._cpu_start
    self.suite_wall = time.perf_counter() - self._wall_start
    if self.share is not None:
      self.total_budget = max(0.0, self.share * self.suite_seconds
                              - self.recorder.seconds)
    self.test_files = {str(item.path) for item in session.items}
    if exitstatus == pytest.ExitCode.INTERRUPTED:
      return
    self._check_all()
    if path := self.config.getoption("hijax_rules_json"):
      with open(path, "w", encoding="utf-8") as f:
        json.dump(self.json(), f, indent=1, ensure_ascii=False)
    if self._failing() and session.exitstatus == pytest.ExitCode.OK:
      session.exitstatus = pytest.ExitCode.TESTS_FAILED

  def pytest_unconfigure(self) -> None:
    self.recorder.remove()

  def _failing(self) -> list[str]:
    bad = {"never": (), "inconclusive": ("failed", "inconclusive")}.get(
        self.fail_on, ("failed",))
    return [r.rule.identity.label() for r in self.results if r.verdict in bad]

  def _declarations(self) -> list[tuple[Any, str, str, set[str]]]:
    """``(object or None, location or "", word, items)`` per declaration."""
    out, deliberate = [], self.config.getini("hijax_deliberate")
    for line in ([f"{n}: surrogate" for n in self.config.getini(
        "hijax_surrogates")] + deliberate):
      target, _, what = (s.strip() for s in line.rpartition(": "))
      word, _, items = what.partition(" ")
      items = {i.strip() for i in items.split(",") if i.strip()}
      if not target or word not in ("surrogate", "skip", "output") or (
          word == "skip" and not items <= set(MODES)) or (
              word == "surrogate" and len(items) > 1):
        self.unresolved.append(
            f"{line!r} (hijax_deliberate takes TARGET: surrogate [REFERENCE]"
            f", TARGET: skip MODE,... with MODE one of {', '.join(MODES)}, "
            "or TARGET: output OUT,...)")
        continue
      if line in deliberate:
        self.declared.append((target, what))
      try:  # a location, a dotted name, or module:attr.path
        obj = None if ".py:" in target or not re.fullmatch(
            r"[\w.:]+", target) else pkgutil.resolve_name(target)
        if word == "surrogate":  # (its reference: a function of that value)
          items = {(i, pkgutil.resolve_name(i)) for i in items}
        out.append((obj, target if obj is None else "", word, items))
      except (ImportError, AttributeError, ValueError) as e:
        self.unresolved.append(f"{target} ({type(e).__name__}: {e})")
    return out

  def declaration(self, rule, declared) -> Declaration:
    """What the declarations say of ``rule``."""
    file, line = rule.identity.where()
    file, out = "/" + file.replace(os.sep, "/"), Declaration()
    for obj, location, word, items in declared:
      path, _, at = location.rpartition("::" if "::" in location else ":")
      if is_surrogate(rule, obj) if obj is not None else (
          path and file.endswith("/" + path.lstrip("/"))
          and at in (str(line), rule.identity.name)):
        if word == "surrogate":
          out.surrogate = True
          out.reference = next(iter(items), out.reference)
        else:
          (out.skip if word == "skip" else out.outputs).update(items)

    return out

  def _progress(self, line: str, every: float = 0.0) -> None:
    """One line rewritten in place (at most each ``every`` s), on a tty."""
    reporter = self.config.pluginmanager.get_plugin("terminalreporter")
    if time.monotonic() - self._shown < every:
      return
    self._shown = time.monotonic()
    if reporter is not None and reporter.isatty():
      width = reporter._tw.fullwidth - 1  # pylint: disable=protected-access
      reporter.rewrite(f"hijax: {line}"[:width] if line else "", erase=True)

  def _check_all(self) -> None:
    declared, rules = self._declarations(), list(self.recorder.rules.values())
    start, cpu = time.monotonic(), time.process_time()
    # wall-clock seconds per CPU second: the smaller of the tests' own and
    # the load per core now, at least 1
    pace = max(1.0, min(os.getloadavg()[0] / (os.cpu_count() or 1),
                        self.suite_wall / max(self.suite_seconds, 1e-9)))
    for n, rule in enumerate(rules, 1):
      spent = time.process_time() - cpu
      left = min(self.rule_budget, self.total_budget - spent)
      head = (f"checking rule {n}/{len(rules)} ({spent:.0f} of "
              f"{self.total_budget:.0f} s): {rule.identity.label()}")
      if left > 0:  # (else each of its inputs is listed skipped for time)
        self._progress(head)
      self.results.append(check_rule(
          rule, max(left, 0), self.declaration(rule, declared),
          lambda line, head=head: self._progress(f"{head}: {line}",
                                                 PROGRESS_EVERY), pace=pace))
    self.check_seconds = time.monotonic() - start
    self.check_cpu = time.process_time() - cpu
    if rules:
      self._progress("")

  def hint(self, result: RuleResult) -> str | None:
    """How to declare ``result``'s failure deliberate, or report it (an
    output only where its detail names one of several); None unless
    failed."""
    found = re.search(r"\bout\b(\[[^\]\s]*\])+", result.detail)
    mode = next((m for w, m in MODE_WORDS if w in result.detail), "expand")
    return HOW_TO_DECLARE.format(
        where=self._where(result.rule)[0], mode=mode,
        output=f", or: output {found.group(0)}" if found else ""
    ) if result.verdict == "failed" else None

  def _where(self, rule) -> list[str]:
    """Where ``rule`` (and its wrapper) is defined, from the root or package."""
    out = []
    for via in (False, True)[:1 + bool(rule.identity.via)]:
      path, line = rule.identity.where(via)
      try:
        rel = os.path.relpath(path, self.config.rootpath)
      except ValueError:
        rel = ".."
      out.append(("via " if via else "") + (rel if not rel.startswith("..")
                  else path.split(f"site-packages{os.sep}", 1)[-1])
                 + f":{line}")
    return out

  def in_test_file(self, rule) -> bool:
    """Whether ``rule`` is defined in a test module or a conftest.py."""
    file = rule.identity.where()[0]
    return file in self.test_files or os.path.basename(file) == "conftest.py"

  def pytest_terminal_summary(self, terminalreporter) -> None:
    tr = terminalreporter
    tr.write_sep("=", "hijax: custom derivative rules called by the tests")
    rows = [(r.rule.identity.label() + " [surrogate]" * r.surrogate,
             self._where(r.rule), [
                 f"{', '.join(t.types) or 'no arrays'} ({t.source})"
                 for t in r.tried], r.verdict,
             r.detail + (f"; {h}" if (h := self.hint(r)) else ""))
            for r in self.results]
    for line in table(rows, tr._tw.fullwidth) + self.summary():
      tr.write_line(line)

  def summary(self) -> list[str]:
    """The lines after the table: counts, costs, advisories, what was
    skipped, declarations not used, whether the run fails."""
    results, rec = self.results, self.recorder
    labels = lambda rows: "; ".join(r.rule.identity.label() for r in rows)
    counts = collections.Counter(r.verdict for r in results)
    lines = [f"{len(results)} rule(s): " + ", ".join(
        f"{counts[v]} {v}" for v in VERDICTS if counts[v]) if results else
             "0 rules checked"]
    if in_tests := sum(self.in_test_file(r.rule) for r in results):
      lines.append(f"{in_tests} of them defined in the test files")
    if rec.skipped_rules:
      lines.append(f"{len(rec.skipped_rules)} rule(s) defined in JAX, jaxlib "
                   "or hijax were called and not checked "
                   "(--hijax-rules-include-jax checks them)")
    of = (f" ({self.share:.0%} of the tests' {self.suite_seconds:.1f} s CPU "
          "time)" if self.share is not None else "")
    lines.append(f"recording: {rec.calls} call(s), {rec.seconds:.2f} s; "
                 f"checks: {self.check_cpu:.1f} s CPU time of a "
                 f"{self.total_budget:.1f} s budget{of}")
    if advised := [r for r in results if any(t.advisory for t in r.tried)]:
      lines.append(f"advisory (not failing): {labels(advised)} fail the "
                   "vmap check at batched arguments no test used (the "
                   "JSON's \"advisory\" lists them)")
    if skipped := [r for r in results if r.verdict == "skipped for time"]:
      lines.append(f"skipped for time: {labels(skipped)} (a larger "
                   "--hijax-rules-budget, in seconds or a % of the tests' "
                   "CPU time, checks them)")
    lines += [f"recording error (the call went on): {e}" for e in rec.errors]
    lines += [f"hijax_surrogates / hijax_deliberate: cannot use {name}"
              for name in self.unresolved]
    if failing := self._failing():
      lines.append("the test run fails: " + "; ".join(failing))
    return [f"hijax: {line}" for line in lines]

  def json(self) -> dict[str, Any]:
    """The results as a JSON-serializable dict (``--hijax-rules-json``)."""
    rec, rules = self.recorder, []
    for r in self.results:
      where = self._where(r.rule) + [None]
      rules.append({
          "rule": r.rule.identity.name, "kind": r.rule.identity.kind,
          "defined_at": where[0], "via": where[1] and where[1][len("via "):],
          "in_test_file": self.in_test_file(r.rule),
          "surrogate": r.surrogate, "calls": r.rule.calls,
          "first_test": next((s.test for s in r.rule.samples.values()), ""),
          "verdict": r.verdict,
          "detail": r.detail, "seconds": round(r.seconds, 3),
          "how_to_declare": self.hint(r),
          "inputs": [dict(dataclasses.asdict(t), seconds=round(t.seconds, 3))
                     for t in r.tried]})
    return {"rules": rules, "counts": dict(collections.Counter(
        r.verdict for r in self.results)), "recording": {
            "calls": rec.calls, "seconds": round(rec.seconds, 3),
            "errors": rec.errors,
            "rules_in_jax_not_checked": len(rec.skipped_rules)},
            "checks": {"seconds": round(self.check_seconds, 3),
                       "cpu_seconds": round(self.check_cpu, 3),
                       "budget": self.total_budget,
                       "rule_budget": self.rule_budget,
                       "suite_cpu_seconds": round(self.suite_seconds, 3)},
            "declared": [{"target": t, "what": w} for t, w in self.declared],
            "unresolved_surrogates": self.unresolved}
