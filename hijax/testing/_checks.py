"""The checks of `expand`, of the first-order rules (`check_mode`: jvp, vjp
and lin in each direction) and of transpose, and the inner-product identity
that checks a backward rule."""
from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from hijax._internals import core as _core
from hijax.testing._context import Point, Settings, Writer
from hijax.testing._discovery import ExpandStructureError, eval_expanded
from hijax.testing._finite_diff import FLOOR
from hijax.testing._numerics import (compare_leaf, eps_of, inner_identity,
                                     on_device, type_str, ulp_factor)
from hijax.testing._nzs_out import check_nzs_out
from hijax.testing._report import KINK


# ``<ȳ, J ṫ> = <Jᵀ ȳ, ṫ>`` checks a backward rule against a reference for
# ``J ṫ``: output elements the reference cannot judge get a zero cotangent;
# input elements whose cotangent is not finite, where some output element
# was not judged (a kink), are left out (a zero tangent) and the identity
# checked again; where the function is flat, each of two rules may lose
# what cancels (`_flat_floors`).

def aligned_cotangents(p: Point, like, j_t, judged):
  """Random cotangents with the signs of ``J ṫ``: ``<ȳ, J ṫ>`` then has no
  cancellation to hide a wrong rule in."""
  out = []
  for y, t, ok in zip(like, j_t, judged):
    c = np.abs(np.asarray(p.random_like(y)))
    t = np.asarray(t)
    random_sign = p.rng.choice(np.array([-1.0, 1.0]), size=c.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
      # complex: Re(ȳ J ṫ) = c |J ṫ| with ȳ along conj(J ṫ)
      unit = np.conj(t) / np.abs(t) if np.iscomplexobj(t) else np.sign(t)
      sign = np.where(np.isfinite(t) & (t != 0), unit, random_sign)
    out.append(on_device(np.where(ok, c * sign, 0).astype(
        np.asarray(y).dtype)))
  return out


def check_identity(p: Point, s: Settings, w: Writer, mode: str, check: str,
                   inputs: str, tangents: list | None, direction,
                   reference: Callable, transpose: Callable,
                   floors: Callable | None = None, rule: str | None = None,
                   what: str = "<ȳ, J ṫ> = {lhs:.8g} with J ṫ from {ref}, but "
                   "<vjp(ȳ), ṫ> = {rhs:.8g}", hint: str = ""):
  """Checks ``<ȳ, J ṫ> = <transpose(ȳ), ṫ>`` at ``p`` along ``direction``;
  ``reference(tangents, first)``: `reference`'s tuple."""
  like = p.ref_out()
  judge = lambda bounds, est: p.judged(direction, bounds, est)
  ref, label, bounds, used, est = reference(tangents, True)
  judged = judge(bounds, est)
  if not any(np.any(ok) for ok in judged):
    w.judged_nothing(check, "no output element can be judged along this "
                       "direction (see the finite differences above)")
    return
  ybar = aligned_cotangents(p, like, ref, judged)
  cts_in = transpose(ybar)
  left_out = [~np.isfinite(np.asarray(c)) for c in cts_in]
  if any(np.any(b) for b in left_out) and not all(np.all(ok) for ok in judged):
    w.inconclusive(check, "the backward rule gives a non-finite cotangent "
                     f"at {sum(int(np.sum(b)) for b in left_out)} input "
                     "element(s), and the function is not smooth or not "
                     "finite at some output element (see above): those "
                     "input elements are left out", KINK)
    ref, label, bounds, used, est = reference(
        [on_device(np.where(b, 0, t)) for t, b in zip(used, left_out)], False)
    judged = judge(bounds, est)
    ybar = aligned_cotangents(p, like, ref, judged)
    cts_in = [on_device(np.where(b, 0, c))
              for c, b in zip(transpose(ybar), left_out)]
  ref = [np.where(ok, r, 0) for r, ok in zip(ref, judged)]
  lhs, rhs, bound = inner_identity(ybar, ref, cts_in, used,
                                   s.tol, bounds)
  if floors is not None and bounds is None:
    top = max([float(np.max(np.abs(np.asarray(y)))) for y in ybar
               if np.size(y)] or [0.0])
    bound += 2 * top * sum(float(np.sum(f)) for f in floors(used))
  if abs(lhs - rhs) <= bound:
    counted = judged if est is None or lhs == rhs else [
        ok & ~u for ok, u in zip(judged, est.uncounted())]
    if np.isfinite(bound) and any(np.any(ok) for ok in counted):
      w.conclusive_pass(mode, rule)
    else:
      w.judged_nothing(check, f"{label} only bounds the elements compared "
                         "(see above)")
    return
  w.fail(mode, check, inputs,
           what.format(lhs=lhs, rhs=rhs, ref=label)
           + f": error {abs(lhs - rhs):.3g} (tolerance {bound:.3g})"
           + (hint if np.isfinite(rhs) else ""), abs(lhs - rhs), rule=rule)


def _flat_floors(p: Point, w: Writer, direction, tangents) -> list:
  """Per output, the error allowed between two rules' ``J ṫ`` where the
  function is flat: ``FLOOR eps |y| max |ṫ|``."""
  est = p.fd(direction, w)
  top_t = max([float(np.max(np.abs(np.asarray(t)))) for t in tangents
               if np.size(t)] or [0.0])
  return [np.where(flat, FLOOR * eps_of(np.asarray(y).dtype)
                   * np.abs(np.asarray(y)) * top_t, 0.0)
          for y, flat in zip(p.ref_out(), est.flat())]


def _check_types(w: Writer, mode, check, inputs, got, like, names,
                 got_label):
  """Fails the first of ``got`` without the type of its input."""
  for name, g, x in zip(names, got, like):
    if type_str(g) != type_str(x):
      w.fail(mode, check, inputs,
               f"{name}: {got_label} gives {type_str(g)}, but the input is "
               f"{type_str(x)} (a cotangent has the shape and dtype of "
               "its input)", float("inf"))
      return


def check_expand(p: Point, s: Settings, w: Writer):
  """`expand`'s output types against ``out_aval``, the eager and the jitted
  call against `expand`; a custom function's jitted call against its
  trace's types (and, without jit, against the eager call)."""
  inputs = p.describe_inputs()
  jitted = ((lambda *_: p.compiled.evaluate([p.leaves])[0]) if s.jit
            else jax.jit(p.fn))
  if p.fd_of == "expand":
    want = _expanded(p, w, inputs)
    for how, fn in [("eager call", p.fn), ("jitted call", jitted)]:
      if want is not None and (got := _call(
          w, f"{how} vs expand", inputs, fn, p.args)) is not None:
        _versus(p, s, w, inputs, how, got, "expand", want)
    return
  if (got := _call(w, "jitted call", inputs, jitted, p.args)) is None:
    return
  _check_traced_types(p, w, inputs, got)
  if not s.jit and (eager := _call(w, "eager call", inputs, p.fn,
                                   p.args)) is not None:
    _versus(p, s, w, inputs, "jitted call", got, "eager call",
            [on_device(y) for y in eager])


def _call(w: Writer, check, inputs, fn, args) -> list | None:
  """``fn(*args)``'s leaves, or None where it raised (failed)."""
  try:
    return jax.tree.leaves(fn(*args))
  except Exception as e:  # pylint: disable=broad-except
    w.fail_raised("expand", check, inputs, e)
    return None


def _versus(p: Point, s: Settings, w: Writer, inputs, got_label, got,
            want_label, want):
  check = f"{got_label} vs {want_label}"
  w.ran("expand", check)
  w.compare("expand", check, inputs, got, want, s.tol, names=p.out_names,
            got_label=got_label, want_label=want_label,
            floors=p.primal_floors(w, True))


def _expanded(p: Point, w: Writer, inputs) -> list | None:
  """`expand` evaluated at the point, its output types checked against
  ``out_aval`` (None where it raised)."""
  closed = jax.make_jaxpr(p.fn)(*p.args)
  found = []
  try:
    expanded = eval_expanded(closed.jaxpr, closed.consts, p.leaves, found)
  except ExpandStructureError as e:
    w.fail("expand", "expand's output structure matches out_aval", inputs,
           str(e), float("inf"), rule=f"{type(e.prim).__name__}.expand")
    return None
  except Exception as e:  # pylint: disable=broad-except
    w.fail_raised("expand", "evaluating expand", inputs, e)
    return None
  w.ran("expand", "expand's output types match out_aval")
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
        w.fail("expand", "expand's output types match out_aval", inputs,
               f"output leaf {i}: expand returned {got.str_short()}, but "
               f"out_aval declares {aval.str_short()}", float("inf"),
               rule=f"{type(prim).__name__}.expand")
  return [on_device(x) for x in expanded]


def _check_traced_types(p: Point, w: Writer, inputs, got):
  """A custom function's compiled call must return its trace's types."""
  check = "jitted call's output types vs its trace"
  w.ran("expand", check)
  for name, y, aval in zip(p.out_names, got, p.out_avals):
    if (np.shape(y), np.asarray(y).dtype) != (aval.shape, aval.dtype):
      w.fail("expand", check, inputs,
             f"{name}: the jitted call gives {type_str(y)}, but its trace "
             f"gives {aval.dtype.name}{list(aval.shape)}", float("inf"))


def _same_primal(p: Point, s: Settings, w: Writer, mode, inputs,
                 out) -> bool:
  """Whether a derivative's primal output is the function's (uncounted)."""
  return w.compare(mode, f"{mode}'s primal output vs the primitive's "
                   "output", inputs, out, p.ref_out(), s.tol,
                   got_label=mode, want_label="the primitive",
                   floors=p.primal_floors(w), counts=False)


def check_mode(p: Point, s: Settings, w: Writer, mode: str,
               jvp_passed: dict):
  """The checks of ``expand``, ``transpose`` or a first-order derivative
  (``jvp``, ``vjp``, ``lin``: in each direction, ``jvp_passed`` recording
  where the jvp rule passed, the reference of the others)."""
  if mode in ("expand", "transpose"):
    return (check_expand if mode == "expand" else check_transpose)(p, s, w)
  if mode != "jvp":
    check_nzs_out(p, s, w, mode)
  for direction in p.directions():
    if not w.out_of_time(mode, p.describe_direction(direction)):
      _AT_DIRECTION[mode](p, s, w, direction, p.describe_inputs(direction),
                          jvp_passed)
  return None


def _jvp_at(p: Point, s: Settings, w: Writer, direction, inputs,
            jvp_passed: dict):
  """``jax.jvp`` against central finite differences."""
  tangents = list(p.fd(direction, w).tangents)  # those of the reference
  check = f"jvp vs central finite differences of {p.fd_of}"
  try:
    out, t_out = p.derivative("jvp", direction, tangents)
  except Exception as e:  # pylint: disable=broad-except
    w.fail_raised("jvp", check, inputs, e)
    jvp_passed[direction] = False
    return
  ok = _same_primal(p, s, w, "jvp", inputs, out)
  where = f"{check} ({p.describe_direction(direction)})"
  if p.surrogate:  # its tangent is not the function's: nothing to compare
    w.skip_by_intent("jvp", f"{where}: a surrogate's tangent is not "
                     "compared with the function")
  else:
    w.ran("jvp", where)
    fd = p.fd(direction, w)
    ok &= w.compare("jvp", check, inputs, t_out, fd.values, s.tol,
                    got_label="jvp", want_label="finite differences",
                    bounds=fd.bounds, skip=fd.skipped(),
                    uncounted=fd.uncounted(), own=fd.own)
  jvp_passed[direction] = ok


def reference(p: Point, s: Settings, w: Writer, direction, tangents,
              first=True, trust_jvp=False, of=None):
  """``(J ṫ, label, bounds, tangents, est)`` from the jvp rule where
  ``trust_jvp``, else from finite differences of ``of`` (``first``: the
  point's own)."""
  if trust_jvp:
    try:
      return (list(p.derivative("jvp", direction, tangents)[1]),
              "the jvp rule", None, list(tangents), None)
    except Exception:  # pylint: disable=broad-except  (the jvp check reports it)
      pass
  est = (p.fd(direction, w) if first
         else p.fd_along(direction, tangents, s.eps))
  return (list(est.values), f"finite differences of {of or p.fd_of}",
          est.bounds, list(est.tangents), est)


def _vjp_at(p: Point, s: Settings, w: Writer, direction, inputs,
            jvp_passed: dict):
  """``jax.vjp`` against the jvp rule (or finite differences) through
  ``<ȳ, J ṫ> = <vjp(ȳ), ṫ>``."""
  xs = tuple(p.xs_of(direction))
  tangents = [p.random_like(p.leaves[i]) for i in direction]
  try:
    out, _ = p.derivative("vjp", direction, [np.zeros_like(y)
                                             for y in p.ref_out()])
  except Exception as e:  # pylint: disable=broad-except
    w.fail_raised("vjp", "vjp", inputs, e)
    return
  trust = p.has("jvp") and jvp_passed.get(direction, True)
  label = "the jvp rule" if trust else f"finite differences of {p.fd_of}"
  check = f"vjp vs {label} (<ȳ, J ṫ> = <vjp(ȳ), ṫ>)"
  if p.surrogate and not trust:
    w.skip_by_intent(
        "vjp", f"{check} ({p.describe_direction(direction)}): a "
        "surrogate's backward pass is not compared with the function")
    return
  w.ran("vjp", f"{check} ({p.describe_direction(direction)})")
  _same_primal(p, s, w, "vjp", inputs, out)
  calls = []

  def transpose(ybar):
    cts_in = list(p.derivative("vjp", direction, ybar)[1])
    if not calls:  # the types, at the first call
      _check_types(w, "vjp", "vjp's cotangent types vs the inputs' types",
                   inputs, cts_in, xs, [p.names[i] for i in direction], "vjp")
    calls.append(ybar)
    return cts_in
  try:
    check_identity(p, s, w, "vjp", check, inputs, tangents, direction,
                   lambda t, first: reference(p, s, w, direction, t, first,
                                              trust), transpose,
                   lambda t: _flat_floors(p, w, direction, t))
  except Exception as e:  # pylint: disable=broad-except
    w.fail_raised("vjp", check, inputs, e)


def _lin_at(p: Point, s: Settings, w: Writer, direction, inputs,
            jvp_passed: dict):
  """``jax.linearize`` against the jvp rule (or finite differences)."""
  ref, ref_label, bounds, tangents, est = reference(
      p, s, w, direction, [p.random_like(p.leaves[i]) for i in direction],
      trust_jvp=p.has("jvp") and jvp_passed.get(direction, True))
  uncounted, own = (None, None) if est is None else (est.uncounted(),
                                                     est.own)
  if p.surrogate and bounds is not None:
    w.skip_by_intent("lin", f"linearized vs {ref_label}: a surrogate's "
                     "tangent is not compared with the function")
    return
  try:
    out, t_out = p.derivative("lin", direction, tangents)
  except Exception as e:  # pylint: disable=broad-except
    w.fail_raised("lin", "linearize", inputs, e)
    return
  check = f"linearized vs {ref_label}"
  w.ran("lin", f"{check} ({p.describe_direction(direction)})")
  _same_primal(p, s, w, "lin", inputs, out)
  floors = None
  if bounds is None:  # two rules: each may lose what cancels
    floors = [2 * f for f in _flat_floors(p, w, direction, tangents)]
  skip = [~ok for ok in p.judged(direction)]
  w.compare("lin", check, inputs, t_out, ref, s.tol, got_label="linearized",
            want_label=ref_label, bounds=bounds, skip=skip, floors=floors,
            uncounted=uncounted, own=own)


_AT_DIRECTION = {"jvp": _jvp_at, "vjp": _vjp_at, "lin": _lin_at}


def _linear_sets(p: Point, s: Settings):
  """The sets of leaves prim_fn is linear in, and how they were found."""
  ends = np.cumsum([len(jax.tree.leaves(a)) for a in p.args], dtype=int)
  arg_leaves = [tuple(range(e - len(jax.tree.leaves(a)), e))
                for a, e in zip(p.args, ends)]
  if s.linear_argnums is not None:
    return [tuple(i for n in ((e,) if isinstance(e, int) else e)
                  for i in arg_leaves[n])
            for e in s.linear_argnums], None
  sets = [idx for idx in arg_leaves
          if idx and all(i in p.float_idx for i in idx)
          and _is_linear(p, s, idx)]
  return sets, "detected numerically"


def _is_linear(p: Point, s: Settings, direction) -> bool:
  """Whether f(0) = 0 and f(0.75 u - 1.5 v) = 0.75 f(u) - 1.5 f(v) on random
  u, v, up to rounding on the scale of f(u) and f(v)."""
  f = p.restrict(direction, evaluate=True)
  try:
    zero = f(*[on_device(np.zeros_like(p.leaves[i])) for i in direction])
    u, v = ([p.random_like(p.leaves[i]) for i in direction]
            for _ in range(2))
    fu, fv = f(*u), f(*v)
    fuv = f(*[on_device(0.75 * np.asarray(a) - 1.5 * np.asarray(b))
              for a, b in zip(u, v)])
  except Exception:  # pylint: disable=broad-except
    return False
  tol = s.tol
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


def check_transpose(p: Point, s: Settings, w: Writer):
  """``jax.linear_transpose`` against the linear map, through
  ``<ȳ, A ṫ> = <Aᵀ ȳ, ṫ>``, in each set of arguments it is linear in."""
  sets, how = _linear_sets(p, s)
  if not sets:
    w.fail("transpose", "transpose", p.describe_inputs(),
             "the primitive defines a transpose rule, but prim_fn is not "
             "linear in any one argument on this input; pass "
             "linear_argnums= to say which arguments are linear",
             float("inf"))
    return
  # found linear numerically: a rule may refuse some (judged after the loop)
  raised, transposed = [], False
  for direction in sets:
    names = ", ".join(p.names[i] for i in direction)
    if w.out_of_time("transpose", f"in {names}"):
      continue
    inputs = p.describe_inputs(extra=f"transposed in {names}" + (
        f" ({how})" if how else ""))
    f = p.restrict(direction)
    f_eval = p.restrict(direction, evaluate=True)
    xs = tuple(p.leaves[i] for i in direction)
    cts_out = tuple(p.random_like(y) for y in p.ref_out())
    try:
      cts_in = jax.linear_transpose(f, *xs)(cts_out)
    except Exception as e:  # pylint: disable=broad-except
      if how is None:
        w.fail_raised("transpose", "linear_transpose", inputs, e)
      else:
        raised.append((
            "linear_transpose", inputs, e,
            f"transposed in {names}: the rule raised {type(e).__name__}: "
            f"{e}; {names} was found linear numerically, not declared: pass "
            "linear_argnums= to check the transpose in it"))
      continue
    transposed = True
    check = "transpose vs the linear map (<ȳ, A ṫ> = <Aᵀ ȳ, ṫ>)"
    w.ran("transpose", f"{check} (in {names})")
    _check_types(w, "transpose",
                 "transpose's cotangent types vs the inputs' types", inputs,
                 cts_in, xs, [p.names[i] for i in direction],
                 "linear_transpose")
    for k in range(len(direction)) if len(direction) > 1 else [None]:
      tangents = [p.random_like(x) if k in (None, j)
                  else on_device(np.zeros_like(x)) for j, x in enumerate(xs)]
      lhs, rhs, bound = inner_identity(cts_out, f_eval(*tangents), cts_in,
                                       tangents, s.tol)
      if abs(lhs - rhs) <= bound:
        w.conclusive_pass("transpose")
      else:
        leaf = names if k is None else p.names[direction[k]]
        w.fail("transpose", check, inputs,
                 f"cotangent for {leaf}: <ȳ, A ṫ> = {lhs:.8g}, but "
                 f"<transpose(ȳ), ṫ> = {rhs:.8g}: error {abs(lhs - rhs):.3g} "
                 f"(tolerance {bound:.3g})", abs(lhs - rhs))
        break
  w.judge_refusals("transpose", raised, transposed)
