"""The second derivative of the rules, against finite differences of the
first: a backward rule (or a jvp rule) can be right at first order and
wrong when differentiated again, e.g. ``g * stop_gradient(cos(x))``, whose
Hessian is 0 instead of ``-sin x``. The rules that bind hijax primitives
again are checked rule by rule in `hijax.testing._run`; this check covers
every rule, at the cost of finite differences of the first derivative."""
from __future__ import annotations

import jax

from hijax.testing._context import CheckContext
from hijax.testing._numerics import inner_identity


def _first_derivatives(ctx: CheckContext):
  """``(mode, description, g, xs, names)``: the backward pass
  ``x -> vjp(f, x)[1](ȳ)`` and the tangent map ``x -> jvp(f, x, ṫ)[1]``, for
  fixed random ``ȳ`` and ``ṫ``, as functions of the floating-point inputs."""
  direction = tuple(ctx.float_idx)
  f = ctx.restrict(direction)
  xs = [ctx.leaves[i] for i in direction]
  names = [ctx.leaf_names[i] for i in direction]
  found = []
  if ctx.has("vjp") and "vjp" in ctx.requested:
    ybar = tuple(ctx.random_like(y) for y in ctx.ref_out())
    found.append(("vjp", "the backward pass x -> vjp(f, x)[1](ȳ)",
                  lambda *a: jax.vjp(f, *a)[1](ybar), xs, names))
  if ctx.has("jvp") and "jvp" in ctx.requested:
    tdot = tuple(ctx.random_like(x) for x in xs)
    found.append(("jvp", "the tangent map x -> jvp(f, x, ṫ)[1]",
                  lambda *a: jax.jvp(f, a, tdot)[1], xs, names))
  return found


def check_differentiated_rules(ctx: CheckContext):
  """The vjp of the backward pass and the jvp of the tangent map (second
  derivatives as JAX computes them from the rules) against central finite
  differences of the backward pass and of the tangent map."""
  for mode, what, g, xs, names in _first_derivatives(ctx):
    inputs = ctx.describe_inputs(extra=f"differentiating {what}")
    check = f"{what}, differentiated again, vs its finite differences"
    try:
      sub = ctx.sub(g, xs, names, ctx.prims, label=ctx.label,
                    per_leaf=False)
      est = sub.fd(tuple(sub.float_idx))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("second_order", check, inputs, e,
                      rule=ctx.rule_name(mode))
      continue
    if not sub.out_float_idx:
      continue
    evals = est.evaluations + 1
    try:
      if mode == "vjp":  # reverse over reverse: needs no jvp rule
        w = tuple(sub.random_like(y) for y in sub.ref_out())
        _, g_vjp = jax.vjp(sub.restrict(tuple(sub.float_idx)),
                           *[sub.leaves[i] for i in sub.float_idx])
        cts = g_vjp(w)
      else:  # forward over forward
        _, t_out = jax.jvp(sub.restrict(tuple(sub.float_idx)),
                           tuple(sub.leaves[i] for i in sub.float_idx),
                           tuple(est.tangents))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("second_order", check, inputs, e,
                      rule=ctx.rule_name(mode))
      continue
    ctx.report.cost["second-order evaluations"] = ctx.report.cost.get(
        "second-order evaluations", 0) + evals
    ctx.ran("second_order", check)
    if mode == "vjp":
      lhs, rhs, bound = inner_identity(w, est.values, cts, est.tangents,  # pyright: ignore[reportPossiblyUnboundVariable]
                                       ctx.settings.tol, est.bounds)
      if not abs(lhs - rhs) <= bound:
        ctx.fail("second_order", check, inputs,
                 f"<w, H ṫ> = {lhs:.8g} with H ṫ from finite differences of "
                 f"the backward pass, but <vjp of the backward pass (w), ṫ> "
                 f"= {rhs:.8g}: error {abs(lhs - rhs):.3g} (tolerance "
                 f"{bound:.3g}); the backward rule is not differentiable "
                 "as it stands (a stop_gradient, a residual computed "
                 "outside JAX, ...)", abs(lhs - rhs), rule=ctx.rule_name(mode))
    else:
      ctx.compare("second_order", check, inputs, t_out, est.values,  # pyright: ignore[reportPossiblyUnboundVariable]
                  ctx.settings.tol, names=[sub.out_names[i] for i in
                                           sub.out_float_idx],
                  got_label="jvp of the tangent map",
                  want_label="finite differences", bounds=est.bounds,
                  rule=ctx.rule_name(mode))
