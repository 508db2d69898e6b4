"""`check_rule`: a recorded rule checked by `check_rules` at its samples
(types only: `candidates`) within a CPU-time budget, in the tests' dtypes
and ``in_axes``; one verdict: failed if a sample failed, else passed if one
passed, else inconclusive, else skipped for time."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import signal
import sys
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from hijax import RuleTypeError, testing
from hijax.testing._plugin._recorder import (RecordedRule, Sample,
                                             named_function, unwrap)

OVERRUN = 1.5  # check_rules overruns its time budget by at most this factor
CHECK_COST = 5  # a sample's checks cost about this many times its call
DRAW_RANGE = (0.1, 0.9)  # where inputs are drawn where no call showed values
DRAW_INTEGERS = (1, 3)  # likewise integers (then 0 where those raise)
STOP_AGAIN = 0.1  # CPU s from a stop to the next, until the block ends
_SOURCE_ORDER = ("eager", "traced, values known", "traced, values at run time",
                 "traced", "too large to keep")
_TRACEBACK = "Traceback (most recent call last):"
_VERDICTS = ("failed", "passed", "inconclusive", "skipped for time",
             "not checked")


class _OutOfTime(BaseException):
  """The rule's CPU time ran out during a check (`_stop_at`)."""


@contextlib.contextmanager
def _stop_at(seconds: float):
  """Raises `_OutOfTime` after ``seconds`` CPU, again each `STOP_AGAIN` s
  (Python drops one raised in a ``__del__`` or gc callback: not reported as
  unraisable, which pytest would warn of) to the end."""
  if not hasattr(signal, "setitimer") or (
      threading.current_thread() is not threading.main_thread()):
    yield
    return
  armed = [True]  # (cleared by the block's end: then a late tick does nothing)

  def stop(signum, frame):  # (not while a stop's cleanups run)
    if armed and not isinstance(sys.exception(), _OutOfTime):
      raise _OutOfTime()
  hook = sys.unraisablehook

  def dropped(unraisable):
    if not isinstance(unraisable.exc_value, _OutOfTime):
      hook(unraisable)
  previous = signal.signal(signal.SIGPROF, stop)
  sys.unraisablehook = dropped
  signal.setitimer(signal.ITIMER_PROF, max(seconds, 1e-3), STOP_AGAIN)
  try:
    yield
  finally:
    armed.clear()
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.signal(signal.SIGPROF, previous)
    sys.unraisablehook = hook


@dataclasses.dataclass
class Tried:
  """One sample as checked (``advisory``: vmap failures no test reaches)."""
  types: list[str]
  source: str
  verdict: str
  detail: str = ""
  seconds: float = 0.0
  failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  surrogate: bool = False
  test: str = ""
  by_intent: list[str] = dataclasses.field(default_factory=list)
  skipped: list[str] = dataclasses.field(default_factory=list)
  advisory: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RuleResult:
  """The verdict of one rule."""
  rule: RecordedRule
  verdict: str  # passed, failed, inconclusive, skipped for time
  detail: str = ""
  tried: list[Tried] = dataclasses.field(default_factory=list)
  surrogate: bool = False
  seconds: float = 0.0


@dataclasses.dataclass
class Declaration:
  """A rule's ``hijax_deliberate`` lines: surrogate (with a reference:
  ``(name, function)``), modes, outputs."""
  surrogate: bool = False
  skip: set[str] = dataclasses.field(default_factory=set)
  outputs: set[str] = dataclasses.field(default_factory=set)
  reference: tuple[str, Callable] | None = None


def _drawn(spec: jax.ShapeDtypeStruct, rng: np.random.Generator,
           lo: float | None = None, hi: float | None = None) -> Any:
  """Uniform in ``[lo, hi]`` (if not given `DRAW_RANGE`, or `DRAW_INTEGERS`:
  a value ignored only at 0 is then seen); booleans False."""
  kind = np.dtype(spec.dtype).kind
  lo, hi = (DRAW_INTEGERS if kind in "iu" else DRAW_RANGE) if (
      lo is None or hi is None) else (lo, hi)
  if kind in "biu":
    return np.zeros(spec.shape, bool) if kind == "b" else rng.integers(
        int(lo), int(hi), spec.shape, endpoint=True).astype(spec.dtype)
  value = rng.uniform(lo, hi, spec.shape)
  return (value + 1j * rng.uniform(lo, hi, spec.shape) if kind == "c"
          else value).astype(spec.dtype)


def _from_calls(spec: jax.ShapeDtypeStruct, seen: list[Any],
                rng: np.random.Generator) -> tuple[Any, str] | None:
  if same := [x for x in seen if np.shape(x) == tuple(spec.shape)]:
    return np.asarray(same[0]).astype(spec.dtype), "values of another call"
  if not (seen := [np.asarray(x).real for x in seen if np.size(x)]):
    return None
  return _drawn(spec, rng, min(np.min(x) for x in seen), max(
      np.max(x) for x in seen)), ("drawn" if np.dtype(
          spec.dtype).kind == "b" else "drawn in the range seen")


def candidates(rule: RecordedRule, sample: Sample,
               rng: np.random.Generator) -> list[tuple[list[Any], str]]:
  """``(array inputs, where from)`` to try: per leaf another call's value of
  its shape, else drawn in their range, else drawn; then all drawn."""
  if sample.concrete:
    return [([x for x in sample.leaves if x is not None], sample.source)]
  others = [s for s in rule.samples.values()
            if s.concrete and s.treedef == sample.treedef]
  from_calls, drawn, zeros, hows = [], [], [], set()
  for i, x in enumerate(sample.leaves):
    found = isinstance(x, jax.ShapeDtypeStruct) and _from_calls(
        x, [s.leaves[i] for s in others if s.leaves[i] is not None], rng)
    if x is not None:
      drawn.append(_drawn(x, rng) if found is not False else x)
      from_calls.append(found[0] if found else drawn[-1])
      hows.add(found[1] if found else "drawn" if found is None else "")
      zeros.append(np.zeros_like(drawn[-1]) if found is not False and np.dtype(
          x.dtype).kind in "iu" else drawn[-1])
  how = next(h for h in ("drawn", "drawn in the range seen",
                         "values of another call") if h in hows)
  return [(from_calls, f"{sample.source}; {how}")] + (
      [(drawn, f"{sample.source}; drawn")] if how != "drawn" else []) + (
          [(zeros, f"{sample.source}; drawn, integers 0")]
          if any(z is not x for z, x in zip(zeros, drawn)) else [])


def _not_finite(values: Any) -> bool:
  return not all(np.all(np.isfinite(x)) for x in map(
      np.asarray, jax.tree.leaves(values)) if x.dtype.kind in "fc")


def _bits(sample: Sample) -> set[int]:
  """The widths of the floating-point (and integer) inputs' dtypes."""
  return {d.itemsize * 8 // (2 if d.kind == "c" else 1) for d in (
      np.dtype(x.dtype) for x in sample.leaves if hasattr(x, "dtype"))
          if d.kind in "fciu"}


@contextlib.contextmanager
def _quiet():
  """No warnings or prints; strict promotion, debug_nans/infs and
  disable_jit (the checks compile) off."""
  sink = io.StringIO()
  with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
      contextlib.redirect_stderr(sink), jax.numpy_dtype_promotion("standard"), \
      jax.debug_nans(False), jax.debug_infs(False), jax.disable_jit(False):
    warnings.simplefilter("ignore")
    yield


def _check_rules(fn: Callable, arrays: list[Any], seconds: float,
                 progress: Callable[[str], None] | None,
                 surrogates: list[Any], **options: Any) -> testing.RuleReport:
  """`check_rules` quietly, not raising; undefined ``modes`` dropped."""
  modes = options.pop("modes", None)
  while True:
    try:
      with _quiet():
        return testing.check_rules(
            fn, *arrays, raise_on_failure=False, accept_inconclusive=True,
            time_budget=seconds, progress=progress or False,
            surrogates=surrogates, modes=modes, **options)
    except ValueError as e:
      if modes is None or not (undefined := re.match(
          r"mode '(\w+)' was requested", str(e))):
        raise
      modes.remove(undefined.group(1))


def one_line(text: str, error: BaseException | None = None) -> str:
  """The first line of ``text``, or of the exception ending its traceback."""
  head, sep, rest = text.partition(_TRACEBACK)
  if sep:
    rest = rest if error is None else str(error).partition(_TRACEBACK)[2]
    last = [ln.strip() for ln in rest.splitlines() if ln.strip()
            and not ln.startswith(" ") and ln.strip() != "..."]
    head += last[-1] if last else "(a traceback)"
  return (head.splitlines() or [""])[0][:300]


def is_surrogate(rule: RecordedRule, obj: Any) -> bool:
  """Whether ``obj`` (or what it decorates or holds) is ``rule``."""
  if isinstance(obj, type):
    return obj is rule.identity.target
  found = [obj, unwrap(obj)] + ([obj.fun, named_function(obj.fun)] if getattr(
      obj, "fun", None) is not None else []) + [
          f for v in getattr(obj, "__dict__", {}).values()
          if callable(v) and not isinstance(v, type)
          for f in (v, named_function(getattr(v, "fun", v)))]
  return any(f is g for f in found for g in [
      rule.identity.target, rule.identity.fun,
      *(s.fn for s in rule.samples.values())])


def check_rule(rule: RecordedRule, seconds: float,
               declared: Declaration | None = None,
               progress: Callable[[str], None] | None = None,
               pace: float = 1.0) -> RuleResult:
  """Checks ``rule`` within ``seconds`` CPU (``pace``: wall s per CPU s)."""
  declared, start = declared or Declaration(), time.process_time()
  result, rng = RuleResult(rule, "skipped for time"), np.random.default_rng(0)
  for sample in sorted(rule.samples.values(), key=lambda s: (
      _SOURCE_ORDER.index(s.source), s.size)):
    tried = Tried(sample.types(), sample.source, "skipped for time",
                  test=sample.test)
    result.tried.append(tried)
    left = seconds - (time.process_time() - start)
    prim = rule.identity.kind == "Primitive"
    why = (f"over {sample.size} elements"
           if sample.source == "too large to keep" else "no array inputs"
           if all(x is None for x in sample.leaves) else (
               "bound inside jit (values unknown): a primitive's inputs may "
               "depend on each other (a solver's state on its operator), so "
               "drawn values would judge nothing; it is checked at the "
               "values its program ran with, where the program ran while "
               "recording (not with --hijax-no-values-inside-jit)")
           if prim and not sample.concrete else (
               "differentiating it raised in the tests too: not "
               "differentiable on purpose") if prim and rule.refused else
           "no test differentiated it at inputs of these types" if prim
           and not rule.differentiated.get(sample.treedef) else "")
    if why:
      tried.verdict, tried.detail = "not checked", why
    elif left > 0 and CHECK_COST * sample.seconds > left:
      tried.detail = (f"its call took {sample.seconds:.2g} s CPU in the test; "
                      f"its checks, about {CHECK_COST} times that, would "
                      "overrun the rule's budget")
    elif left > 0:
      t0 = time.process_time()
      with jax.enable_x64(True) if 64 in _bits(sample) else (
          contextlib.nullcontext()):  # as called: float64 stays float64
        try:
          with _stop_at(left):
            _check_sample(rule, sample, candidates(rule, sample, rng),
                          tried, declared, progress, (start + seconds, pace))
        except _OutOfTime:
          tried.verdict, tried.detail = (
              "skipped for time", "stopped where the rule's budget ran out")
      tried.seconds = time.process_time() - t0
  result.seconds = time.process_time() - start
  result.surrogate = declared.surrogate or any(
      t.surrogate for t in result.tried)
  best = min(result.tried, default=None, key=lambda t: (  # its detail first
      _VERDICTS.index(t.verdict), not t.detail, t.detail == "no array inputs"))
  result.verdict, result.detail = ("inconclusive", (
      "no call with inputs that can be checked")) if best is None else (
          {"not checked": "inconclusive"}.get(best.verdict, best.verdict),
          best.detail)
  return result


def _checked(rule, sample, arrays, declared) -> tuple[Callable, list, dict]:
  """What `check_rules` checks (less the declared outputs), its inputs (a
  primitive's that the tests differentiated) and options."""
  def left_out(i, path):
    path = "out" + jax.tree_util.keystr(path)
    return str(i) in declared.outputs or any(
        path == o or path.startswith(o) and path[len(o)] in "[."
        for o in declared.outputs)

  def fn(*a):
    if rule.identity.kind == "Primitive":
      given = dict(zip(keep, a))
      a = tuple(given.get(i, x) for i, x in enumerate(arrays))
    out = sample.call(list(a))
    if declared.reference:  # then its derivatives are the rule's less its
      out = jax.tree.map(lambda o, r: o - r, out, sample.call(
          list(a), declared.reference[1]))
    if not declared.outputs:
      return out
    paths, tree = jax.tree_util.tree_flatten_with_path(out)
    return jax.tree.unflatten(tree, [None if left_out(i, path) else leaf
                                     for i, (path, leaf) in enumerate(paths)])
  options: dict[str, Any] = {}  # a reference's second order means nothing
  if skip := declared.skip | ({"second_order"} if declared.reference
                              else set()):  # (it stops gradients)
    options["modes"] = [m for m in testing.MODES if m not in skip]

  keep = ([i for i in sorted(rule.differentiated[sample.treedef])
           if _moves(sample, arrays, i)]
          if rule.identity.kind == "Primitive" else range(len(arrays)))
  if patterns := {tuple(p[i] for i in keep) for p in rule.batched.get(
      sample.treedef, ()) if len(p) == len(arrays)}:
    options["batch_in_axes"] = sorted(patterns, key=repr)
  if (bits := _bits(sample)) and max(bits) <= 32 and any(
      np.dtype(x.dtype).kind in "fc" for x in sample.leaves
      if hasattr(x, "dtype")) and jax.devices()[0].platform == "cpu" and (
          not declared.reference):  # (a difference of about 0: no ulps)
    options["device"] = jax.devices("cpu")[0]
  return fn, [arrays[i] for i in keep], options


def _moves(sample: Sample, arrays: list[Any], i: int) -> bool:
  """Whether nudging ``arrays[i]`` moves the output (a solver's impl may
  read its operator only through its state: then its jvp rule is not)."""
  x = np.asarray(arrays[i])
  nudged = [*arrays[:i], jax.numpy.asarray(
      (x + 1e-3 * (1 + np.abs(x))).astype(x.dtype)), *arrays[i + 1:]]
  try:
    with _quiet():
      return not all(np.array_equal(a, b) for a, b in zip(
          jax.tree.leaves(sample.call(arrays)),
          jax.tree.leaves(sample.call(nudged))))
  except Exception:  # pylint: disable=broad-except  (then it is checked)
    return True


def _check_sample(rule, sample, tries, tried, declared, progress,
                  deadline) -> None:
  why, at_fault = "", False
  for arrays, tried.source in tries:  # the first where it runs and is finite
    arrays = [jax.numpy.asarray(x) if isinstance(x, (np.ndarray, np.generic))
              else x for x in arrays]  # (as the tests passed them)
    why, at_fault = ("an input is not finite (a test passed inf or nan): "
                     "finite differences cannot step from it", False)
    try:
      with _quiet():
        if not _not_finite(arrays):
          why = ("the function's output is not finite at these inputs"
                 if _not_finite(sample.call(arrays)) else "")
    except Exception as e:  # pylint: disable=broad-except  (reported)
      why, at_fault = (f"the function raises at these inputs: "
                       f"{type(e).__name__}: "
                       f"{(str(e).splitlines() or [''])[0][:200]}",
                       isinstance(e, RuleTypeError))
    if not why:
      break
  else:
    tried.verdict, tried.detail = "failed" if at_fault else "not checked", why
    return
  names = ([type(sample.fn) if rule.identity.kind == "HiPrim" else
            getattr(sample.fn, "custom_jvp", sample.fn)]
           if declared.surrogate and not declared.reference else [])
  fn, checked, options = _checked(rule, sample, arrays, declared)
  if not checked:
    tried.verdict, tried.detail = "not checked", (
        "its output does not move with the inputs the tests differentiated "
        "(at these values): they reach it through other inputs (a solver's "
        "state computed from its operator), which the checks hold fixed")
    return
  left = lambda: (deadline[0] - time.process_time()) / OVERRUN * deadline[1]
  raised = lambda report: any(f.error is not None for f in report.failures)
  if left() <= 0:
    tried.detail = "calling the function spent the rule's budget"
    return
  try:
    report = _check_rules(fn, checked, left(), progress, names, **options)
    if raised(report) and left() > 0:
      again = _check_rules(fn, checked, left(), progress, names,
                           x64=False, **options)
      if not raised(again):
        tried.source += "; in its own dtypes (its rules raise in float64)"
        report = again
  except Exception as e:  # pylint: disable=broad-except  (reported)
    tried.verdict, tried.detail = "inconclusive", (
        f"check_rules raised {type(e).__name__}: {one_line(str(e))[:200]}")
    return
  if "batch_in_axes" not in options:  # failures no caller reaches
    keep = [f for f in report.failures if "vmap" not in f"{f.rule} {f.check}"]
    tried.advisory = [one_line(f"{f.rule}: {f.check}: {f.detail}", f.error)
                      + f" [{f.inputs.splitlines()[-1]}]"
                      for f in report.failures if not any(f is k for k in keep)]
    if tried.advisory:
      report.failures[:] = keep
      report.required[:] = [r for r in report.required
                            if "vmap" not in r or report.compared.get(r)]
  failures = report.failures
  if rule.identity.kind == "Primitive" and failures and all(
      f.error is not None for f in failures):
    tried.verdict, tried.detail = "inconclusive", (  # (refused on purpose?)
        f"its rules raised ({failures[0].check}: "
        f"{one_line(failures[0].detail, failures[0].error)}): a "
        "library primitive may refuse a transformation on purpose")
    return
  if (failures and not raised(report) and rule.identity.kind != "Primitive"
      and (outside := _not_a_root(sample, arrays))):
    tried.verdict, tried.detail = "not checked", outside
    return
  tried.verdict, tried.surrogate = report.verdict, bool(report.surrogates)
  tried.by_intent = list(report.by_intent)
  tried.skipped = [f"{mode}: {why}" for mode, why in report.skipped]
  tried.failures = [{"rule": f.rule, "check": f.check, "inputs": f.inputs,
                     "detail": one_line(f.detail, f.error),
                     "max_error": f.max_error,
                     "traceback": "" if f.error is None else "".join(
                         traceback.format_exception(f.error))}
                    for f in failures]
  if failures:
    f, at = failures[0], failures[0].inputs.partition("\n")[0]
    tried.detail = (f"{f.rule}: {f.check}: {one_line(f.detail, f.error)}"
                    + (f" [{at}]" if at else ""))
    if declared.reference:
      tried.detail = (f"against the reference {declared.reference[0]} (the "
                      f"difference checked): {tried.detail}")
  elif tried.verdict == "inconclusive" and report.skipped_for_time:
    tried.verdict, tried.detail = "skipped for time", (  # (judged too little)
        f"the budget ran out during its checks "
        f"({len(report.skipped_for_time)} not run)")
  elif tried.verdict == "inconclusive":
    tried.detail = "; ".join(report.why_inconclusive()[:2])


def _not_a_root(sample: Sample, arrays: list[Any]) -> str:
  """Why an implicit rule is not judged here: ``condition(*outputs,
  *inputs)``, a function argument, is not about 0 ("" if it is)."""
  biggest = lambda tree: max((float(np.max(np.abs(x))) for x in
                              jax.tree.leaves(tree) if np.size(x)), default=0.)
  with _quiet():
    out = sample.call(arrays)
  outs = out if isinstance(out, tuple) else (out,)
  scale = max(1.0, biggest((outs, arrays)))
  for condition in jax.tree.leaves(list(sample.statics.values())):
    try:
      with _quiet():
        size = biggest(condition(*outs, *arrays)) if isinstance(
            condition, types.FunctionType) else 0.0
    except Exception:  # pylint: disable=broad-except  (not a condition)
      continue
    if size > 1e-3 * scale:
      name = condition.__name__
      return (f"the outputs are not a root of {name} at these inputs "
              f"(|{name}(outputs, inputs)| = {size:.3g}): an implicit "
              "rule's derivative holds at roots only, so this input judges "
              "nothing")
  return ""
