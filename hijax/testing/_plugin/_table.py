"""The table and the summary lines ``pytest --hijax-check-rules`` prints."""
from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

HEADER = ("rule", "defined at", "inputs tried", "verdict")
# The widest a column may get (longer entries are cut with "…").
MAX_WIDTHS = (44, 48, 50)
VERDICTS = ("passed", "failed", "inconclusive", "skipped for time")


def _cut(s: str, width: int) -> str:
  return s if len(s) <= width else s[:width - 1] + "…"


def _cut_path(s: str, width: int) -> str:
  """A location cut at its start, so that the file name and the line
  number stay."""
  return s if len(s) <= width else "…" + s[len(s) - width + 1:]


def table(rows: Sequence[tuple[str, list[str], list[str], str, str]],
          width: int = 120) -> list[str]:
  """The lines of the table: one row per rule (``(rule, defined at, inputs
  tried, verdict, detail)``, the second and third a line each), and the
  detail of a verdict that is not "passed" on the lines below, indented."""
  if not rows:
    return ["no custom derivative rule was called by the tests"]
  columns = ([r[0] for r in rows], [w for r in rows for w in r[1]],
             [i for r in rows for i in r[2]])
  widths = [min(m, max([len(h)] + [len(c) for c in col]))
            for h, col, m in zip(HEADER, columns, MAX_WIDTHS)]

  def line(cells):
    parts = [cut(c, w).ljust(w)
             for c, w, cut in zip(cells[:3], widths, (_cut, _cut_path, _cut))]
    return "  ".join(parts + [cells[3]]).rstrip()

  out = [line(HEADER), line(["-" * w for w in widths] + ["-" * 7])]
  for rule, where, inputs, verdict, detail in rows:
    n = max(len(where), len(inputs), 1)
    where = where + [""] * (n - len(where))
    inputs = inputs + [""] * (n - len(inputs))
    out.append(line([rule, where[0], inputs[0], verdict]))
    out += [line(["", w, i, ""]) for w, i in zip(where[1:], inputs[1:])]
    if detail and verdict != "passed":
      out += textwrap.wrap(detail, max(40, width - 4), initial_indent="    ",
                           subsequent_indent="      ",
                           break_on_hyphens=False, break_long_words=False)
  return out


def summary(results: Sequence[Any], recorder: Any, seconds: float,
            budget: float, unresolved: Sequence[str],
            fail_on: str, in_tests: int = 0, share: float | None = None,
            suite: float = 0.0) -> list[str]:
  """The lines after the table: counts of verdicts, what recording and
  checking cost (``seconds`` of CPU time, of ``budget``: ``share`` of
  the tests' ``suite`` seconds where given), the rules skipped for time,
  names in ``hijax_surrogates`` or ``hijax_deliberate`` not found, and
  whether the run fails because of the rules."""
  counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
  lines = [f"{len(results)} rule(s): " + ", ".join(
      f"{n} {v}" for v, n in counts.items() if n) if results else
           "0 rules checked"]
  if in_tests:
    lines.append(f"{in_tests} of them defined in the test files")
  if recorder.skipped_rules:
    lines.append(
        f"{len(recorder.skipped_rules)} rule(s) defined in JAX, jaxlib or "
        "hijax were called and not checked (--hijax-rules-include-jax "
        "checks them)")
  of = (f" ({share:.0%} of the tests' {suite:.1f} s CPU time)"
        if share is not None else "")
  lines.append(f"recording: {recorder.calls} call(s), {recorder.seconds:.2f} s"
               f"; checks: {seconds:.1f} s CPU time of a {budget:.1f} s "
               f"budget{of}")
  advised = [r.rule.identity.label() for r in results
             if any(t.advisory for t in r.tried)]
  if advised:
    lines.append(f"advisory (not failing): {'; '.join(advised)} fail the "
                 "vmap check at batched arguments no test used (the JSON's "
                 "\"advisory\" lists them)")
  skipped = [r.rule.identity.label() for r in results
             if r.verdict == "skipped for time"]
  if skipped:
    lines.append(f"skipped for time: {'; '.join(skipped)} (a larger "
                 "--hijax-rules-budget, in seconds or a % of the tests' CPU "
                 "time, checks them)")
  for error in recorder.errors:
    lines.append(f"recording error (the call went on): {error}")
  for name in unresolved:
    lines.append(f"hijax_surrogates / hijax_deliberate: cannot use {name}")
  failing = [r for r in results if r.verdict == "failed" or (
      fail_on == "inconclusive" and r.verdict == "inconclusive")]
  if failing and fail_on != "never":
    lines.append("the test run fails: " + "; ".join(
        r.rule.identity.label() for r in failing))
  return [f"hijax: {line}" for line in lines]
