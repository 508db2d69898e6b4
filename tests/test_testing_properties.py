"""Property tests of check_rules's verdicts: correct zoo primitives at random
magnitudes and dtypes pass (no false alarm), and one-line mutations of their
rules (a tangent or cotangent scaled by 2, 1/2 or -1) are caught, unless the
report says that finite differences could not resolve the point.

The default run is small (HIJAX_PROPERTY_EXAMPLES / 10 examples per test,
at least 8); run this file as a script to measure the false-alarm and miss
rates over many random draws:

    python tests/test_testing_properties.py 400
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hijax.testing import RuleCheckError, check_rules

import zoo

EXAMPLES = max(8, int(os.environ.get("HIJAX_PROPERTY_EXAMPLES", "150")) // 10)

# the elementwise zoo primitives, with the magnitudes they are defined at
# without overflow or saturation (where every derivative is 0 or 1, no
# scaled rule can be told from a right one)
MAGNITUDES = {
    "sin_derived": (-3, 6), "cube_lin": (-3, 6), "square": (-3, 6),
    "cube_sres": (-3, 6), "log1pexp": (-3, 1), "sech2": (-3, 0),
    "tanh": (-3, 0), "newton_sqrt": (-3, 6),
}
DTYPES = ("float64", "float32", "bfloat16")
# newton_sqrt iterates to a relative 1e-6: float64 only
ONLY_FLOAT64 = {"newton_sqrt"}
FACTORS = (2.0, 0.5, -1.0)


def _point(rng, name, log10_magnitude, dtype):
  m = 10.0 ** log10_magnitude * 10 ** rng.uniform(-0.5, 0.5, size=3)
  sign = 1 if name == "newton_sqrt" else rng.choice([-1.0, 1.0], size=3)
  return (sign * m).astype(jnp.dtype(dtype))


def _modes(entry):
  return tuple(m for m in ("jvp", "vjp", "lin") if m in entry.transforms)


def _check(fn, x, dtype, entry):
  return check_rules(fn, x, x64=dtype == "float64", modes=_modes(entry),
                     order=1, raise_on_failure=False)


def mutate(entry, rule, factor):
  """The primitive of ``entry`` with one rule's output scaled by ``factor``:
  the tangent of ``jvp`` or ``linearized``, or the cotangents of
  ``vjp_bwd_retval`` / ``vjp_bwd``. None if the class has no such rule."""
  prim = jax.make_jaxpr(entry.fn)(*entry.args()).jaxpr.eqns[0].params["_prim"]
  base = type(prim)
  if rule == "jvp" and "jvp" in entry.transforms:
    def jvp(self, primals, tangents):
      out, t = base.jvp(self, primals, tangents)
      return out, factor * zoo.inst(t)
    body = {"jvp": jvp}
  elif rule == "linearized" and "lin" in entry.transforms:
    def linearized(self, res, *t):
      return factor * zoo.inst(base.linearized(self, res, *t))
    body = {"linearized": linearized}
  elif rule == "vjp" and "vjp_bwd" in base.__dict__:
    def vjp_bwd(self, res, *args):
      *rest, g, acc = args  # scaling g scales the accumulated cotangent
      return base.vjp_bwd(self, res, *rest, factor * zoo.inst(g), acc)
    body = {"vjp_bwd": vjp_bwd}
  elif rule == "vjp" and "vjp" in entry.transforms:
    def vjp_bwd_retval(self, res, g):
      cts = base.vjp_bwd_retval(self, res, g)
      return tuple(None if c is None else factor * zoo.inst(c) for c in cts)
    body = {"vjp_bwd_retval": vjp_bwd_retval}
  else:
    return None
  cls = type(f"{base.__name__}Mutant", (base,), body)
  params = dict(prim.params)
  if issubclass(base, zoo.FixedPoint):
    return lambda a: cls(jax.typeof(a), jax.typeof(a), **params)(a, a)
  return lambda x: cls(jax.typeof(x), **params)(x)


def _applies(name, dtype):
  return dtype == "float64" or name not in ONLY_FLOAT64


def _bounded(n):
  return settings(max_examples=n, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.filter_too_much],
                  print_blob=True)


draws = st.tuples(st.sampled_from(sorted(MAGNITUDES)), st.sampled_from(DTYPES),
                  st.floats(0, 1), st.integers(0, 2 ** 31 - 1)).filter(
                      lambda d: _applies(d[0], d[1]))


@_bounded(EXAMPLES)
@given(draws)
def test_correct_primitives_raise_no_false_alarm(draw):
  name, dtype, u, seed = draw
  entry = zoo.BY_NAME[name]
  lo, hi = MAGNITUDES[name]
  x = _point(np.random.default_rng(seed), name, lo + u * (hi - lo), dtype)
  report = _check(entry.fn, x, dtype, entry)
  # no false alarm (where finite differences resolve nothing, as sech² near
  # 0 in bfloat16, the verdict is inconclusive, not passed)
  assert report.verdict != "failed", "\n\n".join(
      str(f) for f in report.failures)


@_bounded(EXAMPLES)
@given(draws, st.sampled_from(("jvp", "linearized", "vjp")),
       st.sampled_from(FACTORS))
def test_mutated_rules_are_caught(draw, rule, factor):
  name, dtype, u, seed = draw
  entry = zoo.BY_NAME[name]
  fn = mutate(entry, rule, factor)
  if fn is None:
    return
  lo, hi = MAGNITUDES[name]
  x = _point(np.random.default_rng(seed), name, lo + u * (hi - lo), dtype)
  report = _check(fn, x, dtype, entry)
  assert not report.passed, (name, dtype, x, rule, factor, str(report))


def measure(n, seed=0):
  """False-alarm (failed) and miss (not failed) rates over ``n`` random
  draws each; a miss whose verdict is inconclusive is counted apart."""
  rng = np.random.default_rng(seed)
  alarms = misses = flagged = mutants = 0
  by_kind = {}
  for _ in range(n):
    name = rng.choice(sorted(MAGNITUDES))
    dtype = rng.choice(DTYPES)
    if not _applies(name, dtype):
      continue
    entry = zoo.BY_NAME[name]
    lo, hi = MAGNITUDES[name]
    x = _point(rng, name, rng.uniform(lo, hi), dtype)
    alarms += _check(entry.fn, x, dtype, entry).verdict == "failed"
    rule = rng.choice(["jvp", "linearized", "vjp"])
    factor = float(rng.choice(FACTORS + (1.1,)))
    fn = mutate(entry, rule, factor)
    if fn is None:
      continue
    mutants += 1
    report = _check(fn, x, dtype, entry)
    key = (dtype, factor)
    caught, total = by_kind.get(key, (0, 0))
    by_kind[key] = (caught + (report.verdict == "failed"), total + 1)
    if report.verdict != "failed":
      misses += 1
      flagged += report.verdict == "inconclusive"
  return dict(draws=n, false_alarms=alarms, mutants=mutants, misses=misses,
              misses_flagged_inconclusive=flagged,
              caught_by_dtype_and_factor=by_kind)


if __name__ == "__main__":
  print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 100))
