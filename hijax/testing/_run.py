"""Running the checks: the table of checks by mode, and the second-order
mode, which runs them again on functions derived from ``prim_fn``."""
from __future__ import annotations

import jax

from hijax._internals import partial_eval as _pe
from hijax.testing._batching import add_batch_parts, check_batch
from hijax.testing._checks import (check_expand, check_jvp, check_lin,
                                   check_transpose, check_vjp)
from hijax.testing._compiled import Bundle, Compiled
from hijax.testing._context import CheckContext
from hijax.testing._discovery import find_hiprims
from hijax.testing._report import DERIVATIVE_MODES
from hijax.testing._second_order import (add_second_order_parts,
                                         check_differentiated_rules)


def _derived_functions(ctx: CheckContext, modes):
  """``(mode, description, function, arguments, argument names)`` of the
  tangent map, the backward pass and the linearized map of ``prim_fn``, for
  the derivative modes requested whose rules are defined."""
  direction = tuple(ctx.float_idx)
  f = ctx.restrict(direction)
  xs = [ctx.leaves[i] for i in direction]
  x_names = [ctx.leaf_names[i] for i in direction]
  out_names = [ctx.out_names[i] for i in ctx.out_float_idx]
  n = len(xs)
  derived = []
  if ctx.has("jvp") and "jvp" in modes:
    derived.append((
        "jvp", "the tangent map x, ṫ -> jvp(f, x, ṫ)[1]",
        lambda *a: jax.jvp(f, tuple(a[:n]), tuple(a[n:]))[1],
        xs + [ctx.random_like(x) for x in xs],
        x_names + [f"ṫ for {m}" for m in x_names]))
  if ctx.has("vjp") and "vjp" in modes:
    derived.append((
        "vjp", "the backward pass x, ȳ -> vjp(f, x)[1](ȳ)",
        lambda *a: jax.vjp(f, *a[:n])[1](tuple(a[n:])),
        xs + [ctx.random_like(y) for y in ctx.ref_out()],
        x_names + [f"ȳ for {m}" for m in out_names]))
  if ctx.has("lin") and "lin" in modes:
    derived.append((
        "lin", "the linearized map x, ṫ -> linearize(f, x)[1](ṫ)",
        lambda *a: jax.linearize(f, *a[:n])[1](*a[n:]),
        xs + [ctx.random_like(x) for x in xs],
        x_names + [f"ṫ for {m}" for m in x_names]))
  return derived


def check_second_order(ctx: CheckContext):
  """The first-order checks, on each derived function that binds hijax
  primitives again (recursing while ``order`` allows). What they evaluate
  for all the derived functions is compiled as one program."""
  if not ctx.float_idx or not ctx.out_float_idx:
    ctx.skip("second_order", "no floating-point inputs or outputs")
    return
  modes = ctx.requested
  check_differentiated_rules(ctx)
  shared = Bundle(ctx.settings.jit)
  subs = []
  for kind, what, g, g_args, names in _derived_functions(ctx, modes):
    if ctx.out_of_time("second_order", f"the rules bound by {what}"):
      continue
    try:
      closed = jax.make_jaxpr(g)(*g_args)
      live, _ = _pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
      prims = find_hiprims(live, [])
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("second_order", f"tracing {what}",
                      ctx.describe_inputs(), e, rule=ctx.rule_name(kind))
      continue
    if not prims:
      ctx.skip("second_order", f"{what} binds no hijax primitive")
      continue
    sub = ctx.sub(g, g_args, names, prims, within="second_order",
                  label=f"{ctx.label}second order, on {what}: ",
                  order=ctx.settings.order - 1, per_leaf=False,
                  prepared=Compiled(g, g_args, ctx.settings.jit,
                                    shared=(shared, kind)))
    sub_modes = [m for m in DERIVATIVE_MODES if m in modes and sub.has(m)]
    if not sub_modes:
      ctx.skip("second_order", f"{what}: its primitives "
               f"({', '.join(type(p).__name__ for p in prims)}) define no "
               "derivative rule")
    sub_modes += ["second_order"] if sub.settings.order > 1 else []
    add_parts(sub, sub_modes)  # all compiled on the first evaluation
    subs.append((sub, sub_modes))
  for sub, sub_modes in subs:
    run(sub, sub_modes)


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


def run(ctx: CheckContext, modes):
  """Runs the checks of ``modes`` in ``ctx``; a mode that cannot apply (no
  floating-point inputs or outputs) is reported as skipped."""
  add_parts(ctx, modes)  # nothing is traced yet (a second call adds nothing)
  for mode in modes:
    if ctx.out_of_time(mode, "all its checks"):
      continue
    if mode in DERIVATIVE_MODES and not ctx.float_idx:
      ctx.skip(mode, "no floating-point inputs to differentiate")
    elif mode in DERIVATIVE_MODES + ("transpose",) and not ctx.out_float_idx:
      ctx.skip(mode, "no floating-point outputs")
    else:
      try:
        CHECKS[mode](ctx)
      except Exception as e:  # pylint: disable=broad-except  (e.g. prim_fn fails under jit)
        ctx.fail_raised(mode, f"running the {mode} checks",
                        ctx.describe_inputs(), e)
