"""One run of the checks, top to bottom: the dtype, the plan, the parts
compiled, the checks of each mode, the conclusions, the device's half."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._batching import add_batch_parts, check_batch
from hijax.testing._compiled import SECONDS_PER_RULE, BudgetSpent
from hijax.testing._checks import check_mode
from hijax.testing import _device
from hijax.testing._context import Point, Settings, Writer
from hijax.testing._device import describe
from hijax.testing._discovery import (CustomRules, custom_calls,
                                      find_custom_rules, find_hiprims)
from hijax.testing._numerics import is_float, on_device, wide
from hijax.testing._report import DERIVATIVE_MODES, RuleReport, first_lines
from hijax.testing._second_order import (Derived, add_derived,
                                         add_second_order_parts,
                                         check_second_order)


# --- one run -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Request:
  """What `check_rules` was asked, but the point."""
  prim_fn: Callable
  explicit: bool
  settings: Settings
  seed: int
  per_rule: bool  # the default budget: SECONDS_PER_RULE per rule checked
  host: Any = None

  def point(self, args, dtype) -> tuple[Point, Writer, list[str]]:
    """The point ``args`` (in ``dtype``), its report's writer, and the modes
    to run."""
    closed = jax.make_jaxpr(self.prim_fn)(*args)
    prims = find_hiprims(closed.jaxpr) or find_custom_rules(closed.jaxpr)
    if not prims:
      raise ValueError(
          "prim_fn binds no hijax primitive and calls no jax.custom_jvp or "
          "jax.custom_vjp function: pass a function that applies one, "
          "e.g. lambda x: MyPrim(jax.typeof(x))(x)")
    s = self.settings
    if self.per_rule:
      s.budget.seconds = SECONDS_PER_RULE * len(prims)
    paths = jax.tree_util.tree_flatten_with_path(args)[0]
    names = [f"args[{q[0].idx}]" + jax.tree_util.keystr(q[1:])
             for q, _ in paths]
    report = RuleReport([repr(q) for q in prims], dtype)
    report.surrogates = [repr(q) for q in prims if q in s.surrogates]
    report.devices["checks"] = describe(self.host or jax.devices()[0], dtype)
    p = Point.of(self.prim_fn, args, names, prims, s,
                 np.random.default_rng(self.seed))
    w = Writer(report, p, s)
    return p, w, plan_modes(p, s, w, self.explicit)


def in_dtype(x, dtype):
  """``x`` in ``dtype`` if it is floating (complex: of that precision), else
  in its own dtype, without a weak type."""
  own = jnp.result_type(x)
  if jnp.issubdtype(own, jnp.complexfloating):
    dtype = jnp.result_type(dtype, jnp.complex64)
  return on_device(np.asarray(x), dtype if jnp.issubdtype(own, jnp.inexact)
                   else own)


def _in_own_dtypes(args):
  """``args`` in their own dtypes, and the first floating dtype's name."""
  own = jax.tree.map(lambda x: in_dtype(x, jnp.result_type(x)), args)
  floats = [x.dtype for x in jax.tree.leaves(own) if is_float(x)]
  return own, str(floats[0]) if floats else None


def _device_point(request: Request, plan, own, own_dtype, accel,
                  ahead=True) -> Point | None:
  """The device's point of ``plan``, its compile started now (``ahead``: it
  runs while the host's half does); None where it cannot be made."""
  try:
    # float64 enabled only for float64 inputs (else a constant the function
    # makes would come out float64)
    with jax.default_device(accel), jax.enable_x64(own_dtype == "float64"):
      p, _, _ = request.point(own, own_dtype)
      add_parts(p, request.settings, plan)
      if ahead:
        p.compiled.bundle.compile_ahead()
    return p
  except Exception:  # pylint: disable=broad-except  (the device half reports it)
    if ahead:
      return None
    raise


def check(request: Request, args, x64: bool | None, accel) -> RuleReport:
  """One run of `check_rules` at ``args``: the dtype (float64 where prim_fn
  runs in it), the plan, the checks, the device's half."""
  s, budget = request.settings, request.settings.budget
  # the device's half runs the inputs in their own dtypes, on the device
  on_accel, accel_float = _in_own_dtypes(args) if accel else (None, None)
  accel_dtype = accel_float or "float32"
  devices: dict = {}  # plan -> the device's point, compiling ahead

  def device_ahead(plan):
    if accel is not None and tuple(plan) not in devices:
      devices[tuple(plan)] = _device_point(request, plan, on_accel,
                                           accel_dtype, accel)
  p = w = plan = made = derived = error = None
  host_done = False  # a stop in the device's half leaves no mode unrun
  try:
    with contextlib.ExitStack() as stack:
      if request.host is not None:
        stack.enter_context(jax.default_device(request.host))
      own, own_float = _in_own_dtypes(args)
      with jax.enable_x64(True):
        args64 = jax.tree.map(lambda x: in_dtype(x, jnp.float64), args)
      points = {True: (args64, "float64"),
                False: (own, own_float or "no floating-point inputs")}
      in64 = x64 is not False
      if x64 is None:  # the first dtype where it runs, else float64
        for in64 in (True, False):
          with jax.enable_x64(True) if in64 else contextlib.nullcontext():
            try:
              made = q, w, plan = request.point(*points[in64])
            except Exception:  # pylint: disable=broad-except
              continue
            p, derived = q, add_parts(q, s, plan) if s.jit else None
            device_ahead(plan)
            if _raised(lambda: q.compiled.evaluate([q.leaves]) if s.jit
                       else jax.jit(q.fn)(*q.args)) is None:
              break
        else:
          error = _raised(lambda: jax.jit(request.prim_fn)(*own))
          with jax.enable_x64(True):
            in64 = _raised(lambda: jax.make_jaxpr(request.prim_fn)(
                *args64)) is None
          made = derived = None
      if in64:
        stack.enter_context(jax.enable_x64(True))
      p, w, plan = made or request.point(*points[in64])
      if derived is None:
        derived = add_parts(p, s, plan)
      if error is None:
        device_ahead(plan)
      w.report.required = required_rules(p, s, plan)
      if not function_raises(p, w, plan, error):
        run(p, s, w, plan, derived)
      # a refusal by design (or a surrogate) in a program names the mode's
      # rules together, and would excuse them all: checked alone too
      if (w.report.failures or w.report.by_intent) and error is None:
        blame_alone(p, s, w)
        inner_first(p, w.report)
    if accel is not None and error is None and not budget.spent:
      host_done = True
      device_half(request, p, w, plan, on_accel, accel_dtype, accel,
                  devices.get(tuple(plan)))
  except BudgetSpent as e:
    assert p is not None and w is not None  # spent compiling the checks
    stopped(p, s, w, [] if host_done else plan, e)
  finally:
    budget.finish()
  w.report.seconds = budget.elapsed
  return w.report


def device_half(request: Request, p: Point, w: Writer, plan, own,
                own_dtype, accel, device: Point | None) -> None:
  """`check_on_device` for the host's point ``p``, against a float64 host
  point at ``own``."""
  x64, host64 = own_dtype == "float64", w.report.dtype == "float64"

  def host_settings():
    stack = contextlib.ExitStack()
    stack.enter_context(jax.enable_x64(host64))
    if request.host is not None:
      stack.enter_context(jax.default_device(request.host))
    return stack
  if device is None:
    device = _device_point(request, plan, own, own_dtype, accel, ahead=False)
  assert device is not None
  reference = p
  same = all(np.array_equal(wide(a), wide(b))
             for a, b in zip(jax.tree.leaves(own), p.leaves))
  if host64 and not same:
    with host_settings():
      reference, _, _ = request.point(jax.tree.map(
          lambda x: wide(x) if is_float(x) else np.asarray(x), own),
                                      "float64")
      add_parts(reference, request.settings, plan)
    reference.compiled.bundle.seen = p.compiled.bundle.seen

  def host_run(key, args):
    with host_settings():
      return reference.compiled.bundle.run(key, args)
  with jax.enable_x64(x64 or host64):
    _device.check_on_device(p, w, accel, device.compiled.bundle, own_dtype,
                            host_run, plan, device_x64=x64)


# --- plan ------------------------------------------------------------------

def plan_modes(p: Point, s: Settings, w: Writer, explicit) -> list[str]:
  """The modes to run; the others are reported as skipped. Naming a mode
  whose rule a primitive does not define is a ValueError."""
  to_run = []
  for mode in s.modes:
    if mode == "second_order":
      if s.order < 2:
        w.skip(mode, "order < 2")
      elif any(p.has(m) for m in DERIVATIVE_MODES if m in s.modes):
        to_run.append(mode)
      else:
        w.skip(mode, "no first-order derivative mode runs")
    elif p.has(mode):
      to_run.append(mode)
    elif explicit:
      missing = [type(q).__name__ for q, r in zip(p.prims, p.rules)
                 if mode not in r]
      raise ValueError(f"mode {mode!r} was requested, but {', '.join(missing)} "
                       f"define(s) no {mode} rule")
    else:
      w.skip(mode, "rule not defined")
  return to_run


def required_rules(p: Point, s: Settings, plan) -> list[str]:
  """The rules a pass needs compared conclusively: those of the modes
  planned that apply at this point."""
  return list(dict.fromkeys(
      p.rule_name(mode) for mode in plan if not (
          mode == "second_order"
          or mode in DERIVATIVE_MODES and not (p.float_idx
                                               and p.out_float_idx)
          or mode == "transpose" and not p.out_float_idx
          or mode == "expand" and p.fd_of != "expand" and s.jit)))


# The modes whose checks evaluate each derivative, in every direction (the
# first set) or in all floating-point inputs together (the second).
_USED_BY = {"jvp": ({"jvp", "vjp", "lin"}, {"batch", "second_order"}),
            "vjp": ({"vjp"}, {"batch", "second_order"}),
            "lin": ({"lin"}, set())}


def add_parts(p: Point, s: Settings, modes) -> list[Derived]:
  """Adds every program the checks of ``modes`` run to ``p``'s compiled
  program (nothing is traced yet); the derived functions the second-order
  mode checks."""
  if p.float_idx and p.out_float_idx:
    for kind, (each, together) in _USED_BY.items():
      if not p.has(kind):
        continue
      if each & set(modes):
        for direction in p.directions():
          p.add_derivative(kind, direction)
      elif together & set(modes):
        p.add_derivative(kind, tuple(p.float_idx))
  if "batch" in modes:
    add_batch_parts(p, s)
  if "second_order" in modes and p.float_idx and p.out_float_idx:
    add_second_order_parts(p, s)
    return add_derived(p, s, add_parts)
  return []


# --- run ---------------------------------------------------------------------

def run(p: Point, s: Settings, w: Writer, modes, derived: list[Derived]):
  """Runs the checks of ``modes`` (their parts added: `add_parts`); a mode
  that cannot apply (no floating-point inputs or outputs) is skipped."""
  # direction -> whether the jvp rule passed its check there: the vjp and
  # lin checks take the jvp rule as their reference where it did
  jvp_passed: dict = {}
  for mode in modes:
    if w.out_of_time(mode, "all its checks"):
      continue
    if mode in DERIVATIVE_MODES and not p.float_idx:
      w.skip(mode, "no floating-point inputs to differentiate")
    elif mode in DERIVATIVE_MODES + ("transpose",) and not p.out_float_idx:
      w.skip(mode, "no floating-point outputs")
    else:
      try:
        if mode == "batch":
          check_batch(p, s, w)
        elif mode == "second_order":
          check_second_order(p, s, w, derived, run)
        else:
          check_mode(p, s, w, mode, jvp_passed)
      except Exception as e:  # pylint: disable=broad-except  (e.g. prim_fn fails under jit)
        w.fail_raised(mode, f"running the {mode} checks",
                      p.describe_inputs(), e)


# --- judge and report --------------------------------------------------------

def _raised(fn: Callable[[], Any]) -> Exception | None:
  try:
    jax.block_until_ready(fn())
    return None
  except Exception as e:  # pylint: disable=broad-except
    return e


def function_raises(p: Point, w: Writer, plan,
                    error: Exception | None) -> bool:
  """Where a custom function raises at the point in every dtype, reports
  that (naming it); True if so."""
  if error is None or p.fd_of == "expand":
    return False
  name = getattr(p.fn, "__name__", None) or type(p.fn).__name__
  text = str(error).strip()
  last = text.splitlines()[-1] if text else ""
  detail = f"raised {type(error).__name__}: {first_lines(text, 3)}"
  if last and last not in detail:  # a callback's error ends its message
    detail += f"\n  ... {last}"
  w.fail("expand", "running the function at the input (in float64 and in "
         "the inputs' dtypes)", p.describe_inputs(),
         f"{detail}\nno rule was checked: check the function at an input "
         "where it runs", float("inf"),
         rule=f"{name} (the function checked)", error=error)
  w.report.skipped += [(mode, "the function raises at this input")
                       for mode in plan]
  return True


def stopped(p: Point, s: Settings, w: Writer, plan, e: BudgetSpent):
  """Ends a run stopped by a compile that would end past the hard limit:
  what did not run is skipped for time, and the report says why."""
  report = w.report
  if not report.required:
    report.required = required_rules(p, s, plan)
  done = set(report.modes_run)
  report.skipped_for_time += [f"the run stopped: {e}"] + [
      f"{mode}: the checks not yet run" for mode in plan if mode not in done]


def inner_first(p: Point, report: RuleReport):
  """Puts first the failures of primitives the checked rules bind."""
  outer = {name for rules in p.rules for name in rules.values()}
  inner = [f for f in report.failures
           if f.rule not in outer and f.rule != "prim_fn"]
  if inner and len(inner) < len(report.failures):
    report.failures[:] = inner + [f for f in report.failures
                                  if f not in inner]
    report.inner_first = list(dict.fromkeys(f.rule for f in inner))


def blame_alone(p: Point, s: Settings, w: Writer):
  """Checks each custom function alone, where a program of several failed or
  excused its rules together by intent."""
  # Not done first: a library's rule can rely on a relation the program
  # keeps between its inputs (equinox's loop wrapper), which perturbing its
  # inputs independently breaks.
  report = w.report
  if len(p.prims) < 2 or not all(isinstance(q, CustomRules)
                                 for q in p.prims):
    return
  try:
    calls = custom_calls(p.fn, p.args)
  except Exception:  # pylint: disable=broad-except  (the program's failures stand)
    return
  # written into the program's report, but for their failures
  program, report.failures = report.failures, []
  for rules, fn, inputs in calls:
    sub = Point.of(fn, inputs, [f"args[{i}]" for i in range(len(inputs))],
                   [rules], s, p.rng, per_leaf=p.per_leaf,
                   fd_scale=p.fd_scale)
    sub_w = Writer(report, sub, s, f"{rules!r} alone: ", w.within)
    plan = plan_modes(sub, s, sub_w, explicit=False)
    run(sub, s, sub_w, plan, add_parts(sub, s, plan))
  alone, report.failures = report.failures, program
  if alone:
    named = sorted({f.rule for f in report.failures})
    report.failures[:] = alone
    report.skipped.append(("all modes", (
        f"the failures of the program as a whole (of {'; '.join(named)}) "
        "are replaced by those of each function alone" if named else
        "the rules the program's checks left unjudged by intent together "
        "failed alone") + ", at the inputs the program gives it"))
  elif report.failures:
    report.skipped.append((
        "all modes", "the functions checked alone passed, at the inputs the "
        "program gives them (one called only inside a loop or a branch is "
        "not taken out): the failures are those of the program as a "
        "whole"))
