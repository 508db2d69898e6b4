"""tools/accelerator_facts.py's measurement of the checker, which a TPU
session runs to find where a check's time goes there: here with a CPU as
the device, which shows the device's half without an accelerator."""
import jax

from tools_loader import load_tool


def test_the_checker_measured_with_and_without_the_device_half():
  facts = load_tool("accelerator_facts").checker(
      cases=("fixed",), x64s=(False,), check_device=jax.devices("cpu")[0])
  assert sorted(facts) == ["fixed x64=False default", "fixed x64=False default again",
                           "fixed x64=False host only", "fixed x64=False host only again"]
  for key, run in facts.items():
    assert run["passed"], run
    assert run["compile_phases"]["backend_compile_duration"] > 0, run
    assert ("device check" in run["devices"]) == ("default" in key), run
  # the device's half compiles one program more, each time
  default, host = facts["fixed x64=False default again"], facts["fixed x64=False host only again"]
  assert default["backend_compiles"] == host["backend_compiles"] + 1, (default, host)


def test_a_callbacks_error_is_raised_once_on_a_cpu():
  """The measurement the accelerators page reads from a TPU, where the error
  is raised again at the next effects barrier: here it is raised once."""
  errors = load_tool("accelerator_facts").callback_errors()
  assert "raised in the callback" in errors["at_the_result"], errors
  if jax.default_backend() == "cpu":
    assert errors["at_the_next_barrier"] is None, errors
  assert errors["at_a_second_barrier"] is None, errors
