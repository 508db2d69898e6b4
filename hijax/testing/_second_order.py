"""The second derivative of the rules, against finite differences of the
first (``g * stop_gradient(cos(x))`` is right at first order only), and
the first-order checks again on derived functions that bind hijax
primitives. A rule that declares it cannot be differentiated again is
first-order only (reverse over reverse falls back to forward over reverse
first)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hijax._internals import partial_eval as _pe

from hijax.testing._checks import check_identity
from hijax.testing._compiled import Compiled
from hijax.testing._context import CheckContext, Part, derivative_part
from hijax.testing._discovery import find_hiprims
from hijax.testing._report import DERIVATIVE_MODES

def _derivative(kind, f, n):
  """The tangent map ``x, ṫ -> jvp(f, x, ṫ)[1]`` (``kind`` ``"jvp"``), the
  backward pass ``x, ȳ -> vjp(f, x)[1](ȳ)`` or the linearized map of ``f``
  (of ``n`` inputs), a function of ``(*x, *vector)``; the vector is cast to
  the dtypes it pairs with (finite differences evaluate it wider)."""
  def g(*a):
    xs, v = tuple(a[:n]), a[n:]
    if kind == "vjp":
      out, f_vjp = jax.vjp(f, *xs)
      return tuple(f_vjp(tuple(jnp.asarray(y, o.dtype)
                               for y, o in zip(v, out))))
    v = tuple(jnp.asarray(t, x.dtype) for t, x in zip(v, xs))
    return tuple(jax.jvp(f, xs, v)[1] if kind == "jvp"
                 else jax.linearize(f, *xs)[1](*v))
  return g


# The first derivatives differentiated again, with their fixed vectors.
_AGAIN = {"vjp": "the backward pass x -> vjp(f, x)[1](ȳ)",
          "jvp": "the tangent map x -> jvp(f, x, ṫ)[1]"}


def _first_derivatives(ctx: CheckContext):
  """The backward pass and the tangent map as functions of the floating-
  point inputs, with their fixed vectors."""
  direction = tuple(ctx.float_idx)
  f = ctx.restrict(direction)
  xs = ctx.xs_of(direction)
  names = [ctx.leaf_names[i] for i in direction]
  found = []
  # the size of the values a backward pass (a tangent map) combines: the
  # output's times the cotangent's (the tangent's)
  top = lambda vs: max([float(np.max(np.abs(np.asarray(v)))) for v in vs
                        if np.size(v)] or [0.0])
  y_top = top(ctx.ref_out())
  for mode, what in _AGAIN.items():
    if ctx.has(mode) and mode in ctx.requested:
      v = tuple(ctx.random_like(y)  # ȳ, or ṫ
                for y in (ctx.ref_out() if mode == "vjp" else xs))
      g = _derivative(mode, f, len(xs))
      found.append((mode, what, lambda *x, g=g, v=v: g(*x, *v), xs, names,
                    y_top * top(v),
                    lambda a, mode=mode, v=v: ctx.derivative(
                        mode, direction, v, xs=a)[1], v))
  return found


def _again(ctx: CheckContext, mode):
  """The second derivative of ``mode``: ``(first derivative, second)`` at
  ``(xs, vector, direction)`` (reverse of reverse, forward of forward)."""
  g = _derivative(mode, ctx.restrict(tuple(ctx.float_idx)),
                  len(ctx.float_idx))

  def again(xs, v, u):
    h = lambda *x: g(*x, *v)
    if mode == "jvp":
      return jax.jvp(h, tuple(xs), tuple(u))
    out, h_vjp = jax.vjp(h, *xs)
    return out, h_vjp(tuple(u))
  return again


def _again_part(mode) -> Part:
  return Part("second_order", mode, "{} differentiated again", mode)


def add_second_order_parts(ctx: CheckContext):
  """Adds the vjp of the backward pass and the jvp of the tangent map (the
  checks of `check_differentiated_rules`) to ``ctx``'s compiled program."""
  d = tuple(ctx.float_idx)
  for mode in _AGAIN:
    if ctx.has(mode) and mode in ctx.requested:
      ctx.compiled.add(_again_part(mode), _again(ctx, mode), lambda mode=mode: (
          ctx.xs_of(d), ctx.zeros_like_outputs() if mode == "vjp"
          else ctx.zeros_like_inputs(d), ctx.zeros_like_inputs(d)))


def check_differentiated_rules(ctx: CheckContext):
  """The rules' second derivatives against finite differences of the first."""
  for mode, what, g, xs, names, scale, evaluate_one, vector in (
      _first_derivatives(ctx)):
    inputs = ctx.describe_inputs(extra=f"differentiating {what}")
    check = f"{what}, differentiated again, vs its finite differences"
    rule = ctx.rule_name(mode)
    if ctx.out_of_time("second_order", check):
      continue
    # the derivative's context, evaluated by the first-order programs
    bound = {}
    if ctx.compiled.has(_again_part(mode)):
      bound[derivative_part(mode, tuple(range(len(xs))))] = (
          ctx.compiled, _again_part(mode), (vector,))
    try:
      sub = ctx.sub(g, xs, names, ctx.prims, label=ctx.label, per_leaf=False,
                    fd_scale=scale, prepared=Compiled(
                        g, xs, ctx.settings.jit, budget=ctx.settings.budget,
                        evaluate_one=evaluate_one, bound=bound))
      est = sub.fd(tuple(sub.float_idx))
      if not sub.out_float_idx:
        continue
      ctx.report.cost["second-order evaluations"] = ctx.report.cost.get(
          "second-order evaluations", 0) + est.evaluations + 1
      if mode == "vjp":
        try:  # reverse over reverse: needs no jvp rule
          _reverse_over_reverse(ctx, sub, check, inputs, rule)
          continue
        except Exception as e:  # pylint: disable=broad-except
          why = ctx.declared_limit(e)
          if why is None or ctx.settings.require_second_order:
            ctx.fail_raised("second_order", check, inputs, e, rule=rule)
            continue
          ctx.skip("second_order", f"{what}: reverse over reverse is not "
                   f"supported ({why}); checked forward over reverse instead")
      # forward over forward, or over reverse
      _, t_out = sub.derivative("jvp", tuple(sub.float_idx), est.tangents)
    except Exception as e:  # pylint: disable=broad-except
      why = ctx.declared_limit(e)
      if why is None or ctx.settings.require_second_order:
        ctx.fail_raised("second_order", check, inputs, e, rule=rule)
      else:  # a declared limitation: a first-order-only rule
        ctx.report.first_order_only.append(
            f"{rule}: {what} cannot be differentiated again ({why})")
      continue
    ctx.ran("second_order", check + (" (forward over reverse)"
                                     if mode == "vjp" else ""))
    ctx.compare("second_order", check, inputs, t_out, est.values,
                ctx.settings.tol, names=[sub.out_names[i] for i in
                                         sub.out_float_idx],
                got_label=("jvp of the backward pass" if mode == "vjp"
                           else "jvp of the tangent map"),
                want_label="finite differences", bounds=est.bounds,
                rule=rule, skip=est.skipped(), uncounted=est.uncounted(),
                own=est.own)


def _reverse_over_reverse(ctx, sub, check, inputs, rule):
  """``<w, H ṫ>`` with ``H ṫ`` from finite differences of the backward pass,
  against ``<vjp of the backward pass (w), ṫ>``."""
  direction = tuple(sub.float_idx)
  transpose = lambda w: list(sub.derivative("vjp", direction, w)[1])
  transpose([np.zeros_like(y) for y in sub.ref_out()])  # may raise

  def reference(tangents, first):
    est = sub.fd(direction) if first else sub.fd_along(direction, tangents)
    return (list(est.values), "finite differences of the backward pass",
            est.bounds, list(est.tangents), est)
  ctx.ran("second_order", check)
  check_identity(
      ctx, "second_order", check, inputs, None, sub.ref_out(), reference,
      transpose, lambda b, est: sub.judged(direction, b, est), rule=rule,
      what="<w, H ṫ> = {lhs:.8g} with H ṫ from {ref}, but <vjp of the "
      "backward pass (w), ṫ> = {rhs:.8g}",
      hint="; the backward rule is not differentiable as it stands (a "
      "stop_gradient, a residual computed outside JAX, ...)")


# --- the first-order checks again, on derived functions ------------------

def _derived_functions(ctx: CheckContext, modes):
  """The tangent map, the backward pass and the linearized map of
  ``prim_fn``, as functions."""
  direction = tuple(ctx.float_idx)
  f = ctx.restrict(direction)
  xs = ctx.xs_of(direction)
  x_names = [ctx.leaf_names[i] for i in direction]
  out_names = [ctx.out_names[i] for i in ctx.out_float_idx]
  rng = ctx.rng.spawn(1)[0]
  kinds = {  # what, its vectors' templates, their names
      "jvp": ("the tangent map x, ṫ -> jvp(f, x, ṫ)[1]", lambda: xs,
              [f"ṫ for {m}" for m in x_names]),
      "vjp": ("the backward pass x, ȳ -> vjp(f, x)[1](ȳ)",
              ctx.zeros_like_outputs, [f"ȳ for {m}" for m in out_names]),
      "lin": ("the linearized map x, ṫ -> linearize(f, x)[1](ṫ)",
              lambda: xs, [f"ṫ for {m}" for m in x_names])}
  return [(kind, what, _derivative(kind, f, len(xs)),
           xs + [ctx.random_like(v, rng) for v in like()], x_names + v_names)
          for kind, (what, like, v_names) in kinds.items()
          if ctx.has(kind) and kind in modes]


@dataclasses.dataclass
class _Derived:
  """The first-order checks of a derived function, prepared before the
  checks run."""
  kind: str
  what: str
  sub: CheckContext | None = None
  modes: list = dataclasses.field(default_factory=list)
  error: Exception | None = None  # raised tracing the function
  prims: list = dataclasses.field(default_factory=list)


def add_derived(ctx: CheckContext, modes, add_parts):
  """The contexts of the derived functions that bind hijax primitives, their
  parts added."""
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


def check_second_order(ctx: CheckContext, run):
  """The first-order checks on each derived function that binds hijax
  primitives again."""
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
