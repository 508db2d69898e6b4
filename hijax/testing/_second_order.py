"""The second order: the rules' derivatives differentiated again against
finite differences of the first, and the first-order checks again on the
derived functions that bind hijax primitives."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hijax._internals import partial_eval as _pe

from hijax.testing._checks import check_identity, reference
from hijax.testing._compiled import Compiled, Part, derivative_part
from hijax.testing._context import Point, Settings, Writer
from hijax.testing._discovery import find_hiprims
from hijax.testing._report import DERIVATIVE_MODES, declared_limit


def _derivative(kind, f, n):
  """The tangent map, backward pass or linearized map (``kind``) of ``f`` (of
  ``n`` inputs) as a function of ``(*x, *vector)``."""
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


def _again(p: Point, mode):
  """``(first derivative, second)`` of ``mode`` at ``(xs, vector, u)``."""
  g = _derivative(mode, p.restrict(tuple(p.float_idx)), len(p.float_idx))

  def again(xs, v, u):
    h = lambda *x: g(*x, *v)
    if mode == "jvp":
      return jax.jvp(h, tuple(xs), tuple(u))
    out, h_vjp = jax.vjp(h, *xs)
    return out, h_vjp(tuple(u))
  return again


def _again_part(mode) -> Part:
  return Part("second_order", mode, "{} differentiated again", mode)


def add_second_order_parts(p: Point, s: Settings):
  """Adds the vjp of the backward pass and the jvp of the tangent map to
  ``p``'s compiled program."""
  d = tuple(p.float_idx)
  for mode in _AGAIN:
    if p.has(mode) and mode in s.modes:
      p.compiled.add(_again_part(mode), _again(p, mode), lambda mode=mode: (
          p.xs_of(d), p.zeros_like_outputs() if mode == "vjp"
          else p.zeros_like_inputs(d), p.zeros_like_inputs(d)))


def _limit(p: Point, s: Settings, w: Writer, check, inputs, rule,
           e) -> str | None:
  """The limit ``e`` declares, where it excuses the rule; else None, ``e``
  reported as a failure (also where the jvp rule is at fault)."""
  why = declared_limit(e)
  if why is None or p.primal_reads_tangent or s.require_second_order:
    w.fail_raised("second_order", check, inputs, e, rule=rule)
    return None
  return why


def _top(vs) -> float:
  return max([float(np.max(np.abs(np.asarray(v)))) for v in vs
              if np.size(v)] or [0.0])


def check_differentiated_rules(p: Point, s: Settings, w: Writer):
  """The backward pass and the tangent map (of the floating-point inputs,
  at fixed vectors) differentiated again, against their finite
  differences."""
  d = tuple(p.float_idx)
  xs, names = p.xs_of(d), [p.names[i] for i in d]
  vectors = {mode: tuple(p.random_like(y)  # ȳ, or ṫ
                         for y in (p.ref_out() if mode == "vjp" else xs))
             for mode in _AGAIN if p.has(mode) and mode in s.modes}
  for mode, v in vectors.items():
    what, rule = _AGAIN[mode], p.rule_name(mode)
    fixed = lambda *x, g=_derivative(mode, p.restrict(d), len(xs)), v=v: g(
        *x, *v)
    inputs = p.describe_inputs(extra=f"differentiating {what}")
    check = f"{what}, differentiated again, vs its finite differences"
    if w.out_of_time("second_order", check):
      continue
    # the derivative as a point, evaluated by the first-order programs
    bound = {}
    if p.compiled.has(_again_part(mode)):
      bound[derivative_part(mode, tuple(range(len(xs))))] = (
          p.compiled, _again_part(mode), (v,))
    try:
      # fd_scale: the size of the values it combines, the output's times
      # the cotangent's (the tangent's)
      sub = Point.of(fixed, xs, names, p.prims, s, p.rng, Compiled(
          fixed, xs, s.jit, budget=s.budget, bound=bound,
          evaluate_one=lambda a, mode=mode, v=v: p.derivative(
              mode, d, v, xs=a)[1]), per_leaf=False,
                     fd_scale=_top(p.ref_out()) * _top(v))
      sub_w = Writer(w.report, sub, s, w.label, w.within)
      est = sub.fd(tuple(sub.float_idx), sub_w)
      if not sub.out_float_idx:
        continue
      w.report.cost["second-order evaluations"] = w.report.cost.get(
          "second-order evaluations", 0) + est.evaluations + 1
      if mode == "vjp":
        try:  # reverse over reverse: needs no jvp rule
          _reverse_over_reverse(s, w, sub, sub_w, check, inputs, rule)
          continue
        except Exception as e:  # pylint: disable=broad-except
          if (why := _limit(p, s, w, check, inputs, rule, e)) is None:
            continue
          w.skip("second_order", f"{what}: reverse over reverse is not "
                 f"supported ({why}); checked forward over reverse instead")
      # forward over forward, or over reverse
      _, t_out = sub.derivative("jvp", tuple(sub.float_idx), est.tangents)
    except Exception as e:  # pylint: disable=broad-except
      if (why := _limit(p, s, w, check, inputs, rule, e)) is not None:
        w.report.first_order_only.append(
            f"{rule}: {what} cannot be differentiated again ({why})")
      continue
    w.ran("second_order", check + (" (forward over reverse)"
                                   if mode == "vjp" else ""))
    w.compare("second_order", check, inputs, t_out, est.values, s.tol,
              names=[sub.out_names[i] for i in sub.out_float_idx],
              got_label=("jvp of the backward pass" if mode == "vjp"
                         else "jvp of the tangent map"),
              want_label="finite differences", bounds=est.bounds,
              rule=rule, skip=est.skipped(), uncounted=est.uncounted(),
              own=est.own)


def _reverse_over_reverse(s, w, sub, sub_w, check, inputs, rule):
  """``<w, H ṫ>`` (finite differences) against ``<vjp of the backward pass
  (w), ṫ>``."""
  direction = tuple(sub.float_idx)
  transpose = lambda c: list(sub.derivative("vjp", direction, c)[1])
  transpose([np.zeros_like(y) for y in sub.ref_out()])  # may raise
  w.ran("second_order", check)
  check_identity(
      sub, s, w, "second_order", check, inputs, None, direction,
      lambda t, first: reference(sub, s, sub_w, direction, t, first,
                                 of="the backward pass"),
      transpose, rule=rule,
      what="<w, H ṫ> = {lhs:.8g} with H ṫ from {ref}, but <vjp of the "
      "backward pass (w), ṫ> = {rhs:.8g}",
      hint="; the backward rule is not differentiable as it stands (a "
      "stop_gradient, a residual computed outside JAX, ...)")


# --- the first-order checks again, on derived functions ------------------

# The derived functions whose rules are checked again, and the names of
# their vectors' leaves.
_DERIVED = {"jvp": "the tangent map x, ṫ -> jvp(f, x, ṫ)[1]",
            "vjp": "the backward pass x, ȳ -> vjp(f, x)[1](ȳ)",
            "lin": "the linearized map x, ṫ -> linearize(f, x)[1](ṫ)"}


@dataclasses.dataclass
class Derived:
  """A derived function's first-order checks, planned before the checks
  run: its point, modes and their own derived functions."""
  kind: str
  what: str
  sub: Point | None = None  # None: it binds no hijax primitive
  settings: Settings | None = None  # the order one less
  modes: list = dataclasses.field(default_factory=list)
  derived: list | None = None
  error: Exception | None = None  # raised tracing the function


def add_derived(p: Point, s: Settings, add_parts) -> list[Derived]:
  """The tangent map, backward pass and linearized map of ``p``'s function
  where they bind hijax primitives, as points whose parts ``add_parts``
  adds to ``p``'s program."""
  d = tuple(p.float_idx)
  xs, x_names = p.xs_of(d), [p.names[i] for i in d]
  out_names = [p.out_names[i] for i in p.out_float_idx]
  rng = p.rng.spawn(1)[0]
  sub_s = dataclasses.replace(s, order=s.order - 1)
  found = []
  for kind, what in _DERIVED.items():
    if not (p.has(kind) and kind in s.modes):
      continue
    like, v_names = ((p.zeros_like_outputs(), [f"ȳ for {m}" for m in out_names])
                     if kind == "vjp" else (xs, [f"ṫ for {m}" for m in x_names]))
    g = _derivative(kind, p.restrict(d), len(xs))
    g_args = xs + [p.random_like(v, rng) for v in like]
    entry = Derived(kind, what)
    found.append(entry)
    try:
      closed = jax.make_jaxpr(g)(*g_args)
      live, _ = _pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
      prims = find_hiprims(live)
      if not prims:
        continue
      sub = Point.of(g, g_args, x_names + v_names, prims, sub_s, p.rng,
                     Compiled(g, g_args, s.jit,
                              shared=p.compiled.nested(kind)),
                     per_leaf=False, fd_scale=p.fd_scale)
      entry.modes = [m for m in DERIVATIVE_MODES if m in s.modes and sub.has(m)]
      if sub_s.order > 1:
        entry.modes.append("second_order")
      entry.derived = add_parts(sub, sub_s, entry.modes)
      entry.sub, entry.settings = sub, sub_s
    except Exception as e:  # pylint: disable=broad-except  (reported by check_second_order)
      entry.error = e
  return found


def check_second_order(p: Point, s: Settings, w: Writer,
                       derived: list[Derived], run):
  """The rules' second derivatives; the first-order checks on each derived
  function that binds hijax primitives again."""
  if not p.float_idx or not p.out_float_idx:
    w.skip("second_order", "no floating-point inputs or outputs")
    return
  check_differentiated_rules(p, s, w)
  for entry in derived:
    what = entry.what
    if w.out_of_time("second_order", f"the rules bound by {what}"):
      continue
    if entry.error is not None:
      w.fail_raised("second_order", f"tracing {what}", p.describe_inputs(),
                    entry.error, rule=p.rule_name(entry.kind))
      continue
    if entry.sub is None or entry.settings is None:
      w.skip("second_order", f"{what} binds no hijax primitive")
      continue
    if not [m for m in entry.modes if m != "second_order"]:
      w.skip("second_order", f"{what}: its primitives "
             f"({', '.join(type(q).__name__ for q in entry.sub.prims)}) "
             "define no derivative rule")
    run(entry.sub, entry.settings, Writer(
        w.report, entry.sub, entry.settings,
        f"{w.label}second order, on {what}: ", "second_order"),
        entry.modes, entry.derived)
