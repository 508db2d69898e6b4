"""A fake clock for check_rules' time budget on which each check started
takes one second and nothing else takes time (compiles included; the CPU
keeps pace with it), so a budget is spent at a known check on any machine."""
from hijax.testing import _compiled


def one_second_per_check(monkeypatch):
  """Installs the clock; returns it (``clock[0]``, settable)."""
  starting = _compiled.Budget.starting
  clock = [0.]

  def one_second_each(budget, what):
    starting(budget, what)
    clock[0] += 1.
  monkeypatch.setattr(_compiled.Budget, "starting", one_second_each)
  monkeypatch.setattr(_compiled, "_clock", lambda: clock[0])
  monkeypatch.setattr(_compiled, "_cpu_clock", lambda: clock[0])
  return clock
