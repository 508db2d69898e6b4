"""The time a run of `check_rules` may take, and the progress it shows.

The checks run one after another (each mode, each direction, each batch
axis, each second-order function); before each one starts, the budget is
consulted, and once it is spent the remaining checks are not started but
listed in the report as skipped for time. A check that has started runs to
its end, so a run can end past its budget by one check. A run that takes
long prints where it is to ``stderr`` (or to a given function).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable

# The default budget, per rule checked (primitive or jax.custom_* function).
SECONDS_PER_RULE = 30.0

# With progress=None, progress is shown once a run has taken this long, and
# then at most this often.
PROGRESS_AFTER = 10.0


def _to_stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Budget:
  """The deadline of one run of the checks, shared by its sub-checks.

  Attributes:
    seconds: the time allowed (None: no limit).
    progress: where progress lines go (None: nowhere).
    always: show progress from the start (else after `PROGRESS_AFTER`).
  """
  seconds: float | None
  progress: Callable[[str], None] | None = None
  always: bool = False
  start: float = dataclasses.field(default_factory=time.monotonic)
  _last: float = -float("inf")

  @classmethod
  def of(cls, time_budget: float | str | None,
         progress: bool | Callable[[str], None] | None,
         n_rules: int) -> Budget:
    """The budget of `check_rules`'s ``time_budget`` and ``progress``."""
    if time_budget == "default":
      seconds = SECONDS_PER_RULE * max(1, n_rules)
    else:
      seconds = None if time_budget is None else float(time_budget)
    if callable(progress):
      return cls(seconds, progress, always=True)
    if progress is False:
      return cls(seconds)
    return cls(seconds, _to_stderr, always=bool(progress))

  @property
  def elapsed(self) -> float:
    return time.monotonic() - self.start

  @property
  def spent(self) -> bool:
    return self.seconds is not None and self.elapsed > self.seconds

  def starting(self, what: str) -> None:
    """Shows that the check ``what`` starts, if progress is shown now."""
    if self.progress is None:
      return
    now = self.elapsed
    if (self.always or now > PROGRESS_AFTER) and now - self._last >= (
        0 if self.always else PROGRESS_AFTER):
      self._last = now
      limit = "" if self.seconds is None else f" of {self.seconds:.0f} s"
      self.progress(f"check_rules: {now:.1f} s{limit}: {what}")
