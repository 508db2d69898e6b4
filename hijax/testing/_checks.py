"""The checks of the derivative rules and of `expand`: one function per mode,
each taking a `CheckContext` and writing into its report; the inner-product
identity that checks a backward rule (`check_identity`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from hijax._internals import core as _core
from hijax.testing._context import CheckContext
from hijax.testing._discovery import ExpandStructureError, eval_expanded
from hijax.testing._numerics import (compare_leaf, inner_identity, on_device,
                                     type_str, ulp_factor)
from hijax.testing._nzs_out import check_nzs_out


# The identity ``<ȳ, J ṫ> = <Jᵀ ȳ, ṫ>`` that checks a
# backward rule against a reference for ``J ṫ`` (the jvp rule, or finite
# differences), element by element where it matters:
#
# * output elements the reference cannot judge (not smooth, not finite; for
#   finite differences also unresolved) get a zero cotangent and are left out
#   of ``<ȳ, J ṫ>``;
# * where the backward rule gives a non-finite cotangent and some output
#   element could not be judged (a kink, a domain boundary: ``entr`` at 0),
#   those input elements are left out too: the identity is checked again with
#   a tangent that is zero there, so that one element's NaN does not hide the
#   others' verdicts. A non-finite cotangent where every element was judged
#   is a failure;
# * two rules compared with each other may each lose a different part of a
#   result that cancels (softmax with a dominant logit, whose output is
#   1 - exp(-40)): where finite differences find the function flat, each
#   side may be off by the rounding of values of the output's size
#   (`CheckContext.flat_floors`). Finite differences allow their own error
#   bound instead.

def aligned_cotangents(ctx: CheckContext, like, j_t, judged):
  """Random cotangents with the signs of ``J ṫ``: ``<ȳ, J ṫ>`` then has no
  cancellation to hide a wrong rule in."""
  out = []
  for y, t, ok in zip(like, j_t, judged):
    c = np.abs(np.asarray(ctx.random_like(y)))
    t = np.asarray(t)
    random_sign = ctx.rng.choice(np.array([-1.0, 1.0]), size=c.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
      # complex: Re(ȳ J ṫ) = c |J ṫ| with ȳ along conj(J ṫ)
      unit = np.conj(t) / np.abs(t) if np.iscomplexobj(t) else np.sign(t)
      sign = np.where(np.isfinite(t) & (t != 0), unit, random_sign)
    out.append(on_device(np.where(ok, c * sign, 0).astype(
        np.asarray(y).dtype)))
  return out


def check_identity(ctx: CheckContext, mode: str, check: str, inputs: str,
                   tangents: list | None, like: Sequence,
                   reference: Callable, transpose: Callable, judge: Callable,
                   floors: Callable | None = None, rule: str | None = None,
                   what: str = "<ȳ, J ṫ> = {lhs:.8g} with J ṫ from {ref}, but "
                   "<vjp(ȳ), ṫ> = {rhs:.8g}", hint: str = "") -> bool:
  """Checks ``<ȳ, J ṫ> = <transpose(ȳ), ṫ>``; records a failure or an
  inconclusive entry. ``reference(tangents, first)``: `_reference`'s
  ``(J ṫ, label, bounds, tangents, est)``; ``judge(bounds, est)``: the
  output elements it judges."""
  ref, label, bounds, used, est = reference(tangents, True)
  judged = judge(bounds, est)
  if not any(np.any(ok) for ok in judged):
    ctx.judged_nothing(check, "no output element can be judged along this "
                       "direction (see the finite differences above)")
    return True
  ybar = aligned_cotangents(ctx, like, ref, judged)
  cts_in = transpose(ybar)
  left_out = [~np.isfinite(np.asarray(c)) for c in cts_in]
  if any(np.any(b) for b in left_out) and not all(np.all(ok) for ok in judged):
    ctx.inconclusive(check, "the backward rule gives a non-finite cotangent "
                     f"at {sum(int(np.sum(b)) for b in left_out)} input "
                     "element(s), and the function is not smooth or not "
                     "finite at some output element (see above): those "
                     "input elements are left out")
    ref, label, bounds, used, est = reference(
        [on_device(np.where(b, 0, t)) for t, b in zip(used, left_out)], False)
    judged = judge(bounds, est)
    ybar = aligned_cotangents(ctx, like, ref, judged)
    cts_in = [on_device(np.where(b, 0, c))
              for c, b in zip(transpose(ybar), left_out)]
  ref = [np.where(ok, r, 0) for r, ok in zip(ref, judged)]
  lhs, rhs, bound = inner_identity(ybar, ref, cts_in, used,
                                   ctx.settings.tol, bounds)
  if floors is not None and bounds is None:
    top = max([float(np.max(np.abs(np.asarray(y)))) for y in ybar
               if np.size(y)] or [0.0])
    bound += 2 * top * sum(float(np.sum(f)) for f in floors(used))
  if abs(lhs - rhs) <= bound:
    counted = judged if est is None or lhs == rhs else [
        ok & ~u for ok, u in zip(judged, est.uncounted())]
    if np.isfinite(bound) and any(np.any(ok) for ok in counted):
      ctx.conclusive_pass(mode, rule)
    else:
      ctx.judged_nothing(check, f"{label} only bounds the elements compared "
                         "(see above)")
    return True
  ctx.fail(mode, check, inputs,
           what.format(lhs=lhs, rhs=rhs, ref=label)
           + f": error {abs(lhs - rhs):.3g} (tolerance {bound:.3g})"
           + (hint if np.isfinite(rhs) else ""), abs(lhs - rhs), rule=rule)
  return False


def _check_types(ctx: CheckContext, mode, check, inputs, got, like, names,
                 got_label) -> bool:
  """Checks that each of ``got`` has the type of its input; records the
  first mismatch."""
  for name, g, x in zip(names, got, like):
    if type_str(g) != type_str(x):
      ctx.fail(mode, check, inputs,
               f"{name}: {got_label} gives {type_str(g)}, but the input is "
               f"{type_str(x)} (a cotangent has the shape and dtype of "
               "its input)", float("inf"))
      return False
  return True


def check_expand(ctx: CheckContext):
  """`expand`'s output types against ``out_aval``; the eager and the jitted
  call against `expand` evaluated directly."""
  inputs = ctx.describe_inputs()
  if ctx.fd_of != "expand":
    _check_eager_and_jit(ctx, inputs)
    return
  closed = jax.make_jaxpr(ctx.prim_fn)(*ctx.args)
  found = []
  try:
    expanded = eval_expanded(closed.jaxpr, closed.consts, ctx.leaves, found)
  except ExpandStructureError as e:
    ctx.fail("expand", "expand's output structure matches out_aval", inputs,
             str(e), float("inf"), rule=f"{type(e.prim).__name__}.expand")
    return
  except Exception as e:  # pylint: disable=broad-except
    ctx.fail_raised("expand", "evaluating expand", inputs, e)
    return
  ctx.ran("expand", "expand's output types match out_aval")
  for prim, _, out, _ in found:
    for i, (x, aval) in enumerate(zip(jax.tree.leaves(out),
                                      prim.out_avals_flat)):
      got = _core.typeof(x)
      if isinstance(aval, _core.ShapedArray):
        same = (isinstance(got, _core.ShapedArray) and got.shape == aval.shape
                and got.dtype == aval.dtype)
      else:  # a hi type: the types themselves are compared
        same = got == aval
      if not same:
        ctx.fail("expand", "expand's output types match out_aval", inputs,
                 f"output leaf {i}: expand returned {got.str_short()}, but "
                 f"out_aval declares {aval.str_short()}", float("inf"),
                 rule=f"{type(prim).__name__}.expand")
  expanded = [on_device(x) for x in expanded]
  for how, fn in [("eager call", ctx.prim_fn),
                  ("jitted call", jax.jit(ctx.prim_fn) if not ctx.settings.jit
                   else lambda *_: ctx.compiled.evaluate([ctx.leaves])[0])]:
    try:
      got = jax.tree.leaves(fn(*ctx.args))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("expand", f"{how} vs expand", inputs, e)
      continue
    ctx.ran("expand", f"{how} vs expand")
    ctx.compare("expand", f"{how} vs expand", inputs, got, expanded,
                ctx.settings.tol, names=ctx.out_names, got_label=how,
                want_label="expand", floors=ctx.primal_floors(True))


def _check_eager_and_jit(ctx: CheckContext, inputs):
  """A function with custom rules is its own reference: its compiled call
  must return the types its trace declares."""
  check = "jitted call's output types vs its trace"
  try:
    got = (ctx.compiled.evaluate([ctx.leaves])[0] if ctx.settings.jit
           else jax.tree.leaves(jax.jit(ctx.prim_fn)(*ctx.args)))
  except Exception as e:  # pylint: disable=broad-except
    ctx.fail_raised("expand", "jitted call", inputs, e)
    return
  ctx.ran("expand", check)
  for name, y, aval in zip(ctx.out_names, got, ctx.out_avals):
    if (np.shape(y), np.asarray(y).dtype) != (aval.shape, aval.dtype):
      ctx.fail("expand", check, inputs,
               f"{name}: the jitted call gives {type_str(y)}, but its trace "
               f"gives {aval.dtype.name}{list(aval.shape)}", float("inf"))
  if ctx.settings.jit:
    return
  check = "jitted call vs eager call"
  try:
    eager = jax.tree.leaves(ctx.prim_fn(*ctx.args))
  except Exception as e:  # pylint: disable=broad-except
    ctx.fail_raised("expand", "eager call", inputs, e)
    return
  ctx.ran("expand", check)
  ctx.compare("expand", check, inputs, got, [on_device(y) for y in eager],
              ctx.settings.tol, names=ctx.out_names, got_label="jitted call",
              want_label="eager call", floors=ctx.primal_floors(True))


def _same_primal(ctx: CheckContext, mode, inputs, out) -> bool:
  """Whether a derivative's primal output is the function's (not counted as
  a comparison of the rule)."""
  return ctx.compare(mode, f"{mode}'s primal output vs the primitive's "
                     "output", inputs, out, ctx.ref_out(), ctx.settings.tol,
                     got_label=mode, want_label="the primitive",
                     floors=ctx.primal_floors(), counts=False)


def check_jvp(ctx: CheckContext, jvp_passed: dict):
  """``jax.jvp`` against central finite differences, in each direction
  (``jvp_passed`` records where it passed)."""
  for direction in ctx.directions():
    if ctx.out_of_time("jvp", ctx.describe_direction(direction)):
      continue
    inputs = ctx.describe_inputs(direction)
    tangents = list(ctx.fd(direction).tangents)  # those of the reference
    check = f"jvp vs central finite differences of {ctx.fd_of}"
    try:
      out, t_out = ctx.derivative("jvp", direction, tangents)
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("jvp", check, inputs, e)
      jvp_passed[direction] = False
      continue
    ok = _same_primal(ctx, "jvp", inputs, out)
    where = f"{check} ({ctx.describe_direction(direction)})"
    if ctx.surrogate:  # its tangent is not the function's: nothing to compare
      ctx.skip_by_intent("jvp", f"{where}: a surrogate's tangent is not "
                         "compared with the function")
    else:
      ctx.ran("jvp", where)
      fd = ctx.fd(direction)
      ok &= ctx.compare("jvp", check, inputs, t_out, fd.values,
                        ctx.settings.tol, got_label="jvp",
                        want_label="finite differences", bounds=fd.bounds,
                        skip=fd.skipped(), uncounted=fd.uncounted(),
                        own=fd.own)
    jvp_passed[direction] = ok


def _trusts_jvp(ctx: CheckContext, jvp_passed: dict, direction) -> bool:
  """Whether the jvp rule is the reference in ``direction``: it is defined
  and did not fail its own check there (or that check did not run)."""
  return ctx.has("jvp") and jvp_passed.get(direction, True)


def _reference(ctx: CheckContext, direction, jvp_passed: dict, tangents,
               first=True):
  """``(J ṫ, label, bounds, tangents, est)``: from the jvp rule where it
  passed (``est`` None), else from finite differences (``first``: those
  of the point, along their own tangents)."""
  if _trusts_jvp(ctx, jvp_passed, direction):
    try:
      return (list(ctx.derivative("jvp", direction, tangents)[1]),
              "the jvp rule", None, list(tangents), None)
    except Exception:  # pylint: disable=broad-except  (the jvp check reports it)
      pass
  est = ctx.fd(direction) if first else ctx.fd_along(direction, tangents)
  return (list(est.values), f"finite differences of {ctx.fd_of}", est.bounds,
          list(est.tangents), est)


def check_vjp(ctx: CheckContext, jvp_passed: dict):
  """``jax.vjp`` against the jvp rule (or finite differences) through
  ``<ȳ, J ṫ> = <vjp(ȳ), ṫ>``; the ``nzs_out`` that `vjp_fwd` returns."""
  check_nzs_out(ctx, "vjp")
  for direction in ctx.directions():
    if ctx.out_of_time("vjp", ctx.describe_direction(direction)):
      continue
    inputs = ctx.describe_inputs(direction)
    xs = tuple(ctx.xs_of(direction))
    tangents = [ctx.random_like(ctx.leaves[i]) for i in direction]
    try:
      out, _ = ctx.derivative("vjp", direction, [np.zeros_like(y)
                                      for y in ctx.ref_out()])
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("vjp", "vjp", inputs, e)
      continue
    label = ("the jvp rule" if _trusts_jvp(ctx, jvp_passed, direction)
             else f"finite differences of {ctx.fd_of}")
    check = f"vjp vs {label} (<ȳ, J ṫ> = <vjp(ȳ), ṫ>)"
    if ctx.surrogate and label != "the jvp rule":
      ctx.skip_by_intent(
          "vjp", f"{check} ({ctx.describe_direction(direction)}): a "
          "surrogate's backward pass is not compared with the function")
      continue
    ctx.ran("vjp", f"{check} ({ctx.describe_direction(direction)})")
    _same_primal(ctx, "vjp", inputs, out)
    seen = []

    def transpose(ybar):
      cts_in = list(ctx.derivative("vjp", direction, ybar)[1])
      if not seen:
        seen.append(_check_types(
            ctx, "vjp", "vjp's cotangent types vs the inputs' types", inputs,
            cts_in, xs, [ctx.leaf_names[i] for i in direction], "vjp"))
      return cts_in
    try:
      check_identity(ctx, "vjp", check, inputs, tangents, ctx.ref_out(),
                     lambda t, first: _reference(ctx, direction, jvp_passed,
                                                 t, first), transpose,
                     lambda b, est: ctx.judged(direction, b, est),
                     lambda t: ctx.flat_floors(direction, t))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("vjp", check, inputs, e)


def check_lin(ctx: CheckContext, jvp_passed: dict):
  """``jax.linearize`` against the jvp rule (or finite differences); `lin`'s
  ``nzs_out``."""
  check_nzs_out(ctx, "lin")
  for direction in ctx.directions():
    if ctx.out_of_time("lin", ctx.describe_direction(direction)):
      continue
    inputs = ctx.describe_inputs(direction)
    ref, ref_label, bounds, tangents, est = _reference(
        ctx, direction, jvp_passed,
        [ctx.random_like(ctx.leaves[i]) for i in direction])
    uncounted, own = (None, None) if est is None else (est.uncounted(),
                                                       est.own)
    if ctx.surrogate and bounds is not None:
      ctx.skip_by_intent("lin", f"linearized vs {ref_label}: a surrogate's "
                         "tangent is not compared with the function")
      continue
    try:
      out, t_out = ctx.derivative("lin", direction, tangents)
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("lin", "linearize", inputs, e)
      continue
    check = f"linearized vs {ref_label}"
    ctx.ran("lin", f"{check} ({ctx.describe_direction(direction)})")
    _same_primal(ctx, "lin", inputs, out)
    floors = None
    if bounds is None:  # two rules: each may lose what cancels
      floors = [2 * f for f in ctx.flat_floors(direction, tangents)]
    skip = [~ok for ok in ctx.judged(direction)]
    ctx.compare("lin", check, inputs, t_out, ref, ctx.settings.tol,
                got_label="linearized", want_label=ref_label, bounds=bounds,
                skip=skip, floors=floors, uncounted=uncounted, own=own)


def _linear_sets(ctx: CheckContext):
  """The sets of leaves in which prim_fn is linear (each transposed alone),
  and how they were found."""
  ends = np.cumsum([len(jax.tree.leaves(a)) for a in ctx.args], dtype=int)
  arg_leaves = [tuple(range(e - len(jax.tree.leaves(a)), e))
                for a, e in zip(ctx.args, ends)]
  if ctx.settings.linear_argnums is not None:
    return [tuple(i for n in ((e,) if isinstance(e, int) else e)
                  for i in arg_leaves[n])
            for e in ctx.settings.linear_argnums], None
  sets = [idx for idx in arg_leaves
          if idx and all(i in ctx.float_idx for i in idx)
          and _is_linear(ctx, idx)]
  return sets, "detected numerically"


def _is_linear(ctx: CheckContext, direction) -> bool:
  """Whether f(0) = 0 and f(0.75 u - 1.5 v) = 0.75 f(u) - 1.5 f(v) on random
  u, v, up to rounding on the scale of f(u) and f(v)."""
  f = ctx.restrict(direction, evaluate=True)
  try:
    zero = f(*[on_device(np.zeros_like(ctx.leaves[i])) for i in direction])
    u, v = ([ctx.random_like(ctx.leaves[i]) for i in direction]
            for _ in range(2))
    fu, fv = f(*u), f(*v)
    fuv = f(*[on_device(0.75 * np.asarray(a) - 1.5 * np.asarray(b))
              for a, b in zip(u, v)])
  except Exception:  # pylint: disable=broad-except
    return False
  tol = ctx.settings.tol
  for z, a, b, ab in zip(zero, fu, fv, fuv):
    a, b = np.asarray(a), np.asarray(b)
    want = (0.75 * a - 1.5 * b).astype(a.dtype)
    # rounding is judged on the scale of the terms, not of their difference
    scale = np.full(np.shape(a), float(np.max(np.abs(a), initial=0)) + float(
        np.max(np.abs(b), initial=0)))
    bound = 4 * ulp_factor(tol, a.dtype) * scale + tol.atol
    if (compare_leaf(z, np.zeros_like(z), tol, bound) is not None
        or compare_leaf(ab, want, tol, bound) is not None):
      return False
  return bool(zero)


def check_transpose(ctx: CheckContext):
  """``jax.linear_transpose`` against the linear map, through
  ``<ȳ, A ṫ> = <Aᵀ ȳ, ṫ>``, in each set of arguments it is linear in."""
  sets, how = _linear_sets(ctx)
  if not sets:
    ctx.fail("transpose", "transpose", ctx.describe_inputs(),
             "the primitive defines a transpose rule, but prim_fn is not "
             "linear in any one argument on this input; pass "
             "linear_argnums= to say which arguments are linear",
             float("inf"))
    return
  # Where linearity was found numerically, not declared, a rule that raises
  # transposing in one argument may handle only the others (Scale: c * x,
  # transposed in x only): that is judged after the loop.
  raised, transposed = [], False
  for direction in sets:
    names = ", ".join(ctx.leaf_names[i] for i in direction)
    if ctx.out_of_time("transpose", f"in {names}"):
      continue
    inputs = ctx.describe_inputs(extra=f"transposed in {names}" + (
        f" ({how})" if how else ""))
    f = ctx.restrict(direction)
    f_eval = ctx.restrict(direction, evaluate=True)
    xs = tuple(ctx.leaves[i] for i in direction)
    cts_out = tuple(ctx.random_like(y) for y in ctx.ref_out())
    try:
      cts_in = jax.linear_transpose(f, *xs)(cts_out)
    except Exception as e:  # pylint: disable=broad-except
      if how is None:
        ctx.fail_raised("transpose", "linear_transpose", inputs, e)
      else:
        raised.append((
            "linear_transpose", inputs, e,
            f"transposed in {names}: the rule raised {type(e).__name__}: "
            f"{e}; {names} was found linear numerically, not declared: pass "
            "linear_argnums= to check the transpose in it"))
      continue
    transposed = True
    check = "transpose vs the linear map (<ȳ, A ṫ> = <Aᵀ ȳ, ṫ>)"
    ctx.ran("transpose", f"{check} (in {names})")
    _check_types(ctx, "transpose",
                 "transpose's cotangent types vs the inputs' types", inputs,
                 cts_in, xs, [ctx.leaf_names[i] for i in direction],
                 "linear_transpose")
    for k in range(len(direction)) if len(direction) > 1 else [None]:
      tangents = [ctx.random_like(x) if k in (None, j)
                  else on_device(np.zeros_like(x)) for j, x in enumerate(xs)]
      lhs, rhs, bound = inner_identity(cts_out, f_eval(*tangents), cts_in,
                                       tangents, ctx.settings.tol)
      if abs(lhs - rhs) <= bound:
        ctx.conclusive_pass("transpose")
      else:
        leaf = names if k is None else ctx.leaf_names[direction[k]]
        ctx.fail("transpose", check, inputs,
                 f"cotangent for {leaf}: <ȳ, A ṫ> = {lhs:.8g}, but "
                 f"<transpose(ȳ), ṫ> = {rhs:.8g}: error {abs(lhs - rhs):.3g} "
                 f"(tolerance {bound:.3g})", abs(lhs - rhs))
        break
  ctx.judge_refusals("transpose", raised, transposed)
