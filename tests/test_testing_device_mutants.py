"""What the device's half of check_rules (hijax.testing._device) promises
beyond tests/test_testing_device.py, each behaviour a mutant of the module
changed without a test failing (issue 61). Shown on the CPU, as the device
beside a float64 host."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_testing_device as device_tests
import zoo
from budget_clock import one_second_per_check
from hijax.testing import RuleCheckError, _device, check_rules

CPU = jax.devices("cpu")[0]
X = jnp.array([-1.5, 0.3, 2.0])
ON_CPU = jax.devices()[0].platform == "cpu"


def _in_float32(v, off):
  return v * (1 + off) if v.dtype == jnp.float32 else v


class LogCosh(device_tests.LogCosh):
  """log cosh x (test_testing_device's), its jvp rule ``JVP[name]`` and a
  right backward rule."""

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), JVP[self.name](jnp.tanh(x)) * t

  def vjp_bwd_retval(self, tanh_x, g):
    return (tanh_x * g,)


def _refuses_float32(t):
  if t.dtype == jnp.float32:
    raise ValueError("this jvp rule refuses float32")
  return t


JVP = {"right": lambda t: t, "refuses_float32": _refuses_float32}


def log_cosh(x, name="right"):
  return LogCosh(jax.typeof(x), name)(x)


# Where each function's calibration samples lie strictly inside its range
# (not at its ends), and where an error there shows against the largest
# value the function takes on its range.
INSIDE = {"exp": (1., 19.), "log1p": (-0.8, -0.1), "expm1": (1., 4.),
          "tanh": (-4., -1.), "sin": (-19., -1.), "logistic": (-19., -1.)}


@pytest.fixture
def fresh_calibration():
  """The calibration measured anew: neither its own cache nor JAX's trace
  of its program (which holds the functions patched) kept."""
  _device._calibration.cache_clear()
  jax.clear_caches()
  yield
  _device._calibration.cache_clear()
  jax.clear_caches()


@pytest.mark.parametrize("name", list(INSIDE))
def test_the_calibration_samples_each_function_across_its_range(
    name, monkeypatch, fresh_calibration):
  """A device whose ``name`` is 0.1% off inside the function's range (not
  at its ends) is measured as that coarse: the calibration samples the
  whole range."""
  jf, nf, (lo, hi) = _device._FUNCTIONS[name]
  a, b = INSIDE[name]
  off = lambda x: jnp.where((a < x) & (x < b), jf(x) * 1.001, jf(x))
  monkeypatch.setitem(_device._FUNCTIONS, name, (off, nf, (lo, hi)))
  measured = _device.calibrate(CPU, np.float32)
  assert measured["transcendental"] > 100, measured
  assert measured["matmul"] < 16, measured


def test_on_accelerator_is_whether_the_default_device_is_not_a_cpu(
    monkeypatch):
  class FakeTPU:
    platform, device_kind = "tpu", "TPU v5 lite"
  assert _device.on_accelerator() is (not ON_CPU)
  monkeypatch.setattr(jax, "devices", lambda *a: [FakeTPU()] if not a
                      else [CPU])
  assert _device.on_accelerator() is True


def _part(fn):
  return types.SimpleNamespace(
      fn=fn, template=lambda: (np.ones((2, 2), np.float32),))


def test_a_part_is_judged_at_the_products_tolerance_where_it_cannot_be_lowered():
  """Whether a part multiplies matrices is read from its lowered program;
  a part that cannot be lowered gets the wider tolerance."""
  assert _device.multiplies_matrices(_part(lambda a: a @ a)) is True
  assert _device.multiplies_matrices(_part(jnp.sin)) is False
  assert _device.multiplies_matrices(_part(lambda a: float(a[0, 0]))) is True


def test_an_output_integer_on_the_device_and_float_on_the_host_fails():
  """An output whose kind depends on the dtype (an int32 on the device, a
  float64 on the host) is not cast to the device's kind and passed."""
  def f(x):
    y = jnp.round(x * 10)
    return log_cosh(x), (y.astype(jnp.int32) if x.dtype == jnp.float32
                         else y)
  with pytest.raises(RuleCheckError) as raised:
    check_rules(f, X, device=CPU)
  assert raised.value.check.startswith("on cpu: the function in float32")


def test_a_rule_raising_on_the_device_leaves_the_other_parts_checked():
  """A jvp rule that raises in float32 only: a failure on the device
  naming it, and every other part still compared there."""
  report = check_rules(lambda x: log_cosh(x, "refuses_float32"), X,
                       device=CPU, raise_on_failure=False)
  (failure,) = [f for f in report.failures
                if f.check.startswith("on cpu: jax.jvp in (0,) in float32")]
  assert failure.rule == "LogCosh.jvp"
  assert "refuses float32" in str(failure)
  assert any(r.startswith("vjp: on cpu: jax.vjp") for r in report.ran)
  assert any(r.startswith("batch: on cpu: jax.vmap") for r in report.ran)


def test_the_functions_own_error_on_the_device_widens_its_tolerance():
  """A function 1e-4 off in float32 (800 ulps) is measured so on the
  device, and its rules are judged within that: it passes there."""
  f = lambda x: _in_float32(log_cosh(x), 1e-4)
  report = check_rules(f, X, device=CPU)
  assert report.passed, report
  measured = report.devices["device check"]
  function = int(measured.split("the function ")[1].rstrip(")"))
  assert 100 < function < 1000, measured
  # measured first, before the parts that build on it (the jvp's primal
  # output is the function's), also where the function is not compared
  assert check_rules(f, X, device=CPU, modes=("jvp",)).passed


def test_a_failure_on_the_device_names_the_device_and_the_host():
  with pytest.raises(RuleCheckError) as raised:
    check_rules(device_tests.f_of("off_in_float32"), X, device=CPU)
  assert "(cpu gives " in str(raised.value)
  assert ", the host gives " in str(raised.value)


def test_float64_inputs_are_checked_in_float64_on_the_device():
  """The device's half runs in the inputs' dtype: float64 there where the
  inputs are float64 (a rule 1% off in float32 only passes)."""
  with jax.enable_x64(True):
    report = check_rules(device_tests.f_of("off_in_float32"),
                         jnp.array([-1.5, 0.3, 2.0], jnp.float64), device=CPU)
  assert report.passed, report
  assert report.devices["device check"].startswith("cpu (cpu), float64: ")


class _Sech2Off(zoo.Sech2):
  """Sech2 whose jvp rule is 1% off in float32 only."""

  def jvp(self, primals, tangents):
    s, t = super().jvp(primals, tangents)
    return s, _in_float32(t, 1e-2)


class _TanhOverSech2Off(zoo.Tanh):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), _Sech2Off(jax.typeof(x))(x) * t


def test_a_derived_functions_failure_on_the_device_names_its_kinds_rule():
  """Tanh's tangent map binds Sech2, wrong in float32: the device's half
  fails that derived function's parts, each naming the rule that made it
  (Tanh's jvp, or the rules derived from it), not the primitive."""
  report = check_rules(lambda x: _TanhOverSech2Off(jax.typeof(x))(x), X,
                       device=CPU, raise_on_failure=False)
  derived = [f for f in report.failures
             if f.check.startswith("on cpu: the second-order part")]
  assert derived, [f.check for f in report.failures]
  rules = {f.rule for f in derived}
  assert "_TanhOverSech2Off.jvp" in rules, rules
  assert all(r.startswith("_TanhOverSech2Off.") for r in rules), rules


def test_a_budget_spent_in_the_devices_half_lists_each_check_it_did_not_start(
    monkeypatch):
  """On a fake clock on which each check takes a second, a budget spent two
  checks into the device's half: those two ran there, every other device
  check is listed as skipped for time."""
  clock = one_second_per_check(monkeypatch)
  full = check_rules(log_cosh, X, device=CPU, order=1, time_budget=None)
  on_device = lambda lines: [r for r in lines if ": on cpu: " in r]
  n = len(on_device(full.ran))
  assert n > 3, full.ran
  host_seconds = clock[0] - n
  clock[0] = 0.
  with pytest.warns(UserWarning, match="time budget"):
    report = check_rules(log_cosh, X, device=CPU, order=1,
                         time_budget=host_seconds + 2.5,
                         accept_inconclusive=True)
  ran, skipped = on_device(report.ran), on_device(report.skipped_for_time)
  assert ran and len(ran) + len(skipped) == n, (ran, skipped)


def test_device_true_is_the_default_device_where_it_is_not_a_cpu(monkeypatch):
  """``device=True`` asks for JAX's default device where it is an
  accelerator: on a CPU default there is none (the host checks alone)."""
  class FakeTPU:
    platform, device_kind = "tpu", "TPU v5 lite"
  if ON_CPU:
    assert _device.accelerator(True) is None
    report = check_rules(log_cosh, X, device=True)
    assert report.passed and list(report.devices) == ["checks"], report.devices
  monkeypatch.setattr(jax, "devices", lambda *a: [FakeTPU()] if not a
                      else [CPU])
  assert isinstance(_device.accelerator(True), FakeTPU)


def test_the_measured_error_of_small_values_and_of_zeros():
  """The function's measured error on the device (in ulps of the dtype,
  relative to the output's size) counts outputs far below 1, and is 0, not
  NaN, for an output that is zero on both sides."""
  want = np.array([0.1, 0.2, 0.0])
  got = (want * (1 + 1e-5)).astype(np.float32)
  assert 10 < _device._ulps(got, want, np.float32) < 1000
  with np.errstate(all="raise"):
    assert _device._ulps(np.zeros(3, np.float32), np.zeros(3), np.float32) == 0


SINGULAR = jnp.arange(1., 10.).reshape(3, 3)


def test_outputs_zero_to_rounding_beside_an_integer_output_keep_their_floors():
  """det of a singular matrix (zero to rounding: judged on the host's floor,
  scaled) twice, an integer output between them: each det keeps its own
  floor on the device."""
  f = lambda a: (jnp.linalg.det(a), jnp.argmax(a), 2 * jnp.linalg.det(a))
  report = check_rules(f, SINGULAR, order=1, device=CPU)
  assert report.passed, report


@pytest.mark.parametrize("name", list(_device._DERIVATIVES))
def test_the_calibrations_exact_derivatives_are_the_functions(name):
  """The closed forms the calibration measures a device's derivatives
  against are each function's first and second derivatives (JAX's, in
  float64, across the function's range): a wrong one, even one that is zero,
  would hide the device's error (an error against zero counts as none)."""
  jf, _, (lo, hi) = _device._FUNCTIONS[name]
  x = np.linspace(lo, hi, 33)
  with jax.enable_x64(True):
    d1 = jax.grad(jf)
    want = [jax.vmap(d1)(x), jax.vmap(jax.grad(d1))(x)]
  for exact, w in zip(_device._DERIVATIVES[name], want):
    np.testing.assert_allclose(exact(x), w, rtol=1e-9, err_msg=name)


def test_only_a_second_order_part_is_allowed_the_derivatives_error(monkeypatch):
  """With a device whose derivatives are measured far worse than its
  functions, the device check's line gives the functions' tolerance, and the
  derivatives' only where a second-order part was checked."""
  monkeypatch.setattr(_device, "calibrate", lambda device, dtype: {
      "matmul": 0.0, "transcendental": 216.0, "differentiated": 5000.0})
  first = check_rules(zoo.tanh, X, order=1, device=CPU, raise_on_failure=False)
  line = first.devices["device check"]
  assert "tolerance 864 ulps" in line and "second-order" not in line, line
  both = check_rules(zoo.tanh, X, device=CPU, raise_on_failure=False)
  line = both.devices["device check"]
  assert "tolerance 864 ulps" in line and "20000 for a second-order part" in line, line
