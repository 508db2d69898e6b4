"""What `check_rules` reports: the modes it knows, and its results."""
from __future__ import annotations

import dataclasses

from hijax.derived import NonlinearBackwardError
from hijax.testing._foreign_words import declares_limit

MODES = ("expand", "jvp", "vjp", "lin", "transpose", "batch", "second_order")

# The modes that differentiate, and so need floating-point inputs and outputs.
DERIVATIVE_MODES = ("jvp", "vjp", "lin")


@dataclasses.dataclass
class RuleFailure:
  """One failed check.

  Attributes:
    rule: the rule under suspicion, e.g. ``"Log1pExp.jvp"``.
    check: what was compared, e.g. ``"jvp vs central finite differences of
      expand"``.
    inputs: the input the check ran on (and the tangent direction or batch
      axes, where relevant).
    detail: where the results differ, and by how much.
    max_error: the largest absolute error found (``inf`` when a rule raised or
      returned the wrong type; None when not applicable).
    error: the exception the rule (or the function) raised, where it raised
      rather than returned a wrong value; None otherwise.
  """
  rule: str
  check: str
  inputs: str
  detail: str
  max_error: float | None = None
  error: BaseException | None = dataclasses.field(
      default=None, repr=False, compare=False)

  def __str__(self) -> str:
    lines = [f"{self.rule}: {self.check}"]
    lines += ["  " + line for line in self.inputs.splitlines()]
    lines += ["  " + line for line in self.detail.splitlines()]
    return "\n".join(lines)


# Why a comparison was inconclusive, where a hint follows from it.
NOT_RESOLVED, KINK = "not resolved", "kink"

# A report's verdicts.
PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"

# How many failures a report's text and an error's message show in full.
SHOWN_FAILURES = 5


@dataclasses.dataclass
class RuleReport:
  """What `check_rules` did, and its verdict.

  A *comparison* sets a rule's result against a reference (finite
  differences, another rule, a loop) on some output elements. It is
  *conclusive* where at least one element was judged: a reference that
  resolves no element (every finite difference unresolved, a kink at every
  element, a check skipped for time) judges nothing. The verdict
  (`verdict`) is ``"failed"`` where a comparison failed, ``"passed"`` where
  none failed and every rule the run set out to check (`required`) passed at
  least one conclusive comparison, and ``"inconclusive"`` otherwise: a
  report that compared nothing never passes.

  Attributes:
    primitives: the names of the hijax primitives ``prim_fn`` binds.
    dtype: the floating-point dtype the checks ran in.
    ran: one line per check that ran.
    skipped: ``(mode, reason)`` for each mode that did not run.
    failures: the `RuleFailure` of each failed comparison (empty when none
      failed).
    inconclusive: one line per comparison that could not see everything:
      finite differences that cannot resolve some output elements in this
      dtype at this point (those elements were not compared with them), and
      comparisons that judged no element at all.
    cost: what the checks cost, e.g. the number of evaluations of the
      function for finite differences and for the second-order checks.
    first_order_only: one line per rule that declares that it cannot be
      differentiated again (JAX's error for forward mode of a
      ``jax.custom_vjp`` function, for reverse mode of a ``while_loop``, a
      ``NotImplementedError``): its second order was not checked, and it did
      not fail for it (unless ``require_second_order=True``).
    skipped_for_time: one line per check not started because the time
      budget was spent (``time_budget``).
    required: the rules the run set out to check (each mode planned, named
      as `defined_rules` names it): each needs a conclusive comparison for
      the report to pass.
    compared: per rule, the number of its conclusive comparisons that
      passed.
    unjudged: the number of comparisons that judged no element.
    surrogates: the rules declared surrogates (``surrogates=`` or
      `hijax.testing.surrogate`): deliberately not the derivative of the
      function, so never compared with the function's finite differences,
      only with each other, with loops and for types.
    by_intent: the rules left unjudged by intent: a surrogate's that only
      the function could judge, and rules that refuse a mode by design
      (they raise saying they cannot be differentiated so): they are not
      required to pass.
    devices: which device computed what: ``"checks"`` (the device and
      dtype the checks ran in: the host CPU where there is an accelerator)
      and, on an accelerator, ``"device check"`` (the device, the dtype, the
      parts compared and the tolerance measured there; see `check_rules`'s
      ``device``).
    inner_first: where the checked rules bind other hijax primitives whose
      own rules failed, those rules: their failures are listed first, since
      the outer rules' failures can follow from them.
    seconds: how long the run took.
  """
  primitives: list[str]
  dtype: str
  ran: list[str] = dataclasses.field(default_factory=list)
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  failures: list[RuleFailure] = dataclasses.field(default_factory=list)
  inconclusive: list[str] = dataclasses.field(default_factory=list)
  cost: dict[str, int] = dataclasses.field(default_factory=dict)
  first_order_only: list[str] = dataclasses.field(default_factory=list)
  skipped_for_time: list[str] = dataclasses.field(default_factory=list)
  required: list[str] = dataclasses.field(default_factory=list)
  compared: dict[str, int] = dataclasses.field(default_factory=dict)
  unjudged: int = 0
  surrogates: list[str] = dataclasses.field(default_factory=list)
  by_intent: list[str] = dataclasses.field(default_factory=list)
  inner_first: list[str] = dataclasses.field(default_factory=list)
  devices: dict[str, str] = dataclasses.field(default_factory=dict)
  seconds: float = dataclasses.field(default=0.0, repr=False, compare=False)
  # what `ran` and `inconclusive` say, as the checks' writer records it
  _modes: set[str] = dataclasses.field(default_factory=set, init=False,
                                       repr=False, compare=False)
  _causes: set[str] = dataclasses.field(default_factory=set, init=False,
                                        repr=False, compare=False)

  @property
  def complete(self) -> bool:
    """Whether every check planned ran (none was skipped for time) and every
    comparison was conclusive."""
    return not self.skipped_for_time and not self.inconclusive

  @property
  def not_judged(self) -> list[str]:
    """The rules in `required` without a conclusive comparison."""
    failed = {f.rule for f in self.failures}
    return [r for r in self.required if not self.compared.get(r)
            and r not in failed and r not in self.by_intent]

  @property
  def verdict(self) -> str:
    """``"passed"``, ``"failed"`` or ``"inconclusive"`` (see the class)."""
    if self.failures:
      return FAILED
    if self.not_judged or not any(self.compared.values()):
      return INCONCLUSIVE
    return PASSED

  @property
  def passed(self) -> bool:
    """Whether the verdict is ``"passed"``."""
    return self.verdict == PASSED

  @property
  def conclusive(self) -> int:
    """The number of conclusive comparisons (passed or failed)."""
    return sum(self.compared.values()) + len(self.failures)

  @property
  def modes_run(self) -> list[str]:
    """The modes with at least one check run, in order."""
    return [m for m in MODES if m in self._modes]

  def headline(self) -> str:
    """The first line of the report: the verdict and what it counts."""
    passed = sum(self.compared.values())
    counts = (f"{self.conclusive} conclusive comparison"
              f"{'' if self.conclusive == 1 else 's'} ({passed} passed, "
              f"{len(self.failures)} failed)")
    if self.unjudged:
      counts += f", {self.unjudged} that judged nothing"
    if self.surrogates:
      counts += (f"; {', '.join(self.surrogates)} checked as "
                 f"surrogate{'s' if len(self.surrogates) > 1 else ''}, not "
                 "against the function")
    return (f"check_rules on {', '.join(self.primitives)} in {self.dtype}: "
            f"{self.verdict.upper()}: {counts}")

  def why_inconclusive(self) -> list[str]:
    """Per rule not judged, why, and what would make it judgeable."""
    if not self.required and not any(self.compared.values()):
      return ["no rule was compared with anything"]
    hints = [hint for cause, hint in (
        (self.skipped_for_time, "a larger time_budget (or None)"),
        (NOT_RESOLVED in self._causes, "float64 (x64=True) or another point, "
         "where finite differences resolve the derivative"),
        (KINK in self._causes,
         "a point away from kinks and domain boundaries")) if cause]
    return [f"{rule}: no conclusive comparison; try " + "; or ".join(
        hints or ["another point or other modes"])
            for rule in self.not_judged or ["every rule"]]

  def __str__(self) -> str:
    lines = [self.headline()]
    if self.inner_first:
      lines.append(f"  (first the rules that the checked rules bind: "
                   f"{', '.join(self.inner_first)}; the other failures can "
                   "follow from them)")
    for f in self.failures[:SHOWN_FAILURES]:
      first, *rest = str(f).splitlines()
      lines.append(f"  FAILED   {first}")
      lines += [f"           {line}" for line in rest]
    if len(self.failures) > SHOWN_FAILURES:
      lines.append(f"  ... and {len(self.failures) - SHOWN_FAILURES} more "
                   "failure(s) (the report's failures list them all)")
    if self.verdict == INCONCLUSIVE:
      lines += [f"  NOT JUDGED  {why}" for why in self.why_inconclusive()]
    lines += [f"  surrogate  {r}: checked against its own rules, loops and "
              "types only (declared not the derivative)"
              for r in self.surrogates]
    lines += [f"  device   {k}: {v}" for k, v in self.devices.items()]
    lines += [f"  ran      {r}" for r in self.ran]
    lines += [f"  skipped  {m}: {why}" for m, why in self.skipped]
    lines += [f"  inconclusive  {why}" for why in self.inconclusive]
    lines += [f"  first-order only  {why}" for why in self.first_order_only]
    lines += [f"  skipped for time  {what}" for what in self.skipped_for_time]
    if self.cost:
      lines.append("  cost     " + ", ".join(
          f"{k}: {v}" for k, v in self.cost.items()))
    return "\n".join(lines)


class RuleCheckError(AssertionError):
  """A primitive's rules failed `check_rules`.

  The message lists the failures (the first `SHOWN_FAILURES` in full). The
  attributes describe the first one: ``rule``, ``check``, ``inputs`` and
  ``max_error``; ``failures`` has them all and ``report`` is the full
  `RuleReport`.
  """

  report: RuleReport
  failures: list[RuleFailure]
  rule: str
  check: str
  inputs: str
  max_error: float | None

  def __init__(self, report: RuleReport) -> None:
    self.report, self.failures = report, list(report.failures)
    first, n = self.failures[0], len(self.failures)
    self.rule, self.check = first.rule, first.check
    self.inputs, self.max_error = first.inputs, first.max_error
    head = (f"{n} rule check{'s' if n > 1 else ''} failed for "
            f"{', '.join(report.primitives)} (in {report.dtype}):")
    if report.inner_first:
      many = len(report.inner_first) > 1
      head += (f"\n{', '.join(report.inner_first)}, bound by the rules "
               f"checked, failed too: fix {'them' if many else 'it'} first "
               "(listed first), since the other failures can follow from "
               f"{'them' if many else 'it'}.")
    shown = [str(f) for f in self.failures[:SHOWN_FAILURES]]
    if n > SHOWN_FAILURES:
      shown.append(f"... and {n - SHOWN_FAILURES} more (the report's "
                   "failures list them all)")
    super().__init__("\n\n".join([head] + shown))


class InconclusiveCheckError(AssertionError):
  """`check_rules` could not judge every rule it checked: no comparison
  failed, but some rule (or every one) was compared with nothing
  conclusively (finite differences that resolve nothing at this point, a
  kink at every element, checks skipped for time).

  ``report`` is the `RuleReport`; ``rules`` the rules not judged. Pass
  ``accept_inconclusive=True`` to `check_rules` to return the report
  instead.
  """

  report: RuleReport
  rules: list[str]

  def __init__(self, report: RuleReport) -> None:
    self.report, self.rules = report, report.not_judged
    lines = [f"check_rules could not judge {', '.join(report.primitives)} "
             f"(in {report.dtype}): nothing failed, but not every rule was "
             "compared conclusively:"]
    lines += ["  " + why for why in report.why_inconclusive()]
    lines += ["  " + why for why in report.inconclusive[:SHOWN_FAILURES]]
    if report.skipped_for_time:
      lines.append(f"  {len(report.skipped_for_time)} check(s) skipped for "
                   "time")
    lines.append("Pass accept_inconclusive=True to return the report "
                 "instead of raising.")
    super().__init__("\n".join(lines))


def declared_limit(e: BaseException, strict: bool = False,
                   surrogate: bool = False) -> str | None:
  """The reason, if ``e`` says that the function cannot be differentiated in
  some mode (rather than that it broke)."""
  text = f"{type(e).__name__}: {first_lines(str(e), 2)}"
  if _nonlinear_backward(e):
    # forward mode of a backward rule not linear in the cotangent (hijax's
    # own condition): a limit by design only for a surrogate's rule
    return text if surrogate else None
  limit = isinstance(e, NotImplementedError) and not strict
  return text if limit or declares_limit(e) else None


def _nonlinear_backward(e: BaseException | None) -> bool:
  """Whether ``e`` is, or was raised from, a `NonlinearBackwardError`."""
  seen = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, NonlinearBackwardError):
      return True
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return False


def first_lines(s: str, n: int = 6) -> str:
  """The first ``n`` lines of an exception message, for a failure's detail."""
  lines = s.strip().splitlines()
  return "\n".join(lines[:n] + (["..."] if len(lines) > n else []))
