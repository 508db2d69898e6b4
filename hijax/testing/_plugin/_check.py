"""Checking the rules a test suite called (`._recorder`) with `check_rules`,
at the inputs recorded, within a time budget; one verdict
per rule.

Inputs: `hijax.testing._plugin._inputs`. A sample whose function raises, or
returns a value that is not finite, at its inputs is not checked (finite
differences mean nothing there; a test may call a function where it raises
on purpose): it is reported, and the rule is inconclusive if no other
sample was checked. Where what raised is hijax's check of a rule's output
(`RuleTypeError`: an `expand` that returns another type than declared),
the rule is failed.

Dtypes: `check_rules` checks in float64 where the function runs in it. A
rule that raises in float64 only (a library that checks the types of what
its functions get: equinox's closure-converted functions) is checked again
in the dtypes the tests called it with, and that check is reported. Values
a test passed in float64 (under ``jax.enable_x64``) are checked with x64
on.

Dtypes the tests used: a sample whose floating-point inputs are float32
(or narrower) is checked in float64 on the host, and every part of the
checks' program is evaluated again in the sample's own dtypes and compared
with float64 (`check_rules`' ``device``, here the CPU), so a rule that is
right in float64 and wrong in float32 fails.

Batching: where the tests called the rule under ``vmap``, ``vmap`` is
checked at the ``in_axes`` they used (``batch_in_axes``), and a failure
there fails the rule. Where they never did, every combination is checked,
and a failure is an advisory (`Tried.advisory`): listed, not failing (no
caller of the suite batched it so).

Declared deliberate (`Declaration`, from the ``hijax_deliberate`` ini
lines): a surrogate's rules are compared with each other only; the checks
(modes) named are not run; the outputs named are left out of the function
checked (a residual whose tangent is zero by design).

An implicit rule (one of the call's non-array arguments is the condition
its outputs solve) called at outputs that are not a root is not judged
there: the implicit function theorem holds at roots only (`_not_a_root`).

Inputs that are not finite (an ``inf`` a test passed on purpose) are not
checked: finite differences cannot step from them.

Verdict of a rule: failed if a sample failed (the first failure is shown:
the rule at fault, the check, the worst element, the input); else passed if
a sample passed; else inconclusive if a sample's check was; else skipped
for time if a sample was not started for time; else inconclusive, with why
no sample could be checked.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import time
import traceback
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from hijax import testing
from hijax import RuleTypeError
from hijax.testing._plugin._inputs import as_jax, candidates, ordered
from hijax.testing._plugin._recorder import RecordedRule, Sample
from hijax.testing._plugin._rule_identity import named_function, unwrap


# check_rules stops within this many times its time budget (a compile
# running at its end is abandoned at 1.4 times): it gets what is left of
# the rule's budget divided by this, so that a check started within the
# budget ends within it.
OVERRUN = 1.5


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
  surrogate: bool = False  # check_rules checked it as a surrogate
  test: str = ""  # the test that made the call
  by_intent: list[str] = dataclasses.field(default_factory=list)
  # the checks check_rules listed as skipped ("mode: why"), e.g. the
  # combinations of batched arguments a partial batch rule refuses
  skipped: list[str] = dataclasses.field(default_factory=list)
  # failures of checks no caller of the suite reaches (vmap at in_axes the
  # tests never used): reported, not failing
  advisory: list[str] = dataclasses.field(default_factory=list)

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


@dataclasses.dataclass
class Declaration:
  """What a rule's ``hijax_deliberate`` lines declare (see the module
  docstring): a surrogate, checks (modes) not to run, outputs (flat
  indices, or paths like ``out[1]``) left out."""
  surrogate: bool = False
  skip: set[str] = dataclasses.field(default_factory=set)
  outputs: set[str] = dataclasses.field(default_factory=set)


# --- check_rules ------------------------------------------------------------

def _why_inconclusive(report: testing.RuleReport) -> str:
  return "; ".join(report.why_inconclusive()[:2])


def _check_rules(fn: Callable, arrays: Sequence[Any], seconds: float,
                 progress: Callable[[str], None] | None,
                 surrogates: list[Any], x64: bool | None = None,
                 **options: Any) -> testing.RuleReport:
  """`check_rules` quietly, without raising for a verdict; ``modes`` that
  the rules do not define are dropped."""
  modes = options.pop("modes", None)
  while True:
    try:
      with _quiet():
        return testing.check_rules(
            fn, *arrays, raise_on_failure=False, accept_inconclusive=True,
            time_budget=seconds, progress=progress or False, x64=x64,
            surrogates=surrogates, modes=modes, **options)
    except ValueError as e:
      undefined = re.match(r"mode '(\w+)' was requested", str(e))
      if modes is None or undefined is None:
        raise
      modes = [m for m in modes if m != undefined.group(1)]


@contextlib.contextmanager
def _quiet():
  """Warnings ignored (a suite's ``filterwarnings = error`` applies at the
  end of the session too), what the checked functions print
  (``jax.debug.print`` in a loop body) dropped, and the suite's settings
  that the checks' own arithmetic cannot run under set back to JAX's
  defaults: strict dtype promotion (the checks mix float64 references
  with the tests' float32 and complex64 values) and ``jax_debug_nans`` /
  ``jax_debug_infs`` (finite differences step to where a function is not
  finite, and say so)."""
  sink = io.StringIO()
  with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
      contextlib.redirect_stderr(sink), \
      jax.numpy_dtype_promotion("standard"), jax.debug_nans(False), \
      jax.debug_infs(False):
    warnings.simplefilter("ignore")
    yield


def _a_rule_raised(report) -> bool:
  return any(f.error is not None for f in report.failures)


def _is_vmap(failure) -> bool:
  return "vmap" in failure.rule or "vmap" in failure.check


def _without_advisories(report, tried: Tried) -> None:
  """Moves the batching failures of ``report`` to ``tried.advisory``, and
  out of what its verdict requires."""
  keep = [f for f in report.failures if not _is_vmap(f)]
  tried.advisory = [one_line(f"{f.rule}: {f.check}: {f.detail}", f.error)
                    + f" [{f.inputs.splitlines()[-1]}]"
                    for f in report.failures if _is_vmap(f)]
  if tried.advisory:
    report.failures[:] = keep
    report.required[:] = [r for r in report.required
                          if "vmap" not in r or report.compared.get(r)]


def one_line(text: str, error: BaseException | None = None) -> str:
  """The first line of ``text``, and where it holds a Python traceback
  (a callback's error that JAX passes on), the exception at its end
  (in ``error``'s text, where the report cut it) instead of the
  traceback."""
  head, sep, rest = text.partition("Traceback (most recent call last):")
  if sep and error is not None:
    rest = str(error).partition("Traceback (most recent call last):")[2]
  if sep:
    last = [ln.strip() for ln in rest.splitlines() if ln.strip()
            and not ln.startswith(" ") and ln.strip() != "..."]
    head = head + (last[-1] if last else "(a traceback)")
  return (head.splitlines() or [""])[0][:300]


def _traceback(error: BaseException | None) -> str:
  if error is None:
    return ""
  return "".join(traceback.format_exception(error))


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

def check_rule(rule: RecordedRule, seconds: float,
               declared: Declaration | None = None,
               progress: Callable[[str], None] | None = None,
               seed: int = 0) -> RuleResult:
  """Checks ``rule`` at its samples within ``seconds`` (see the module
  docstring)."""
  declared = declared or Declaration()
  surrogate = declared.surrogate
  start = time.process_time()
  result = RuleResult(rule, "skipped for time", surrogate=surrogate)
  rng = np.random.default_rng(seed)
  for sample in ordered(rule):
    left = seconds - (time.process_time() - start)
    if sample.source == "too large to keep":
      result.tried.append(Tried(sample.types(), sample.source, "not checked",
                                f"over {sample.size} elements"))
      continue
    tried = Tried(sample.types(), sample.source, "skipped for time",
                  test=sample.test)
    result.tried.append(tried)
    if not any(x is not None for x in sample.leaves):
      tried.verdict, tried.detail = "not checked", "no array inputs"
      continue
    if left <= 0:
      continue
    t0 = time.process_time()
    _check_sample(rule, sample, candidates(rule, sample, rng), tried,
                  declared, progress, start + seconds)
    tried.seconds = time.process_time() - t0
  result.seconds = time.process_time() - start
  result.surrogate = surrogate or any(t.surrogate for t in result.tried)
  _conclude(result)
  return result


def _runs_at(sample: Sample, arrays: list[Any]) -> tuple[str, bool]:
  """Why ``sample``'s function cannot be checked at ``arrays`` ("" if it
  can), and whether that is a rule's fault: hijax's check of what a rule
  returned raised (`RuleTypeError`: an `expand` of another type than
  declared)."""
  for x in arrays:
    a = np.asarray(x)
    if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
      return ("an input is not finite (a test passed inf or nan): finite "
              "differences cannot step from it", False)
  try:
    with _quiet():
      out = sample.call(arrays)
  except Exception as e:  # pylint: disable=broad-except  (reported)
    return (f"the function raises at these inputs: {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}",
            isinstance(e, RuleTypeError))
  if _not_finite(out):
    return "the function's output is not finite at these inputs", False
  return "", False


def _wide(sample: Sample) -> bool:
  """Whether the tests called it with 64-bit values (under x64)."""
  def bits(dtype):
    d = np.dtype(dtype)
    return d.itemsize * 8 // (2 if d.kind == "c" else 1)
  return any(hasattr(x, "dtype") and bits(x.dtype) == 64
             for x in sample.leaves)


def _narrow(sample: Sample) -> bool:
  """Whether the tests called it with floating-point values of 32 bits or
  fewer (and none of 64)."""
  kinds = [np.dtype(x.dtype) for x in sample.leaves
           if hasattr(x, "dtype") and np.dtype(x.dtype).kind in "fc"]
  return bool(kinds) and not _wide(sample)


def _without_outputs(fn: Callable, outputs: set[str]) -> Callable:
  """``fn`` returning its output leaves but those named in ``outputs`` (a
  flat index, or a path like ``out[1]``), as a tuple."""
  def kept(*args):
    paths = jax.tree_util.tree_flatten_with_path(fn(*args))[0]
    return tuple(leaf for i, (path, leaf) in enumerate(paths)
                 if str(i) not in outputs
                 and "out" + jax.tree_util.keystr(path) not in outputs)
  return kept


def _check_sample(rule, sample, tries, tried, declared, progress,
                  deadline) -> None:
  # values the tests passed in float64 (int64) are checked with x64 on, as
  # they were called (a primitive built for float64 refuses float32)
  with jax.enable_x64(True) if _wide(sample) else contextlib.nullcontext():
    _check_sample_at(rule, sample, tries, tried, declared, progress,
                     deadline)


def _options(rule, sample, arrays, declared) -> dict[str, Any]:
  """`check_rules`' options for ``sample``: the modes not declared
  skipped, the in_axes the tests used, and the tests' own dtypes."""
  options: dict[str, Any] = {}
  if declared.skip:
    options["modes"] = [m for m in testing.MODES if m not in declared.skip]
  patterns = [p for p in rule.batched.get(sample.treedef, ())
              if len(p) == len(arrays)]
  if patterns:
    options["batch_in_axes"] = sorted(patterns, key=repr)
  if _narrow(sample) and jax.devices()[0].platform == "cpu":
    options["device"] = jax.devices("cpu")[0]
  return options


def _left(deadline: float) -> float:
  """The time budget to give `check_rules` by ``deadline`` (CPU time):
  what is left, less what it may run over (`OVERRUN`)."""
  return (deadline - time.process_time()) / OVERRUN


def _check_sample_at(rule, sample, tries, tried, declared, progress,
                     deadline) -> None:
  why, rule_at_fault, arrays = "", False, []
  for arrays, source in tries:
    arrays = as_jax(arrays)
    tried.source = source
    why, rule_at_fault = _runs_at(sample, arrays)
    if not why:
      break
  if why:
    tried.verdict = "failed" if rule_at_fault else "not checked"
    tried.detail = why
    return
  def fn(*a):
    return sample.call(list(a))
  if declared.outputs:
    fn = _without_outputs(fn, declared.outputs)
  names = surrogate_arguments(rule, sample) if declared.surrogate else []
  options = _options(rule, sample, arrays, declared)
  try:
    if _left(deadline) <= 0:
      tried.detail = "calling the function spent the rule's budget"
      return
    report = _check_rules(fn, arrays, _left(deadline), progress, names,
                          **options)
    if _a_rule_raised(report) and _left(deadline) > 0:
      again = _check_rules(fn, arrays, _left(deadline), progress,
                           names, x64=False, **options)
      if not _a_rule_raised(again):
        tried.source += "; in its own dtypes (its rules raise in float64)"
        report = again
  except Exception as e:  # pylint: disable=broad-except  (reported)
    tried.verdict = "inconclusive"
    tried.detail = (f"check_rules raised {type(e).__name__}: "
                    f"{one_line(str(e))[:200]}")
    return
  if "batch_in_axes" not in options:
    _without_advisories(report, tried)
  if report.failures and not _a_rule_raised(report):
    outside = _not_a_root(sample, arrays)
    if outside:
      tried.verdict, tried.detail = "not checked", outside
      return
  tried.verdict = report.verdict
  tried.surrogate = bool(report.surrogates)
  tried.by_intent = list(report.by_intent)
  tried.skipped = [f"{mode}: {why}" for mode, why in report.skipped]
  tried.failures = [{"rule": f.rule, "check": f.check, "inputs": f.inputs,
                     "detail": one_line(f.detail, f.error),
                     "max_error": f.max_error,
                     "traceback": _traceback(f.error)}
                    for f in report.failures]
  if report.failures:
    f = report.failures[0]
    at = f.inputs.splitlines()[0] if f.inputs else ""
    tried.detail = (f"{f.rule}: {f.check}: {one_line(f.detail, f.error)}"
                    + (f" [{at}]" if at else ""))
  elif tried.verdict == "inconclusive" and report.skipped_for_time:
    tried.verdict = "skipped for time"  # (what it judged was not enough)
    tried.detail = (f"the budget ran out during its checks "
                    f"({len(report.skipped_for_time)} not run)")
  elif tried.verdict == "inconclusive":
    tried.detail = _why_inconclusive(report)


def _not_a_root(sample: Sample, arrays: list[Any]) -> str:
  """Why ``sample`` judges nothing of an implicit rule ("" if it may): a
  function among the call's non-array arguments takes the outputs, then
  the array inputs (the condition ``condition(*outputs, *inputs) = 0``
  the outputs solve), and is not about 0 there."""
  with _quiet():
    out = sample.call(arrays)
  outs = out if isinstance(out, tuple) else (out,)
  scale = max([1.0] + [float(np.max(np.abs(x))) for x in
                       jax.tree.leaves((outs, arrays)) if np.size(x)])
  for condition in jax.tree.leaves(list(sample.statics.values())):
    if not isinstance(condition, types.FunctionType):
      continue
    try:
      with _quiet():
        value = [np.abs(np.asarray(x)) for x in
                 jax.tree.leaves(condition(*outs, *arrays)) if np.size(x)]
    except Exception:  # pylint: disable=broad-except  (not a condition)
      continue
    size = max((float(np.max(x)) for x in value), default=0.0)
    if size > 1e-3 * scale:
      name = condition.__name__
      return (f"the outputs are not a root of {name} at these inputs "
              f"(|{name}(outputs, inputs)| = {size:.3g}): an implicit "
              "rule's derivative holds at roots only, so this input judges "
              "nothing")
  return ""


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
    result.detail = next((t.detail for t in by_verdict["skipped for time"]
                          if t.detail), "")
  elif "not checked" in by_verdict:
    result.verdict = "inconclusive"
    details = [t.detail for t in by_verdict["not checked"]]
    result.detail = next((d for d in details if d != "no array inputs"),
                         details[0])
  else:
    result.verdict = "inconclusive"
    result.detail = "no call with inputs that can be checked"
