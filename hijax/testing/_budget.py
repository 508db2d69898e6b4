"""The time budget of one run of `check_rules`, and its progress lines: no
check starts once it is spent, no compile that would end past `HARD_LIMIT`
times it (estimated from its StableHLO's size: `BudgetSpent` instead)."""
from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


# The default budget, per rule checked (primitive or jax.custom_* function).
SECONDS_PER_RULE = 30.0

PROGRESS_AFTER = 10.0  # progress=None: shown after this long, this often

# No compile starts that would end past this many times the budget.
HARD_LIMIT = 1.4

# Seconds per character of StableHLO a compile takes before the run measured
# its own: hyp2f1's program, 351,387 characters in 19.8 s of CPU time (jax
# 0.12.0.1), the slowest per character of bench/bench_checker.py's (i0: 6e-6).
PRIOR_RATE = 6e-5

_clock = time.monotonic
_cpu_clock = time.process_time


class BudgetSpent(BaseException):
  """A compile would end past `HARD_LIMIT` times the budget: the run ends
  (a BaseException: not taken for a rule's failure)."""

  def __init__(self, what: str, seconds: float,
               estimate: float | None = None):
    self.what, self.seconds, self.estimate = what, seconds, estimate
    super().__init__(f"{what} was not started after {seconds:.1f} s: " + (
        "the time budget was spent" if estimate is None else
        f"it would take about {estimate:.1f} s, past {HARD_LIMIT:g} times "
        "the time budget"))


@dataclasses.dataclass
class Budget:
  """The deadline of one run (``seconds``, None: no limit) and where its
  progress lines go (``always``: from the start)."""
  seconds: float | None
  progress: Callable[[str], None] | None = None
  always: bool = False
  start: float = dataclasses.field(default_factory=lambda: _clock())
  _cpu_start: float = dataclasses.field(default_factory=lambda: _cpu_clock())
  _last: float = -float("inf")
  # the slowest seconds per character of the compiles measured (None: none)
  rate: float | None = None
  # the threads `begin` started, for `finish`
  _threads: list = dataclasses.field(default_factory=list)

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
    return cls(seconds, lambda line: print(line, file=sys.stderr, flush=True),
               always=bool(progress))

  @property
  def elapsed(self) -> float:
    return _clock() - self.start

  @property
  def spent(self) -> bool:
    return self.seconds is not None and self.elapsed > self.seconds

  def estimate(self, size: int) -> float:
    """The seconds a compile of ``size`` characters would take."""
    if self.rate is not None:
      return size * self.rate
    wall, cpu = _clock() - self.start, _cpu_clock() - self._cpu_start
    return size * PRIOR_RATE * max(1.0, wall / cpu if cpu > 0 else 1.0)

  def fits(self, size: int) -> bool:
    """Whether a compile of ``size`` characters would end within
    `HARD_LIMIT` times the budget."""
    return self.seconds is None or (
        self.elapsed + self.estimate(size) <= HARD_LIMIT * self.seconds)

  def size(self, lowered: Any) -> int:
    """A lowered program's characters of StableHLO (0 without a budget)."""
    return 0 if self.seconds is None else len(lowered.as_text())

  def compile(self, what: str, lowered: Any, probe: bool = False,
              size: int | None = None) -> Any:
    """``lowered.compile()``, measuring the rate; `BudgetSpent` where it
    does not fit (but a first ``probe``)."""
    if self.seconds is None:
      return lowered.compile()
    size = self.size(lowered) if size is None else size
    if self.spent:
      raise BudgetSpent(what, self.elapsed)
    if not (self.fits(size) or (probe and self.rate is None)):
      raise BudgetSpent(what, self.elapsed, self.estimate(size))
    start = _clock()
    executable = lowered.compile()
    self.rate = max(self.rate or 0.0, (_clock() - start) / size)
    return executable

  def begin(self, what: str, lowered: Any,
            size: int | None = None) -> Callable[[], Any]:
    """A function returning ``lowered.compile()``, compiled in a thread
    started now where it fits (`finish` waits for it)."""
    if not self.fits(self.size(lowered) if size is None else size):
      return functools.cache(lambda: self.compile(what, lowered, probe=True))
    box: dict[str, Any] = {}

    def work():
      try:
        box["value"] = lowered.compile()
      except BaseException as e:  # pylint: disable=broad-except  (re-raised below)
        box["error"] = e
    worker = threading.Thread(target=work, name=f"check_rules: {what}")
    worker.start()
    self._threads.append(worker)

    def wait():
      worker.join()
      if "error" in box:
        raise box["error"]
      return box["value"]
    return wait

  def finish(self) -> None:
    """Waits for the compiles `begin` started: no thread outlives the run."""
    for worker in self._threads:
      worker.join()
    self._threads = []

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
