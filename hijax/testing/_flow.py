"""One run of the checks, top to bottom: plan the modes (those whose rules
are defined) and the rules a pass requires; add every part their checks
evaluate to the compiled program; run the check of each mode (the
second-order mode runs them again on functions derived from ``prim_fn``);
then conclude: a function that raises at the input, a run its budget
stopped, which failures to list first, and custom functions checked alone
where a program of several failed. `hijax.testing._api.check_rules` drives
it."""
from __future__ import annotations

import dataclasses

import jax

from hijax._internals import partial_eval as _pe
from hijax.testing._batching import add_batch_parts, check_batch
from hijax.testing._budget import HARD_LIMIT, BudgetSpent
from hijax.testing._checks import (check_expand, check_jvp, check_lin,
                                   check_transpose, check_vjp)
from hijax.testing._compiled import Compiled
from hijax.testing._context import CheckContext
from hijax.testing._discovery import CustomRules, custom_calls, find_hiprims
from hijax.testing._report import DERIVATIVE_MODES, RuleReport, first_lines
from hijax.testing._second_order import (add_second_order_parts,
                                         check_differentiated_rules)


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
  """The rules of the modes planned that must be compared conclusively for
  a report to pass: those of the modes that apply at this point (the
  derivative modes and transpose need floating-point inputs and outputs);
  `expand` where it is compared with values (a hijax primitive's, or any
  with ``jit=False``), not only with types."""
  rules = []
  for mode in plan:
    if mode == "second_order":
      continue
    if mode in DERIVATIVE_MODES and not (ctx.float_idx and ctx.out_float_idx):
      continue
    if mode == "transpose" and not ctx.out_float_idx:
      continue
    if mode == "expand" and ctx.fd_of != "expand" and ctx.settings.jit:
      continue
    name = ctx.rule_name(mode)
    if name not in rules:
      rules.append(name)
  return rules


# --- the parts, and the checks of each mode -------------------------------

def _derived_functions(ctx: CheckContext, modes):
  """``(mode, description, function, arguments, argument names)`` of the
  tangent map, the backward pass and the linearized map of ``prim_fn``, for
  the derivative modes requested whose rules are defined. Their fixed
  tangents and cotangents are drawn from a generator of their own (spawned
  from the context's, whose draws they leave as they are), since they are
  made before the checks run."""
  direction = tuple(ctx.float_idx)
  f = ctx.restrict(direction)
  xs = [ctx.leaves[i] for i in direction]
  x_names = [ctx.leaf_names[i] for i in direction]
  out_names = [ctx.out_names[i] for i in ctx.out_float_idx]
  rng = ctx.rng.spawn(1)[0]
  n = len(xs)
  derived = []
  if ctx.has("jvp") and "jvp" in modes:
    derived.append((
        "jvp", "the tangent map x, ṫ -> jvp(f, x, ṫ)[1]",
        lambda *a: jax.jvp(f, tuple(a[:n]), tuple(a[n:]))[1],
        xs + [ctx.random_like(x, rng) for x in xs],
        x_names + [f"ṫ for {m}" for m in x_names]))
  if ctx.has("vjp") and "vjp" in modes:
    derived.append((
        "vjp", "the backward pass x, ȳ -> vjp(f, x)[1](ȳ)",
        lambda *a: jax.vjp(f, *a[:n])[1](tuple(a[n:])),
        xs + [ctx.random_like(y, rng) for y in ctx.zeros_like_outputs()],
        x_names + [f"ȳ for {m}" for m in out_names]))
  if ctx.has("lin") and "lin" in modes:
    derived.append((
        "lin", "the linearized map x, ṫ -> linearize(f, x)[1](ṫ)",
        lambda *a: jax.linearize(f, *a[:n])[1](*a[n:]),
        xs + [ctx.random_like(x, rng) for x in xs],
        x_names + [f"ṫ for {m}" for m in x_names]))
  return derived


@dataclasses.dataclass
class _Derived:
  """The first-order checks of a derived function (`_derived_functions`),
  prepared before the checks run: the context (None where the function binds
  no hijax primitive or could not be traced), the modes to run in it, and
  what to report first."""
  kind: str
  what: str
  sub: CheckContext | None = None
  modes: list = dataclasses.field(default_factory=list)
  error: Exception | None = None  # raised tracing the function
  prims: list = dataclasses.field(default_factory=list)


def _add_derived(ctx: CheckContext, modes):
  """Makes the contexts of the derived functions that bind hijax primitives
  again (into ``ctx.derived``) and adds their parts to ``ctx``'s program,
  so that they are compiled with it."""
  ctx.derived = []
  for kind, what, g, g_args, names in _derived_functions(ctx, modes):
    entry = _Derived(kind, what)
    ctx.derived.append(entry)
    try:
      closed = jax.make_jaxpr(g)(*g_args)
      live, _ = _pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
      entry.prims = find_hiprims(live, [])
      if not entry.prims:
        continue
      sub = ctx.sub(
          g, g_args, names, entry.prims, within="second_order",
          label=f"{ctx.label}second order, on {what}: ",
          order=ctx.settings.order - 1, per_leaf=False,
          prepared=Compiled(g, g_args, ctx.settings.jit,
                            shared=ctx.compiled.nested(kind)))
      entry.modes = [m for m in DERIVATIVE_MODES if m in modes and sub.has(m)]
      if sub.settings.order > 1:
        entry.modes.append("second_order")
      add_parts(sub, entry.modes)
      entry.sub = sub
    except Exception as e:  # pylint: disable=broad-except  (reported by check_second_order)
      entry.error = e


def check_second_order(ctx: CheckContext):
  """The first-order checks, on each derived function that binds hijax
  primitives again (recursing while ``order`` allows). What they evaluate
  is part of ``ctx``'s program (`_add_derived`)."""
  if not ctx.float_idx or not ctx.out_float_idx:
    ctx.skip("second_order", "no floating-point inputs or outputs")
    return
  check_differentiated_rules(ctx)
  assert ctx.derived is not None, "run() adds the parts (add_parts) first"
  for entry in ctx.derived:
    what = entry.what
    if ctx.out_of_time("second_order", f"the rules bound by {what}"):
      continue
    if entry.error is not None:
      ctx.fail_raised("second_order", f"tracing {what}",
                      ctx.describe_inputs(), entry.error,
                      rule=ctx.rule_name(entry.kind))
      continue
    if entry.sub is None:
      ctx.skip("second_order", f"{what} binds no hijax primitive")
      continue
    if not [m for m in entry.modes if m != "second_order"]:
      ctx.skip("second_order", f"{what}: its primitives "
               f"({', '.join(type(p).__name__ for p in entry.prims)}) "
               "define no derivative rule")
    run(entry.sub, entry.modes)


# The check of each mode, in the order of `MODES`.
CHECKS = {
    "expand": check_expand,
    "jvp": check_jvp,
    "vjp": check_vjp,
    "lin": check_lin,
    "transpose": check_transpose,
    "batch": check_batch,
    "second_order": check_second_order,
}


# The modes whose checks evaluate each derivative, in every direction (the
# first set) or in all floating-point inputs together (the second).
_USED_BY = {"jvp": ({"jvp", "vjp", "lin"}, {"batch", "second_order"}),
            "vjp": ({"vjp"}, {"batch", "second_order"}),
            "lin": ({"lin"}, set())}


def add_parts(ctx: CheckContext, modes):
  """Adds every program the checks of ``modes`` will run to ``ctx``'s
  compiled program (`hijax.testing._compiled.Bundle`), so that they are
  compiled together, once, on the first evaluation."""
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
      _add_derived(ctx, ctx.requested)


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
        if mode in DERIVATIVE_MODES:
          CHECKS[mode](ctx, jvp_passed)
        else:
          CHECKS[mode](ctx)
      except Exception as e:  # pylint: disable=broad-except  (e.g. prim_fn fails under jit)
        ctx.fail_raised(mode, f"running the {mode} checks",
                        ctx.describe_inputs(), e)


# --- conclude ----------------------------------------------------------------

def raised_at(prim_fn, args) -> Exception | None:
  """What ``prim_fn`` raises, compiled, at ``args`` (None if it runs)."""
  try:
    jax.block_until_ready(jax.jit(prim_fn)(*args))
    return None
  except Exception as e:  # pylint: disable=broad-except
    return e


def function_raises(ctx: CheckContext, prim_fn, plan,
                    error: Exception | None) -> bool:
  """Where a function whose rules are jax.custom_jvp / custom_vjp ones
  raises ``error`` at the point in every dtype (optimistix's root_find refusing an
  input in float32), reports that, naming the function, instead of the
  failures of the rules it calls there; True if so."""
  if error is None or ctx.fd_of == "expand":
    return False
  name = getattr(prim_fn, "__name__", None) or type(prim_fn).__name__
  text = str(error).strip()
  last = text.splitlines()[-1] if text else ""
  detail = (f"raised {type(error).__name__}: "
            f"{first_lines(text, 3)}")
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
  """Ends a run that a compile past the hard limit stopped: what did not
  run is skipped for time, and the report says what was abandoned."""
  report = ctx.report
  if not report.required:
    report.required = required_rules(ctx, plan)
  done = set(report.modes_run)
  report.skipped_for_time.append(
      f"the run stopped: {e.what} was still running after {e.seconds:.1f} s, "
      f"past {HARD_LIMIT:g} times the time budget, and was abandoned")
  report.skipped_for_time += [f"{mode}: the checks not yet run" for mode in
                              plan if mode not in done]


def inner_first(ctx: CheckContext, report: RuleReport):
  """Puts first the failures of primitives that the checked rules bind (a
  jvp rule that calls another primitive, whose own rule is wrong): the
  outer rules' failures can follow from them, so the error names the rule
  to fix first."""
  outer = {name for rules in ctx.rules for name in rules.values()}
  inner = [f for f in report.failures
           if f.rule not in outer and f.rule != "prim_fn"]
  if inner and len(inner) < len(report.failures):
    rest = [f for f in report.failures if f not in inner]
    report.failures[:] = inner + rest
    report.inner_first = sorted({f.rule for f in inner},
                                key=[f.rule for f in inner].index)


def _absorb(report: RuleReport, alone: RuleReport):
  """Adds to the program's report all that the checks alone ran, skipped,
  counted and left unjudged by intent, but their failures (which replace
  the program's only where there are any) and the rules they require."""
  for field in dataclasses.fields(RuleReport):
    mine, theirs = getattr(report, field.name), getattr(alone, field.name)
    if field.name in ("failures", "required", "primitives", "dtype",
                      "seconds", "inner_first", "devices"):
      continue
    if isinstance(mine, list):
      mine += [x for x in theirs if not (
          field.name in ("by_intent", "surrogates") and x in mine)]
    elif isinstance(mine, dict):
      for key, n in theirs.items():
        mine[key] = mine.get(key, 0) + n
    else:
      setattr(report, field.name, mine + theirs)


def blame_alone(prim_fn, args, prims, settings, rng, report, modes):
  """Where the program as a whole failed and calls several
  ``jax.custom_jvp`` / ``custom_vjp`` functions (whose failures then name
  them all), checks each alone, at the inputs the program gives it, and
  reports those failures instead, each naming the one at fault (the modes
  one of them lacks run for the others). Where none fails alone, the
  program's failures stand: the fault is in the rules together.

  Not done first: a library's rule can rely on a relation the program
  keeps between its inputs (equinox's loop wrapper takes the loop's result
  and recomputes its derivative from the loop's input), which perturbing
  its inputs independently breaks."""
  if len(prims) < 2 or not all(isinstance(p, CustomRules) for p in prims):
    return
  try:
    calls = custom_calls(prim_fn, args)
  except Exception:  # pylint: disable=broad-except  (the program's failures stand)
    return
  alone = RuleReport(report.primitives, report.dtype)
  for rules, fn, inputs in calls:
    ctx = CheckContext(fn, tuple(inputs), [f"args[{i}]" for i in range(
        len(inputs))], settings, rng, alone, [rules],
                       label=f"{rules!r} alone: ", requested=modes)
    run(ctx, plan_modes(ctx, modes, explicit=False))
  _absorb(report, alone)
  if alone.failures:
    named = sorted({f.rule for f in report.failures})
    report.failures[:] = alone.failures
    report.skipped.append((
        "all modes", "the failures of the program as a whole (of "
        f"{'; '.join(named)}) are replaced by those of each function "
        "alone, at the inputs the program gives it"))
  else:
    report.skipped.append((
        "all modes", "the functions checked alone passed, at the inputs the "
        "program gives them (one called only inside a loop or a branch is "
        "not taken out): the failures are those of the program as a "
        "whole"))
