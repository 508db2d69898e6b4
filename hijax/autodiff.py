"""Autodiff rules of `HiPrim`: forward mode, linearization, reverse mode, transpose.

JAX differentiates a primitive through four tables, filled here per subclass:

* ``ad.primitive_jvps``: forward mode (``jax.jvp``), calling `HiPrim.jvp`;
* ``ad.primitive_linearizations``: called with ``is_vjp=True`` by ``grad`` and
  ``vjp`` (we call `HiPrim.vjp_fwd`) and with ``is_vjp=False`` by
  ``jax.linearize`` (we call `HiPrim.lin`). Reverse mode records the linear part
  as one equation of the subclass's *linearized* primitive, whose transpose
  calls `HiPrim.vjp_bwd` with gradient accumulators;
* ``ad.fancy_transposes``: the linearized primitive's transpose (above), and
  the primitive's own `HiPrim.transpose` for primitives linear in some inputs.

A backward rule may return a dict: JAX merges those into the logs returned by
``f_vjp.with_logs`` (and rejects a key logged twice).
"""
from __future__ import annotations

import jax
import numpy as np
from jax._src import ad_util
from jax._src import api
from jax._src import core
from jax._src import dtypes
from jax._src import pretty_printer as pp
from jax._src.interpreters import ad
from jax._src.interpreters import batching
from jax._src.state.types import AbstractRef

from hijax.primitive import (HiPrim, RULE_INSTALLERS, flatten_output,
                             taking_prim)

# JAX core recognises accumulators and symbolic zeros by class, so these are
# JAX's own classes, re-exported.
Zero = ad_util.Zero
GradAccum = ad.GradAccum
ValAccum = ad.ValAccum
RefAccum = ad.RefAccum
NullAccum = ad.NullAccum
instantiate_zeros = ad.instantiate_zeros

__all__ = ["Zero", "GradAccum", "ValAccum", "RefAccum", "NullAccum",
           "instantiate_zeros", "accumulate"]


def accumulate(prim: HiPrim, arg_accums, cts) -> None:
  """Adds cotangents returned by a retval-style rule into the accumulators.

  ``cts`` has one entry per input of ``prim``, each a pytree matching that
  input's type (None, anywhere, means a zero cotangent).
  """
  name = type(prim).__name__
  if not isinstance(cts, (tuple, list)) or len(cts) != len(prim.in_avals):
    raise TypeError(
        f"{name}.vjp_bwd_retval must return a tuple with one cotangent per "
        f"input ({len(prim.in_avals)}), got {_describe(cts)}")
  if prim._args_are_leaves:  # one accumulator per input: no pytrees to match
    for i, (acc, ct) in enumerate(zip(arg_accums, cts)):
      if ct is not None:
        _check_ct_shape(name, "vjp_bwd_retval", i, acc.aval, ct)
        acc.accum(ct)
    return
  for i, (accs, ct, aval_tree) in enumerate(zip(arg_accums, cts, prim.in_avals)):
    if ct is None:
      continue
    treedef = jax.tree.structure(aval_tree)
    try:
      ct_leaves = treedef.flatten_up_to(ct)
    except (ValueError, TypeError):
      raise TypeError(
          f"{name}.vjp_bwd_retval: the cotangent for input {i} has structure "
          f"{jax.tree.structure(ct)}, but the input has structure {treedef}"
      ) from None
    for acc, c in zip(jax.tree.leaves(accs), ct_leaves):
      if c is None:
        continue
      _check_ct_shape(name, "vjp_bwd_retval", i, acc.aval, c)
      acc.accum(c)


def _check_ct_shape(name, method, i, aval, ct):
  expected = getattr(aval, "shape", None)
  actual = ct.aval.shape if isinstance(ct, Zero) else np.shape(ct)
  if expected is not None and tuple(actual) != tuple(expected):
    raise TypeError(
        f"{name}.{method} returned a cotangent of shape {tuple(actual)} for "
        f"input {i}, whose type is {aval.str_short()}: a cotangent has the "
        "shape of its input")


def _describe(x):
  return f"a {type(x).__name__} of length {len(x)}" if isinstance(
      x, (tuple, list)) else f"a {type(x).__name__}"


def _unpack_forward(prim, method, result):
  """Splits a `vjp_fwd`/`lin` result into (out, res, nzs_out, sres)."""
  if not isinstance(result, tuple) or not 2 <= len(result) <= 4:
    raise TypeError(
        f"{type(prim).__name__}.{method} must return (out, residuals), "
        "(out, residuals, nzs_out) or (out, residuals, nzs_out, "
        f"structured_residuals); got {_describe(result)}")
  out, res, *rest = result
  nzs_out = rest[0] if rest else None
  sres = rest[1] if len(rest) > 1 else None
  return out, res, nzs_out, sres


def _check_out_types(prim, method, out_flat):
  for x, expected in zip(out_flat, prim.out_avals_flat):
    actual = core.typeof(x)
    if not core.typematch(actual, expected):
      raise TypeError(
          f"{type(prim).__name__}.{method} returned an output of type "
          f"{actual.str_short()}, but out_aval declares {expected.str_short()}; "
          "compute the primal output with self(*args)")


# --- forward mode ---------------------------------------------------------------

def _jvp_rule(primals_flat, tangents_flat, *, prim):
  primals = jax.tree.unflatten(prim.in_tree, primals_flat)
  tangents = jax.tree.unflatten(prim.in_tree, tangents_flat)
  result = prim.jvp(primals, tangents)
  if not isinstance(result, tuple) or len(result) != 2:
    raise TypeError(f"{type(prim).__name__}.jvp must return a pair "
                    f"(out, out_tangent), got {_describe(result)}")
  out, out_tangent = result
  return flatten_output(prim, "jvp", out), _flatten_tangent(prim, "jvp", out_tangent)


def _flatten_tangent(prim, method, tangent) -> list:
  """Flattens an output tangent against ``out_aval``; None becomes `Zero`."""
  try:
    flat = prim.out_tree.flatten_up_to(tangent)
  except (ValueError, TypeError):
    raise TypeError(
        f"{type(prim).__name__}.{method} returned a tangent with structure "
        f"{jax.tree.structure(tangent)}, but out_aval has structure "
        f"{prim.out_tree}") from None
  return [Zero(a.to_tangent_aval()) if t is None else t
          for t, a in zip(flat, prim.out_avals_flat)]


# --- linearization and reverse mode ---------------------------------------------

def _linearize_rule(is_vjp, nzs_in_flat, *args_flat, prim):
  name = type(prim).__name__
  args = jax.tree.unflatten(prim.in_tree, args_flat)
  nzs_in = jax.tree.unflatten(prim.in_tree, list(nzs_in_flat))
  method = "vjp_fwd" if is_vjp else "lin"
  result = prim.vjp_fwd(nzs_in, *args) if is_vjp else prim.lin(nzs_in, *args)
  out, res, nzs_out, sres = _unpack_forward(prim, method, result)
  out_flat = flatten_output(prim, method, out)
  _check_out_types(prim, method, out_flat)
  if nzs_out is None:
    nzs_out = any(nzs_in_flat) or any(
        isinstance(core.typeof(x), AbstractRef) for x in args_flat)
  nzs_out_flat = api.tuptree_flags(
      nzs_out, prim.out_tree, "nzs_out", f"the nzs_out returned by {name}.{method}")
  if sres is not None and is_vjp and type(prim).vjp_bwd is HiPrim.vjp_bwd:
    raise TypeError(
        f"{name}.vjp_fwd returned structured residuals, which only "
        "`vjp_bwd(self, res, sres, g, *accums)` can receive: override "
        "`vjp_bwd` instead of `vjp_bwd_retval`")
  if is_vjp:
    linearized = _bind_linearized(prim, list(nzs_in_flat), nzs_out_flat)
  else:
    linearized = _call_user_linearized(prim)
  return out_flat, nzs_out_flat, res, sres, linearized


def _bind_linearized(prim, nzs_in_flat, nzs_out_flat):
  """The tangent map of reverse mode: one equation, transposed by `vjp_bwd`."""
  def linearized(res, sres, *tangents_flat):
    if not any(nzs_out_flat):
      return [Zero(a.to_tangent_aval()) for a in prim.out_avals_flat]
    res_flat, res_tree = jax.tree.flatten(res if sres is None else (res, sres))
    res_flat = [dtypes.canonicalize_value(r) for r in res_flat]
    nz_tangents = [t for t in tangents_flat if type(t) is not Zero]
    outs = iter(prim._linearized_primitive.bind(
        *res_flat, *nz_tangents, prim=prim, res_tree=res_tree,
        nzs_in=tuple(nzs_in_flat), nzs_out=tuple(nzs_out_flat),
        has_sres=sres is not None))
    return [next(outs) if nz else Zero(a.to_tangent_aval())
            for a, nz in zip(prim.out_avals_flat, nzs_out_flat)]
  return linearized


def _call_user_linearized(prim):
  def linearized(res, sres, *tangents_flat):
    tangents = jax.tree.unflatten(prim.in_tree, tangents_flat)
    out = (prim.linearized(res, *tangents) if sres is None
           else prim.linearized(res, sres, *tangents))
    return _flatten_tangent(prim, "linearized", out)
  return linearized


def _linearized_abstract_eval(*avals, prim, res_tree, nzs_in, nzs_out, has_sres):
  return [a.to_tangent_aval() for a, nz in zip(prim.out_avals_flat, nzs_out)
          if nz]


def _linearized_transpose(cts_flat, *args, prim, res_tree, nzs_in, nzs_out,
                          has_sres):
  res = jax.tree.unflatten(res_tree, args[:res_tree.num_leaves])
  accums = iter(args[res_tree.num_leaves:])
  accums_flat = [next(accums) if nz else NullAccum(a.to_ct_aval())
                 for a, nz in zip(prim.in_avals_flat, nzs_in)]
  cts = iter(cts_flat)
  cts_full = [next(cts) if nz else Zero(a.to_ct_aval())
              for a, nz in zip(prim.out_avals_flat, nzs_out)]
  g = jax.tree.unflatten(prim.out_tree, cts_full)
  arg_accums = jax.tree.unflatten(prim.in_tree, accums_flat)
  if has_sres:
    res, sres = res
    logs = prim.vjp_bwd(res, sres, g, *arg_accums)
  else:
    logs = prim.vjp_bwd(res, g, *arg_accums)
  return _check_logs(prim, "vjp_bwd", logs)


def _check_logs(prim, method, logs):
  if logs is not None and type(logs) is not dict:
    raise TypeError(
        f"{type(prim).__name__}.{method} must return None or a dict of "
        f"backward-pass log entries, got {type(logs).__name__}")
  return logs


def _forward_only_error(*_, prim, **__):
  raise NotImplementedError(
      f"{type(prim).__name__}'s reverse-mode rules were asked for forward-mode "
      "values. Differentiating a vjp_fwd/vjp_bwd rule in forward mode needs a "
      "`jvp` rule on the primitive")


def _pp_linearized(eqn, context, settings):
  lhs = core.pp_vars(eqn.outvars, context, print_shapes=settings.print_shapes,
                     is_binder=True)
  rhs = pp.text(eqn.primitive.name + " ") + core.pp_vars(eqn.invars, context)
  return pp.concat([lhs, pp.text(" = "), rhs]) if eqn.outvars else rhs


# --- transposition of linear primitives -----------------------------------------

def _transpose_rule(cts_flat, *args_flat, prim):
  cts = jax.tree.unflatten(prim.out_tree, list(cts_flat))
  args = jax.tree.unflatten(prim.in_tree, list(args_flat))
  return _check_logs(prim, "transpose", prim.transpose(cts, *args))


def _install_autodiff_rules(cls):
  p, lin_p = cls._primitive, cls._linearized_primitive
  ad.primitive_jvps[p] = taking_prim(_jvp_rule)
  ad.primitive_linearizations[p] = taking_prim(_linearize_rule)
  ad.linearize_on_zero_tangents.add(p)  # refs may need the rule with zero tangents
  ad.fancy_transposes[p] = taking_prim(_transpose_rule)

  lin_p.is_high = lambda *avals, **params: True
  lin_p.def_abstract_eval(_linearized_abstract_eval)
  lin_p.to_lojax = _forward_only_error
  ad.fancy_transposes[lin_p] = _linearized_transpose
  batching.fancy_primitive_batchers[lin_p] = _forward_only_error
  core.pp_eqn_rules[lin_p] = _pp_linearized


RULE_INSTALLERS.append(_install_autodiff_rules)
