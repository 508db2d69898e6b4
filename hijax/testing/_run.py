"""Running the checks: the table of checks by mode, and the second-order
mode, which runs them again on functions derived from ``prim_fn``."""
from __future__ import annotations

import dataclasses

import jax

from hijax._internals import partial_eval as _pe
from hijax.testing._batching import add_batch_parts, check_batch
from hijax.testing._checks import (check_expand, check_jvp, check_lin,
                                   check_transpose, check_vjp)
from hijax.testing._compiled import Compiled
from hijax.testing._context import CheckContext
from hijax.testing._discovery import find_hiprims
from hijax.testing._report import DERIVATIVE_MODES
from hijax.testing._second_order import (add_second_order_parts,
                                         check_differentiated_rules)


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
