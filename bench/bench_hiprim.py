"""Overhead of hijax.HiPrim and hijax.custom_vjp against plain JAX, jax.custom_vjp and JAX's own HiPrim.

Run: python bench/bench_hiprim.py [--chain 200] [--repeat 5]

For each implementation of the same function (sin(x) * y with a custom VJP) it
times, taking the best of ``--repeat`` runs (7):

  (a) one eager call,
  (b) one eager ``jax.grad`` call,
  (c) ``jax.jit(jax.grad(f)).lower(...).compile()`` for a chain of ``--chain``
      applications,
  (d) for the two HiPrims only: constructing an instance, and constructing
      and hashing one,

then prints hijax's time divided by JAX's own HiPrim's (target: <= 1.1), and
``hijax.custom_vjp``'s divided by ``jax.custom_vjp``'s. The decorators are
then timed pairwise (``hijax.custom_vjp`` against ``jax.custom_vjp``,
``hijax.custom_jvp`` against ``jax.custom_jvp``, the same function and rules
under each, rounds interleaved): eager call, eager ``grad``, eager ``jvp``
(``custom_jvp`` only: JAX's ``custom_vjp`` has no forward mode) and
``jit(grad)`` compile, printed as hijax/JAX ratios (target: <= 1.0).
``--clock cpu`` times with the process's CPU time, which other processes on
a shared machine disturb less than the wall clock. It also
checks that the optimized HLO of ``jit(f)`` for a HiPrim equals that of its
``expand`` written as a plain function: the primitive costs nothing once lowered.
"""
from __future__ import annotations

import argparse
import re
import time

import jax
import jax.numpy as jnp

import _timing
import hijax

try:
  from jax.experimental import hijax as jax_hijax
except ImportError:  # pragma: no cover - every supported JAX has it
  jax_hijax = None


def applying(cls):
  """The function ``(x, y) -> cls(typeof(x), typeof(y))(x, y)``."""
  return lambda x, y: cls(jax.typeof(x), jax.typeof(y))(x, y)


def make_class(base):
  class SinTimesY(base.HiPrim):
    def __init__(self, x_aval, y_aval):
      self.in_avals = (x_aval, y_aval)
      self.out_aval = x_aval
      self.params = {}
      super().__init__()

    def expand(self, x, y):
      return jnp.sin(x) * y

    def vjp_fwd(self, nzs_in, x, y):
      return self(x, y), (jnp.cos(x), jnp.sin(x), y)

    def vjp_bwd_retval(self, res, g):
      cos_x, sin_x, y = res
      return cos_x * g * y, sin_x * g

  return SinTimesY


def plain(x, y):
  return jnp.sin(x) * y


@jax.custom_vjp
def with_custom_vjp(x, y):
  return jnp.sin(x) * y


def _fwd(x, y):
  return with_custom_vjp(x, y), (jnp.cos(x), jnp.sin(x), y)


def _bwd(res, g):
  cos_x, sin_x, y = res
  return cos_x * g * y, sin_x * g


with_custom_vjp.defvjp(_fwd, _bwd)


@hijax.custom_vjp
def with_hijax_custom_vjp(x, y):
  return jnp.sin(x) * y


def _hijax_fwd(x, y):
  return with_hijax_custom_vjp(x, y), (jnp.cos(x), jnp.sin(x), y)


with_hijax_custom_vjp.defvjp(_hijax_fwd, _bwd)


def _sin_times_y_jvp(f):
  """``f`` (sin(x) * y) with its jvp rule, for either decorator."""
  @f.defjvp
  def _(primals, tangents):
    x, y = primals
    tx, ty = tangents
    return f(x, y), jnp.cos(x) * tx * y + jnp.sin(x) * ty
  return f


with_custom_jvp = _sin_times_y_jvp(jax.custom_jvp(plain))
with_hijax_custom_jvp = _sin_times_y_jvp(hijax.custom_jvp(plain))

CLOCK = time.perf_counter


def chain(f, n):
  def g(x):
    for _ in range(n):
      x = f(x, x)
    return jnp.sum(x)
  return g


def time_once(thunk, number=1, wait=True):
  """Seconds per call of ``thunk``, over ``number`` calls; ``wait``: block
  until each result is ready (for JAX values; not for Python objects)."""
  t0 = CLOCK()
  for _ in range(number):
    out = thunk()
    if wait:
      jax.block_until_ready(out)
  return (CLOCK() - t0) / number


def workloads(f, n):
  """The three timed thunks for one implementation, warmed up."""
  x = jnp.linspace(0.1, 1.0, 16)
  loss = lambda x: jnp.sum(f(x, x))
  f(x, x)  # warm up op-by-op caches
  jax.grad(loss)(x)
  return [
      (lambda: f(x, x), 20),
      (lambda: jax.grad(loss)(x), 5),
      # A new function each time, so that no tracing or compilation cache helps.
      (lambda: jax.jit(jax.grad(chain(f, n))).lower(x).compile() and x, 1),
  ]


DECORATOR_PAIRS = {
    "custom_vjp": (with_hijax_custom_vjp, with_custom_vjp),
    "custom_jvp": (with_hijax_custom_jvp, with_custom_jvp),
}
DECORATOR_FIGURES = ("eager call", "eager grad", "eager jvp",
                     "jit(grad) compile")


def decorator_workloads(f, n, forward):
  """`workloads` and, with ``forward``, an eager ``jax.jvp`` (third)."""
  loads = workloads(f, n)
  if forward:
    x = jnp.linspace(0.1, 1.0, 16)
    jvp = lambda: jax.jvp(lambda x: f(x, x), (x,), (x,))  # noqa: E731
    jvp()  # warm up
    loads.insert(2, (jvp, 5))
  return loads


def measure_decorators(n, repeat):
  """``{decorator: {figure: hijax time / JAX time}}``, each figure the best
  of ``repeat`` interleaved rounds."""
  ratios = {}
  for kind, (ours, theirs) in DECORATOR_PAIRS.items():
    forward = kind == "custom_jvp"
    best = best_times({"hijax": decorator_workloads(ours, n, forward),
                       "jax": decorator_workloads(theirs, n, forward)},
                      repeat)
    figures = [f for f in DECORATOR_FIGURES if forward or f != "eager jvp"]
    ratios[kind] = {f: a / b for f, a, b in
                    zip(figures, best["hijax"], best["jax"])}
  return ratios


def print_decorator_ratios(ratios):
  for kind, figures in ratios.items():
    print(f"hijax.{kind} / jax.{kind}: " + ", ".join(
        f"{f} {r:.2f}" for f, r in figures.items()))
  worst = max(r for figures in ratios.values() for r in figures.values())
  print("decorators, target <= 1.0 (1.05 noise): "
        + ("met" if worst <= 1.05 else "NOT met"))


def best_times(loads, repeat, wait=True):
  """Best time per (name, workload) of ``loads = {name: [(thunk, number)]}``.
  Rounds interleave the names, so that drift in machine load affects them
  alike."""
  best = {name: [float("inf")] * len(thunks) for name, thunks in loads.items()}
  for _ in range(repeat):
    for name, thunks in loads.items():
      for i, (thunk, number) in enumerate(thunks):
        best[name][i] = min(best[name][i], time_once(thunk, number, wait))
  return best


def measure(impls, n, repeat):
  """Best time per (implementation, workload)."""
  return best_times({name: workloads(f, n) for name, f in impls.items()},
                    repeat)


def measure_construction(classes, repeat, number=20000):
  """Best time to construct an instance, and to construct and hash one (the
  first hash of an instance computes it), per class."""
  aval = jax.typeof(jnp.linspace(0.1, 1.0, 16))
  loads = {name: [(lambda cls=cls: cls(aval, aval), number),
                  (lambda cls=cls: hash(cls(aval, aval)), number)]
           for name, cls in classes.items()}
  return best_times(loads, repeat, wait=False)


def _optimized_hlo(f, *args):
  text = jax.jit(f).lower(*args).compile().as_text()
  # Debug metadata (source lines, Python names) differs; the computations from
  # the first one ("%...") on are what XLA runs.
  text = text[text.index("\n%"):]
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  return re.sub(r"jit_\w+", "jit_f", text)


def check_zero_lowering_overhead():
  f = applying(make_class(hijax))
  x = jnp.linspace(0.1, 1.0, 16)
  same = _optimized_hlo(f, x, x) == _optimized_hlo(plain, x, x)
  print(f"compiled HLO of jit(HiPrim) == jit(expand as a plain function): {same}")
  return same


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--chain", type=int, default=200)
  parser.add_argument("--repeat", type=int, default=7)
  parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                      help="wall clock, or this process's CPU time")
  _timing.add_save_option(parser)
  args = parser.parse_args()
  global CLOCK
  CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

  classes = {"hijax HiPrim": make_class(hijax)}
  if jax_hijax is not None:
    classes = {"jax HiPrim": make_class(jax_hijax), **classes}
  impls = {"jax.numpy": plain, "jax.custom_vjp": with_custom_vjp,
           "hijax.custom_vjp": with_hijax_custom_vjp,
           **{name: applying(cls) for name, cls in classes.items()}}

  print(f"jax {jax.__version__}, chain of {args.chain}, best of {args.repeat}")
  header = f"{'implementation':<18}{'eager call':>14}{'eager grad':>14}{'jit(grad) compile':>20}"
  print(header)
  results = measure(impls, args.chain, args.repeat)
  for name, (e, g, c) in results.items():
    print(f"{name:<18}{e * 1e6:>11.1f} us{g * 1e6:>11.1f} us{c * 1e3:>17.1f} ms")

  print("hijax.custom_vjp / jax.custom_vjp: " + ", ".join(
      f"{label} {a / b:.2f}" for label, a, b in
      zip(("eager call", "eager grad", "jit(grad) compile"),
          results["hijax.custom_vjp"], results["jax.custom_vjp"])))
  decorator_ratios = measure_decorators(args.chain, args.repeat)
  print_decorator_ratios(decorator_ratios)
  if "jax HiPrim" in results:
    ours, theirs = results["hijax HiPrim"], results["jax HiPrim"]
    ratios = [a / b for a, b in zip(ours, theirs)]
    print("hijax / jax HiPrim: " + ", ".join(
        f"{label} {r:.2f}" for label, r in
        zip(("eager call", "eager grad", "jit(grad) compile"), ratios)))
    build = measure_construction(classes, args.repeat)
    for name, (c, h) in build.items():
      print(f"{name:<16} construct {c * 1e6:.2f} us, construct and hash "
            f"{h * 1e6:.2f} us")
    build_ratios = [a / b for a, b in zip(build["hijax HiPrim"],
                                          build["jax HiPrim"])]
    print("hijax / jax HiPrim: construct {:.2f}, construct and hash {:.2f}"
          .format(*build_ratios))
    ratios += build_ratios
    print("target <= 1.1: " + ("met" if max(ratios) <= 1.1 else "NOT met"))
  ok = check_zero_lowering_overhead()
  workloads_ = ("eager call", "eager grad", "jit(grad) compile")
  figures = {name: dict(zip(workloads_, times)) for name, times in results.items()}
  if "jax HiPrim" in results:
    for name, times in build.items():
      figures[name].update(zip(("construct", "construct and hash"), times))
  _timing.save(args, "bench_hiprim", {"seconds": figures, "same HLO": ok,
                                      "decorator ratios": decorator_ratios},
               clock=args.clock)
  raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
  main()
