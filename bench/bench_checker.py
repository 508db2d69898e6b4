"""How long `hijax.testing.check_rules` takes on real rules, old against new.

Run: python bench/bench_checker.py [--before DIR] [--repeat 2] [--timeout 300]
                                   [--cases i0,sici,...] [--clock cpu] [--where]
                                   [--budget]

Each case is one ``check_rules`` call with the default options (every mode,
second order included; no time budget, or the default one with
``--budget``), in a fresh Python process with JAX's persistent
compilation cache off, so that every run compiles what it needs, as a first
call in a test does. ``--before DIR`` also runs each case on the hijax found
in ``DIR`` (e.g. ``git archive main | tar -x -C DIR``), interleaved with the
current one, and prints the ratio before / after. A case that runs past
``--timeout`` seconds is killed and shown as ``>timeout``.

``--where`` also prints where the time went (XLA's compiles, JAX's tracing
and lowering) and each report's verdict.

The cases: JAX's own special functions (``jax.custom_jvp`` rules in float64,
``expi`` in float32), a hijax primitive (``hiprim``), one whose jvp rule
binds another (``hiprims``: its rules are checked at second order again),
hijax.implicit's ``root`` (``implicit_root``, Kepler's equation), and,
where it is installed (the ``bench`` extra), optimistix's ``root_find``
(two custom rules, one of them an implicit solve).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _timing

CASES = {
    "i0": "lambda: (jax.scipy.special.i0, jnp.array([-2., .5, 3.]), {})",
    "xlogy": "lambda: (jax.scipy.special.xlogy, (jnp.array([.5, 2., 3.]), "
             "jnp.array([.3, 1.5, 4.])), {})",
    "sici": "lambda: (jax.scipy.special.sici, jnp.array([.5, 2., 7.]), {})",
    "hyp1f1": "lambda: (lambda x: jax.scipy.special.hyp1f1(1.5, 2.5, x), "
              "jnp.array([.5, 2.]), {})",
    "hyp2f1": "lambda: (lambda x: jax.scipy.special.hyp2f1(1.5, .5, 2.5, x), "
              "jnp.array([.1, .4]), {})",
    "zeta": "lambda: (lambda x: jax.scipy.special.zeta(x, 2.), "
            "jnp.array([2.5, 4.]), {})",
    "expn": "lambda: (lambda x: jax.scipy.special.expn(3, x), "
            "jnp.array([.5, 2.]), {})",
    "expi_f32": "lambda: (jax.scipy.special.expi, "
                "jnp.array([-64., 30., 64.], jnp.float32), {'x64': False})",
    "hiprim": "lambda: (softplus, jnp.array([-2., .5, 3.]), {})",
    "hiprims": "lambda: (tanh, jnp.array([-2., .5, 3.]), {})",
    "root_find": "lambda: (root_find, jnp.array([2., 3.]), {})",
    "implicit_root": "lambda: (eccentric_anomaly, jnp.array([1., .3]), {})",
}

# Run in the child process: defines the functions the cases name.
PRELUDE = """
import jax, jax.numpy as jnp, jax.scipy.special
from hijax import HiPrim, linearize_from_jvp, vjp_from_jvp, vjp_from_lin

class Softplus(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()
  def expand(self, x):
    return jnp.logaddexp(x, 0.)
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jax.nn.sigmoid(x) * t
  def vjp_fwd(self, nzs_in, x):
    return self(x), jax.nn.sigmoid(x)
  def vjp_bwd_retval(self, s, g):
    return (g * s,)
  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]

def softplus(x):
  return Softplus(jax.typeof(x))(x)

class Sech2(HiPrim):  # the derivative of tanh
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()
  def expand(self, x):
    return 1 / jnp.cosh(x) ** 2
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    s = self(x)
    return s, -2 * s * jnp.tanh(x) * t
  lin, linearized = linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = vjp_from_jvp
  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]

class Tanh(Sech2):  # its rules bind Sech2: checked at second order too
  def expand(self, x):
    return jnp.tanh(x)
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), Sech2(jax.typeof(x))(x) * t
  vjp_fwd, vjp_bwd_retval = vjp_from_lin

def tanh(x):
  return Tanh(jax.typeof(x))(x)

def eccentric_anomaly(p):  # hijax.implicit's root: Kepler's equation
  from hijax.implicit import root
  return root(lambda E, p: E - p[..., 1] * jnp.sin(E) - p[..., 0], p[..., 0], p)

def root_find(a):
  import optimistix as optx
  solver = optx.Newton(rtol=1e-10, atol=1e-10)
  return optx.root_find(lambda y, a: y ** 3 + y - a, solver, jnp.ones_like(a),
                        args=a).value
"""

CHILD = """
import importlib.util, inspect, json, os, sys, time
source = os.environ.get("BENCH_CHECKER_HIJAX")
if source:  # import hijax from there, ahead of the installed (editable) one
  init = os.path.join(source, "hijax", "__init__.py")
  spec = importlib.util.spec_from_file_location(
      "hijax", init, submodule_search_locations=[os.path.dirname(init)])
  module = importlib.util.module_from_spec(spec)
  sys.modules["hijax"] = module
  spec.loader.exec_module(module)
{prelude}
from hijax.testing import check_rules
import hijax
import jax.monitoring
spent = {{"compile": 0.0, "trace and lower": 0.0}}
def _listen(event, seconds, **_):
  if event.endswith("/backend_compile_duration"):
    spent["compile"] += seconds
  elif event.endswith(("/jaxpr_trace_duration",
                       "/jaxpr_to_mlir_module_duration")):
    spent["trace and lower"] += seconds
jax.monitoring.register_event_duration_secs_listener(_listen)
fn, x, kw = ({case})()
if {no_budget} and "time_budget" in inspect.signature(check_rules).parameters:
  kw["time_budget"] = None
start = time.{clock}()
args = x if isinstance(x, tuple) else (x,)
report = check_rules(fn, *args, raise_on_failure=False, **kw)
print(json.dumps(dict(seconds=time.{clock}() - start,
                      failures=len(report.failures),
                      verdict=report.verdict, hijax=hijax.__file__,
                      **spent)))
"""


def run(case: str, source: str | None, timeout: float,
        clock: str = "wall", budget: bool = False) -> dict:
  """Runs one case in a fresh process, on the hijax in ``source`` (None:
  the installed one); ``budget``: with check_rules's default time budget
  (else none)."""
  env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if source:
    env["BENCH_CHECKER_HIJAX"] = source
  code = CHILD.format(prelude=PRELUDE, case=CASES[case], no_budget=not budget,
                      clock={
      "wall": "perf_counter", "cpu": "process_time"}[clock])
  start = time.perf_counter()
  try:
    out = subprocess.run([sys.executable, "-c", code], env=env, timeout=timeout,
                         capture_output=True, text=True, check=False)
  except subprocess.TimeoutExpired:
    return dict(seconds=float("inf"), failures=None, wall=timeout)
  lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
  if out.returncode or not lines:
    tail = (out.stderr or out.stdout).strip().splitlines()[-1:]
    return dict(seconds=float("nan"), failures=None, error=" ".join(tail))
  result = json.loads(lines[-1])
  result["wall"] = time.perf_counter() - start
  return result


def _fmt(r: dict, timeout: float, where: bool = False) -> str:
  if r["seconds"] == float("inf"):
    return f">{timeout:.0f} s"
  if r.get("error"):
    return "error"
  if where:  # JAX's own measures, in wall time
    return (f"{r['seconds']:.2f} s: {r['compile']:.2f} compiling, "
            f"{r['trace and lower']:.2f} tracing and lowering, "
            f"{r['verdict']}")
  return f"{r['seconds']:.2f} s ({r['failures']} failed)"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--before", help="a directory holding the old hijax")
  parser.add_argument("--repeat", type=int, default=2)
  parser.add_argument("--timeout", type=float, default=300.0)
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                      help="the check's wall time, or its process's CPU time "
                      "(steadier on a shared machine)")
  parser.add_argument("--where", action="store_true",
                      help="also print where each best run's time went: "
                      "XLA's compiles and JAX's tracing and lowering (their "
                      "wall time, as JAX measures it), and the verdict")
  parser.add_argument("--budget", action="store_true",
                      help="run with check_rules's default time budget, as a "
                      "user's call does (else time_budget=None)")
  _timing.add_save_option(parser)
  args = parser.parse_args()
  print(f"check_rules, one call per case, fresh process, no compilation "
        f"cache, {'the default' if args.budget else 'no'} time budget; best "
        f"of {args.repeat}")
  header = f"{'case':<10} {'now':>22}"
  if args.before:
    header += f" {'before':>22} {'before/now':>11}"
  print(header)
  figures = {}
  for case in args.cases.split(","):
    now, before = [], []
    for _ in range(args.repeat):  # interleaved
      if args.before:
        before.append(run(case, args.before, args.timeout, args.clock,
                          args.budget))
      now.append(run(case, None, args.timeout, args.clock, args.budget))
    best = lambda rs: min(rs, key=lambda r: (r["seconds"] != r["seconds"],
                                             r["seconds"]))
    line = f"{case:<10} {_fmt(best(now), args.timeout):>22}"
    if args.before:
      b, n = best(before), best(now)
      ratio = b["seconds"] / n["seconds"] if n["seconds"] > 0 else float("nan")
      shown = (f">{args.timeout / n['seconds']:.1f}" if ratio == float("inf")
               else f"{ratio:.1f}")
      line += f" {_fmt(b, args.timeout):>22} {shown:>11}"
    errors = [r["error"] for r in now + before if r.get("error")]
    print(line + (f"  ({errors[0]})" if errors else ""), flush=True)
    if args.where:
      for label, rs in (("now", now), ("before", before)):
        if rs:
          print(f"{'':<10} {label}: {_fmt(best(rs), args.timeout, True)}",
                flush=True)
    n = best(now)
    if n["seconds"] == n["seconds"] and n["seconds"] != float("inf"):
      figures[case] = {"seconds": n["seconds"], "failures": n["failures"],
                       "runs": [r["seconds"] for r in now]}
  _timing.save(args, "bench_checker", {"check_rules seconds": figures},
               args.clock)


if __name__ == "__main__":
  main()
