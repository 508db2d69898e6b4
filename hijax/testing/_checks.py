"""The checks of the derivative rules and of `expand`: one function per mode,
each taking a `CheckContext` and writing into its report."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hijax._internals import api as _api
from hijax._internals import core as _core
from hijax.testing._context import CheckContext
from hijax.testing._discovery import (ExpandStructureError, applications,
                                      defined_rules, eval_expanded)
from hijax.testing._numerics import (compare_leaf,
                                     describe_leaf, fmt_array, inner_identity,
                                     is_float, ulp_factor)
from hijax.testing._report import RuleReport


def check_expand(ctx: CheckContext):
  """`expand`'s output types against ``out_aval``; the eager and the jitted
  call against `expand` evaluated directly."""
  inputs = ctx.describe_inputs()
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
  expanded = [jnp.asarray(x) for x in expanded]
  for how, fn in [("eager call", ctx.prim_fn),
                  ("jitted call", jax.jit(ctx.prim_fn))]:
    try:
      got = jax.tree.leaves(fn(*ctx.args))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("expand", f"{how} vs expand", inputs, e)
      continue
    ctx.ran("expand", f"{how} vs expand")
    ctx.compare("expand", f"{how} vs expand", inputs, got, expanded,
                ctx.settings.tol, names=ctx.out_names, got_label=how,
                want_label="expand")


def check_jvp(ctx: CheckContext):
  """``jax.jvp`` against central finite differences, in each direction."""
  for direction in ctx.directions():
    inputs = ctx.describe_inputs(direction)
    tangents = ctx.tangents_for(direction)
    f = ctx.restrict(direction)
    xs = tuple(ctx.leaves[i] for i in direction)
    check = f"jvp vs central finite differences of {ctx.fd_of}"
    try:
      out, t_out = jax.jvp(f, xs, tuple(tangents))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("jvp", check, inputs, e)
      ctx.jvp_ok[direction] = False
      continue
    ctx.ran("jvp", f"{check} ({ctx.describe_direction(direction)})")
    ok = ctx.compare("jvp", "jvp's primal output vs the primitive's output",
                     inputs, out, ctx.ref_out(), ctx.settings.tol,
                     got_label="jvp", want_label="the primitive")
    fd = ctx.fd(direction)
    ok &= ctx.compare("jvp", check, inputs, t_out, fd.values,
                      ctx.settings.tol, got_label="jvp",
                      want_label="finite differences", bounds=fd.bounds)
    ctx.jvp_ok[direction] = ok


def _aligned_cotangents(ctx: CheckContext, j_t):
  """Random cotangents whose signs follow those of ``J ṫ`` (random where it
  is zero): ``<ȳ, J ṫ>`` is then a sum without cancellation, so a wrong
  backward rule cannot hide in a sum that happens to be small next to the
  rounding allowed (which matters in low precision)."""
  out = []
  for y, t in zip(ctx.ref_out(), j_t):
    c = np.abs(np.asarray(ctx.random_like(y), np.float64))
    t = np.asarray(t, np.float64)
    random_sign = ctx.rng.choice(np.array([-1.0, 1.0]), size=c.shape)
    with np.errstate(invalid="ignore"):
      sign = np.where(np.isfinite(t) & (t != 0), np.sign(t), random_sign)
    out.append(jnp.asarray((c * sign).astype(np.asarray(y).dtype)))
  return out


def check_vjp(ctx: CheckContext):
  """``jax.vjp`` against the jvp rule (or finite differences) through
  ``<ȳ, J ṫ> = <vjp(ȳ), ṫ>``; the ``nzs_out`` that `vjp_fwd` returns."""
  check_nzs_out(ctx, "vjp")
  for direction in ctx.directions():
    inputs = ctx.describe_inputs(direction)
    f = ctx.restrict(direction)
    xs = tuple(ctx.leaves[i] for i in direction)
    tangents = [ctx.random_like(ctx.leaves[i]) for i in direction]
    ref, ref_label, bounds, tangents = ctx.tangent_reference(direction,
                                                             tangents)
    cts_out = _aligned_cotangents(ctx, ref)
    try:
      out, f_vjp = jax.vjp(f, *xs)
      cts_in = f_vjp(tuple(cts_out))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("vjp", "vjp", inputs, e)
      continue
    check = f"vjp vs {ref_label} (<ȳ, J ṫ> = <vjp(ȳ), ṫ>)"
    ctx.ran("vjp", f"{check} ({ctx.describe_direction(direction)})")
    ctx.compare("vjp", "vjp's primal output vs the primitive's output",
                inputs, out, ctx.ref_out(), ctx.settings.tol, got_label="vjp",
                want_label="the primitive")
    ctx.check_types("vjp", "vjp's cotangent types vs the inputs' types",
                    inputs, cts_in, xs, [ctx.leaf_names[i] for i in direction],
                    "vjp")
    lhs, rhs, bound = inner_identity(cts_out, ref, cts_in, tangents,
                                     ctx.settings.tol, bounds)
    if not abs(lhs - rhs) <= bound:
      ctx.fail("vjp", check, inputs,
               f"<ȳ, J ṫ> = {lhs:.8g} with J ṫ from {ref_label}, but "
               f"<vjp(ȳ), ṫ> = {rhs:.8g}: error {abs(lhs - rhs):.3g} "
               f"(tolerance {bound:.3g})", abs(lhs - rhs))


def _nz_in(x) -> bool:
  """The nzs_in flag of an argument leaf: whether its tangent type is a
  floating-point array (for a hi value, its type's tangent type)."""
  aval = _core.typeof(x)
  if isinstance(aval, _core.ShapedArray):
    return is_float(aval)
  try:
    return is_float(aval.to_tangent_aval())
  except Exception:  # pylint: disable=broad-except
    return False


def _tangent_like(ctx, x):
  """A random tangent for an argument leaf (of a hi value: of its tangent
  type)."""
  aval = _core.typeof(x)
  if not isinstance(aval, _core.ShapedArray):
    aval = aval.to_tangent_aval()
  return jnp.asarray(ctx.rng.standard_normal(aval.shape).astype(aval.dtype))


def _zero_derivatives(ctx, prim, p_args, zero_outs):
  """``{k: (max |J ṫ| of output leaf k, allowed, label)}`` for the outputs in
  ``zero_outs``, from the jvp rule or finite differences; None if neither
  applies (an argument of a hi type without a jvp rule)."""
  p_leaves = jax.tree.leaves(p_args)
  direction = tuple(i for i, x in enumerate(p_leaves) if _nz_in(x))
  hi = any(not isinstance(_core.typeof(x), _core.ShapedArray)
           for x in p_leaves) or any(
               not isinstance(a, _core.ShapedArray) for a in prim.out_avals_flat)
  if not direction:
    return {}
  if "jvp" in defined_rules(prim):
    tangents = [_tangent_like(ctx, p_leaves[i]) for i in direction]

    def f(*xs):
      leaves = list(p_leaves)
      for i, x in zip(direction, xs):
        leaves[i] = x
      return prim(*jax.tree.unflatten(prim.in_tree, leaves))
    try:
      out, t_out = jax.jvp(f, tuple(p_leaves[i] for i in direction),
                           tuple(tangents))
    except Exception:  # pylint: disable=broad-except  (the jvp check reports it)
      out = None
    if out is not None:
      result = {}
      outs, t_outs = jax.tree.leaves(out), jax.tree.leaves(t_out)  # pyright: ignore[reportPossiblyUnboundVariable]
      for k in zero_outs:
        t = np.asarray(t_outs[k], np.float64) if k < len(t_outs) else None
        if t is None or t.size == 0:
          continue
        y = np.asarray(outs[k], np.float64) if isinstance(
            _core.typeof(outs[k]), _core.ShapedArray) else np.zeros(())
        scale = max([float(np.max(np.abs(y)))] + [
            float(np.max(np.abs(np.asarray(u, np.float64)))) for u in tangents
            if np.size(u)])
        allowed = ulp_factor(ctx.settings.tol,
                             np.asarray(t_outs[k]).dtype) * scale
        result[k] = (float(np.max(np.abs(t))), allowed, "the jvp rule")
      return result
  if hi:
    return None
  sub = ctx.sub(lambda *a: prim(*a), p_args,
                [f"leaf {i}" for i in range(len(p_leaves))], [prim],
                report=RuleReport([], ""), label="")
  est = sub.fd(tuple(sub.float_idx))
  out_pos = {k: j for j, k in enumerate(sub.out_float_idx)}
  result = {}
  for k in zero_outs:
    v, b = est.values[out_pos[k]], est.bounds[out_pos[k]]
    if v.size:
      excess = np.abs(v) - b
      j = int(np.argmax(excess))
      result[k] = (float(np.abs(v).ravel()[j]), float(b.ravel()[j]),
                   f"finite differences of {ctx.fd_of}")
  return result


def check_nzs_out(ctx: CheckContext, mode):
  """Checks the nzs_out each primitive's vjp_fwd / lin declares: an output
  declared symbolically zero must have a zero derivative. Arguments and
  outputs of hi types are supported (their derivative is taken with the
  jvp rule)."""
  method = "vjp_fwd" if mode == "vjp" else "lin"
  for prim, p_args in applications(ctx.prim_fn, ctx.args):
    name = f"{type(prim).__name__}.{method}"
    p_leaves = jax.tree.leaves(p_args)
    nzs_in = jax.tree.unflatten(prim.in_tree, [_nz_in(x) for x in p_leaves])
    inputs = "\n".join(f"{type(prim).__name__} argument leaf {i} = "
                       f"{describe_leaf(x)}" for i, x in enumerate(p_leaves))
    check = f"{method}'s nzs_out vs the output's derivative"
    try:
      result = getattr(prim, method)(nzs_in, *p_args)
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised(mode, f"calling {method}", inputs, e, rule=name)
      continue
    if not isinstance(result, tuple) or len(result) < 3 or result[2] is None:
      continue
    try:
      nzs_out = _api.tuptree_flags(result[2], prim.out_tree, "nzs_out",
                                   f"the nzs_out returned by {name}")
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised(mode, check, inputs, e, rule=name)
      continue
    zero_outs = [k for k, nz in enumerate(nzs_out)
                 if not nz and _nz_in_aval(prim.out_avals_flat[k])]
    if not zero_outs:
      continue
    found = _zero_derivatives(ctx, prim, p_args, zero_outs)
    if found is None:
      ctx.skip(mode, f"{check} ({name}): an argument or output of a hi type "
               "and no jvp rule to differentiate it with")
      continue
    if not found:
      continue
    ctx.ran(mode, f"{check} ({name})")
    out_names = ["out" + jax.tree_util.keystr(p) for p, _ in
                 jax.tree_util.tree_flatten_with_path(
                     jax.tree.unflatten(prim.out_tree,
                                        list(range(len(nzs_out)))))[0]]
    for k, (err, allowed, label) in found.items():
      if not err <= allowed:
        ctx.fail(mode, check, inputs,
                 f"{method} returned nzs_out False for {out_names[k]} "
                 f"(a symbolically zero tangent), but its derivative is "
                 f"nonzero: max |J ṫ| = {err:.3g} from {label}", err,
                 rule=name)


def _nz_in_aval(aval) -> bool:
  if isinstance(aval, _core.ShapedArray):
    return bool(jnp.issubdtype(aval.dtype, jnp.floating))
  try:
    return is_float(aval.to_tangent_aval())
  except Exception:  # pylint: disable=broad-except
    return False


def check_lin(ctx: CheckContext):
  """``jax.linearize`` against the jvp rule (or finite differences); `lin`'s
  ``nzs_out``."""
  check_nzs_out(ctx, "lin")
  for direction in ctx.directions():
    inputs = ctx.describe_inputs(direction)
    f = ctx.restrict(direction)
    xs = tuple(ctx.leaves[i] for i in direction)
    ref, ref_label, bounds, tangents = ctx.tangent_reference(
        direction, [ctx.random_like(ctx.leaves[i]) for i in direction])
    try:
      out, f_lin = jax.linearize(f, *xs)
      t_out = f_lin(*tangents)
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("lin", "linearize", inputs, e)
      continue
    check = f"linearized vs {ref_label}"
    ctx.ran("lin", f"{check} ({ctx.describe_direction(direction)})")
    ctx.compare("lin", "lin's primal output vs the primitive's output",
                inputs, out, ctx.ref_out(), ctx.settings.tol, got_label="lin",
                want_label="the primitive")
    ctx.compare("lin", check, inputs, t_out, ref, ctx.settings.tol,
                got_label="linearized", want_label=ref_label, bounds=bounds)


def _linear_sets(ctx: CheckContext):
  """The sets of leaves in which prim_fn is linear (each transposed alone),
  and how they were found."""
  arg_leaves = []
  start = 0
  for a in ctx.args:
    n = len(jax.tree.leaves(a))
    arg_leaves.append(tuple(range(start, start + n)))
    start += n
  if ctx.settings.linear_argnums is not None:
    sets = []
    for entry in ctx.settings.linear_argnums:
      nums = (entry,) if isinstance(entry, int) else tuple(entry)
      sets.append(tuple(i for n in nums for i in arg_leaves[n]))
    return sets, None
  sets = [idx for idx in arg_leaves
          if idx and all(i in ctx.float_idx for i in idx)
          and _is_linear(ctx, idx)]
  return sets, "detected numerically"


def _is_linear(ctx: CheckContext, direction) -> bool:
  """Whether f(0) = 0 and f(0.75 u - 1.5 v) = 0.75 f(u) - 1.5 f(v) on random
  u, v, up to rounding on the scale of f(u) and f(v)."""
  f = ctx.restrict(direction, evaluate=True)
  try:
    zero = f(*[jnp.asarray(np.zeros_like(ctx.leaves[i])) for i in direction])
    u = [ctx.random_like(ctx.leaves[i]) for i in direction]
    v = [ctx.random_like(ctx.leaves[i]) for i in direction]
    fu, fv = f(*u), f(*v)
    fuv = f(*[jnp.asarray(0.75 * np.asarray(a) - 1.5 * np.asarray(b))
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
  for direction in sets:
    names = ", ".join(ctx.leaf_names[i] for i in direction)
    inputs = ctx.describe_inputs(extra=f"transposed in {names}" + (
        f" ({how})" if how else ""))
    f = ctx.restrict(direction)
    f_eval = ctx.restrict(direction, evaluate=True)
    xs = tuple(ctx.leaves[i] for i in direction)
    cts_out = tuple(ctx.random_like(y) for y in ctx.ref_out())
    try:
      cts_in = jax.linear_transpose(f, *xs)(cts_out)
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("transpose", "linear_transpose", inputs, e)
      continue
    check = "transpose vs the linear map (<ȳ, A ṫ> = <Aᵀ ȳ, ṫ>)"
    ctx.ran("transpose", f"{check} (in {names})")
    ctx.check_types("transpose",
                    "transpose's cotangent types vs the inputs' types",
                    inputs, cts_in, xs, [ctx.leaf_names[i] for i in direction],
                    "linear_transpose")
    for k in range(len(direction)) if len(direction) > 1 else [None]:
      tangents = [ctx.random_like(x) if k in (None, j)
                  else jnp.asarray(np.zeros_like(x)) for j, x in enumerate(xs)]
      lhs, rhs, bound = inner_identity(cts_out, f_eval(*tangents), cts_in,
                                       tangents, ctx.settings.tol)
      if not abs(lhs - rhs) <= bound:
        leaf = names if k is None else ctx.leaf_names[direction[k]]
        ctx.fail("transpose", check, inputs,
                 f"cotangent for {leaf}: <ȳ, A ṫ> = {lhs:.8g}, but "
                 f"<transpose(ȳ), ṫ> = {rhs:.8g}: error {abs(lhs - rhs):.3g} "
                 f"(tolerance {bound:.3g})", abs(lhs - rhs))
        break
