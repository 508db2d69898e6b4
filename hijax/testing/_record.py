"""The inner-product identity that checks a backward rule against a
reference for ``J ṫ``: `check_identity`."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hijax.testing._numerics import inner_identity, on_device


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

def aligned_cotangents(ctx: Any, like, j_t, judged):
  """Random cotangents with the signs of ``J ṫ``: ``<ȳ, J ṫ>`` then has no
  cancellation to hide a wrong rule in."""
  out = []
  for y, t, ok in zip(like, j_t, judged):
    c = np.abs(np.asarray(ctx.random_like(y)))
    t = np.asarray(t)
    random_sign = ctx.rng.choice(np.array([-1.0, 1.0]), size=c.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
      if np.iscomplexobj(t):  # Re(ȳ J ṫ) = c |J ṫ|: ȳ along conj(J ṫ)
        sign = np.where(np.isfinite(t) & (t != 0), np.conj(t) / np.abs(t),
                        random_sign)
      else:
        sign = np.where(np.isfinite(t) & (t != 0), np.sign(t), random_sign)
    ybar = np.where(ok, c * sign, 0)
    out.append(on_device(ybar.astype(np.asarray(y).dtype)))
  return out


def _finite(xs):
  return [np.isfinite(np.asarray(x)) for x in xs]


def check_identity(ctx: Any, mode: str, check: str, inputs: str,
                   tangents: list | None, like: Sequence,
                   reference: Callable, transpose: Callable,
                   floors: Callable | None = None, rule: str | None = None,
                   what: str = "<ȳ, J ṫ> = {lhs:.8g} with J ṫ from {ref}, but "
                   "<vjp(ȳ), ṫ> = {rhs:.8g}", hint: str = "") -> bool:
  """Checks ``<ȳ, J ṫ> = <transpose(ȳ), ṫ>``; records a failure or an
  inconclusive entry."""
  ref, label, bounds, judged, used, uncounted = reference(tangents)
  if not any(np.any(ok) for ok in judged):
    ctx.judged_nothing(check, "no output element can be judged along this "
                       "direction (see the finite differences above)")
    return True
  ybar = aligned_cotangents(ctx, like, ref, judged)
  cts_in = transpose(ybar)
  left_out = [~ok for ok in _finite(cts_in)]
  if any(np.any(b) for b in left_out) and not all(np.all(ok) for ok in judged):
    ctx.inconclusive(check, "the backward rule gives a non-finite cotangent "
                     f"at {sum(int(np.sum(b)) for b in left_out)} input "
                     "element(s), and the function is not smooth or not "
                     "finite at some output element (see above): those "
                     "input elements are left out")
    ref, label, bounds, judged, used, uncounted = reference(
        [on_device(np.where(b, 0, t)) for t, b in zip(used, left_out)])
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
    counted = judged if uncounted is None or lhs == rhs else [
        ok & ~u for ok, u in zip(judged, uncounted)]
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
