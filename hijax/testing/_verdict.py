"""What a run concludes beyond its checks: the rules that must be judged,
a function that raises at the input, a run stopped by its budget, which
failures to list first, and functions checked alone where a program of
several failed."""
from __future__ import annotations

import dataclasses

import jax

from hijax.testing._budget import HARD_LIMIT, BudgetSpent
from hijax.testing._context import CheckContext
from hijax.testing._discovery import CustomRules, custom_calls
from hijax.testing._report import DERIVATIVE_MODES, RuleReport, first_lines
from hijax.testing._run import run

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



