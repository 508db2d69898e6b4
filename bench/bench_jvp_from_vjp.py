"""The cost of ``jvp = jvp_from_vjp`` against a hand-written ``jvp``.

Run: python bench/bench_jvp_from_vjp.py [--chain 100] [--size 1000] [--repeat 5]
[--clock cpu]

The same primitive (sin(x) * y with reverse-mode rules) is given forward mode
twice: by a hand-written ``jvp``, and by ``jvp = jvp_from_vjp``, which runs
``vjp_fwd`` and transposes the backward rule (after checking its jaxpr is
linear in the cotangent). For a chain of ``--chain`` applications it times,
best of ``--repeat``:

  (a) one eager ``jax.jvp`` call (the derived rule traces, checks and
      transposes the backward rule once per primitive, flags and residual
      types, and runs it compiled afterwards),
  (b) tracing and compiling ``jax.jit(jax.jvp(...))``,
  (c) running the compiled function on arrays of ``--size`` elements,
  (d) tracing and compiling ``jax.jit(jax.hessian(...))`` of a short chain,

and prints derived / hand-written for each, and the same ratio for the
number of instructions in the optimized HLO of (c). (c) near 1 means that once
compiled, forward mode from the backward rule costs what the hand-written rule
does; (a), (b) and (d) are the price of the extra tracing. ``--clock cpu``
times the process's CPU time instead of wall time (steadier on a shared
machine; pin to one core with ``taskset -c 0``).
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import _timing
from hijax import HiPrim, jvp_from_vjp


class SinTimesY(HiPrim):
  def __init__(self, x_aval, y_aval):
    self.in_avals, self.out_aval, self.params = (x_aval, y_aval), x_aval, {}
    super().__init__()

  def expand(self, x, y):
    return jnp.sin(x) * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (jnp.cos(x), jnp.sin(x), y)

  def vjp_bwd_retval(self, res, g):
    cos_x, sin_x, y = res
    return cos_x * g * y, sin_x * g

  def batch_dim_rule(self, axis_data, in_dims):
    return next(d for d in in_dims if d is not None)


class Derived(SinTimesY):
  jvp = jvp_from_vjp


class Hand(SinTimesY):
  def jvp(self, primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    return self(x, y), (jnp.cos(x) * y * dx + jnp.sin(x) * dy)


def chain(cls, n):
  def f(x):
    for _ in range(n):
      x = cls(jax.typeof(x), jax.typeof(x))(x, x)
    return x
  return f


clock = time.perf_counter  # --clock cpu: time.process_time


def best(thunk, repeat, number=1):
  times = []
  for _ in range(repeat):
    t0 = clock()
    for _ in range(number):
      jax.block_until_ready(thunk())
    times.append((clock() - t0) / number)
  return min(times)


def fresh_jit(f):
  """A new jitted function each time, so that nothing is cached."""
  return jax.jit(lambda *args: f(*args))


def hlo_instructions(f, *args) -> int:
  hlo = jax.jit(f).lower(*args).compile().as_text()
  return sum(1 for line in hlo.splitlines() if " = " in line)


def measure(cls, n, size, repeat):
  f = chain(cls, n)
  x, t = jnp.full(size, 0.3), jnp.ones(size)
  jvp = lambda x, t: jax.jvp(f, (x,), (t,))
  compiled = jax.jit(jvp).lower(x, t).compile()
  compiled(x, t)
  h = chain(cls, 5)
  loss = lambda x: jnp.sum(h(x))
  return [
      best(lambda: jvp(x, t), repeat),
      best(lambda: fresh_jit(jvp).lower(x, t).compile(), repeat),
      best(lambda: compiled(x, t), repeat, number=50),
      best(lambda: fresh_jit(jax.hessian(loss)).lower(x[:8]).compile(), repeat),
  ], hlo_instructions(jvp, x, t)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--chain", type=int, default=100)
  parser.add_argument("--size", type=int, default=1000)
  parser.add_argument("--repeat", type=int, default=5)
  parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
  _timing.add_save_option(parser)
  a = parser.parse_args()
  global clock
  clock = time.process_time if a.clock == "cpu" else time.perf_counter
  derived, derived_hlo = measure(Derived, a.chain, a.size, a.repeat)
  hand, hand_hlo = measure(Hand, a.chain, a.size, a.repeat)
  names = ("eager jvp", "jit(jvp) trace+compile", "compiled jvp run",
           "jit(hessian) trace+compile")
  print(f"jvp_from_vjp / hand-written jvp (chain of {a.chain}, size {a.size}, "
        f"best of {a.repeat}):")
  for name, d, h in zip(names, derived, hand):
    print(f"  {name:28s} {d / h:6.2f}   ({d * 1e3:.2f} ms vs {h * 1e3:.2f} ms)")
  print(f"  optimized HLO instructions   {derived_hlo / hand_hlo:6.2f}   "
        f"({derived_hlo} vs {hand_hlo})")
  _timing.save(a, "bench_jvp_from_vjp", {
      name: {"ratio": d / h, "seconds": d, "hand-written seconds": h}
      for name, d, h in zip(names, derived, hand)}, a.clock)


if __name__ == "__main__":
  main()
