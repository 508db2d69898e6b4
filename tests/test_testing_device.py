"""check_rules on an accelerator (issue 45), shown on the CPU: the checks on
the host in float64, then the checks' program again on a device in the
inputs' dtype, against the host's float64, with a tolerance measured on the
device. (tools/accelerator_run.py runs the same on a TPU.)"""
import re
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from compile_count import Lowered
from hijax import HiPrim
from hijax.testing import RuleCheckError, _device, check_rules

CPU = jax.devices("cpu")[0]
X = jnp.array([-1.5, 0.3, 2.0])


class LogCosh(HiPrim):
  """log cosh x; ``scale(g)`` is what the backward rule multiplies g by."""

  def __init__(self, x_aval, name):
    self.in_avals, self.out_aval = (x_aval,), x_aval
    self.params = dict(name=name)
    super().__init__()

  def expand(self, x):
    return jnp.logaddexp(x, -x) - jnp.log(2.)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.tanh(x) * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), jnp.tanh(x)

  def vjp_bwd_retval(self, tanh_x, g):
    return (BACKWARD[self.name](tanh_x) * g,)

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]


def _through_bfloat16(v):
  return v.astype(jnp.bfloat16).astype(v.dtype)


BACKWARD = {
    "right": lambda t: t,
    # right in float64, 1% off in float32: a rule wrong where it runs
    "off_in_float32": lambda t: t * (1.01 if t.dtype == jnp.float32 else 1.),
    "tenth_off_in_float32": lambda t: t * (1.1 if t.dtype == jnp.float32
                                           else 1.),
    # bfloat16's precision in float32, as a TPU's default matmul has it:
    # from a matrix product (the identity's), and without one
    "bfloat16_product": lambda t: (
        _through_bfloat16(jnp.eye(t.shape[-1], dtype=t.dtype) @ t)
        if t.dtype == jnp.float32 else t),
    "bfloat16_passes": lambda t: (_through_bfloat16(t) if t.dtype ==
                                  jnp.float32 else t),
}


def f_of(name):
  return lambda x: LogCosh(jax.typeof(x), name)(x)


ON_CPU = jax.devices()[0].platform == "cpu"


@pytest.mark.skipif(not ON_CPU, reason="on an accelerator the device's half "
                    "runs by default")
def test_on_a_cpu_default_only_the_host_checks():
  report = check_rules(f_of("off_in_float32"), X)
  assert report.passed  # in float64 the rule is right
  assert list(report.devices) == ["checks"]
  assert report.devices["checks"].endswith("float64")


def test_a_rule_wrong_in_the_inputs_dtype_fails_on_the_device():
  """The host's float64 verdict passes it; the device half names the
  backward rule first."""
  with pytest.raises(RuleCheckError) as raised:
    check_rules(f_of("off_in_float32"), X, device=CPU)
  report = raised.value.report
  assert raised.value.rule == "LogCosh.vjp_fwd/vjp_bwd_retval"
  assert raised.value.check.startswith("on cpu: jax.vjp")
  assert "in float32 vs the host's float64" in raised.value.check
  assert report.devices["checks"] == "cpu (cpu), float64"
  assert report.devices["device check"].startswith("cpu (cpu), float32: ")
  assert "tolerance 256 ulps" in report.devices["device check"]


def test_a_right_rule_passes_on_the_device():
  report = check_rules(f_of("right"), X, device=CPU)
  assert report.passed
  device_runs = [r for r in report.ran if ": on cpu: " in r]
  assert any(r.startswith("expand: on cpu: the function") for r in device_runs)
  assert any(r.startswith("vjp: on cpu: jax.vjp") for r in device_runs)
  assert any(r.startswith("batch: on cpu: jax.vmap") for r in device_runs)


def test_the_tolerance_is_the_devices_measured_accuracy(monkeypatch):
  """A rule whose matrix product has bfloat16's precision passes, as a TPU's
  default-precision products have: refused where the device is measured
  exact to float32, accepted where its products are measured as coarse as
  that. The products' error counts only for a part that has one: the same
  rounding without a product fails (found on a TPU: a float32 rule 1% off
  passed at the products' tolerance)."""
  with pytest.raises(RuleCheckError):
    check_rules(f_of("bfloat16_product"), X, device=CPU)
  coarse = {"matmul": 2.0 ** -8 / float(jnp.finfo(jnp.float32).eps),
            "transcendental": 4.}
  monkeypatch.setattr(_device, "calibrate", lambda device, dtype: coarse)
  report = check_rules(f_of("bfloat16_product"), X, device=CPU)
  assert report.passed
  assert re.search(r"tolerance 256 ulps, 131072 for the [1-9]\d* with a "
                   "matrix product", report.devices["device check"]), report.devices
  with pytest.raises(RuleCheckError, match="on cpu: jax.vjp"):
    check_rules(f_of("bfloat16_passes"), X, device=CPU)
  # a rule off by more than the measured accuracy allows still fails
  with pytest.raises(RuleCheckError, match="on cpu: jax.vjp"):
    check_rules(f_of("tenth_off_in_float32"), X, device=CPU)


def test_calibration_measures_a_cpu_as_exact_to_a_few_ulps():
  measured = _device.calibrate(CPU, np.float32)
  assert set(measured) == {"matmul", "transcendental", "differentiated"}
  assert measured["transcendental"] <= measured["differentiated"] < 64
  assert 0 <= measured["matmul"] < 16 and 0 <= measured["transcendental"] < 16
  assert _device.tolerance(measured).ulps == 256


def test_an_accelerator_is_found_where_the_default_is_not_a_cpu(monkeypatch):
  class FakeTPU:
    platform, device_kind = "tpu", "TPU v5 lite"
  default = jax.devices()[0]
  assert _device.accelerator() is (None if ON_CPU else default)
  assert _device.accelerator(False) is None
  assert _device.accelerator(CPU) is CPU
  monkeypatch.setattr(jax, "devices", lambda *a: [FakeTPU()] if not a
                      else [CPU])
  assert isinstance(_device.accelerator(), FakeTPU)
  assert _device.describe(FakeTPU(), "float32") == "TPU v5 lite (tpu), float32"
  assert _device.host() is CPU


def test_the_host_only_still_checks_on_the_host(monkeypatch):
  """device=False leaves out the device's half; on an accelerator the
  checks still run on the host CPU (not in float64 on the device)."""
  monkeypatch.setattr(_device, "on_accelerator", lambda: True)
  from hijax.testing import _api
  monkeypatch.setattr(_api, "on_accelerator", lambda: True)
  report = check_rules(f_of("right"), X, device=False)
  assert report.passed and list(report.devices) == ["checks"]
  assert report.devices["checks"] == "cpu (cpu), float64"


def test_a_function_the_device_cannot_run_is_not_a_rule_failure(monkeypatch):
  """A dtype the device does not support (float16 on some TPUs): the
  device's half is skipped, saying why."""
  from hijax.testing import _compiled
  run, half = _compiled.Bundle.run, _device.check_on_device

  def marked(p, w, device, bundle, *args, **kwargs):
    bundle.on_the_device = True
    return half(p, w, device, bundle, *args, **kwargs)

  def refuse_on_the_device(bundle, key, args):
    if key == "points" and getattr(bundle, "on_the_device", False):
      raise RuntimeError("UNIMPLEMENTED: this dtype on this device")
    return run(bundle, key, args)
  monkeypatch.setattr(_device, "check_on_device", marked)
  monkeypatch.setattr(_compiled.Bundle, "run", refuse_on_the_device)
  report = check_rules(f_of("right"), X, device=CPU)
  assert report.passed and not report.failures
  assert "not checked, the function does not run there" in (
      report.devices["device check"])
  assert any("does not run on cpu" in why for _, why in report.skipped)


def test_a_constant_the_function_makes_has_the_devices_dtype():
  """``jnp.ones(())`` in the function is float32 on the device as in the
  user's own float32 run: the device's program is traced without float64
  (found on a TPU: its vjp was fed a float32 cotangent for a float64 output,
  and a right rule failed)."""
  report = check_rules(lambda x: f_of("right")(x)[..., 0] + jnp.ones(()), X,
                       device=CPU)
  assert report.passed, report
  # the function's own error there is a few ulps of float32 (it was 1.9e7
  # when its output came out in float64)
  assert re.search(r"the function \d\)", report.devices["device check"])


def test_an_integer_output_is_compared_by_value():
  """``argmax`` is int32 on the device in float32 and int64 on the host in
  float64: the same values, not a rule's error."""
  report = check_rules(lambda x: (f_of("right")(x), jnp.argmax(x)), X,
                       device=CPU)
  assert report.passed, report


def test_a_wrong_integer_output_on_the_device_still_fails():
  def f(x):
    index = jnp.argmax(x)
    return f_of("right")(x), index + (x.dtype == jnp.float32)
  with pytest.raises(RuleCheckError) as raised:
    check_rules(f, X, device=CPU)
  assert raised.value.check.startswith("on cpu: the function in float32")


def test_a_complex_outputs_error_counts_its_imaginary_part():
  """The function's own error on the device (which sets the tolerance) of
  a complex output: both parts (its imaginary part was cast away)."""
  got = np.array([1 + 1j, 2 - 1j], np.complex64)
  want = np.array([1 + 1.001j, 2 - 1j], np.complex128)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no ComplexWarning
    measured = _device._ulps(got, want, np.complex64)
  assert 1e3 < measured < 1e5, measured


@jax.custom_jvp
def _csin(z):
  return jnp.sin(z)


_csin.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


@pytest.mark.parametrize("z", [0.1 + 0.2j, np.array([0.3 - 0.7j, 1.1 + 0.1j])],
                         ids=["python-complex", "complex128"])
def test_complex_inputs_rounded_for_the_device_keep_their_imaginary_part(z):
  """A complex input the device rounds to complex64: the host's reference
  is taken at the rounded value, imaginary part included (it was cast to
  float64, which dropped it)."""
  with warnings.catch_warnings():
    warnings.simplefilter("error", np.exceptions.ComplexWarning)
    report = check_rules(_csin, z, device=CPU)
  assert report.passed, report


def test_the_functions_measured_error_leaves_out_what_is_not_finite():
  """inf on both sides, or one side's NaN: the comparisons judge those; the
  measurement (which sets the tolerance) would have been NaN or inf."""
  got = np.array([np.inf, 1.0, np.nan, 2.0], np.float32)
  want = np.array([np.inf, 1.0, 3.0, 2.0 + 2e-7])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    measured = _device._ulps(got, want, np.float32)
  assert 0 <= measured < 4, measured


@pytest.mark.parametrize("entry", zoo.ENTRIES, ids=lambda e: e.name)
def test_the_zoo_passes_with_a_cpu_as_the_device(entry):
  """Every right rule of the test zoo passes the device's half too (its
  false failures so far came from the setting, not the rule: a constant's
  dtype, an integer output's width, a complex part, an output zero to
  rounding)."""
  modes = [m for m in ("jvp", "vjp", "lin") if m in entry.transforms]
  if "vmap" in entry.transforms:
    modes.append("batch")
  report = check_rules(entry.fn, *entry.args(), modes=modes, device=CPU,
                       **entry.check_kwargs)
  assert report.passed, report
  assert report.devices["device check"].startswith("cpu (cpu), float32: "), (
      report.devices)


SINGULAR = jnp.arange(1., 10.).reshape(3, 3)


def test_an_output_zero_to_rounding_is_judged_on_the_floor_of_the_dtype():
  """det of a singular matrix: the host's float64 gives -9.5e-16, float32
  on the device 1e-6 (a TPU: 0), both zero to rounding. Compared with the
  host's absolute floor (its rounding noise and what rounding the inputs
  changes) scaled to the device's dtype, as the host compares it (found on
  a TPU: the device half failed JAX's right det, and the function's
  measured error widened the tolerance of every other part)."""
  report = check_rules(jnp.linalg.det, SINGULAR, order=1, device=CPU)
  assert report.passed, report
  assert "tolerance 256 ulps" in report.devices["device check"], report.devices


def test_an_output_zero_to_rounding_still_fails_when_off_in_the_dtype():
  """The floor is float32's rounding on the output's scale (about 1e-5
  here), not a licence: 1e-3 more in float32 fails."""
  def det(a):
    return jnp.linalg.det(a) + (1e-3 if a.dtype == jnp.float32 else 0.)
  with pytest.raises(RuleCheckError) as raised:
    check_rules(det, SINGULAR, order=1, device=CPU)
  assert raised.value.check.startswith("on cpu: the function in float32")


def test_python_floats_are_checked_at_their_rounded_value():
  """The device sees 0.1 rounded to float32; the host reference is taken
  at that value, not at float64's 0.1."""
  report = check_rules(f_of("right"), 0.1, device=CPU)
  assert report.passed, report


def test_the_devices_half_does_not_make_an_inconclusive_check_pass():
  """sin at 1e6 in bfloat16 cannot be judged on the host; the device's half
  (the rule against itself on the host) must not turn that into a pass
  (it did on a TPU)."""
  x = jnp.array([1e6, -2.5e6, 7.25e6], jnp.bfloat16)
  report = check_rules(lambda x: LogCosh(jax.typeof(x), "right")(x) * 0
                       + jnp.sin(x), x, x64=False, modes="jvp", device=CPU,
                       accept_inconclusive=True)
  assert report.verdict == "inconclusive", report


class _MatVecXOnly(zoo.MatVec):
  """A @ x, whose batch rule refuses a batched A."""

  def batch(self, axis_data, args, dims):
    if dims[0] is not None:
      raise ValueError("A must not be batched")
    return super().batch(axis_data, args, dims)


class _SinTimesYWrongDims(zoo.SinTimesY):
  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]  # wrong where only y is batched


def test_the_device_half_leaves_a_rules_refusals_to_the_host():
  """Found on a TPU: a batch rule that refuses to batch A (and asserts so)
  was skipped for those combinations on the host, then failed on the
  device, which ran them again."""
  fn = lambda A, x: _MatVecXOnly(jax.typeof(A), jax.typeof(x))(A, x)
  A, x = zoo.BY_NAME["matvec"].args()
  report = check_rules(fn, A.astype(np.float32), x.astype(np.float32),
                       modes="batch", device=CPU)
  assert report.verdict == "passed" and not report.failures
  assert any("A must not be batched" in why for _, why in report.skipped)
  assert any(r.startswith("batch: on cpu: jax.vmap") for r in report.ran)


def test_a_rule_the_host_failed_fails_once():
  """Found on a TPU: a batch_dim_rule wrong for in_axes=(None, 0) failed on
  the host and again on the device, the second failure without the
  in_axes in its inputs."""
  fn = lambda x, y: _SinTimesYWrongDims(jax.typeof(x), jax.typeof(y))(x, y)
  report = check_rules(fn, jnp.array([0.1, 0.2, 0.3]), 2.0, modes="batch",
                       raise_on_failure=False, device=CPU)
  assert report.failures and {f.rule for f in report.failures} == {
      "_SinTimesYWrongDims.batch_dim_rule"}
  assert not any(f.check.startswith("on cpu") for f in report.failures), [
      f.check for f in report.failures]  # the host's failures only
  (plain,) = [f for f in report.failures if f.check == "vmap vs a loop over the batch"]
  assert "in_axes=(None, 0)" in plain.inputs


def test_the_device_half_runs_only_the_modes_asked_for():
  """Found on a TPU: modes=("jvp",) reported 'expand' run as well (the
  function's own comparison on the device)."""
  report = check_rules(f_of("right"), X, modes=("jvp",), device=CPU)
  assert report.modes_run == ["jvp"]
  assert any(r.startswith("jvp: on cpu:") for r in report.ran)
  with_expand = check_rules(f_of("right"), X, modes=("expand", "jvp"), device=CPU)
  assert any(r.startswith("expand: on cpu: the function") for r in with_expand.ran)


def test_calibration_in_float16_leaves_out_what_float16_cannot_hold():
  """exp(20) overflows float16: the calibration measured an infinite error
  there, and so an infinite tolerance, and the device half could fail no
  float16 rule. It measures where the exact values are representable."""
  measured = _device.calibrate(CPU, np.float16)
  assert np.isfinite(measured["transcendental"]) and measured["transcendental"] < 4
  assert _device.tolerance(measured).ulps < 1e3


def test_calibration_is_one_program():
  """The device's calibration compiles one program (it compiled eight: each
  costs most on a device, where compiles are slow)."""
  _device._calibration.cache_clear()
  jax.clear_caches()  # a check before this one may have traced it already
  with Lowered() as programs:  # a persistent-cache hit is lowered too
    _device.calibrate(CPU, np.float32)
  assert len(programs) == 1, programs


def test_the_devices_program_compiles_while_the_hosts_half_runs(monkeypatch):
  """The device half's program is traced first and compiled in a thread of
  its own, which the host's half does not wait for: on the TPU machine a
  check with the device's half took 1.4 s without this, 0.8 s with it (the
  host's half alone: 0.8 s). The verdict is the same."""
  compiled_in = []
  original = jax.stages.Lowered.compile

  def compile_(self, *args, **kwargs):
    compiled_in.append(threading.current_thread().name)
    return original(self, *args, **kwargs)
  monkeypatch.setattr(jax.stages.Lowered, "compile", compile_)
  report = check_rules(f_of("right"), X, device=CPU, time_budget=None)
  assert report.passed and any(": on cpu: " in r for r in report.ran)
  # with no time budget the host's compiles run in the calling thread
  ahead = [name for name in compiled_in
           if name.startswith("check_rules: compiling the checks' program")]
  assert len(ahead) == 1, compiled_in
  assert compiled_in.count(threading.current_thread().name) == 1, compiled_in
  with pytest.raises(RuleCheckError, match="off_in_float32"):
    check_rules(f_of("off_in_float32"), X, device=CPU, time_budget=None)
