"""The time a run of `check_rules` may take, and the progress it shows.

The checks run one after another (each mode, each direction, each batch
axis, each second-order function); before each one starts, the budget is
consulted, and once it is spent the remaining checks are not started but
listed in the report as skipped for time. A check that has started runs to
its end, except for what can take long in one piece, a compile (one
program for a special function built from long loops can take minutes):
that runs in a thread of its own and is abandoned at `HARD_LIMIT` times the
budget (`Budget.within` raises `BudgetSpent`, which ends the run: the rest
is reported skipped for time). A run that takes long prints where it is to
``stderr`` (or to a given function).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

# The default budget, per rule checked (primitive or jax.custom_* function).
SECONDS_PER_RULE = 30.0

# With progress=None, progress is shown once a run has taken this long, and
# then at most this often.
PROGRESS_AFTER = 10.0

# A compile still running at this many times the budget is abandoned.
HARD_LIMIT = 1.4


class BudgetSpent(BaseException):
  """A compile ran past `HARD_LIMIT` times the time budget: the run ends
  and reports what did not run as skipped for time. A BaseException, so
  that the checks' handlers of a rule's exceptions do not take it for a
  failure of the rule."""

  # where it stopped the preparation of the checks: (context, modes)
  prepared: tuple | None = None

  def __init__(self, what: str, seconds: float):
    self.what, self.seconds = what, seconds
    super().__init__(f"{what} was still running after {seconds:.1f} s")


def _to_stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def _thread_settings() -> contextlib.ExitStack:
  """JAX's settings of this thread that a context manager sets (x64, the
  default matmul precision and device), to enter in another thread: they
  do not carry over to it."""
  stack = contextlib.ExitStack()
  x64 = bool(jax.config.jax_enable_x64)
  precision = jax.config.jax_default_matmul_precision
  device = jax.config.jax_default_device
  stack.enter_context(jax.enable_x64(x64))
  stack.enter_context(jax.default_matmul_precision(precision))
  if device is not None:
    stack.enter_context(jax.default_device(device))
  return stack


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
    return cls(seconds, _to_stderr, always=bool(progress))

  @property
  def elapsed(self) -> float:
    return time.monotonic() - self.start

  @property
  def spent(self) -> bool:
    return self.seconds is not None and self.elapsed > self.seconds

  def within(self, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, abandoned (`BudgetSpent`) if it is still running at
    `HARD_LIMIT` times the budget; without a budget, ``fn()`` itself. It
    runs in a thread of its own, which an abandoned ``fn`` keeps until it
    ends (a compile cannot be interrupted; its result is dropped)."""
    if self.seconds is None:
      return fn()
    if HARD_LIMIT * self.seconds - self.elapsed <= 0:
      raise BudgetSpent(what, self.elapsed)
    return self.begin(what, fn)()

  def begin(self, what: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """Starts ``fn()`` in a thread of its own (with this thread's JAX
    settings) and returns a function that waits for its result, as
    `within` does (`BudgetSpent` at `HARD_LIMIT` times the budget). Work
    started and never waited for is waited for by `finish`, at the end of
    the run. The thread is not a daemon: one ended while in XLA's compiler
    aborts the process, so one abandoned at the hard limit is joined at the
    process's exit, with no exit hook of ours."""
    box: dict[str, Any] = {}
    settings = _thread_settings()

    def work():
      try:
        with settings:
          box["value"] = fn()
      except BaseException as e:  # pylint: disable=broad-except  (re-raised below)
        box["error"] = e
    worker = threading.Thread(target=work, daemon=False,
                              name=f"check_rules: {what}")
    worker.start()
    self._threads.append(worker)

    def wait():
      left = (None if self.seconds is None
              else HARD_LIMIT * self.seconds - self.elapsed)
      if left is not None and left <= 0 and worker.is_alive():
        raise BudgetSpent(what, self.elapsed)
      worker.join(left)
      if worker.is_alive():
        raise BudgetSpent(what, self.elapsed)
      if "error" in box:
        raise box["error"]
      return box["value"]
    return wait

  def finish(self) -> None:
    """Waits, at the end of a run, for the work started in threads that
    nothing waited for (a compile started ahead for a half of the checks
    that did not run), up to `HARD_LIMIT` times the budget: no thread of
    the run outlives it, but one still compiling then (abandoned, as
    `within` abandons it, and reported so where it was waited for)."""
    for worker in self._threads:
      left = (None if self.seconds is None
              else max(0.0, HARD_LIMIT * self.seconds - self.elapsed))
      worker.join(left)
    self._threads = [w for w in self._threads if w.is_alive()]

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
