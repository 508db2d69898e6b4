"""The fixed cost of one jitted call, and what a host callback adds to it.

Run: python bench/bench_call_cost.py [--repeat 5] [--n 3] [--clock cpu]

A solve with ``throw=True`` (hijax's default, and optimistix's) holds a host
callback that raises if the solve failed; with ``throw=False`` it holds
none. On a CPU a callback costs microseconds; on an accelerator each call
that holds one waits for a round trip to the host. This prints the time
per jitted call (steady state, best of ``--repeat`` loops, blocking on the
result) of:

  add              ``x + 1``: the backend's fixed cost of a call
  add+io_callback  the same with an unordered ``io_callback`` returning a bool
                   that runs on every call
  add+cond(io_callback)
                   the same callback in a branch that is never taken (the
                   shape of hijax's throw=True check)
  jnp.solve        ``jnp.linalg.solve`` of an n x n system
  hijax throw=True / throw=False
                   ``hijax.implicit.linear_solve`` of the same system (Dense)
  root throw=True / throw=False
                   a scalar Newton square root, hijax, vmapped over 1,000 values
  optx root throw=True / throw=False
                   the same with optimistix (if installed)

and the ratios that say where a call's time goes.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import _timing
from hijax.implicit import Dense, linear_solve, root

try:
  import optimistix as optx
except ImportError:  # pragma: no cover
  optx = None


def per_call(fn, *args, repeat=5):
  """Best seconds per call of the jitted ``fn(*args)``, blocking on each result
  (so that a callback's round trip, which happens while the result is made,
  is counted as a user who reads every result pays it)."""
  return _timing.best(fn, *args, repeat=repeat, wait_each=True, clock=clock)


clock = time.perf_counter  # --clock cpu: this process's CPU time instead


def _true(x):
  return np.bool_(True)


def add(x):
  return x + 1


def add_with_callback(x):
  flag = io_callback(_true, jax.ShapeDtypeStruct((), jnp.bool_), x[0],
                     ordered=False)
  return jnp.where(flag, x + 1, x)


def add_with_untaken_callback(x):
  # the shape of hijax's throw=True check: the callback sits in a branch
  # that runs only if a test fails (here never)
  bad = jnp.any(jnp.isnan(x))
  def call(x):
    return io_callback(_true, jax.ShapeDtypeStruct((), jnp.bool_), x[0],
                       ordered=False)
  flag = jax.lax.cond(bad, call, lambda x: jnp.bool_(True), x)
  return jnp.where(flag, x + 1, x)


def sq_residual(x, a):
  return x * x - a


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeat", type=int, default=5)
  parser.add_argument("--n", type=int, default=3)
  parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
  _timing.add_save_option(parser)
  options = parser.parse_args()
  global clock
  clock = time.process_time if options.clock == "cpu" else time.perf_counter
  r = options.repeat
  key = jax.random.key(0)
  n = options.n
  A = jax.random.normal(key, (n, n)) / n ** 0.5 + 2 * jnp.eye(n)
  b = jnp.ones(n)
  x = jnp.ones(n)
  a = jnp.linspace(0.5, 4.0, 1000)

  def solve(throw):
    def f(A, b):
      out = linear_solve(lambda x, A: A @ x, b, A, solver=Dense(), throw=throw)
      return out if throw else out[0]
    return jax.jit(f)

  def sqrt_root(throw):
    def one(a):
      out = root(sq_residual, jnp.float32(1.0), a, throw=throw)
      return out if throw else out[0]
    return jax.jit(jax.vmap(one))

  times = {
      "add": per_call(jax.jit(add), x, repeat=r),
      "add+io_callback": per_call(jax.jit(add_with_callback), x, repeat=r),
      "add+cond(io_callback)": per_call(jax.jit(add_with_untaken_callback),
                                        x, repeat=r),
      "jnp.solve": per_call(jax.jit(jnp.linalg.solve), A, b, repeat=r),
      "hijax throw=True": per_call(solve(True), A, b, repeat=r),
      "hijax throw=False": per_call(solve(False), A, b, repeat=r),
      "root throw=True": per_call(sqrt_root(True), a, repeat=r),
      "root throw=False": per_call(sqrt_root(False), a, repeat=r),
  }
  if optx is not None:
    def optx_root(throw):
      def one(a):
        return optx.root_find(sq_residual, optx.Newton(rtol=1e-6, atol=1e-6),
                              jnp.float32(1.0), a, throw=throw).value
      return jax.jit(jax.vmap(one))
    times["optx root throw=True"] = per_call(optx_root(True), a, repeat=r)
    times["optx root throw=False"] = per_call(optx_root(False), a, repeat=r)

  device = jax.devices()[0]
  print(f"jax {jax.__version__}, {device.platform} ({device.device_kind}), "
        f"{n}x{n} system; microseconds per jitted call, best of {r}")
  for name, t in times.items():
    print(f"{name:24s} {t * 1e6:10.1f} us")
  print(f"io_callback adds                {(times['add+io_callback'] - times['add']) * 1e6:8.1f} us a call")
  print(f"an untaken one adds            {(times['add+cond(io_callback)'] - times['add']) * 1e6:8.1f} us a call")
  print(f"hijax throw=True / throw=False  {times['hijax throw=True'] / times['hijax throw=False']:8.2f}")
  print(f"hijax throw=False / jnp.solve   {times['hijax throw=False'] / times['jnp.solve']:8.2f}")
  print(f"root throw=True / throw=False   {times['root throw=True'] / times['root throw=False']:8.2f}")
  if optx is not None:
    print(f"optx root throw=True / False    {times['optx root throw=True'] / times['optx root throw=False']:8.2f}")
    print(f"optx / hijax root, throw=True   {times['optx root throw=True'] / times['root throw=True']:8.2f}")
    print(f"optx / hijax root, throw=False  {times['optx root throw=False'] / times['root throw=False']:8.2f}")
  _timing.save(options, "bench_call_cost", {"seconds": times}, options.clock)


if __name__ == "__main__":
  main()
