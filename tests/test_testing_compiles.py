"""check_rules compiles one program (issue 39): the function at any number
of points and every transformation the checks evaluate are parts of it,
compiled together once and each run alone (hijax/testing/_compiled.py;
tests/test_testing_bundle.py tests the parts). Counted from JAX's lowering
events, one per program lowered (a persistent-cache hit is lowered too)."""
import jax
import jax.numpy as jnp

from compile_count import Lowered
from hijax.testing import check_rules


def _lowered(fn, *args, **kwargs) -> list[str]:
  """The programs ``check_rules(fn, *args, **kwargs)`` lowers, on the host
  alone unless ``device`` is given (on an accelerator the device's half
  lowers one program more: tested below with a CPU as the device)."""
  kwargs.setdefault("device", False)
  with Lowered() as names:
    report = check_rules(fn, *args, **kwargs)
  assert report.passed, report
  return names


def _scaled_sin():
  @jax.custom_jvp
  def scaled_sin(x, a):
    return jnp.sin(x) * a

  @scaled_sin.defjvp
  def _jvp(primals, tangents):
    (x, a), (tx, ta) = primals, tangents
    return scaled_sin(x, a), jnp.cos(x) * a * tx + jnp.sin(x) * ta
  return scaled_sin


def test_every_check_runs_in_one_compiled_program():
  """The function at the finite differences' points, the jvp, vjp and
  linearization in each of three directions (both inputs, each alone), the
  vmaps of each in_axes, the batched derivatives and the second-order
  checks: one program, lowered and compiled once (each alone: 23
  programs)."""
  names = _lowered(_scaled_sin(), jnp.array([0.3, 1.2]), jnp.array([2., -1.]))
  assert names == ["jit(program)"], names


def test_checking_the_same_function_twice():
  """The second check of the same function compiles its one program again
  and nothing else: the transformations under test are closures each check
  builds, over the inputs it holds fixed, not shared between checks."""
  scaled_sin = _scaled_sin()
  args = jnp.array([0.3, 1.2]), jnp.array([2., -1.])
  kwargs = dict(modes=("jvp", "vjp", "lin"), order=1)
  first = _lowered(scaled_sin, *args, **kwargs)
  second = _lowered(scaled_sin, *args, **kwargs)
  assert first == second == ["jit(program)"], (first, second)


def test_the_devices_half_is_one_program_more():
  """On a device (a TPU; here a CPU standing in for one) the checks'
  program is compiled once more, for the device, and nothing else (once
  the device's accuracy is measured: its own program, once per device and
  dtype)."""
  scaled_sin = _scaled_sin()
  args = jnp.array([0.3, 1.2]), jnp.array([2., -1.])
  kwargs = dict(modes=("jvp", "vjp", "lin"), order=1,
                device=jax.devices("cpu")[0])
  _lowered(scaled_sin, *args, **kwargs)  # measures the device once
  names = _lowered(scaled_sin, *args, **kwargs)
  assert names == ["jit(program)", "jit(program)"], names


def test_the_checks_compile_the_program_as_the_user_does():
  """The checker judges the program a user's ``jax.jit`` compiles: with XLA's
  default optimization. Compiled at ``xla_backend_optimization_level=0`` (a
  shortcut the checker once took to compile faster), hijax.implicit's
  Newton solve of Kepler's equation reports a failed linear solve at
  ``(1 - 2**-17, 0.3 - 2**-19)``, a finite-difference point the checker
  evaluates, where a default ``jit`` converges: check_rules then failed a
  right rule."""
  from hijax.implicit import root

  def kepler_residual(E, p):
    return E - p[..., 1] * jnp.sin(E) - p[..., 0]

  def eccentric_anomaly(p):
    return root(kepler_residual, p[..., 0], p)

  with jax.enable_x64(True):
    p = jnp.array([1., 0.3])
    point = p - 2.0 ** -17 * jnp.array([1., .25])
    assert bool(jax.jit(lambda q: root(kepler_residual, q[..., 0], q,
                                       throw=False)[1].converged)(point))
    report = check_rules(eccentric_anomaly, p, eps=1e-5, order=1,
                         batch_in_axes=[(0,)])
    assert not report.failures
    assert {"jvp", "vjp", "lin", "batch"} <= set(report.modes_run)


def test_a_hiprim_compiles_its_program_and_its_eager_reference_only():
  """A primitive's checks compile the one program and what `expand`
  evaluated eagerly (the reference of the expand check) compiles. The
  ``nzs_out`` check reads the flags `vjp_fwd` returns from a trace of it:
  it once called `vjp_fwd` eagerly, which compiled its jitted pieces
  (here ``sigmoid_slope``) for nothing but a static flag."""
  from hijax import HiPrim

  @jax.jit
  def softplus_reference(x):
    return jnp.logaddexp(x, 0.)

  @jax.jit
  def sigmoid_slope(x):
    return 1 / (1 + jnp.exp(-x))

  class Softplus(HiPrim):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
      super().__init__()

    def expand(self, x):
      return softplus_reference(x)

    def jvp(self, primals, tangents):
      (x,), (t,) = primals, tangents
      return self(x), sigmoid_slope(x) * t

    def vjp_fwd(self, nzs_in, x):
      return self(x), sigmoid_slope(x)

    def vjp_bwd_retval(self, s, g):
      return (g * s,)

    def batch_dim_rule(self, axis_data, in_dims):
      return in_dims[0]

  names = _lowered(lambda x: Softplus(jax.typeof(x))(x),
                   jnp.array([-2., .5, 3.]))
  assert names == ["jit(program)", "jit(softplus_reference)"], names


def test_the_second_order_checks_of_derived_functions_are_in_the_program():
  """Tanh's jvp rule binds Sech2, so the second-order mode runs the
  first-order checks again on the tangent map, the backward pass and the
  linearized map, each binding Sech2: their parts are parts of the one
  program (before: a program each). Nothing else is compiled but
  `expand`'s eager reference: the nzs_out check of Sech2 inside them
  traces the rules and evaluates nothing (it once evaluated each derived
  function eagerly, compiling ``sech2_reference``)."""
  import zoo

  @jax.jit
  def tanh_reference(x):
    return jnp.tanh(x)

  @jax.jit
  def sech2_reference(x):
    return 1 / jnp.cosh(x) ** 2

  class Sech2(zoo.Sech2):  # expand by functions no other test compiles
    def expand(self, x):
      return sech2_reference(x)

  class Tanh(zoo.Tanh):
    def expand(self, x):
      return tanh_reference(x)

    def jvp(self, primals, tangents):
      (x,), (t,) = primals, tangents
      return self(x), Sech2(jax.typeof(x))(x) * t

  with jax.enable_x64(True):
    names = _lowered(lambda x: Tanh(jax.typeof(x))(x),
                     jnp.array([0.3, -1.2, 2.]))
  assert names == ["jit(program)", "jit(tanh_reference)"], names



def test_a_declared_zero_tangent_is_checked_with_one_compiled_jvp():
  """vjp_fwd declares the second output's tangent zero, so the nzs_out
  check differentiates the primitive at its arguments: one compiled jvp
  for the vjp and lin modes together, and one compiled evaluation of the
  arguments (both were evaluated op by op, a solver's loop compiling each
  of its operations)."""
  from hijax import HiPrim

  @jax.jit
  def sin_and_step_reference(x):
    return jnp.sin(x), jnp.floor(x)

  class SinAndStep(HiPrim):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), (x_aval,) * 2, {}
      super().__init__()

    def expand(self, x):
      return sin_and_step_reference(x)

    def jvp(self, primals, tangents):
      (x,), (t,) = primals, tangents
      return self(x), (jnp.cos(x) * t, jnp.zeros_like(t))

    def vjp_fwd(self, nzs_in, x):
      return self(x), jnp.cos(x), (True, False)

    def vjp_bwd_retval(self, cos_x, g):
      return (g[0] * cos_x,)

    def lin(self, nzs_in, x):
      return self(x), jnp.cos(x), (True, False)

    def linearized(self, cos_x, t):
      return cos_x * t, None

  names = _lowered(lambda x: SinAndStep(jax.typeof(x))(x),
                   jnp.array([0.3, 1.7]), modes=("expand", "vjp", "lin"),
                   order=1)
  assert names == ["jit(program)", "jit(sin_and_step_reference)",
                   "jit(application_inputs)", "jit(_prim_jvp)"], names

_CACHED_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])  # tests/, for zoo
import jax, jax.numpy as jnp, jax.monitoring, jax.scipy.special
from hijax.testing import check_rules
import zoo

events = []
jax.monitoring.register_event_listener(lambda e, **kw: events.append(e))
jax.monitoring.register_event_duration_secs_listener(
    lambda e, d, **kw: events.append(e))
assert check_rules(jax.scipy.special.xlogy, jnp.array([0.5, 2.]),
                   jnp.array([0.3, 1.5])).passed
assert check_rules(zoo.tanh, jnp.array([0.3, -1.2])).passed
print(json.dumps(dict(
    asked=events.count("/jax/compilation_cache/compile_requests_use_cache"),
    loaded=events.count("/jax/compilation_cache/cache_hits"))))
"""


def test_a_later_run_loads_every_program_from_jax_s_persistent_cache(tmp_path):
  """With JAX's persistent compilation cache (and its minimum compile time
  at 0, since a program that compiles in under a second is not kept by
  default), a later run of the same checks compiles nothing: what the
  checker compiles depends only on the function and the types, not on the
  run (its random tangents and points are arguments, not constants), so
  JAX finds every program in the cache."""
  import json
  import os
  import subprocess
  import sys
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
             JAX_ENABLE_COMPILATION_CACHE="true",
             JAX_PLATFORMS="cpu")  # an accelerator is this process's

  def run() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CACHED_CHILD, os.path.dirname(__file__)],
        env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])
  first, later = run(), run()
  # the checks of the two functions: at least a program each, all compiled
  assert first["asked"] >= 2 and first["loaded"] == 0, first
  # the same programs again, each one loaded (none compiled)
  assert later == {"asked": first["asked"], "loaded": first["asked"]}, (
      first, later)
