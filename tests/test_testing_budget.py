"""The time budget of check_rules (hijax/testing/_compiled.py): no compile
starts that would end past 1.4 times the budget by its estimate, and no
thread of a run outlives it. On fake clocks, so that no figure depends on
how busy the machine is."""
import atexit
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.testing import _compiled, check_rules
from hijax.testing._compiled import HARD_LIMIT, PRIOR_RATE, Budget, BudgetSpent
from hijax.testing._compiled import Bundle

import zoo

stages = pytest.importorskip("jax.stages")
X = jnp.array([0.3, 1.7, -2.2])


class Clocks:
  """A wall clock and a CPU clock that move only when told to."""

  def __init__(self, monkeypatch):
    self.wall, self.cpu = 100.0, 40.0  # (a run starts at neither zero)
    monkeypatch.setattr(_compiled, "_clock", lambda: self.wall)
    monkeypatch.setattr(_compiled, "_cpu_clock", lambda: self.cpu)

  def run(self, seconds, cpu=None):
    self.wall += seconds
    self.cpu += seconds if cpu is None else cpu


class Lowered:
  """A lowered program of ``size`` characters whose compile takes
  ``seconds`` on the clocks."""

  def __init__(self, clocks, size, seconds):
    self.clocks, self.size, self.seconds, self.compiled = (
        clocks, size, seconds, 0)

  def as_text(self):
    return "x" * self.size

  def compile(self):
    self.clocks.run(self.seconds)
    self.compiled += 1
    return f"executable of {self.size}"


def test_without_a_budget_everything_compiles(monkeypatch):
  clocks = Clocks(monkeypatch)
  budget = Budget(None)
  big = Lowered(clocks, 10 ** 9, 1000.)
  assert budget.compile("compiling big", big) == "executable of 1000000000"
  assert budget.fits(10 ** 9) and budget.size(big) == 0
  assert budget.rate is None and not budget.spent


def test_the_first_estimate_is_the_prior_times_how_slow_the_machine_runs(
    monkeypatch):
  clocks = Clocks(monkeypatch)
  budget = Budget(10.0)
  assert budget.estimate(1000) == pytest.approx(1000 * PRIOR_RATE)
  clocks.run(2.0, cpu=0.5)  # a busy machine: the run got a quarter of a CPU
  assert budget.estimate(1000) == pytest.approx(4 * 1000 * PRIOR_RATE)
  clocks.run(1.0, cpu=6.0)  # compiles on several cores: never below the prior
  assert budget.estimate(1000) == pytest.approx(1000 * PRIOR_RATE)
  budget.rate = 1e-3  # once measured, the run's own rate
  assert budget.estimate(1000) == pytest.approx(1.0)


def test_a_compile_that_fits_runs_and_measures_the_slowest_rate(monkeypatch):
  clocks = Clocks(monkeypatch)
  budget = Budget(10.0)
  assert budget.compile("a", Lowered(clocks, 1000, 2.0)) == "executable of 1000"
  assert budget.rate == pytest.approx(2e-3)
  budget.compile("b", Lowered(clocks, 1000, 1.0))  # faster: the slowest kept
  assert budget.rate == pytest.approx(2e-3)
  budget.compile("c", Lowered(clocks, 500, 2.0))
  assert budget.rate == pytest.approx(4e-3)
  assert budget.elapsed == pytest.approx(5.0)


def test_a_compile_that_would_end_past_the_hard_limit_does_not_start(
    monkeypatch):
  clocks = Clocks(monkeypatch)
  budget = Budget(10.0, rate=1e-3)
  clocks.run(5.0)
  # 5 s spent + 9 s estimated = 14 s = 1.4 x 10 s: fits, just
  assert budget.fits(9000) and not budget.fits(9001)
  too_long = Lowered(clocks, 9100, 9.1)
  with pytest.raises(BudgetSpent) as raised:
    budget.compile("compiling the checks' program (3 parts)", too_long,
                   probe=True)  # a probe only while no rate is measured
  assert too_long.compiled == 0 and budget.elapsed == 5.0
  e = raised.value
  assert (e.what, e.seconds, e.estimate) == (
      "compiling the checks' program (3 parts)", 5.0, pytest.approx(9.1))
  assert str(e) == ("compiling the checks' program (3 parts) was not started "
                    "after 5.0 s: it would take about 9.1 s, past 1.4 times "
                    "the time budget")
  clocks.run(5.5)  # spent: not even a small one starts
  with pytest.raises(BudgetSpent):
    budget.compile("small", Lowered(clocks, 1, 0.0), probe=True)


def test_the_first_compile_of_a_run_may_probe_the_rate(monkeypatch):
  """Before any compile the estimate is the prior's; a probe (the smallest
  program: one part) runs even where the prior says it would not fit, to
  measure the run's own rate; anything else does not."""
  clocks = Clocks(monkeypatch)
  budget = Budget(1.0)
  size = int(2 * HARD_LIMIT / PRIOR_RATE)  # twice the limit by the prior
  with pytest.raises(BudgetSpent):
    budget.compile("whole", Lowered(clocks, size, 0.1))
  assert budget.compile("probe", Lowered(clocks, size, 0.1), probe=True)
  assert budget.rate == pytest.approx(0.1 / size)
  assert budget.compile("next", Lowered(clocks, size, 0.1))  # now it fits


def test_a_compile_started_ahead_is_waited_for_by_finish(monkeypatch):
  clocks = Clocks(monkeypatch)
  budget = Budget(10.0)
  started = threading.Event()
  release = threading.Event()

  class Slow(Lowered):
    def compile(self):
      started.set()
      release.wait(60)
      return "done"
  before = set(threading.enumerate())
  wait = budget.begin("ahead", Slow(clocks, 10, 0.0))
  assert started.wait(60)
  assert [t.name for t in set(threading.enumerate()) - before] == [
      "check_rules: ahead"]
  release.set()
  budget.finish()
  assert set(threading.enumerate()) == before
  assert wait() == "done"

  class Broken(Lowered):
    def compile(self):
      raise ValueError("no compile")
  wait = budget.begin("broken", Broken(clocks, 10, 0.0))
  with pytest.raises(ValueError, match="no compile"):
    wait()  # raised where it is waited for
  budget.finish()
  # one that would not fit is not started: compiled at the call, as a probe
  # where no rate is measured yet, else refused
  fresh = Budget(1.0)
  wait = fresh.begin("unknown", Lowered(clocks, 10 ** 6, 1.0))
  assert set(threading.enumerate()) == before
  assert wait() == "executable of 1000000"
  assert fresh.rate == pytest.approx(1e-6)
  clocks.run(13.0)
  late = Lowered(clocks, 10 ** 6, 1.0)
  wait = budget.begin("late", late)
  assert set(threading.enumerate()) == before and late.compiled == 0
  with pytest.raises(BudgetSpent):
    wait()


def _timed_compiles(monkeypatch, clocks):
  """Compiles take the prior rate's seconds per character on ``clocks``;
  returns the list of the sizes compiled."""
  sizes = []
  compile_ = stages.Lowered.compile

  def timed(self, *args, **kwargs):
    sizes.append(len(self.as_text()))
    clocks.run(sizes[-1] * PRIOR_RATE)
    return compile_(self, *args, **kwargs)
  monkeypatch.setattr(stages.Lowered, "compile", timed)
  return sizes


def test_parts_whose_program_would_not_fit_are_compiled_in_pieces(
    monkeypatch):
  """A program too long for the budget: each part is compiled alone at its
  first call (the first, a probe, measures the rate) where it fits; a part
  that does not fit raises BudgetSpent at its call, the others run, and no
  compile ended past 1.4 times the budget."""
  clocks = Clocks(monkeypatch)
  sizes = _timed_compiles(monkeypatch, clocks)
  x = jnp.linspace(0.1, 1.0, 8)

  def part(x, k):  # large beside what a program adds to its parts
    for j in range(40):
      x = jnp.sin(x + j * k)
    return x

  def bundle(budget):
    b = Bundle(budget=budget)
    for k in range(4):
      b.add(k, lambda x, k=k: part(x, k), lambda: (x,))
    return b
  whole = bundle(Budget(None))
  assert np.allclose(whole.run(2, (x,)), part(x, 2))
  (size,) = sizes
  seconds = size * PRIOR_RATE / 2.5
  budget = Budget(seconds)
  sizes.clear()
  pieces = bundle(budget)
  assert np.allclose(pieces.run(1, (x,)), part(x, 1))
  assert len(sizes) == 1 and sizes[0] < size / 2  # part 1 alone
  assert np.allclose(pieces.run(0, (x,)), part(x, 0))
  assert len(sizes) == 2 and budget.elapsed <= HARD_LIMIT * seconds
  for k in (2, 3):
    with pytest.raises(BudgetSpent, match="was not started"):
      pieces.run(k, (x,))
  assert len(sizes) == 2


def test_the_first_part_is_compiled_as_a_probe_even_past_the_prior(
    monkeypatch):
  """Where even the first part alone would not fit by the prior, it is
  still compiled, once (no rate is measured yet: it measures it); the
  parts after it then do not fit and raise BudgetSpent at their call."""
  clocks = Clocks(monkeypatch)
  sizes = _timed_compiles(monkeypatch, clocks)
  x = jnp.linspace(0.1, 1.0, 8)
  b = Bundle(budget=Budget(None))
  for k in range(4):
    b.add(k, lambda x, k=k: jnp.sin(x + k), lambda: (x,))
  b.run(0, (x,))
  (whole,) = sizes
  sizes.clear()
  b = Bundle(budget=Budget(whole * PRIOR_RATE / 16))
  for k in range(4):
    b.add(k, lambda x, k=k: jnp.sin(x + k), lambda: (x,))
  assert np.allclose(b.run(0, (x,)), jnp.sin(x))
  assert len(sizes) == 1 and sizes[0] * PRIOR_RATE > 1.4 * whole * (
      PRIOR_RATE / 16)  # the probe, past the limit by the prior
  with pytest.raises(BudgetSpent):
    b.run(3, (x,))
  assert len(sizes) == 1


def test_a_run_ends_within_the_hard_limit_with_no_thread_left(monkeypatch):
  """A compile cannot be interrupted (hyp2f1's one program: minutes). On
  clocks where a compile takes the prior rate's seconds per character and
  nothing else takes time, with a budget a quarter of what the run's one
  program would take to compile: the checks' parts are compiled alone
  where they fit (the first measures the rate), the run ends within
  1.4 times its budget, inconclusive, listing what did not run, and leaves
  no thread or exit hook behind (before: the compile was abandoned in a thread that ran
  on past the call)."""
  clocks = Clocks(monkeypatch)
  sizes = _timed_compiles(monkeypatch, clocks)
  # the host's half alone (an accelerator's half compiles a second program:
  # the ninth TPU run)
  full = check_rules(zoo.right_sin(), X, time_budget=None, device=False)
  assert full.passed and len(sizes) == 1  # one program
  whole = sizes.pop()
  seconds = whole * PRIOR_RATE / 4
  before, hooks = set(threading.enumerate()), atexit._ncallbacks()
  start = clocks.wall
  with pytest.warns(UserWarning, match="time budget"):
    report = check_rules(zoo.right_sin(), X, time_budget=seconds,
                         accept_inconclusive=True, device=False)
  assert set(threading.enumerate()) == before
  assert atexit._ncallbacks() == hooks  # and no exit hook
  assert clocks.wall - start <= HARD_LIMIT * seconds
  assert report.seconds <= HARD_LIMIT * seconds
  assert len(sizes) >= 2 and sizes[0] < whole / 2  # in pieces
  assert report.verdict == "inconclusive" and report.conclusive < (
      full.conclusive)
  mode = lambda line: line.split(":")[0]
  # nothing dropped silently: each mode of the full run ran or is listed
  assert {mode(r) for r in full.ran} <= {
      mode(r) for r in report.ran + report.skipped_for_time}, report


def test_the_budget_of_check_rules_options_and_its_progress_lines(
    monkeypatch, capsys):
  clocks = Clocks(monkeypatch)
  assert Budget.of("default", False, 0).seconds == 30.0  # per rule, one at least
  assert Budget.of("default", False, 1).seconds == 30.0
  assert Budget.of("default", False, 3).seconds == 90.0
  assert Budget.of(None, False, 3).seconds is None
  assert Budget.of(2, False, 1).progress is None
  # progress=None: to stderr, once the run has taken 10 s, then every 10 s
  quiet = Budget.of("default", None, 2)
  for step, what in ((0.0, "a"), (10.0, "b"), (0.5, "c"), (5.0, "d"),
                     (5.0, "e")):
    clocks.run(step)
    quiet.starting(what)
  assert capsys.readouterr().err.splitlines() == [
      "check_rules: 10.5 s of 60 s: c", "check_rules: 20.5 s of 60 s: e"]
  # progress=True: from the start, every check; a function: the same
  loud = Budget.of(2, True, 1)
  loud.starting("x")
  loud.starting("y")
  assert capsys.readouterr().err.splitlines() == [
      "check_rules: 0.0 s of 2 s: x", "check_rules: 0.0 s of 2 s: y"]
  lines = []
  Budget.of(None, lines.append, 1).starting("z")
  assert lines == ["check_rules: 0.0 s: z"]
  five = Budget(5.0)
  clocks.run(5.0)
  assert five.elapsed == 5.0 and not five.spent  # spent past it, not at it
  clocks.run(0.25)
  assert five.spent and not Budget(None).spent


def test_a_run_stopped_by_a_compile_that_does_not_fit_says_why(monkeypatch):
  """Where no program but the probe fits the budget, a check that needs one
  ends the run: the report says which compile was not started, and why."""
  clocks = Clocks(monkeypatch)
  _timed_compiles(monkeypatch, clocks)
  monkeypatch.setattr(Budget, "fits", lambda self, size: False)
  with pytest.warns(UserWarning, match="time budget"):
    report = check_rules(zoo.right_sin(), X, time_budget=100.0, accept_inconclusive=True)
  assert report.verdict == "inconclusive", report
  (line,) = [s for s in report.skipped_for_time if s.startswith("the run stopped")]
  assert line.startswith("the run stopped: compiling") and (
      "was not started" in line and "times the time budget" in line), line
