"""The check of the ``nzs_out`` that `vjp_fwd` and `lin` return: an output
declared to have a symbolically zero tangent must have a zero derivative."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from hijax._internals import api as _api
from hijax._internals import core as _core
from hijax.testing._compiled import replaced
from hijax.testing._context import Point, Settings, Writer
from hijax.testing._discovery import application_types, defined_rules
from hijax.testing._finite_diff import BOUNDED, RESOLVED
from hijax.testing._numerics import describe_leaf, is_float, on_device, ulp_factor
from hijax.testing._report import RuleReport


def _tangent_aval(x) -> Any:
  """The type of a leaf's (or type's) tangent (a shaped array's for an array)."""
  aval = x if isinstance(x, _core.AbstractValue) else _core.typeof(x)
  return (aval if isinstance(aval, _core.ShapedArray)
          else aval.to_tangent_aval())


def _nz_in(x) -> bool:
  """Whether a leaf's (or type's) tangent type is a floating-point array."""
  try:
    return is_float(_tangent_aval(x))
  except Exception:  # pylint: disable=broad-except
    return False


def _prim_jvp(prim, direction, p_leaves, tangents):
  """``jax.jvp`` of ``prim`` at its argument leaves ``p_leaves``, along
  ``tangents`` for the leaves in ``direction``."""
  def f(*xs):
    return prim(*jax.tree.unflatten(prim.in_tree,
                                    replaced(p_leaves, direction, xs)))
  return jax.jvp(f, tuple(p_leaves[i] for i in direction), tuple(tangents))


# One program per primitive and types, whichever point or mode asks.
_prim_jvp_compiled = jax.jit(_prim_jvp, static_argnums=(0, 1))


def _zero_derivatives(p: Point, s: Settings, prim, p_args, zero_outs):
  """``{k: (max |J ṫ|, allowed, label, resolved)}`` of the outputs
  ``zero_outs``; None where nothing can differentiate them."""
  p_leaves = jax.tree.leaves(p_args)
  direction = tuple(i for i, x in enumerate(p_leaves) if _nz_in(x))
  if not direction:
    return {}
  if "jvp" in defined_rules(prim):
    # random tangents (for a hi value: of its tangent type)
    tangents = [on_device(p.rng.standard_normal(a.shape).astype(a.dtype))
                for a in (_tangent_aval(p_leaves[i]) for i in direction)]
    top = lambda xs: max(float(np.max(np.abs(np.asarray(x, np.float64))))
                         for x in xs if np.size(x))
    tol = s.tol
    # compiled (one program, not one per operation), else eagerly
    for how in ([_prim_jvp_compiled] if s.jit else []) + [_prim_jvp]:
      try:
        out, t_out = how(prim, direction, list(p_leaves), list(tangents))
      except Exception:  # pylint: disable=broad-except  (the jvp check reports it)
        continue
      outs, t_outs = jax.tree.leaves(out), jax.tree.leaves(t_out)
      result = {}
      for k in zero_outs:
        if k < len(t_outs) and np.size(t_outs[k]):
          y = (outs[k] if isinstance(_core.typeof(outs[k]), _core.ShapedArray)
               else np.zeros(()))
          # rounding on the scale of the output and the tangents
          result[k] = (top([t_outs[k]]), tol.atol + (tol.rtol + ulp_factor(
              tol, np.asarray(t_outs[k]).dtype)) * top([y, *tangents]),
                       "the jvp rule", True)
      return result
  if any(not isinstance(_core.typeof(x), _core.ShapedArray) for x in p_leaves
         ) or any(not isinstance(a, _core.ShapedArray)
                  for a in prim.out_avals_flat):  # a hi type
    return None
  sub = Point.of(lambda *a: prim(*a), p_args,
                 [f"leaf {i}" for i in range(len(p_leaves))], [prim], s,
                 p.rng, fd_scale=p.fd_scale)
  est = sub.fd(tuple(sub.float_idx), Writer(RuleReport([], ""), sub, s))
  result = {}
  for k in zero_outs:
    j = sub.out_float_idx.index(k)
    v, b, st = (est.values[j].ravel(), est.bounds[j].ravel(),
                est.status[j].ravel())
    if v.size:  # bounded elements refute, only resolved ones confirm
      i = int(np.argmax(np.where(np.isin(st, (RESOLVED, BOUNDED)),
                                 np.abs(v) - b, -np.inf)))
      result[k] = (float(np.abs(v[i])), float(b[i]),
                   f"finite differences of {p.fd_of}",
                   bool(np.any(st == RESOLVED)))
  return result


def _declared_nzs_out(s: Settings, rule, nzs_in, p_types, values):
  """The ``nzs_out`` ``rule`` returns (traced where it can be), or None."""
  def nzs_of(result):
    return result[2] if isinstance(result, tuple) and len(result) >= 3 else None
  if s.jit and all(isinstance(a, _core.ShapedArray)
                              for a in jax.tree.leaves(p_types)):
    found = []

    def traced(*args):
      found.append(nzs_of(rule(nzs_in, *args)))
      return ()
    try:
      jax.eval_shape(traced, *jax.tree.map(
          lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                         weak_type=a.weak_type), p_types))
    except Exception:  # pylint: disable=broad-except  (eagerly, it says why)
      found = []
    if found and not any(isinstance(x, _core.Tracer)
                         for x in jax.tree.leaves(found[0])):
      return found[0]
  p_args = values()
  return None if p_args is None else nzs_of(rule(nzs_in, *p_args))


def check_nzs_out(p: Point, s: Settings, w: Writer, mode):
  """Checks the nzs_out each primitive's vjp_fwd / lin declares: an output
  declared symbolically zero must have a zero derivative."""
  method = "vjp_fwd" if mode == "vjp" else "lin"
  if p.fd_of != "expand":  # jax.custom_* functions return no nzs_out
    return
  def values(j):  # found when first needed, once per context
    found = p.application_values
    return found[j] if j < len(found) else None

  for j, (prim, p_types) in enumerate(
      application_types(p.fn, p.args)):
    name = f"{type(prim).__name__}.{method}"
    p_leaves = jax.tree.leaves(p_types)
    nzs_in = jax.tree.unflatten(prim.in_tree, [_nz_in(a) for a in p_leaves])
    # the arguments: their values where they were found, else their types
    inputs = lambda j=j, prim=prim, p_leaves=p_leaves: "\n".join(
        f"{type(prim).__name__} argument leaf {i} = " + (
            x.str_short() if values(j) is None else describe_leaf(x))
        for i, x in enumerate(p_leaves if values(j) is None
                              else jax.tree.leaves(values(j))))
    check = f"{method}'s nzs_out vs the output's derivative"
    try:
      declared = _declared_nzs_out(s, getattr(prim, method), nzs_in,
                                   p_types, lambda j=j: values(j))
    except Exception as e:  # pylint: disable=broad-except
      w.fail_raised(mode, f"calling {method}", inputs(), e, rule=name)
      continue
    if declared is None:
      continue
    try:
      nzs_out = _api.tuptree_flags(declared, prim.out_tree, "nzs_out",
                                   f"the nzs_out returned by {name}")
    except Exception as e:  # pylint: disable=broad-except
      w.fail_raised(mode, check, inputs(), e, rule=name)
      continue
    zero_outs = [k for k, nz in enumerate(nzs_out)
                 if not nz and _nz_in(prim.out_avals_flat[k])]
    if not zero_outs or values(j) is None:
      continue
    found = _zero_derivatives(p, s, prim, values(j), zero_outs)
    if found is None:
      w.skip(mode, f"{check} ({name}): an argument or output of a hi type "
               "and no jvp rule to differentiate it with")
      continue
    if found:
      w.ran(mode, f"{check} ({name})")
    out_names = ["out" + jax.tree_util.keystr(p) for p, _ in
                 jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(
                     prim.out_tree, list(nzs_out)))[0]]
    for k, (err, allowed, label, resolved) in found.items():
      if not err <= allowed:
        w.fail(mode, check, inputs(),
                 f"{method} returned nzs_out False for {out_names[k]} "
                 f"(a symbolically zero tangent), but its derivative is "
                 f"nonzero: max |J ṫ| = {err:.3g} from {label}", err,
                 rule=name)
      elif not resolved:
        w.judged_nothing(f"{check} ({name})",
                           f"{label} resolve no element of {out_names[k]}")
