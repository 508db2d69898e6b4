"""hijax.implicit against optimistix and lineax, printed as ratios.

Run: python bench/bench_implicit.py [--repeat 5] [--stub-checks] [--clock cpu]
[--compile [ROUNDS]]
(needs the `bench` extra: optimistix and lineax; --stub-checks measures
without hijax's checks of the returned solutions, which the peers do not
run, or without those named, e.g. --stub-checks dense,failure (see CHECKS);
--clock cpu times CPU time instead of wall time)

Problems (float32, CPU):

  scalar-root   vmap of a Newton square root over 10,000 values, and its grad
  eager-fp      one eager fixed_point call (a 3-dim contraction), no jit
  eager-lambda  one eager root call of a lambda written in the loop (a new
                function object each call), against optimistix's
  dense-200     a 200x200 dense solve (hijax: MatMul + Dense; lineax: LU) and
                the gradient of its sum with respect to the matrix
  dense-natural the same, written `linear_solve(lambda x, A: A @ x, b, A)`
                (hijax recognises the matrix product; printed also as a ratio
                to MatMul)
  cg-200        a 200x200 SPD solve by CG, and its gradient
  newton-50     a 50-dim Newton root: jacrev of the solution, and an HVP of a
                loss of it
  fixed-point   a jitted fixed_point of the 3-dim contraction, and the
                gradient of its sum with respect to the offset

For each it times the jit steady state (best of ``--repeat`` loops of calls,
hijax and the peer interleaved so that a burst of load hits both)
and the compile time (``jax.jit(fn).lower(...).compile()``, best of rounds,
hijax and the peer alternated, each round after ``jax.clear_caches()`` and
with JAX's persistent compilation cache off, so that nothing is reused),
and checks the accuracy of both against a closed form. ``--compile``
prints the compile times themselves (ms: trace and lower, then XLA's
compile) beside the ratios, best of ROUNDS (default 5) rounds. Each ratio is peer time / hijax time: above 1.0
hijax is faster, below 1.0 the peer is.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import _timing
from hijax.implicit import (CG, Dense, MatMul, fixed_point, linear_solve,
                            root)

try:
  import lineax as lx
  import optimistix as optx
except ImportError as e:  # pragma: no cover
  raise SystemExit(f"bench_implicit needs the `bench` extra ({e})")


# The clock: wall time by default; --clock cpu reads the process's CPU time
# (all its threads), which a busy shared machine disturbs far less (time
# spent waiting for a core is not counted). Pin to one core to compare.
clock = time.perf_counter


def best(fn, *args, repeat=5, number=None):
  """Best seconds per call of ``fn(*args)`` (blocking on the result), on
  this script's clock (`_timing.best`)."""
  return _timing.best(fn, *args, repeat=repeat, number=number, clock=clock)


COMPILE_ROUNDS = 3  # --compile sets it
COMPILED = {}  # problem name -> {"hijax"|"peer": (lower s, compile s)}


def lower_compile(fn, *args):
  """Seconds to trace and lower ``jax.jit(fn)`` at ``args``, and for XLA to
  compile it, from empty in-memory caches (`jax.clear_caches`; the persistent
  cache is off, `main`)."""
  jax.clear_caches()
  t = clock()
  lowered = jax.jit(fn).lower(*args)
  t_lower = clock() - t
  t = clock()
  lowered.compile()
  return t_lower, clock() - t


def compile_times(ours, peer, args, rounds):
  """The best (lower, compile) seconds of hijax's ``ours`` and of ``peer``
  over ``rounds`` rounds, the two alternated (each going first in every
  other round), so that a burst of load hits both. Best: of the sum."""
  found = {"hijax": (float("inf"), 0.), "peer": (float("inf"), 0.)}
  for i in range(rounds):
    order = [("hijax", ours), ("peer", peer)]
    for which, fn in (order if i % 2 == 0 else order[::-1]):
      times = lower_compile(fn, *args)
      if sum(times) < sum(found[which]):
        found[which] = times
  return found


# --- the problems -----------------------------------------------------------

def sq_residual(x, a):
  return x * x - a


def hijax_sqrt(a):
  return root(sq_residual, jnp.ones_like(a), a)


def optx_sqrt(a):
  return optx.root_find(sq_residual, optx.Newton(rtol=1e-6, atol=1e-6),
                        jnp.ones_like(a), a).value


def contraction(x, p):
  return p["A"] @ x + p["c"]


FP_PARAMS = {"A": jnp.array([[0.2, -0.1, 0.0], [0.1, 0.3, 0.1],
                             [0.0, 0.2, -0.1]]),
             "c": jnp.array([1.0, -0.5, 2.0])}


# The start, made once: an eager `jnp.zeros(3)` in the call would cost more
# than the solve (a JAX dispatch of its own), for hijax and optimistix alike.
FP_X0 = jnp.zeros(3)


def hijax_fp(p):
  return fixed_point(contraction, FP_X0, p)


def optx_fp(p):
  return optx.fixed_point(contraction,
                          optx.FixedPointIteration(rtol=1e-6, atol=1e-6),
                          FP_X0, p).value


def hijax_dense(A, b):
  return linear_solve(MatMul(), b, A, solver=Dense())


def lx_dense(A, b):
  return lx.linear_solve(lx.MatrixLinearOperator(A), b, lx.LU()).value


def hijax_dense_natural(A, b):
  return linear_solve(lambda x, A: A @ x, b, A, solver=Dense())


def spd_matvec(x, A):
  return A @ x


def hijax_cg(A, b):
  return linear_solve(spd_matvec, b, A, solver=CG(tol=1e-5))


def lx_cg(A, b):
  op = lx.MatrixLinearOperator(A, lx.positive_semidefinite_tag)
  return lx.linear_solve(op, b, lx.CG(rtol=1e-5, atol=0.)).value


def newton_residual(x, p):
  M, c = p
  return M @ x + 0.1 * jnp.tanh(x) - c


def hijax_newton(p):
  return root(newton_residual, jnp.zeros(50), p)


def unrolled_newton(p):
  """The reference: 20 Newton steps in plain JAX, differentiated through."""
  x = jnp.zeros(50)
  for _ in range(20):
    J = jax.jacfwd(newton_residual)(x, p)
    x = x - jnp.linalg.solve(J, newton_residual(x, p))
  return x


def optx_newton(p):
  return optx.root_find(newton_residual, optx.Newton(rtol=1e-6, atol=1e-6),
                        jnp.zeros(50), p).value


# --- running ------------------------------------------------------------------

def compare(name, ours, peer, args, reference, repeat, rows):
  ours_j, peer_j = jax.jit(ours), jax.jit(peer)
  err_ours = float(jnp.max(jnp.abs(ours_j(*args) - reference)))
  err_peer = float(jnp.max(jnp.abs(peer_j(*args) - reference)))
  # interleaved, best of each: a burst of load on the machine hits both
  t_ours = t_peer = float("inf")
  for _ in range(repeat):
    t_ours = min(t_ours, best(ours_j, *args, repeat=1))
    t_peer = min(t_peer, best(peer_j, *args, repeat=1))
  COMPILED[name] = compiled = compile_times(ours, peer, args, COMPILE_ROUNDS)
  c_ours, c_peer = sum(compiled["hijax"]), sum(compiled["peer"])
  rows.append((name, t_peer / t_ours, c_peer / c_ours, err_ours, err_peer,
               t_ours))


CHECKS = {
    "dense": "Dense's backward-error check of a system of 2 or more unknowns",
    "dense1": "Dense's check of a system of one unknown (each Newton step of "
              "a scalar root)",
    "residual": "the residual check of CG and GMRES",
    "spd": "CG's symmetry and positivity test",
    "failure": "the failure check of throw=True (a count over the batch and a cond)",
}


def stub_checks(which):
  """Replaces the checks named in ``which`` (keys of `CHECKS`) with nothing,
  in this process only: what is left to compare with the peers, which run
  no such checks, is the solve itself. Reaches into private modules; for
  measuring, never for use. Call before anything is traced (the primitives
  cache their expansion)."""
  from hijax.implicit import (_dense, _krylov, _linear, _primitives,
                              _status)
  for owner, name in [(_dense.Dense, "_check"), (_linear, "residual_status"),
                      (_krylov.CG, "_spd_on_probes"),
                      (_primitives, "raise_if_failed")]:
    if not hasattr(owner, name):  # renamed: stubbing it would do nothing
      raise SystemExit(f"--stub-checks: {owner.__name__}.{name} is gone")
  passed = lambda *args, **kwargs: _status.status(_status.CONVERGED, 1, 0.)
  dense = _dense.Dense._check

  def dense_check(self, matrix, x, b, transpose=False, **kwargs):
    if ("dense1" if x.size == 1 else "dense") in which:
      return passed()
    return dense(self, matrix, x, b, transpose, **kwargs)
  _dense.Dense._check = dense_check
  if "residual" in which:
    _krylov.residual_status = passed
  if "spd" in which:
    _krylov.CG._spd_on_probes = staticmethod(lambda *args: jnp.bool_(True))
  if "failure" in which:
    _primitives.raise_if_failed = lambda x, st, where: x


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeat", type=int, default=5)
  parser.add_argument(
      "--stub-checks", nargs="?", const=",".join(CHECKS), default="",
      help="measure with hijax's result checks removed: all of them, or "
      "those named (comma-separated: " + ", ".join(CHECKS) + ")")
  parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                      help="wall time, or this process's CPU time (steadier "
                      "on a shared machine; pin to one core with taskset)")
  parser.add_argument("--compile", nargs="?", type=int, const=5, default=None,
                      metavar="ROUNDS",
                      help="print each problem's compile times (trace and "
                      "lower, XLA's compile), best of ROUNDS (default 5) "
                      "rounds alternated with the peer's")
  _timing.add_save_option(parser)
  options = parser.parse_args()
  # every compilation measured is a compilation: none read from disk
  jax.config.update("jax_enable_compilation_cache", False)
  global COMPILE_ROUNDS
  COMPILE_ROUNDS = options.compile or COMPILE_ROUNDS
  global clock
  clock = time.process_time if options.clock == "cpu" else time.perf_counter
  repeat = options.repeat
  stubbed = [c for c in options.stub_checks.split(",") if c]
  if any(c not in CHECKS for c in stubbed):
    raise SystemExit(f"--stub-checks: one of {', '.join(CHECKS)}")
  if stubbed:
    stub_checks(stubbed)
  rows = []

  a = jnp.linspace(0.5, 4.0, 10_000)
  compare("scalar-root value", jax.vmap(hijax_sqrt), jax.vmap(optx_sqrt),
          (a,), jnp.sqrt(a), repeat, rows)
  compare("scalar-root grad", jax.vmap(jax.grad(hijax_sqrt)),
          jax.vmap(jax.grad(optx_sqrt)), (a,), 0.5 / jnp.sqrt(a), repeat, rows)

  key = jax.random.key(0)
  A = jax.random.normal(key, (200, 200)) / 200 ** 0.5 + 2 * jnp.eye(200)
  b = jnp.ones(200)
  x_ref = jnp.linalg.solve(A, b)
  compare("dense-200 value", hijax_dense, lx_dense, (A, b), x_ref, repeat,
          rows)
  g_ref = jax.grad(lambda A: jnp.linalg.solve(A, b).sum())(A)
  compare("dense-200 grad", jax.grad(lambda A, b: hijax_dense(A, b).sum()),
          jax.grad(lambda A, b: lx_dense(A, b).sum()), (A, b), g_ref, repeat,
          rows)

  compare("dense-natural value", hijax_dense_natural, lx_dense, (A, b), x_ref,
          repeat, rows)
  compare("dense-natural grad",
          jax.grad(lambda A, b: hijax_dense_natural(A, b).sum()),
          jax.grad(lambda A, b: lx_dense(A, b).sum()), (A, b), g_ref, repeat,
          rows)

  Q = jax.random.normal(key, (200, 200)) / 200 ** 0.5
  S = Q @ Q.T + jnp.eye(200)
  compare("cg-200 value", hijax_cg, lx_cg, (S, b), jnp.linalg.solve(S, b),
          repeat, rows)
  gs_ref = jax.grad(lambda S: jnp.linalg.solve(S, b).sum())(S)
  compare("cg-200 grad", jax.grad(lambda S, b: hijax_cg(S, b).sum()),
          jax.grad(lambda S, b: lx_cg(S, b).sum()), (S, b), gs_ref, repeat,
          rows)

  M = jax.random.normal(key, (50, 50)) / 50 ** 0.5 + 3 * jnp.eye(50)
  c = jnp.linspace(-1, 1, 50)
  p = (M, c)
  x = hijax_newton(p)
  J = M + 0.1 * jnp.diag(1 - jnp.tanh(x) ** 2)
  compare("newton-50 jacrev", lambda c: jax.jacrev(hijax_newton)((M, c))[1],
          lambda c: jax.jacrev(optx_newton)((M, c))[1], (c,),
          jnp.linalg.inv(J), repeat, rows)
  loss = lambda solve: lambda c: jnp.sum(solve((M, c)) ** 2)
  v = jnp.ones(50)
  hvp = lambda solve: lambda c: jax.jvp(jax.grad(loss(solve)), (c,), (v,))[1]
  hvp_ref = jax.jit(hvp(unrolled_newton))(c)
  compare("newton-50 hvp", hvp(hijax_newton), hvp(optx_newton), (c,),
          hvp_ref, repeat, rows)

  fp_ref = jnp.linalg.solve(jnp.eye(3) - FP_PARAMS["A"], FP_PARAMS["c"])
  fp_grad_ref = jnp.linalg.solve((jnp.eye(3) - FP_PARAMS["A"]).T,
                                 jnp.ones(3))
  with_c = lambda solve: lambda c: solve(dict(FP_PARAMS, c=c))
  compare("fixed-point value", with_c(hijax_fp), with_c(optx_fp),
          (FP_PARAMS["c"],), fp_ref, repeat, rows)
  compare("fixed-point grad",
          jax.grad(lambda c: with_c(hijax_fp)(c).sum()),
          jax.grad(lambda c: with_c(optx_fp)(c).sum()), (FP_PARAMS["c"],),
          fp_grad_ref, repeat, rows)

  # eager: no jit around the call (as in a notebook)
  eager_ours = best(hijax_fp, FP_PARAMS, repeat=repeat)
  eager_peer = best(optx_fp, FP_PARAMS, repeat=repeat)
  jitted = jax.jit(hijax_fp)
  jitted_ours = best(jitted, FP_PARAMS, repeat=repeat)
  # an eager call returns when its result is ready (a failed solve raises
  # there), so compare it with a jitted call that is waited for too
  jitted_blocked = best(lambda p: jax.block_until_ready(jitted(p)), FP_PARAMS,
                        repeat=repeat)

  # eager, a lambda written again at each call (as in a loop or a cell)
  w0, y = jnp.float32(1.), jnp.float32(2.)
  ours_lambda = lambda: root(lambda w, y: w * jnp.exp(w) - y, w0, y)
  peer_lambda = lambda: optx.root_find(
      lambda w, y: w * jnp.exp(w) - y, optx.Newton(rtol=1e-6, atol=1e-6), w0,
      y).value
  lambda_ours = best(ours_lambda, repeat=repeat)
  lambda_peer = best(peer_lambda, repeat=min(repeat, 3), number=1)

  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, float32; "
        "ratio = peer time / hijax time (>1: hijax faster)"
        + (f"; STUBBED OUT: {', '.join(stubbed)}" if stubbed else "")
        + ("; CPU time" if options.clock == "cpu" else ""))
  print(f"{'problem':<20} {'jit ratio':>9} {'compile':>8} {'hijax err':>10} "
        f"{'peer err':>10} {'hijax time':>11}")
  for name, r, cr, e1, e2, t in rows:
    print(f"{name:<20} {r:9.2f} {cr:8.2f} {e1:10.1e} {e2:10.1e} "
          f"{t * 1e6:9.0f}us")
  if options.compile:
    print(f"compile, best of {COMPILE_ROUNDS} rounds alternated (ms: trace "
          "and lower + XLA's compile):")
    print(f"{'problem':<20} {'ratio':>6} {'hijax':>17} {'peer':>17}")
    for name, c in COMPILED.items():
      (lo, co), (plo, pco) = c["hijax"], c["peer"]
      print(f"{name:<20} {(plo + pco) / (lo + co):6.2f} "
            f"{(lo + co) * 1e3:6.0f} ({lo * 1e3:3.0f}+{co * 1e3:3.0f}) "
            f"{(plo + pco) * 1e3:6.0f} ({plo * 1e3:3.0f}+{pco * 1e3:3.0f})")
  print(f"{'eager fixed_point':<20} {eager_peer / eager_ours:9.2f} "
        f"{'':>8} {'':>10} {'':>10} {eager_ours * 1e6:9.0f}us")
  t = {r[0]: r[5] for r in rows}
  for what in ("value", "grad"):
    print(f"dense-200 {what}: the natural form (A @ x) / MatMul(): "
          f"{t['dense-natural ' + what] / t['dense-200 ' + what]:.2f} (time)")
  print(f"{'eager-lambda root':<20} {lambda_peer / lambda_ours:9.2f} "
        f"{'':>8} {'':>10} {'':>10} {lambda_ours * 1e6:9.0f}us")
  print(f"eager / jitted call of hijax fixed_point: "
        f"{eager_ours / jitted_blocked:.2f} (each call waited for), "
        f"{eager_ours / jitted_ours:.2f} (jitted calls queued)")
  _timing.save(options, "bench_implicit", {
      "stubbed": stubbed,
      "rows": {name: {"ratio": r, "compile ratio": cr, "hijax seconds": t}
               for name, r, cr, e1, e2, t in rows},
      "eager fixed_point": {"ratio": eager_peer / eager_ours,
                            "hijax seconds": eager_ours},
      "eager-lambda root": {"ratio": lambda_peer / lambda_ours,
                            "hijax seconds": lambda_ours}}, options.clock)


if __name__ == "__main__":
  main()
