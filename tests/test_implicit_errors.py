"""Errors of hijax.implicit that name the user's mistake: a solver of one's
own returning the wrong thing is named with what it returned and what was
expected (not blamed on FixedPoint.expand); a failed solve under jit puts its
reason first; jax.export of a solve with throw=True says to pass
throw=False."""
import logging
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.implicit import (Dense, Newton, SolveError, Status, fixed_point,
                            linear_solve, root)


def halve(x, a):
  return 0.5 * (x + a / x)


def wrong_shape(f, x0, p):
  return jnp.ones(3)


def status_as_tuple(f, x0, p):
  return x0, (True, 3)


def wrong_dtype(f, x0, p):
  return x0.astype(jnp.int32)


CASES = {
    "wrong_shape": (wrong_shape, "returned float32[3], but the unknown is "
                    "float32[]: return the solution x"),
    "status_as_tuple": (status_as_tuple, "returned (float32[], (True, 3)), "
                        "whose second element is not a hijax.implicit.Status: "
                        "return (x, Status(converged, steps, error, reason)), "
                        "or x alone"),
    "wrong_dtype": (wrong_dtype, "returned int32[], but the unknown is "
                    "float32[]"),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("jit", [False, True])
def test_a_users_solver_returning_the_wrong_thing_is_named(name, jit):
  solver, message = CASES[name]
  call = lambda a: fixed_point(halve, a, a, solver=solver)
  with pytest.raises(TypeError) as e:
    (jax.jit(call) if jit else call)(jnp.float32(2.))
  text = str(e.value)
  assert f"your solver {name} returned" in text, text
  assert message in text, text
  assert "expand" not in text, text


def test_a_users_linear_solver_is_named_too():
  def lstsq_solver(matvec, b):
    return b[:1]  # wrong shape
  with pytest.raises(TypeError, match=re.escape(
      "your solver test_a_users_linear_solver_is_named_too.<locals>."
      "lstsq_solver returned float32[1], but the unknown is float32[3]")):
    linear_solve(lambda x, A: A @ x, jnp.ones(3), jnp.eye(3),
                 solver=lstsq_solver)
  with pytest.raises(TypeError, match=r"^Newton: your solver .*lstsq_solver "
                     r"returned float32\[1\]"):
    root(lambda x, c: x * x - c, jnp.ones(3), jnp.full(3, 4.),
         solver=Newton(linear_solver=lstsq_solver))


def test_a_status_with_arrays_per_field_is_refused():
  def batched_status(f, x0, p):
    return x0, Status(jnp.ones(2, bool), jnp.ones(2, jnp.int32),
                      jnp.zeros(2), jnp.zeros(2, jnp.int32))
  with pytest.raises(TypeError, match="Status whose `converged` is bool\\[2\\]"
                     ": each field is one scalar per solve"):
    fixed_point(halve, 2., 2., solver=batched_status)


def test_a_users_status_saying_not_converged_is_a_failure():
  """converged=False with reason 0 is read as a failure (not a silent pass),
  and the Status returned has the declared dtypes."""
  def gave_up(f, x0, p):
    return x0, Status(False, 7, 0.5, 0)
  x, st = fixed_point(halve, 2., 2., solver=gave_up, throw=False)
  assert not bool(st.converged) and int(st.reason) != 0
  assert (int(st.steps), float(st.error)) == (7, 0.5)
  assert [a.dtype for a in st] == [jnp.bool_, jnp.int32, jnp.float32,
                                   jnp.int32]
  with pytest.raises(SolveError, match="after 7 step"):
    fixed_point(halve, 2., 2., solver=gave_up)


# --- a failed solve under jit: the reason first ------------------------------

def no_root(x, p):
  return x * x + p


def test_under_jit_the_reason_is_logged_before_jaxs_error(caplog):
  solve = jax.jit(lambda p: root(no_root, 1., p, solver=Newton(max_iter=5)))
  with caplog.at_level(logging.ERROR, logger="hijax.implicit"):
    with pytest.raises(Exception, match="SolveError") as e:
      jax.block_until_ready(solve(1.))
  assert not isinstance(e.value, SolveError)  # JAX's runtime error
  mine = [r for r in caplog.records if r.name == "hijax.implicit"]
  assert len(mine) == 1
  assert mine[0].getMessage().startswith(
      "SolveError: hijax.implicit Root (solver=Newton(")
  assert "failed: non-finite iterate" in mine[0].getMessage()


def test_an_eager_failure_raises_our_error_and_logs_nothing(caplog):
  with caplog.at_level(logging.ERROR, logger="hijax.implicit"):
    with pytest.raises(SolveError, match="^hijax.implicit Root"):
      root(no_root, 1., 1., solver=Newton(max_iter=5))
  assert not [r for r in caplog.records if r.name == "hijax.implicit"]


def test_the_first_line_printed_by_a_failed_jitted_script_is_the_reason():
  script = textwrap.dedent("""
      import jax
      from hijax.implicit import Newton, root
      jax.jit(lambda p: root(lambda x, p: x * x + p, 1., p,
                             solver=Newton(max_iter=5)))(1.).block_until_ready()
      """)
  # on a CPU: an accelerator is held by this process. On a TPU machine JAX
  # warns at import, whatever the platform, that the machine's transparent
  # hugepages are off: that line of JAX's about the machine is left out
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu",
                                 PYTHONWARNINGS="ignore:Transparent hugepages"))
  assert done.returncode != 0
  first = done.stderr.lstrip().splitlines()[0]
  assert first.startswith("SolveError: hijax.implicit Root"), done.stderr
  assert "non-finite iterate" in first


def test_an_eager_failure_reported_from_the_runtimes_thread_is_not_logged(
    caplog):
  """An accelerator's runtime calls the host from a thread of its own: the
  eager call's silence holds there too (on a TPU an eager failure was
  logged as well as raised)."""
  import threading
  from hijax.implicit import _status
  raised = []

  def host_call():
    try:
      _status._raise_solve_error("hijax.implicit Root", 1, 0)
    except SolveError as e:
      raised.append(e)
  with caplog.at_level(logging.ERROR, logger="hijax.implicit"):
    with _status.quiet_solve_errors():
      thread = threading.Thread(target=host_call)
      thread.start()
      thread.join()
    assert len(raised) == 1
    assert not [r for r in caplog.records if r.name == "hijax.implicit"]
    host_call()  # no eager call now: logged
  assert len([r for r in caplog.records if r.name == "hijax.implicit"]) == 1


# --- jax.export --------------------------------------------------------------

def test_export_with_throw_true_names_throw_false():
  f = jax.jit(lambda p: root(lambda x, p: x * x - p, 1., p))
  with pytest.raises(ValueError, match="jax.export cannot serialize.*"
                     "Pass throw=False"):
    jax.export.export(f)(jnp.float32(4.))


def test_export_with_throw_false_runs_and_returns_the_status():
  f = jax.jit(lambda p: root(lambda x, p: x * x - p, 1., p, throw=False))
  x, st = jax.export.export(f)(jnp.float32(4.)).call(jnp.float32(9.))
  np.testing.assert_allclose(x, 3., rtol=1e-6)
  assert bool(st.converged)
  g = jax.jit(lambda A, b: linear_solve(lambda x, A: A @ x, b, A,
                                        solver=Dense(), throw=False)[0])
  A, b = jnp.array([[2., 1.], [0., 3.]]), jnp.array([1., 2.])
  np.testing.assert_allclose(jax.export.export(g)(A, b).call(A, b),
                             jnp.linalg.solve(A, b), rtol=1e-6)


def test_the_failure_primitive_reduces_a_batch_to_its_worst_instance():
  """Its batching rule (the reasons and step counts arriving batched, or the
  step count unbatched) raises for the worst instance: reason 2 after 5
  steps, beside reason 1 after 9; under two vmaps, reason 2 after 4 steps
  beside reason 1 after 7."""
  from hijax.implicit._status import _failed_p
  fail = lambda r, s: _failed_p.bind(r, s, where="here")
  reasons = jnp.array([1, 2], jnp.int32)
  with pytest.raises(SolveError, match=r"non-finite iterate .*after 5 step"):
    jax.vmap(fail)(reasons, jnp.array([9, 5], jnp.int32))
  with pytest.raises(SolveError, match=r"non-finite iterate .*after 3 step"):
    jax.vmap(fail, (0, None))(reasons, jnp.int32(3))
  with pytest.raises(SolveError, match=r"non-finite iterate .*after 4 step"):
    jax.vmap(jax.vmap(fail), (1, 1))(jnp.array([[1], [2]], jnp.int32),
                                     jnp.array([[7], [4]], jnp.int32))
