"""The compiled program of the checks (hijax/testing/_compiled.py): parts
compiled together as one, each call running its own part only, and each
part falling back to a program of its own where the whole cannot serve it,
so that the check that needs it reports why it fails."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compile_count import Lowered
from hijax.testing import check_rules
from hijax.testing._compiled import Budget, Bundle, Compiled


def _counting(name, counts):
  """x -> 2 x (or 3 x for "triple"), counting its runs in ``counts``."""
  def fn(x):
    jax.debug.callback(lambda: counts.__setitem__(name, counts[name] + 1))
    return x * (3.0 if name == "triple" else 2.0)
  return fn


def test_parts_compile_as_one_program_and_a_call_runs_only_its_part():
  counts = {"double": 0, "triple": 0}
  bundle = Bundle()
  x = np.arange(3.0, dtype=np.float32)
  for name in counts:
    bundle.add(name, _counting(name, counts), lambda: (x,))
  with Lowered() as names:
    for _ in range(3):
      np.testing.assert_array_equal(bundle.run("double", (x + 1,)),
                                    2 * (x + 1))
    np.testing.assert_array_equal(bundle.run("triple", (x,)), 3 * x)
  assert names == ["jit(program)"], names
  assert counts == {"double": 3, "triple": 1}


def test_a_part_that_cannot_be_traced_is_compiled_alone_and_raises():
  bundle = Bundle()
  x = np.ones(2, np.float32)

  def broken(v):
    raise ValueError("this rule is broken")
  bundle.add("good", lambda v: v + 1, lambda: (x,))
  bundle.add("other", lambda v: v * 2, lambda: (x,))
  bundle.add("broken", broken, lambda: (x,))
  with Lowered() as names:
    np.testing.assert_array_equal(bundle.run("good", (x,)), x + 1)
    with pytest.raises(ValueError, match="this rule is broken"):
      bundle.run("broken", (x,))
    np.testing.assert_array_equal(bundle.run("other", (x,)), 2 * x)
  assert names == ["jit(program)"], names  # the other two, together


def test_a_call_that_raises_at_run_time_leaves_each_part_alone():
  """A part whose run raises (a callback, a failed check at run time) makes
  the program unusable; from then on each part runs alone: the failing
  one raises again, the others give their values."""
  state = {"fail": False}

  def maybe_raise():
    if state["fail"]:
      raise RuntimeError("fails at run time")

  def host_check(v):
    maybe_raise()
    return v

  def flaky(v):
    # its result depends on the callback, so that its error reaches the
    # caller on an accelerator too (a debug.callback's error did not there)
    return jax.pure_callback(host_check, jax.typeof(v), v) - 1
  bundle = Bundle()
  x = np.ones(2, np.float32)
  bundle.add("flaky", flaky, lambda: (x,))
  bundle.add("good", lambda v: v + 1, lambda: (x,))
  np.testing.assert_array_equal(bundle.run("flaky", (x,)), x - 1)
  state["fail"] = True
  with pytest.raises(Exception, match="fails at run time"):
    bundle.run("flaky", (x,))
  with Lowered() as names:
    np.testing.assert_array_equal(bundle.run("good", (x,)), x + 1)
  assert names == ["jit(<lambda>)"], names  # alone now
  with pytest.raises(Exception, match="fails at run time"):
    bundle.run("flaky", (x,))


def _scalings(*factors):
  """A bundle of ``v -> k v`` for each factor ``k`` (keyed by ``k``), run
  once (so compiled), and the point it was traced at."""
  bundle = Bundle()
  x = np.ones(2, np.float32)
  for k in factors:
    bundle.add(k, lambda v, k=k: v * k, lambda: (x,))
  bundle.run(factors[0], (x,))
  return bundle, x


def test_other_types_than_the_parts_were_traced_with_compile_alone():
  bundle, _ = _scalings(2, 3)
  with Lowered() as names:
    out = bundle.run(2, (np.ones(5, np.float32),))
  assert out.shape == (5,) and names == ["jit(<lambda>)"], names


def test_parts_added_later_form_a_program_of_their_own():
  bundle, x = _scalings(2, 3)
  bundle.add(4, lambda v: v * 4, lambda: (x,))
  bundle.add(5, lambda v: v * 5, lambda: (x,))
  with Lowered() as names:
    np.testing.assert_array_equal(bundle.run(5, (x,)), 5 * x)
    np.testing.assert_array_equal(bundle.run(4, (x,)), 4 * x)
    np.testing.assert_array_equal(bundle.run(3, (x,)), 3 * x)
  assert names == ["jit(program)"], names


def test_points_evaluate_the_function_once_each():
  """The points part is a loop of as many iterations as points asked for
  (not the 64 it is compiled for)."""
  calls = []

  def fn(x, k):
    jax.debug.callback(lambda: calls.append(None))
    return jnp.sin(x) * k
  x, k = jnp.array([0.5, 1.5]), jnp.array(3)
  compiled = Compiled(fn, (x, k), jit=True)
  got = compiled.evaluate([[x, k], [x + 1, k], [x + 2, k]])
  assert len(calls) == 3
  for (y,), shift in zip(got, range(3)):
    np.testing.assert_allclose(y, 3 * np.sin(np.asarray(x) + shift),
                               rtol=1e-6)
  # another integer leaf than the point's: a jitted call of its own
  (y,), = compiled.evaluate([[x, jnp.array(2)]])
  np.testing.assert_allclose(y, 2 * np.sin(np.asarray(x)), rtol=1e-6)


def test_a_backward_rule_failing_at_run_time_fails_its_checks_only():
  """Through the one program, a failure is still reported against the rule
  and the checks that ran it: the checks of the function alone pass."""
  def broken(*_):
    raise RuntimeError("bwd broke at run time")

  @jax.custom_vjp
  def f(x):
    return jnp.sin(x)

  def bwd(c, g):
    jax.debug.callback(broken)
    return (g * c,)
  f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), bwd)
  report = check_rules(f, jnp.array([0.3, 1.2]), raise_on_failure=False,
                       order=1)
  assert sorted(f.check for f in report.failures) == [
      "vjp", "vjp of vmap vs a loop", "vmap of vjp vs a loop"], report
  assert all("CpuCallback error" in f.detail for f in report.failures)
  assert "expand: jitted call's output types vs its trace" in report.ran
  assert "batch: vmap vs a loop over the batch (in_axes=(0,))" in report.ran


def _parts(bundle, *factors):
  x = np.ones(2, np.float32)
  for k in factors:
    bundle.add(k, lambda v, k=k: v * k, lambda: (x,))
  return x


def test_the_first_and_last_two_calls_of_each_part_are_kept():
  """The device's half runs each part again at them (hijax.testing._device),
  and leaves the parts that raised here to the checks that ran them."""
  bundle = Bundle()
  _parts(bundle, 2)
  def broken(v):
    raise ValueError("a broken part")
  bundle.add("broken", broken, lambda: (np.ones(2, np.float32),))
  for k in range(5):
    bundle.run(2, (np.full(2, k, np.float32),))
  assert [int(args[0][0]) for args in bundle.seen[2]] == [0, 3, 4]
  with pytest.raises(ValueError, match="a broken part"):
    bundle.run("broken", (np.ones(2, np.float32),))
  assert bundle.raised == {"broken"}


def test_compile_ahead_compiles_in_a_thread_waited_for_at_the_first_call(
    monkeypatch):
  started = []
  begin = Budget.begin

  def spy(self, what, lowered, size=None):
    started.append(what)
    return begin(self, what, lowered, size)
  monkeypatch.setattr(Budget, "begin", spy)
  bundle = Bundle()
  x = _parts(bundle, 2, 3)
  bundle.compile_ahead()
  assert started == ["compiling the checks' program (2 parts)"]
  with Lowered() as names:
    np.testing.assert_array_equal(bundle.run(3, (x,)), 3 * x)
    np.testing.assert_array_equal(bundle.run(2, (x,)), 2 * x)
  assert names == [], names  # lowered ahead, not again
  bundle.budget.finish()


def test_a_program_too_long_for_the_budget_is_lowered_once(monkeypatch):
  """Its parts are then compiled alone (tests/test_testing_budget.py: where
  each fits)."""
  monkeypatch.setattr(Budget, "fits", lambda self, size: False)
  bundle = Bundle()
  x = _parts(bundle, 2, 3)
  with Lowered() as names:
    np.testing.assert_array_equal(bundle.run(3, (x,)), 3 * x)
  assert names == ["jit(program)", "jit(<lambda>)"], names


def test_without_jit_every_evaluation_runs_eagerly():
  """(an expand that branches in Python on values)"""
  def fn(x):
    return x * 2 if float(x[0]) > 0 else x * 3
  bundle = Bundle(jit=False)
  bundle.add("fn", fn, lambda: (np.ones(2, np.float32),))
  np.testing.assert_array_equal(bundle.run("fn", (-np.ones(2),)), -3 * np.ones(2))
  compiled = Compiled(fn, (jnp.ones(2),), jit=False)
  assert not compiled.has("points")
  (y,), (z,) = compiled.evaluate([[jnp.ones(2)], [-jnp.ones(2)]])
  np.testing.assert_array_equal(z, -3 * np.ones(2))
  np.testing.assert_array_equal(y, 2 * np.ones(2))


def test_a_part_alone_is_compiled_as_itself():
  """(no branch of a program around it: a plain jit of the part)"""
  bundle = Bundle()
  x = _parts(bundle, 2)
  with Lowered() as names:
    np.testing.assert_array_equal(bundle.run(2, (x,)), 2 * x)
  assert names == ["jit(<lambda>)"], names


def test_each_part_is_traced_once_and_one_left_beside_a_broken_one_alone():
  traces = []
  bundle = Bundle()
  x = np.ones(2, np.float32)
  for k in (2, 3):
    def part(v, k=k):
      traces.append(k)
      return v * k
    bundle.add(k, part, lambda: (x,))
  bundle.run(2, (x,))
  bundle.run(3, (x,))
  assert sorted(traces) == [2, 3]

  def broken(v):
    raise ValueError("a broken part")
  lone = Bundle()
  _parts(lone, 4)
  lone.add("broken", broken, lambda: (x,))
  with Lowered() as names:
    np.testing.assert_array_equal(lone.run(4, (x,)), 4 * x)
  assert names[-1:] == ["jit(<lambda>)"] and "jit(program)" not in names[1:], (
      names)


def test_points_in_some_leaves_are_evaluated_by_the_points_part():
  """Once that fails (a function that cannot run in a loop's body), every
  later point is evaluated one by one, without trying again."""
  fn = lambda x, y: jnp.sin(x) * y
  x, y = jnp.array([0.5, 1.5]), jnp.array([2.0])
  compiled = Compiled(fn, (x, y), jit=True)
  with Lowered() as names:
    got = compiled.at_points([0], [[x + k] for k in range(3)])
  assert len(names) == 1 and "program" not in names[0], names
  for (out,), k in zip(got, range(3)):
    np.testing.assert_allclose(out, 2 * np.sin(np.asarray(x) + k), rtol=1e-6)
  tries = []

  def failing(idx, points):
    tries.append(len(points))
    raise TypeError("cannot run in a loop's body")
  compiled._mapped = failing
  for _ in range(2):
    (out,), = compiled.at_points([0], [[x + 1]])
    np.testing.assert_allclose(out, 2 * np.sin(np.asarray(x) + 1), rtol=1e-6)
  assert tries == [1]


def test_nested_functions_put_their_parts_in_one_program_under_their_names():
  x = jnp.array([0.5, 1.5])
  outer = Compiled(jnp.sin, (x,), jit=True)
  inner = {name: Compiled(fn, (x,), jit=True, shared=outer.nested(name))
           for name, fn in (("cos", jnp.cos), ("exp", jnp.exp))}
  x1 = np.asarray(x) + 1
  with Lowered() as names:
    for name, c in [("sin", outer), *inner.items()]:
      (y,), = c.evaluate([[x1]])
      # float32 on the default device (a TPU's exp: 1.06e-6 off at 1.5)
      np.testing.assert_allclose(y, getattr(np, name)(x1), rtol=2e-5)
  assert names == ["jit(program)"], names
  assert len(outer.bundle.parts) == 3 and inner["exp"].has("points")
  # a part bound to another Compiled's, with more arguments
  bound = Compiled(jnp.sin, (x,), jit=True,
                   bound={"cos": (inner["cos"], "points", ())})
  assert bound.has("cos") and not bound.has("exp")


def test_points_whose_other_leaves_equal_the_points_are_evaluated_together():
  fn = lambda x, k: jnp.sin(x) * k
  x, k, x1, k_equal = (jnp.array([0.5, 1.5]), jnp.array(3), jnp.array([1.5, 2.5]),
                       jnp.array(3))
  compiled = Compiled(fn, (x, k), jit=True)
  with Lowered() as names:
    got = compiled.evaluate([[x, k], [x1, k_equal]])  # equal, not the same
  assert len(names) == 1 and "points" in names[0], names  # no call of its own
  np.testing.assert_allclose(got[1][0], 3 * np.sin(np.asarray(x1)), rtol=1e-6)


def test_evaluate_one_serves_points_of_the_leaves_types_only():
  seen = []

  def one(floats):
    seen.append((floats[0].shape, floats[0].dtype))
    return [jnp.sin(floats[0])]
  x = jnp.array([0.5, 1.5], jnp.float32)
  compiled = Compiled(jnp.sin, (x,), jit=True, evaluate_one=one)
  for point in (np.asarray(x), np.asarray(x, np.float16), np.ones(3, np.float32)):
    (y,), = compiled.at_points([0], [[point]])
    np.testing.assert_allclose(y, np.sin(point), rtol=1e-3)
  assert seen == [((2,), np.float32)]
