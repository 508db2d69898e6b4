"""What pages say happens on a TPU, held to the runs recorded there
(docs/accelerator-results.json, written on a TPU v5e by
tools/accelerator_run.py).

The pages mention these behaviours without showing figures, so the record
is read here rather than carried in the page (figures a page shows travel
with it: tools/page_data.py). Each test names the page and the sentence.
"""
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pages

RECORD = Path(__file__).resolve().parent.parent / "docs" / "accelerator-results.json"


@pytest.fixture(scope="module")
def runs():
  if not RECORD.exists():
    pytest.skip("no docs/accelerator-results.json (an sdist)")
  return json.loads(RECORD.read_text())


def test_custom_batching_the_float32_device_check_fails_the_first_call_on_a_tpu(runs):
  """custom-batching: "on a GPU or TPU, `check_rules` also runs its checks on
  that device in the inputs' own dtype, float32 here, so there the first
  call fails too": the third run, before the calls passed device=False."""
  failed = [f for f in runs["third"]["pages"]["custom-batching"]["failures"]
            if "RuleCheckError" in f]
  assert len(failed) == 1 and "(from hijax.testing import check_rules)" in failed[0]
  assert "on TPU v5 lite: " in failed[0] and "in float32 vs the host's float64" in failed[0]


def test_portability_offloading_differs_from_saving_on_a_tpu(runs):
  """portability: "On a TPU, whose own memory is not the host's, the two
  analyses differ": the third run failed the cell asserting them equal on
  every backend; the fourth, on a TPU, passed the page."""
  (failed,) = runs["third"]["pages"]["portability"]["failures"]
  assert failed.startswith("cell ") and "(from jax.ad_checkpoint import checkpoint_name)" in failed
  assert "AssertionError" in failed, failed
  fourth = runs["fourth"]["pages"]["portability"]
  assert fourth["failed"] == fourth["not run"] == 0, fourth
  assert runs["fourth"]["environment"]["backend"] == "tpu"


def test_remat_a_tpu_s_compiler_makes_its_own_choices(runs):
  """remat: the compiled costs are the CPU's ("a TPU's compiler fuses
  differently"): the third run failed `costs['no checkpoint'] == (7000, 0)`
  there; the fourth, asserting it on a CPU only, passed the page."""
  (failed,) = runs["third"]["pages"]["remat"]["failures"]
  assert "costs['no checkpoint'] == (7000, 0)" in failed, failed
  assert "AssertionError" in failed, failed
  assert runs["fourth"]["pages"]["remat"]["failed"] == 0


def test_spectral_gradients_eigh_s_gradient_came_out_nan_on_a_tpu(runs):
  """spectral-gradients: "A solver that returns them as the same float (a
  TPU's can) gives `nan`": in the third run a nan error reached the page's
  `magnitude`, which did not yet allow for one."""
  (nan_on_tpu,) = [f for f in runs["third"]["pages"]["spectral-gradients"]["failures"]
                   if "cannot convert float NaN to integer" in f]
  assert "in magnitude" in nan_on_tpu, nan_on_tpu


def test_pytest_plugin_one_process_at_a_time_holds_the_tpu(runs):
  """pytest-plugin: "On a TPU only one process at a time can hold the chip":
  in the fifth run a test's child process, started while the test's own
  process held the TPU, failed making its TPU client."""
  failures = runs["fifth"]["tests"]["tests/test_implicit_errors.py"]["failures"]
  assert any("test_the_first_line_printed" in f and "make_tpu_client(" in f
             for f in failures), failures


def test_a_float32_rule_1_percent_off_fails_at_the_tpus_measured_errors(runs, monkeypatch):
  """pytest-plugin: a rule wrong only in float32 fails where the tests ran
  float32. On the TPU it passed at the default precision and failed under
  "highest" (the ninth run's float32_rule); replayed here on the CPU with the
  errors the TPU measured, in place of the CPU's own."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from hijax.testing import _device, check_rules  # pylint: disable=import-outside-toplevel

  recorded = runs["ninth"]["float32_rule"]
  assert recorded["default"]["verdict"] == "passed"  # the silent pass, on the TPU
  assert recorded["highest"]["verdict"] == "failed"
  measured = re.search(r"TPU v5 lite \(tpu\), float32: .* ulps of the dtype: "
                       r"matmul (\d+), transcendental (\d+)", recorded["default"]["device check"])
  assert measured, recorded
  tpu = {"matmul": float(measured[1]), "transcendental": float(measured[2])}
  monkeypatch.setattr(_device, "calibrate", lambda device, dtype: dict(tpu))

  @jax.custom_jvp
  def sin(x):
    return jnp.sin(x)

  @sin.defjvp
  def _(p, t):  # 1% off in float32 only
    slope = jnp.cos(p[0]) * (1.01 if p[0].dtype == jnp.float32 else 1.0)
    return sin(p[0]), slope * t[0]

  report = check_rules(sin, jnp.array([0.2, 0.5], jnp.float32),
                       device=jax.devices("cpu")[0], raise_on_failure=False)
  assert "matmul 18192" in report.devices["device check"]  # the TPU's figures
  assert report.verdict == "failed", report.devices


def test_a_right_rule_passes_at_the_tpus_tanh_differentiated_again(runs, monkeypatch):
  """checking-rules: the fixed `LogCosh` passes. On the TPU (the tenth run)
  its right jvp rule, `tanh(x) * x_dot`, failed the device's "jvp
  differentiated again" part: the derivative of tanh is 1 - tanh(x)**2, which
  at x = -1.5 multiplies tanh's relative error by 2 tanh**2 / (1 - tanh**2),
  about 9. Replayed here on the CPU with the TPU's measured tolerance and a
  float32 tanh off by the TPU's worst measured error, calibrated with that
  tanh's derivatives (the function figures are the TPU's): every part
  passes, the one differentiated again within the derivatives' error."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from hijax import HiPrim  # pylint: disable=import-outside-toplevel
  from hijax.testing import _device, check_rules  # pylint: disable=import-outside-toplevel

  (failure,) = [f for f in runs["tenth"]["pages"]["checking-rules"]["failures"]
                if f.startswith("cell 7 ")]
  values = re.search(r"TPU v5 lite gives (\S+), the host gives (\S+?);", failure)
  assert values, failure
  got, want = float(values[1]), float(values[2])
  assert "LogCoshFixed.jvp: on TPU v5 lite: jvp differentiated again" in failure
  assert "tolerance 865.535 ulps" in failure and abs(got - want) / abs(want) > 2e-4
  measured = re.search(r"transcendental (\d+)", runs["ninth"]["float32_rule"]["default"]
                       ["device check"])
  assert measured
  # a tanh off by the TPU's worst measured error (the accelerators page's table)
  delta = runs["facts"]["transcendental"]["tanh"]["max_ulp"] * 2.0 ** -23
  assert 1e-4 < delta < 2e-4, delta

  @jax.custom_jvp
  def tanh(x):
    y = jnp.tanh(x)
    return y * (1 + delta) if x.dtype == jnp.float32 else y

  @tanh.defjvp
  def _(p, t):
    y = tanh(p[0])
    return y, (1 - y * y) * t[0]

  functions = dict(_device._FUNCTIONS, tanh=(tanh, *_device._FUNCTIONS["tanh"][1:]))
  monkeypatch.setattr(_device, "_FUNCTIONS", functions)
  calibrate = _device.calibrate
  monkeypatch.setattr(_device, "calibrate", lambda device, dtype: {
      **calibrate(device, dtype), "matmul": 18192.0,
      "transcendental": float(measured[1])})
  _device._calibration.cache_clear()
  jax.clear_caches()  # the calibration's program read the functions when traced

  class LogCosh(HiPrim):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
      super().__init__()

    def expand(self, x):
      return jnp.logaddexp(x, -x) - jnp.log(2.)

    def jvp(self, primals, tangents):
      return self(primals[0]), tanh(primals[0]) * tangents[0]

  report = check_rules(lambda x: LogCosh(jax.typeof(x))(x), jnp.array([-1.5, 0.3, 2.0]),
                       device=jax.devices("cpu")[0], raise_on_failure=False)
  _device._calibration.cache_clear()
  jax.clear_caches()
  assert report.passed, [str(f) for f in report.failures]
  # the derivatives' error is what widened that part's tolerance
  line = report.devices["device check"]
  figure = float(re.search(r"differentiated (\d+)", line)[1])
  assert figure > 2 * float(measured[1]), line
  assert f"{4 * figure:.0f} for a second-order part" in line, line
