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
from hijax.testing._budget import SECONDS_PER_RULE, BudgetSpent
from hijax.testing._checks import (check_expand, check_jvp, check_lin,
                                   check_transpose, check_vjp)
from hijax.testing._context import CheckContext, Settings
from hijax.testing._device import describe, device_context, device_half
from hijax.testing._discovery import (CustomRules, custom_calls,
                                      find_custom_rules, find_hiprims)
from hijax.testing._numerics import is_float, on_device
from hijax.testing._report import DERIVATIVE_MODES, RuleReport, first_lines
from hijax.testing._second_order import (add_derived,
                                         add_second_order_parts,
                                         check_second_order)


# --- one run -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Request:
  """What `check_rules` was asked, but the point."""
  prim_fn: Callable
  modes: tuple[str, ...]
  explicit: bool
  settings: Settings
  seed: int
  per_rule: bool  # the default budget: SECONDS_PER_RULE per rule checked
  host: Any = None

  def context(self, args, dtype) -> tuple[CheckContext, list[str]]:
    """The context of the checks at ``args`` (in ``dtype``), and the modes
    to run."""
    closed = jax.make_jaxpr(self.prim_fn)(*args)
    prims = (find_hiprims(closed.jaxpr, [])
             or find_custom_rules(closed.jaxpr, []))
    if not prims:
      raise ValueError(
          "prim_fn binds no hijax primitive and calls no jax.custom_jvp or "
          "jax.custom_vjp function: pass a function that applies one, "
          "e.g. lambda x: MyPrim(jax.typeof(x))(x)")
    if self.per_rule:
      self.settings.budget.seconds = SECONDS_PER_RULE * len(prims)
    paths = jax.tree_util.tree_flatten_with_path(args)[0]
    names = [f"args[{p[0].idx}]" + jax.tree_util.keystr(p[1:])
             for p, _ in paths]
    report = RuleReport([repr(p) for p in prims], dtype)
    report.surrogates = [repr(p) for p in prims
                         if p in self.settings.surrogates]
    report.devices["checks"] = describe(self.host or jax.devices()[0], dtype)
    ctx = CheckContext(self.prim_fn, args, names, self.settings,
                       np.random.default_rng(self.seed), report, prims,
                       requested=self.modes)
    return ctx, plan_modes(ctx, self.modes, self.explicit)


def in_dtype(x, dtype):
  """``x`` in ``dtype`` if it is floating (in the complex dtype of the same
  precision if complex), else in its own dtype, without a weak type."""
  own = jnp.result_type(x)
  if jnp.issubdtype(own, jnp.complexfloating):
    dtype = jnp.result_type(dtype, jnp.complex64)
  return on_device(np.asarray(x), dtype if jnp.issubdtype(own, jnp.inexact)
                   else own)


def _in_own_dtypes(args):
  """``args`` in their own dtypes, without weak types, and the first
  floating dtype's name."""
  own = jax.tree.map(lambda x: in_dtype(x, jnp.result_type(x)), args)
  floats = [x.dtype for x in jax.tree.leaves(own) if is_float(x)]
  return own, str(floats[0]) if floats else None


def _runs(ctx: CheckContext, plan, ahead) -> bool:
  """Whether ``ctx``'s function runs compiled at its point."""
  def run():
    if not ctx.settings.jit:
      return jax.jit(ctx.prim_fn)(*ctx.args)
    add_parts(ctx, plan)
    ahead(plan)
    return ctx.compiled.evaluate([ctx.leaves])
  return _raised(run) is None


def check(request: Request, args, x64: bool | None, accel) -> RuleReport:
  """One run of `check_rules` at ``args``: the dtype (float64 where prim_fn
  runs in it), the checks, the device's half."""
  prim_fn, budget = request.prim_fn, request.settings.budget
  # the device's half runs the inputs in their own dtypes, on the device
  on_accel, accel_float = _in_own_dtypes(args) if accel else (None, None)
  accel_dtype = accel_float or "float32"
  devices: dict = {}  # plan -> the device's context, compiling ahead

  def ahead(plan):
    """Starts the device's compile for ``plan`` (once), so that it runs
    while the host's half does."""
    if accel is not None and tuple(plan) not in devices:
      try:
        devices[tuple(plan)] = device_context(
            plan, on_accel, accel_dtype, accel, request.context, add_parts)
      except Exception:  # pylint: disable=broad-except  (the device half reports it)
        devices[tuple(plan)] = None
  ctx = plan = error = None
  host_done = False  # a stop in the device's half leaves no mode unrun
  try:
    with contextlib.ExitStack() as stack:
      if request.host is not None:
        stack.enter_context(jax.default_device(request.host))
      own, own_float = _in_own_dtypes(args)
      own_dtype = own_float or "no floating-point inputs"
      with jax.enable_x64(True):
        args64 = jax.tree.map(lambda x: in_dtype(x, jnp.float64), args)
      points = {True: (args64, "float64"), False: (own, own_dtype)}
      wide = x64 is not False
      if x64 is None:  # the first dtype where it runs, else float64
        for wide in (True, False):
          with jax.enable_x64(True) if wide else contextlib.nullcontext():
            try:
              ctx, plan = request.context(*points[wide])
            except Exception:  # pylint: disable=broad-except
              continue
            if _runs(ctx, plan, ahead):
              break
        else:
          error = _raised(lambda: jax.jit(prim_fn)(*own))
          with jax.enable_x64(True):
            wide = _raised(lambda: jax.make_jaxpr(prim_fn)(*args64)) is None
          ctx = None
      if wide:
        stack.enter_context(jax.enable_x64(True))
      if ctx is None:
        ctx, plan = request.context(*points[wide])
      if error is None:
        ahead(plan)
      ctx.report.required = required_rules(ctx, plan)
      if not function_raises(ctx, prim_fn, plan, error):
        run(ctx, plan)
      # a refusal by design (or a surrogate) in a program names the mode's
      # rules together, and would excuse them all: checked alone too
      if (ctx.report.failures or ctx.report.by_intent) and error is None:
        blame_alone(ctx)
        inner_first(ctx)
    if accel is not None and error is None and not budget.spent:
      assert plan is not None  # planned with the host's context above
      host_done = True
      device_half(ctx, plan, on_accel, accel_dtype, accel, request.host,
                  request.context, add_parts, devices.get(tuple(plan)))
  except BudgetSpent as e:
    assert ctx is not None  # spent compiling the checks' program
    stopped(ctx, [] if host_done else plan, e)
  finally:
    budget.finish()
  ctx.report.seconds = budget.elapsed
  return ctx.report


# --- plan ------------------------------------------------------------------

def plan_modes(ctx: CheckContext, modes, explicit) -> list[str]:
  """The modes to run; the others are reported as skipped. Naming a mode
  whose rule a primitive does not define is a ValueError."""
  to_run = []
  for mode in modes:
    if mode == "second_order":
      if ctx.settings.order < 2:
        ctx.skip(mode, "order < 2")
      elif any(ctx.has(m) for m in DERIVATIVE_MODES if m in modes):
        to_run.append(mode)
      else:
        ctx.skip(mode, "no first-order derivative mode runs")
    elif ctx.has(mode):
      to_run.append(mode)
    elif explicit:
      missing = [type(p).__name__ for p, r in zip(ctx.prims, ctx.rules)
                 if mode not in r]
      raise ValueError(f"mode {mode!r} was requested, but {', '.join(missing)} "
                       f"define(s) no {mode} rule")
    else:
      ctx.skip(mode, "rule not defined")
  return to_run


def required_rules(ctx: CheckContext, plan) -> list[str]:
  """The rules a pass needs compared conclusively: those of the modes
  planned that apply at this point."""
  return list(dict.fromkeys(
      ctx.rule_name(mode) for mode in plan if not (
          mode == "second_order"
          or mode in DERIVATIVE_MODES and not (ctx.float_idx
                                               and ctx.out_float_idx)
          or mode == "transpose" and not ctx.out_float_idx
          or mode == "expand" and ctx.fd_of != "expand" and ctx.settings.jit)))


# --- the parts, and the checks of each mode -------------------------------

# The check of each mode, in the order of `MODES`.
CHECKS = {
    "expand": check_expand,
    "jvp": check_jvp,
    "vjp": check_vjp,
    "lin": check_lin,
    "transpose": check_transpose,
    "batch": check_batch,
    "second_order": lambda ctx: check_second_order(ctx, run),
}


# The modes whose checks evaluate each derivative, in every direction (the
# first set) or in all floating-point inputs together (the second).
_USED_BY = {"jvp": ({"jvp", "vjp", "lin"}, {"batch", "second_order"}),
            "vjp": ({"vjp"}, {"batch", "second_order"}),
            "lin": ({"lin"}, set())}


def add_parts(ctx: CheckContext, modes):
  """Adds every program the checks of ``modes`` run to ``ctx``'s compiled
  program."""
  if ctx.float_idx and ctx.out_float_idx:
    for kind, (each, together) in _USED_BY.items():
      if not ctx.has(kind):
        continue
      if each & set(modes):
        for direction in ctx.directions():
          ctx.add_derivative(kind, direction)
      elif together & set(modes):
        ctx.add_derivative(kind, tuple(ctx.float_idx))
  if "batch" in modes:
    add_batch_parts(ctx)
  if "second_order" in modes and ctx.float_idx and ctx.out_float_idx:
    add_second_order_parts(ctx)
    if ctx.derived is None:
      add_derived(ctx, ctx.requested, add_parts)


def run(ctx: CheckContext, modes):
  """Runs the checks of ``modes`` in ``ctx``; a mode that cannot apply (no
  floating-point inputs or outputs) is reported as skipped."""
  add_parts(ctx, modes)  # nothing is traced yet (a second call adds nothing)
  # direction -> whether the jvp rule passed its check there: the jvp check
  # writes it, the vjp and lin checks then take the jvp rule as their
  # reference where it did (else finite differences)
  jvp_passed: dict = {}
  for mode in modes:
    if ctx.out_of_time(mode, "all its checks"):
      continue
    if mode in DERIVATIVE_MODES and not ctx.float_idx:
      ctx.skip(mode, "no floating-point inputs to differentiate")
    elif mode in DERIVATIVE_MODES + ("transpose",) and not ctx.out_float_idx:
      ctx.skip(mode, "no floating-point outputs")
    else:
      try:
        CHECKS[mode](ctx, *([jvp_passed] if mode in DERIVATIVE_MODES else []))
      except Exception as e:  # pylint: disable=broad-except  (e.g. prim_fn fails under jit)
        ctx.fail_raised(mode, f"running the {mode} checks",
                        ctx.describe_inputs(), e)


# --- conclude ----------------------------------------------------------------

def _raised(run: Callable[[], Any]) -> Exception | None:
  """What ``run()`` raises (waited for), or None."""
  try:
    jax.block_until_ready(run())
    return None
  except Exception as e:  # pylint: disable=broad-except
    return e


def function_raises(ctx: CheckContext, prim_fn, plan,
                    error: Exception | None) -> bool:
  """Where a custom function raises at the point in every dtype, reports
  that (naming it); True if so."""
  if error is None or ctx.fd_of == "expand":
    return False
  name = getattr(prim_fn, "__name__", None) or type(prim_fn).__name__
  text = str(error).strip()
  last = text.splitlines()[-1] if text else ""
  detail = f"raised {type(error).__name__}: {first_lines(text, 3)}"
  if last and last not in detail:  # a callback's error ends its message
    detail += f"\n  ... {last}"
  ctx.fail("expand", "running the function at the input (in float64 and in "
           "the inputs' dtypes)", ctx.describe_inputs(),
           f"{detail}\nno rule was checked: check the function at an input "
           "where it runs", float("inf"),
           rule=f"{name} (the function checked)", error=error)
  ctx.report.skipped += [(mode, "the function raises at this input")
                         for mode in plan]
  return True


def stopped(ctx: CheckContext, plan, e: BudgetSpent):
  """Ends a run stopped by a compile that would end past the hard limit:
  what did not run is skipped for time, and the report says why."""
  report = ctx.report
  if not report.required:
    report.required = required_rules(ctx, plan)
  done = set(report.modes_run)
  report.skipped_for_time += [f"the run stopped: {e}"] + [
      f"{mode}: the checks not yet run" for mode in plan if mode not in done]


def inner_first(ctx: CheckContext):
  """Puts first the failures of primitives the checked rules bind (fix those
  first)."""
  report = ctx.report
  outer = {name for rules in ctx.rules for name in rules.values()}
  inner = [f for f in report.failures
           if f.rule not in outer and f.rule != "prim_fn"]
  if inner and len(inner) < len(report.failures):
    report.failures[:] = inner + [f for f in report.failures
                                  if f not in inner]
    report.inner_first = list(dict.fromkeys(f.rule for f in inner))


def _absorb(report: RuleReport, alone: RuleReport):
  """Adds to the program's report what the checks alone did, but their
  failures and requirements."""
  for field in dataclasses.fields(RuleReport):
    mine, theirs = getattr(report, field.name), getattr(alone, field.name)
    if field.name in ("failures", "required", "primitives", "dtype",
                      "seconds", "inner_first", "devices"):
      continue
    if isinstance(mine, list):
      mine += [x for x in theirs if not (
          field.name in ("by_intent", "surrogates") and x in mine)]
    elif isinstance(mine, dict):
      mine.update({k: mine.get(k, 0) + n for k, n in theirs.items()})
    else:
      setattr(report, field.name, mine + theirs)


def blame_alone(ctx: CheckContext):
  """Checks each custom function alone, where a program of several failed or
  excused its rules together by intent."""
  # Not done first: a library's rule can rely on a relation the program
  # keeps between its inputs (equinox's loop wrapper), which perturbing its
  # inputs independently breaks.
  report = ctx.report
  if len(ctx.prims) < 2 or not all(isinstance(p, CustomRules)
                                   for p in ctx.prims):
    return
  try:
    calls = custom_calls(ctx.prim_fn, ctx.args)
  except Exception:  # pylint: disable=broad-except  (the program's failures stand)
    return
  alone = RuleReport(report.primitives, report.dtype)
  for rules, fn, inputs in calls:
    sub = ctx.sub(fn, inputs, [f"args[{i}]" for i in range(len(inputs))],
                  [rules], report=alone, label=f"{rules!r} alone: ")
    run(sub, plan_modes(sub, ctx.requested, explicit=False))
  _absorb(report, alone)
  if alone.failures:
    named = sorted({f.rule for f in report.failures})
    report.failures[:] = alone.failures
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
