"""Measure what changes for custom rules on the default JAX backend, against
float64 references computed on the host CPU.

  python tools/accelerator_facts.py --out facts.json [--quick]

Each measurement is a small program run on ``jax.devices()[0]`` (the
accelerator, where there is one) in float32, compared with the same
computation in float64 by NumPy on the host:

- ``matmul``: the relative error of float32 products at each
  ``jax.default_matmul_precision`` (default, high, highest), for a matrix
  product, a matrix-vector product and the same matrix-vector product under
  ``vmap`` (which XLA may turn into a matrix product), in units of float32's
  epsilon, relative to ``|A| |B|`` elementwise;
- ``transcendental``: the largest error of float32 functions (exp, log, tanh,
  erf, ...) in units in the last place of the float64 value rounded to
  float32;
- ``gradient``: the relative error of the gradient of ``sum(tanh(A x))``;
- ``float64``: under ``jax.enable_x64``, which float64 operations run on the
  device, and their error (or the exception's type and first line);
- ``cost``: compile time of a small program, one eager operation's latency,
  and a loop of many tiny steps, on the device and on the host CPU;
- ``checker``: `hijax.testing.check_rules` on the checking-rules page's
  broken and fixed LogCosh: its verdict, time and the programs it compiled;
- ``callback_errors``: where a host callback's error reaches the caller (a
  solve with ``throw=True`` raises so): with the call's result, at the next
  ``jax.effects_barrier()``, at the one after it. Plain JAX, no hijax.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import jax
import jax.numpy as jnp

F32_EPS = float(np.finfo(np.float32).eps)


def _timed(fn, *args, repeat=5):
  best = float("inf")
  for _ in range(repeat):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def matmul_errors(n=256, batch=8):
  rng = np.random.default_rng(0)
  a = rng.standard_normal((n, n)).astype(np.float32)
  b = rng.standard_normal((n, n)).astype(np.float32)
  vs = rng.standard_normal((batch, n)).astype(np.float32)
  scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
  want = a.astype(np.float64) @ b.astype(np.float64)
  want_v = vs.astype(np.float64) @ a.astype(np.float64).T
  scale_v = np.abs(vs).astype(np.float64) @ np.abs(a).astype(np.float64).T
  out = {}
  for precision in ("default", "high", "highest"):
    with jax.default_matmul_precision(None if precision == "default" else precision):
      got = np.asarray(jax.jit(jnp.matmul)(a, b), np.float64)
      mv = jax.jit(lambda m, v: m @ v)
      got_single = np.stack([np.asarray(mv(a, v), np.float64) for v in vs])
      got_vmap = np.asarray(jax.jit(jax.vmap(lambda v: a @ v))(vs), np.float64)
    out[precision] = {
        "matmul_eps": float(np.max(np.abs(got - want) / scale) / F32_EPS),
        "matvec_eps": float(np.max(np.abs(got_single - want_v) / scale_v) / F32_EPS),
        "vmap_matvec_eps": float(np.max(np.abs(got_vmap - want_v) / scale_v) / F32_EPS),
    }
  return out


_FUNCTIONS = {
    "exp": (jnp.exp, np.exp, (-80.0, 80.0)),
    "log": (jnp.log, np.log, (1e-30, 1e30)),
    "log1p": (jnp.log1p, np.log1p, (-0.99, 10.0)),
    "expm1": (jnp.expm1, np.expm1, (-10.0, 10.0)),
    "tanh": (jnp.tanh, np.tanh, (-10.0, 10.0)),
    "sin": (jnp.sin, np.sin, (-100.0, 100.0)),
    "cos": (jnp.cos, np.cos, (-100.0, 100.0)),
    "sqrt": (jnp.sqrt, np.sqrt, (0.0, 1e6)),
    "logistic": (jax.nn.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-30.0, 30.0)),
    "erf": (jax.scipy.special.erf, None, (-5.0, 5.0)),
}


def transcendental_errors(n=20001):
  import scipy.special  # pylint: disable=import-outside-toplevel
  out = {}
  for name, (jf, nf, (lo, hi)) in _FUNCTIONS.items():
    if name == "log":
      x = np.geomspace(lo, hi, n).astype(np.float32)
    else:
      x = np.linspace(lo, hi, n).astype(np.float32)
    ref_fn = nf if nf is not None else scipy.special.erf
    want = ref_fn(x.astype(np.float64))
    got = np.asarray(jax.jit(jf)(x), np.float64)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    ulp = np.maximum(ulp, np.finfo(np.float32).smallest_normal)
    err = np.abs(got - want) / ulp
    worst = int(np.argmax(err))
    out[name] = {"max_ulp": float(err[worst]), "at": float(x[worst]),
                 "median_ulp": float(np.median(err))}
  return out


def gradient_error(n=128):
  rng = np.random.default_rng(1)
  a = rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n)
  x = rng.standard_normal(n).astype(np.float32)
  f = lambda x: jnp.sum(jnp.tanh(a @ x))
  a64, x64 = a.astype(np.float64), x.astype(np.float64)
  want = a64.T @ (1 - np.tanh(a64 @ x64) ** 2)
  out = {}
  for precision in ("default", "highest"):
    with jax.default_matmul_precision(None if precision == "default" else precision):
      got = np.asarray(jax.jit(jax.grad(f))(x), np.float64)
    out[precision] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
  return out


def float64_support():
  rng = np.random.default_rng(2)
  m = rng.standard_normal((16, 16))
  spd = m @ m.T + 16 * np.eye(16)
  v = rng.standard_normal(16)
  cases = {
      "add": (lambda a, b: a + b, (m, m), lambda a, b: a + b),
      "exp": (jnp.exp, (m,), np.exp),
      "matmul": (jnp.matmul, (m, m), np.matmul),
      "solve": (jnp.linalg.solve, (spd, v), np.linalg.solve),
      "inv": (jnp.linalg.inv, (spd,), np.linalg.inv),
      "slogdet": (lambda a: jnp.linalg.slogdet(a)[1], (spd,),
                  lambda a: np.linalg.slogdet(a)[1]),
      "cholesky": (jnp.linalg.cholesky, (spd,), np.linalg.cholesky),
      "qr": (lambda a: jnp.abs(jnp.linalg.qr(a)[1]), (m,),
             lambda a: np.abs(np.linalg.qr(a)[1])),
      "eigh": (jnp.linalg.eigvalsh, (spd,), np.linalg.eigvalsh),
      "fft": (lambda a: jnp.abs(jnp.fft.fft(a)), (v,), lambda a: np.abs(np.fft.fft(a))),
  }
  out = {}
  with jax.enable_x64(True):
    for name, (jf, args, nf) in cases.items():
      t0 = time.perf_counter()
      try:
        got = np.asarray(jax.jit(jf)(*[jnp.asarray(a, jnp.float64) for a in args]))
        want = nf(*args)
        err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))
        out[name] = {"ok": True, "dtype": str(got.dtype), "rel_error": err}
      except Exception as e:  # pylint: disable=broad-except
        out[name] = {"ok": False, "error": f"{type(e).__name__}: "
                                           f"{str(e).strip().splitlines()[0][:200]}"}
      out[name]["seconds"] = round(time.perf_counter() - t0, 2)
  return out


def costs():
  out = {}
  devices = {"device": jax.devices()[0], "host_cpu": jax.devices("cpu")[0]}
  for where, dev in devices.items():
    with jax.default_device(dev):
      x = jax.device_put(jnp.linspace(0.0, 1.0, 1000, dtype=jnp.float32), dev)
      times = []
      for k in range(3):
        f = jax.jit(jax.grad(lambda x, k=k: jnp.sum(jnp.sin(x) * jnp.cos(x) ** (k + 2))))
        t0 = time.perf_counter()
        f.lower(x).compile()
        times.append(time.perf_counter() - t0)
      out.setdefault("compile_seconds", {})[where] = min(times)
      jnp.sin(x).block_until_ready()
      out.setdefault("eager_op_seconds", {})[where] = _timed(
          lambda: jnp.sin(x), repeat=20)
      loop = jax.jit(lambda x: jax.lax.fori_loop(0, 1000, lambda i, y: y * 0.999 + 0.001, x))
      loop(x).block_until_ready()
      out.setdefault("tiny_step_loop_1000_seconds", {})[where] = _timed(loop, x)
  return out


def checker(cases=("broken", "fixed"), x64s=(None, False), check_device=None):
  """check_rules on the checking-rules page's LogCosh, broken and fixed, with
  its default device (or ``check_device``: a CPU shows the device half
  where there is no accelerator) and on the host only."""
  import hijax  # pylint: disable=import-outside-toplevel
  from hijax.testing import check_rules  # pylint: disable=import-outside-toplevel

  class LogCosh(hijax.HiPrim):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
      super().__init__()

    def expand(self, x):
      return jnp.logaddexp(x, -x) - jnp.log(2.)

    def jvp(self, primals, tangents):
      (x,), (x_dot,) = primals, tangents
      return self(x), jnp.tanh(x) * x_dot

    def vjp_fwd(self, nzs_in, x):
      return self(x), jnp.tanh(x)

    def vjp_bwd_retval(self, tanh_x, g):
      return (tanh_x,)  # the page's bug: should be tanh_x * g

    def batch_dim_rule(self, axis_data, in_dims):
      return in_dims[0]

  class LogCoshFixed(LogCosh):
    def vjp_bwd_retval(self, tanh_x, g):
      return (tanh_x * g,)

  x = jnp.array([-1.5, 0.3, 2.0])
  out = {}
  # each case twice: the second run is a check's steady cost (the first
  # pays the device's calibration and its first eager compiles)
  runs = [(name, cls, x64, device, again)
          for name, cls in (("broken", LogCosh), ("fixed", LogCoshFixed))
          if name in cases for x64 in x64s for device in (None, False)
          for again in (False, True)]
  for name, cls, x64, device, again in runs:
    compiles = []
    phases: dict[str, float] = {}  # seconds per JAX compile event

    def listener(event, duration, **kw):
      if event == "/jax/core/compile/backend_compile_duration":
        compiles.append(event)
      if event.startswith("/jax/core/compile/"):
        phase = event.rsplit("/", 1)[-1]
        phases[phase] = phases.get(phase, 0.0) + duration
    jax.monitoring.register_event_duration_secs_listener(listener)
    t0 = time.perf_counter()
    try:
      report = check_rules(lambda x: cls(jax.typeof(x))(x), x, x64=x64,
                           raise_on_failure=False,
                           device=check_device if device is None else device)
      verdict = {"passed": report.passed, "first_line": str(report).splitlines()[0],
                 "failures": [f.rule + ": " + f.check for f in report.failures][:3],
                 "verdict": getattr(report, "verdict", None),
                 "devices": getattr(report, "devices", None)}
    except Exception as e:  # pylint: disable=broad-except
      verdict = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    finally:
      jax.monitoring.unregister_event_duration_listener(listener)
    verdict["seconds"] = round(time.perf_counter() - t0, 2)
    verdict["backend_compiles"] = len(compiles)
    # where the time went: tracing, lowering and XLA's compiles (the rest
    # is running the checks); "default" less "host only" is the device's half
    verdict["compile_phases"] = {k: round(v, 3) for k, v in phases.items()}
    where = "host only" if device is False else "default"
    out[f"{name} x64={x64} {where}" + (" again" if again else "")] = verdict
  return out


def callback_errors():
  """A jitted program whose `io_callback` raises: what raises at the result,
  then at two ``jax.effects_barrier()`` calls after it (the class and last
  line of each error, or None)."""
  from jax.experimental import io_callback  # pylint: disable=import-outside-toplevel

  def fails(x):
    raise RuntimeError("raised in the callback")

  @jax.jit
  def program(x):
    io_callback(fails, jax.ShapeDtypeStruct((), jnp.float32), x)
    return x + 1

  def error_of(fn):
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      return f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
    return None
  return {"at_the_result": error_of(lambda: program(1.0).block_until_ready()),
          "at_the_next_barrier": error_of(jax.effects_barrier),
          "at_a_second_barrier": error_of(jax.effects_barrier)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--only", nargs="*", default=None)
  parser.add_argument("--checker-cases", default="broken,fixed")
  parser.add_argument("--checker-x64", default="none,false",
                      help="x64 settings of the checker cases: none, false")
  parser.add_argument("--checker-device", choices=("default", "cpu"), default="default",
                      help="the checker cases' device: the default, or the CPU "
                      "(to see the device half without an accelerator)")
  a = parser.parse_args()
  parts = {"matmul": matmul_errors, "transcendental": transcendental_errors,
           "gradient": gradient_error, "float64": float64_support, "cost": costs,
           "callback_errors": callback_errors,
           "checker": lambda: checker(
               a.checker_cases.split(","),
               tuple({"none": None, "false": False}[v]
                     for v in a.checker_x64.split(",")),
               jax.devices("cpu")[0] if a.checker_device == "cpu" else None)}
  dev = jax.devices()[0]
  facts = {"environment": {"backend": jax.default_backend(), "device_kind": dev.device_kind,
                           "jax": jax.__version__,
                           "date": time.strftime("%Y-%m-%d")}}
  for name, fn in parts.items():
    if a.only and name not in a.only:
      continue
    t0 = time.perf_counter()
    try:
      facts[name] = fn()
    except Exception as e:  # pylint: disable=broad-except
      facts[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    facts.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
    with open(a.out, "w") as f:
      json.dump(facts, f, indent=1)
    print(name, facts["seconds"][name], "s", flush=True)


if __name__ == "__main__":
  main()
