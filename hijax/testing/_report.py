"""What `check_rules` reports: the modes it knows, and its results."""
from __future__ import annotations

import dataclasses

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
  """
  rule: str
  check: str
  inputs: str
  detail: str
  max_error: float | None = None

  def __str__(self) -> str:
    lines = [f"{self.rule}: {self.check}"]
    lines += ["  " + line for line in self.inputs.splitlines()]
    lines += ["  " + line for line in self.detail.splitlines()]
    return "\n".join(lines)


@dataclasses.dataclass
class RuleReport:
  """What `check_rules` did.

  Attributes:
    primitives: the names of the hijax primitives ``prim_fn`` binds.
    dtype: the floating-point dtype the checks ran in.
    ran: one line per check that ran.
    skipped: ``(mode, reason)`` for each mode that did not run.
    failures: the `RuleFailure` of each failed check (empty when all passed).
    inconclusive: one line per comparison that could not see everything:
      finite differences that cannot resolve some output elements in this
      dtype at this point (those elements were not compared with them).
    cost: what the checks cost, e.g. the number of evaluations of the
      function for finite differences and for the second-order checks.
    first_order_only: one line per rule that declares that it cannot be
      differentiated again (JAX's error for forward mode of a
      ``jax.custom_vjp`` function, for reverse mode of a ``while_loop``, a
      ``NotImplementedError``): its second order was not checked, and it did
      not fail for it (unless ``require_second_order=True``).
    skipped_for_time: one line per check not started because the time
      budget was spent (``time_budget``).
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
  seconds: float = dataclasses.field(default=0.0, repr=False, compare=False)

  @property
  def complete(self) -> bool:
    """Whether every check planned ran (none was skipped for time) and every
    comparison was conclusive."""
    return not self.skipped_for_time and not self.inconclusive

  @property
  def passed(self) -> bool:
    return not self.failures

  @property
  def modes_run(self) -> list[str]:
    """The modes with at least one check run, in order."""
    return [m for m in MODES if any(r.startswith(m + ":") for r in self.ran)]

  def __str__(self) -> str:
    lines = [f"check_rules on {', '.join(self.primitives)} in {self.dtype}: "
             f"{len(self.ran)} checks, {len(self.failures)} failed"]
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

  The message lists every failure. The attributes describe the first one:
  ``rule``, ``check``, ``inputs`` and ``max_error``; ``failures`` has them all
  and ``report`` is the full `RuleReport`.
  """

  report: RuleReport
  failures: list[RuleFailure]
  rule: str
  check: str
  inputs: str
  max_error: float | None

  def __init__(self, report: RuleReport) -> None:
    self.report = report
    self.failures = list(report.failures)
    first = self.failures[0]
    self.rule, self.check = first.rule, first.check
    self.inputs, self.max_error = first.inputs, first.max_error
    n = len(self.failures)
    head = (f"{n} rule check{'s' if n > 1 else ''} failed for "
            f"{', '.join(report.primitives)} (in {report.dtype}):")
    super().__init__("\n\n".join([head] + [str(f) for f in self.failures]))


def first_lines(s: str, n: int = 6) -> str:
  """The first ``n`` lines of an exception message, for a failure's detail."""
  lines = s.strip().splitlines()
  return "\n".join(lines[:n] + (["..."] if len(lines) > n else []))
