"""The batching checks (hijax/testing/_batching.py) on what their other tests
leave out: a time budget spent part way through them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.testing import check_rules

import zoo
from budget_clock import one_second_per_check
from compile_count import Lowered

X, Y = jnp.array([0.3, -1.2, 2.0]), jnp.array([1.5, 0.5, -2.0])


def _batch(lines):
  return [line for line in lines if line.startswith("batch")]


@pytest.mark.parametrize("seconds", [2.5, 4.5, 8.5])
def test_every_batching_check_runs_or_is_skipped_for_time(monkeypatch,
                                                          seconds):
  """On a fake clock on which each check takes one second, a budget spent
  part way through the batching checks (vmap for each in_axes, then vmap of
  jvp and vjp and jvp and vjp of vmap) lists each check it did not start:
  none is dropped silently."""
  clock = one_second_per_check(monkeypatch)
  full = check_rules(zoo.sin_times_y, X, Y, modes="batch", order=1,
                     time_budget=None, device=False)  # the host's checks
  assert len(_batch(full.ran)) == 10, full  # 6 in_axes, 4 derivatives
  clock[0] = 0.
  with pytest.warns(UserWarning, match="time budget"):
    report = check_rules(zoo.sin_times_y, X, Y, modes="batch", order=1,
                         time_budget=seconds, accept_inconclusive=True,
                         device=False)
  ran, skipped = _batch(report.ran), _batch(report.skipped_for_time)
  assert ran and skipped, report
  assert len(ran) + len(skipped) == 10, report


def _vmaps(report):
  return [r for r in report.ran if r.startswith("batch: vmap vs a loop")]


def test_up_to_four_arguments_every_subset_is_batched():
  """4 arguments: each of the 15 subsets batched, along the first axis and
  the last (30 vmaps)."""
  f = lambda a, b, c, d: zoo.sin_times_y(a, b) + zoo.sin_times_y(c, d)
  report = check_rules(f, X, Y, Y, X, modes="batch", order=1)
  assert len(_vmaps(report)) == 30, report.ran


def test_from_five_arguments_each_alone_and_all_are_batched():
  """5 arguments: each alone and all together, along the first axis and the
  last (12 vmaps, not 62)."""
  f = lambda a, b, c, d, e: (zoo.sin_times_y(a, b)
                             + zoo.sin_times_y(c, d) * e)
  report = check_rules(f, X, Y, Y, X, Y, modes="batch", order=1)
  vmaps = _vmaps(report)
  assert len(vmaps) == 12, report.ran
  assert any("in_axes=(0, 0, 0, 0, 0)" in r for r in vmaps), vmaps


def test_an_integer_output_has_no_batched_derivative_checks():
  """A function of a float with only an integer output (argmax) has its
  vmap checked, and nothing batched-and-differentiated: no derivative to
  compare."""
  with Lowered() as names:
    report = check_rules(lambda x: zoo.argmax_max(x)[0], X, modes="batch",
                         order=1, device=False)
  assert names == ["jit(program)"], names  # no derivative part in it
  assert report.passed, report
  batch = _batch(report.ran)
  assert batch and all(r.startswith("batch: vmap vs a loop") for r in batch), (
      report.ran)
  assert not report.skipped and not report.failures, report


def test_batch_in_axes_compile_only_the_vmaps_asked_for():
  """With batch_in_axes the batched derivatives are not checked, nor
  compiled: the one program holds the two vmaps (a derivative part, A
  batched, would make the rule refuse while the program is traced)."""
  fn = lambda A, x: zoo.MatVecXOnly(jax.typeof(A), jax.typeof(x))(A, x)
  A, x = zoo.BY_NAME["matvec"].args()
  with Lowered() as names:
    report = check_rules(fn, A, x, modes="batch", device=False,
                         batch_in_axes=[(None, 0), (None, 1)])
  assert report.passed, report
  assert names == ["jit(program)"], names


def _only_at_x(x):
  """x, through a host callback that raises anywhere but at X."""
  def host(v):
    if not np.array_equal(v, np.asarray(X)):
      raise ValueError("called away from X")
    return v
  return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                           vmap_method="sequential")


def test_a_loop_over_the_batch_that_raises_fails_each_in_axes():
  """The function raises away from X, so the loop over the batch raises
  for both in_axes (the first axis, the last): each is a failure."""
  report = check_rules(lambda x: zoo.log1pexp(_only_at_x(x)), X,
                       modes="batch", order=1, raise_on_failure=False)
  loops = [f for f in report.failures if f.check == "loop over the batch"]
  assert len(loops) == 2, report
  assert {f.rule for f in loops} == {"prim_fn"}
  assert loops[0].detail.startswith("raised "), loops[0]
