"""Checking the rules a test suite called (`hijax.testing._recorder`) with
`check_rules`, at the inputs recorded, within a time budget; one verdict
per rule.

Inputs. A rule's samples are checked in this order: values from eager
calls, then values JAX knew while tracing (an eager ``grad``), then calls
seen only as types. For those the values are taken, leaf by leaf, from
another call of the same rule with the same structure: its value where the
shape is the same, else values drawn uniformly between the smallest and the
largest seen; where no call of the rule had values, floating-point inputs
are drawn uniformly from [0.1, 0.9] (inside the domain of ``log``,
``sqrt``, ``arcsin``, ``logit``...), integers are 0 and booleans False. The
table says which inputs were drawn.

A sample whose function raises, or returns a value that is not finite, at
its inputs is not checked (finite differences mean nothing there): it is
reported, and the rule is inconclusive if no other sample was checked.

Verdict of a rule: failed if a sample failed (the first failure is shown:
the check, the rule, the worst element); else passed if a sample passed;
else skipped for time if no sample was started; else inconclusive, with why.
"""
from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from hijax import testing
from hijax.testing._recorder import RecordedRule, Sample
from hijax.testing._rule_identity import named_function, unwrap

# The interval floating-point inputs are drawn from, where no call of the
# rule showed values.
DRAW_RANGE = (0.1, 0.9)

_SOURCE_ORDER = {"eager": 0, "traced, values known": 1, "traced": 2,
                 "too large to keep": 3}


@dataclasses.dataclass
class Tried:
  """One sample as checked: its input types, where the values came from,
  and its verdict (with the detail)."""
  types: list[str]
  source: str
  verdict: str
  detail: str = ""
  seconds: float = 0.0
  failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)

  def describe(self) -> str:
    return f"{', '.join(self.types) or 'no arrays'} ({self.source})"


@dataclasses.dataclass
class RuleResult:
  """The verdict of one rule."""
  rule: RecordedRule
  verdict: str  # passed, failed, inconclusive, skipped for time
  detail: str = ""
  tried: list[Tried] = dataclasses.field(default_factory=list)
  surrogate: bool = False
  seconds: float = 0.0


# --- the checker's API, with a fallback until issue 46 lands ---------------

def _verdict(report) -> str:
  verdict = getattr(report, "verdict", None)
  if verdict is not None:
    return verdict
  if report.failures:
    return "failed"
  return "passed" if report.ran else "inconclusive"


def _why_inconclusive(report) -> str:
  if report.inconclusive:
    return report.inconclusive[0]
  if report.skipped_for_time:
    return f"skipped for time: {report.skipped_for_time[0]}"
  if not report.ran:
    return "nothing could be compared"
  return "; ".join(f"{m}: {why}" for m, why in report.skipped[:2])


def _check_rules(fn: Callable, arrays: Sequence[Any], seconds: float,
                 progress: Callable[[str], None] | None,
                 surrogates: list[Any]):
  kwargs: dict[str, Any] = dict(raise_on_failure=False, time_budget=seconds,
                                progress=progress or False)
  accepts = inspect.signature(testing.check_rules).parameters
  if "accept_inconclusive" in accepts:
    kwargs["accept_inconclusive"] = True
  if surrogates:
    if "surrogates" in accepts:
      kwargs["surrogates"] = surrogates
    else:  # before check_rules knew surrogates: compare nothing to the function
      kwargs["modes"] = ("expand",)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return testing.check_rules(fn, *arrays, **kwargs)


def _failure_dict(f) -> dict[str, Any]:
  return {"rule": f.rule, "check": f.check, "inputs": f.inputs,
          "detail": f.detail, "max_error": f.max_error}


# --- inputs ----------------------------------------------------------------

def _ordered(rule: RecordedRule) -> list[Sample]:
  return sorted(rule.samples.values(),
                key=lambda s: (_SOURCE_ORDER.get(s.source, 9), s.size))


def _draw(spec: jax.ShapeDtypeStruct, seen: list[Any],
          rng: np.random.Generator) -> tuple[Any, str]:
  """A value of type ``spec`` (see the module docstring) and how it was
  found."""
  dtype = np.dtype(spec.dtype)
  same = [x for x in seen if np.shape(x) == tuple(spec.shape)]
  if same:
    return np.asarray(same[0]).astype(dtype), "values of another call"
  if dtype.kind == "b":
    return np.zeros(spec.shape, dtype), "drawn"
  if dtype.kind in "iu":
    low = min((int(np.min(x)) for x in seen if np.size(x)), default=0)
    return np.full(spec.shape, low, dtype), "drawn"
  seen_values = [np.asarray(x).real for x in seen if np.size(x)]
  if seen_values:
    lo = float(min(np.min(x) for x in seen_values))
    hi = float(max(np.max(x) for x in seen_values))
    how = "drawn in the range seen"
  else:
    (lo, hi), how = DRAW_RANGE, "drawn"
  value = rng.uniform(lo, hi, spec.shape)
  if dtype.kind == "c":
    value = value + 1j * rng.uniform(lo, hi, spec.shape)
  return value.astype(dtype), how


def values_for(rule: RecordedRule, sample: Sample,
               rng: np.random.Generator) -> tuple[list[Any], str]:
  """The array inputs to check ``sample`` at, and where they came from."""
  if sample.concrete:
    return [x for x in sample.leaves if x is not None], sample.source
  others = [s for s in rule.samples.values() if s.concrete
            and s.treedef == sample.treedef]
  arrays, hows = [], set()
  for i, x in enumerate(sample.leaves):
    if x is None:
      continue
    if not isinstance(x, jax.ShapeDtypeStruct):
      arrays.append(x)
      continue
    value, how = _draw(x, [s.leaves[i] for s in others
                           if s.leaves[i] is not None], rng)
    arrays.append(value)
    hows.add(how)
  for how in ("drawn", "drawn in the range seen", "values of another call"):
    if how in hows:
      return arrays, f"{sample.source}; {how}"
  return arrays, sample.source


def _not_finite(out: Any) -> bool:
  for leaf in jax.tree.leaves(out):
    a = np.asarray(leaf)
    if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
      return True
  return False


# --- surrogates ------------------------------------------------------------

def _functions_of(obj: Any) -> list[Any]:
  """What a name in ``hijax_surrogates`` may stand for: the object, the
  function it decorates (and the one that names it), and the functions
  and decorated functions a wrapper object holds as attributes."""
  found = [obj, unwrap(obj)]
  fun = getattr(obj, "fun", None)
  if fun is not None:
    found += [fun, named_function(fun)]
  if hasattr(obj, "__dict__") and not isinstance(obj, type):
    for v in vars(obj).values():
      if callable(v) and not isinstance(v, type):
        found += [v, named_function(getattr(v, "fun", v))]
  return found


def is_surrogate(rule: RecordedRule, objects: Sequence[Any]) -> bool:
  """Whether one of ``objects`` names ``rule``."""
  target = rule.identity.target
  samples = [s.fn for s in rule.samples.values()]
  for obj in objects:
    if isinstance(obj, type):
      if obj is target:
        return True
      continue
    for f in _functions_of(obj):
      if f is target or any(f is s for s in samples):
        return True
  return False


def surrogate_arguments(rule: RecordedRule, sample: Sample) -> list[Any]:
  """What to name in ``check_rules(surrogates=...)`` for ``sample``."""
  if rule.identity.kind == "HiPrim":
    return [type(sample.fn)]
  return [sample.fn]


# --- one rule --------------------------------------------------------------

def check_rule(rule: RecordedRule, seconds: float, surrogate: bool,
               progress: Callable[[str], None] | None = None,
               seed: int = 0) -> RuleResult:
  """Checks ``rule`` at its samples within ``seconds`` (see the module
  docstring)."""
  start = time.monotonic()
  result = RuleResult(rule, "skipped for time", surrogate=surrogate)
  rng = np.random.default_rng(seed)
  for sample in _ordered(rule):
    left = seconds - (time.monotonic() - start)
    if sample.source == "too large to keep":
      result.tried.append(Tried(sample.types(), sample.source, "not checked",
                                f"over {sample.size} elements"))
      continue
    arrays, source = values_for(rule, sample, rng)
    tried = Tried(sample.types(), source, "skipped for time")
    result.tried.append(tried)
    if not arrays:
      tried.verdict, tried.detail = "not checked", "no array inputs"
      continue
    if left <= 0:
      continue
    t0 = time.monotonic()
    _check_sample(rule, sample, arrays, tried, left, surrogate, progress)
    tried.seconds = time.monotonic() - t0
  result.seconds = time.monotonic() - start
  _conclude(result)
  return result


def _check_sample(rule, sample, arrays, tried, seconds, surrogate,
                  progress) -> None:
  def fn(*a):
    return sample.call(list(a))
  try:
    out = fn(*arrays)
  except Exception as e:  # pylint: disable=broad-except  (reported)
    tried.verdict = "not checked"
    tried.detail = (f"the function raises at these inputs: "
                    f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return
  if _not_finite(out):
    tried.verdict = "not checked"
    tried.detail = "the function's output is not finite at these inputs"
    return
  try:
    report = _check_rules(fn, arrays, seconds, progress,
                          surrogate_arguments(rule, sample) if surrogate
                          else [])
  except Exception as e:  # pylint: disable=broad-except  (reported)
    tried.verdict = "inconclusive"
    tried.detail = (f"check_rules raised {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200] if str(e) else ''}")
    return
  tried.verdict = _verdict(report)
  tried.failures = [_failure_dict(f) for f in report.failures]
  if report.failures:
    f = report.failures[0]
    at = f.inputs.splitlines()[0] if f.inputs else ""
    tried.detail = (f"{f.rule}: {f.check}: {f.detail.splitlines()[0]}"
                    + (f" [{at}]" if at else ""))
  elif tried.verdict == "inconclusive":
    tried.detail = _why_inconclusive(report)


def _conclude(result: RuleResult) -> None:
  by_verdict: dict[str, list[Tried]] = {}
  for t in result.tried:
    by_verdict.setdefault(t.verdict, []).append(t)
  for verdict in ("failed", "passed", "inconclusive"):
    if verdict in by_verdict:
      result.verdict = verdict
      result.detail = by_verdict[verdict][0].detail
      return
  if "skipped for time" in by_verdict:
    result.verdict = "skipped for time"
  elif "not checked" in by_verdict:
    result.verdict = "inconclusive"
    result.detail = by_verdict["not checked"][0].detail
  else:
    result.verdict = "inconclusive"
    result.detail = "no call with inputs that can be checked"
