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

What every rule returns is checked against the declared types by
`hijax._checks` (once per trace or eager call). Cotangents of the wrong dtype
(a float16 cotangent for a float32 input, an int32 value accumulated into a
float32 input) are **rejected**, not converted: converting would hide that the
rule computed in the wrong precision, and JAX itself only lets them through
(``jax.custom_vjp`` passes them on unconverted, so the gradient has the wrong
dtype) by a temporary exception it means to remove. The weak type of tangents
and cotangents is ignored, as ``jax.custom_vjp`` and ``jax.custom_jvp`` do. The
cotangent of an integer or boolean input has dtype ``float0``: a rule returns
None for it; anything else of the right shape is dropped, as ``jax.custom_vjp``
drops it.

Imports: `hijax.primitive` and the private modules below it. It installs
its rules by appending to `hijax.primitive.RULE_INSTALLERS`, so importing this
module is what gives every `HiPrim` subclass its autodiff rules.
`accumulate` is defined in `hijax._cotangents` (below `hijax.primitive`, whose
default `HiPrim.vjp_bwd` calls it) and re-exported here.
"""
from __future__ import annotations

from typing import Any, Callable

import contextlib

import jax
from jax.ref import AbstractRef

from hijax import _checks
from hijax._internals import ad
from hijax._internals import api
from hijax._internals import batching
from hijax._internals import core
from hijax._internals import dtypes
from hijax._internals import pretty_printer as pp
from hijax._core_rules import JAX_VALUES, flatten_output, taking_prim
from hijax._cotangents import accumulate, check_cotangent
from hijax._util import describe_value, is_float0
from hijax.primitive import HiPrim, RULE_INSTALLERS

# JAX core recognises accumulators and symbolic zeros by class, so these are
# JAX's own classes, re-exported.
Zero = ad.Zero
GradAccum = ad.GradAccum
ValAccum = ad.ValAccum
RefAccum = ad.RefAccum
NullAccum = ad.NullAccum
instantiate_zeros: Callable[[Any], Any] = ad.instantiate_zeros

__all__ = ["Zero", "GradAccum", "ValAccum", "RefAccum", "NullAccum",
           "instantiate_zeros", "accumulate"]


@contextlib.contextmanager
def _checked_accums(prim, method, accums_flat, input_of_leaf):
  """Checks what a rule passes to ``acc.accum`` while the rule runs.

  Each accumulator's ``accum`` is shadowed by a checking one on the instance,
  for the duration of the call only: JAX shares accumulators between the
  equations that use a variable, and checks what the others add itself.
  """
  patched = []
  for acc, i in zip(accums_flat, input_of_leaf):
    # (An accumulator already being checked, by an enclosing rule that handed
    # it on, stays as it is.)
    if (isinstance(acc, GradAccum) and not isinstance(acc, NullAccum)
        and "accum" not in vars(acc)):
      acc.accum = _checking_accum(prim, method, i, acc, type(acc).accum)  # pyright: ignore[reportAttributeAccessIssue]
      patched.append(acc)
  try:
    yield
  finally:
    for acc in patched:
      vars(acc).pop("accum", None)


def _checking_accum(prim, method, i, acc, accum):
  def checked(ct):
    if ct is not None and check_cotangent(prim, method, i, acc.aval, ct,
                                          "passed to acc.accum"):
      accum(acc, ct)
  return checked


def _input_of_leaf(prim) -> list[int]:
  """The input (positional argument) index of each leaf of ``in_avals``."""
  if prim._args_are_leaves:
    return list(range(len(prim.in_avals)))
  return [i for i, a in enumerate(prim.in_avals) for _ in jax.tree.leaves(a)]


def _unpack_forward(prim, method, result):
  """Splits a `vjp_fwd`/`lin` result into (out, res, nzs_out, sres)."""
  if not isinstance(result, tuple) or not 2 <= len(result) <= 4:
    raise TypeError(
        f"{type(prim).__name__}.{method} must return (out, residuals), "
        "(out, residuals, nzs_out) or (out, residuals, nzs_out, "
        f"structured_residuals); got {describe_value(result)}")
  out, res, *rest = result
  nzs_out = rest[0] if rest else None
  sres = rest[1] if len(rest) > 1 else None
  return out, res, nzs_out, sres


def _check_out_types(prim, method, out_flat):
  _checks.check_types(prim, method, "output", prim.out_avals_flat, out_flat,
                      "rule-primal", "out_aval",
                      "Compute the primal output with self(*args).")


# --- forward mode ---------------------------------------------------------------

def _jvp_rule(primals_flat, tangents_flat, *, prim):
  primals = jax.tree.unflatten(prim.in_tree, primals_flat)
  tangents = jax.tree.unflatten(prim.in_tree, tangents_flat)
  with _checks.rule_context(f"{type(prim).__name__}.jvp"):
    result = prim.jvp(primals, tangents)
  if not isinstance(result, tuple) or len(result) != 2:
    raise TypeError(f"{type(prim).__name__}.jvp must return a pair "
                    f"(out, out_tangent), got {describe_value(result)}")
  out, out_tangent = result
  out_flat = flatten_output(prim, "jvp", out)
  _check_out_types(prim, "jvp", out_flat)
  return out_flat, _flatten_tangent(prim, "jvp", out_tangent)


def _flatten_tangent(prim, method, tangent) -> list:
  """Flattens an output tangent against ``out_aval`` and checks its types.

  None becomes a `Zero`.
  """
  try:
    flat = prim.out_tree.flatten_up_to(tangent)
  except (ValueError, TypeError):
    raise TypeError(
        f"{type(prim).__name__}.{method} returned a tangent with structure "
        f"{jax.tree.structure(tangent)}, but out_aval has structure "
        f"{prim.out_tree}") from None
  tangent_avals = [a.to_tangent_aval() for a in prim.out_avals_flat]
  # float0 means "not differentiable": a zero, for an output of any type.
  flat = [Zero(a) if t is None or is_float0(t) and not is_float0(a) else t
          for t, a in zip(flat, tangent_avals)]
  check_tangents(prim, method, tangent_avals, flat)
  return flat


def check_tangents(prim: Any, method: Any, tangent_avals: Any,
                   tangents_flat: Any) -> None:
  """Checks output tangents against the output types' ``to_tangent_aval()``."""
  _checks.check_types(prim, method, "output tangent", tangent_avals,
                      tangents_flat, "tangent", "out_aval (its to_tangent_aval)")


# --- linearization and reverse mode ---------------------------------------------

def _skips_without_tangents(prim, is_vjp) -> bool:
  """Whether the forward rule is skipped where no tangent flows in: asked for
  (`HiPrim.skip_linearization_on_zero_tangents`), or a derived rule
  (`hijax.derived`), which has nothing to compute there."""
  forward = type(prim).vjp_fwd if is_vjp else type(prim).lin
  return prim.skip_linearization_on_zero_tangents or getattr(
      forward, "skipped_without_tangents", False)


def _linearize_rule(is_vjp, nzs_in_flat, *args_flat, prim):
  name = type(prim).__name__
  if is_vjp and getattr(type(prim), "_grad_by_lin", False):
    # (a class whose reverse mode is `vjp_from_lin`, the decorators'
    # custom_jvp: `linearized` records its equations in ``grad``'s linear
    # program, which JAX's backward pass transposes, as for jax.custom_jvp,
    # instead of a linearized equation whose transpose traces it again)
    is_vjp = False
  if not any(nzs_in_flat) and _skips_without_tangents(prim, is_vjp) and not any(
      isinstance(core.typeof(x), AbstractRef) for x in args_flat):
    # No tangent flows in: apply the primitive, without its forward rule.
    out_flat = prim._primitive.bind(*args_flat, _prim=prim)
    zeros = lambda *_: [Zero(a.to_tangent_aval()) for a in prim.out_avals_flat]
    return out_flat, [False] * len(out_flat), None, None, zeros
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
    linearized = _call_user_linearized(prim, nzs_out_flat)
  return out_flat, nzs_out_flat, res, sres, linearized


def _bind_linearized(prim, nzs_in_flat, nzs_out_flat):
  """The tangent map of reverse mode: one equation, transposed by `vjp_bwd`."""
  def linearized(res, sres, *tangents_flat):
    if not any(nzs_out_flat):
      return [Zero(a.to_tangent_aval()) for a in prim.out_avals_flat]
    res_flat, res_tree = jax.tree.flatten(res if sres is None else (res, sres))
    for r in res_flat:
      if not isinstance(r, JAX_VALUES) and _checks.type_of(r) is None:
        raise _residual_error(prim, res, sres)
    res_flat = [dtypes.canonicalize_value(r) for r in res_flat]
    nz_tangents = [t for t in tangents_flat if type(t) is not Zero]
    outs = iter(prim._linearized_primitive.bind(
        *res_flat, *nz_tangents, prim=prim, res_tree=res_tree,
        nzs_in=tuple(nzs_in_flat), nzs_out=tuple(nzs_out_flat),
        has_sres=sres is not None))
    return [next(outs) if nz else Zero(a.to_tangent_aval())
            for a, nz in zip(prim.out_avals_flat, nzs_out_flat)]
  return linearized


def _residual_error(prim, res, sres) -> TypeError:
  """Names the first residual of `vjp_fwd` that is not a JAX value."""
  for what, tree in (("residuals", res), ("structured residuals", sres)):
    for path, r in jax.tree_util.tree_flatten_with_path(tree)[0]:
      if not isinstance(r, JAX_VALUES) and _checks.type_of(r) is None:
        break
    else:
      continue
    break
  name = type(prim).__name__
  return TypeError(
      f"{name}.vjp_fwd returned a {type(r).__name__} among its {what} (at "  # pyright: ignore[reportPossiblyUnboundVariable]
      f"{what}{jax.tree_util.keystr(path)}), which is not a JAX value: "  # pyright: ignore[reportPossiblyUnboundVariable]
      "residuals are saved as arrays for the backward pass. Keep a static "
      f"Python value in {name}.params (each param is an attribute, self.NAME, "
      "in vjp_bwd_retval), or return it as an array")


def _call_user_linearized(prim, nzs_out_flat):
  def linearized(res, sres, *tangents_flat):
    tangents = jax.tree.unflatten(prim.in_tree, tangents_flat)
    with _checks.rule_context(f"{type(prim).__name__}.linearized"):
      out = (prim.linearized(res, *tangents) if sres is None
             else prim.linearized(res, sres, *tangents))
    flat = _flatten_tangent(prim, "linearized", out)
    # JAX was told by nzs_out which output tangents are nonzero: a zero (None)
    # returned for one of them becomes an array of zeros.
    for i, (t, nz) in enumerate(zip(flat, nzs_out_flat)):
      if not nz and type(t) is not Zero:
        raise TypeError(
            f"{type(prim).__name__}.linearized returned a nonzero tangent for "
            f"output {i}, but {type(prim).__name__}.lin returned nzs_out False "
            "for it: return None for that tangent, or True in nzs_out")
    return [instantiate_zeros(t) if nz else t
            for t, nz in zip(flat, nzs_out_flat)]
  return linearized


def _linearized_abstract_eval(*avals, prim, res_tree, nzs_in, nzs_out,
                              has_sres):
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
  try:
    with checked_backward(prim, accums_flat):
      if has_sres:
        res, sres = res
        logs = prim.vjp_bwd(res, sres, g, *arg_accums)
      else:
        logs = prim.vjp_bwd(res, g, *arg_accums)
  except _checks.RuleTypeError as e:
    raise _blame_incoming_cotangents(e, prim, cts_full) from None
  return _check_logs(prim, "vjp_bwd", logs)


def _blame_incoming_cotangents(e, prim, cts_flat):
  """Adds to ``e`` that the output cotangent ``g`` already had a wrong type.

  JAX does not check what reaches a backward rule: e.g. a ``jax.custom_vjp``
  applied to the primitive's output may pass on a cotangent of another dtype.
  """
  for i, (ct, aval) in enumerate(zip(cts_flat, prim.out_avals_flat)):
    actual, declared = _checks.type_of(ct), aval.to_ct_aval()
    if not _checks.matches(declared, actual, "cotangent"):
      return _checks.with_advice(e, (
          f"Note that the output cotangent g it received (output {i}) already "
          f"has type {actual.str_short()} instead of {declared.str_short()}: "  # pyright: ignore[reportOptionalMemberAccess]
          "the mismatch comes from what the output was passed to (e.g. a "
          "jax.custom_vjp whose backward rule returns another dtype)."))
  return e


@contextlib.contextmanager
def checked_backward(prim: HiPrim, accums_flat):
  """Checks a call of ``prim.vjp_bwd`` with the accumulators ``accums_flat``.

  What an overriding `HiPrim.vjp_bwd` passes to ``acc.accum`` is checked; the
  default checks what `HiPrim.vjp_bwd_retval` returns itself. Arithmetic on a
  symbolic zero in either gets advice.
  """
  own_bwd = type(prim).vjp_bwd is not HiPrim.vjp_bwd
  method = "vjp_bwd" if own_bwd else prim._retval_rule()
  with _checks.rule_context(f"{type(prim).__name__}.{method}"):
    if own_bwd:
      with _checked_accums(prim, method, accums_flat, _input_of_leaf(prim)):
        yield
    else:
      yield


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
  with _checks.rule_context(f"{type(prim).__name__}.transpose"), \
      _checked_accums(prim, "transpose", args_flat, _input_of_leaf(prim)):
    logs = prim.transpose(cts, *args)
  return _check_logs(prim, "transpose", logs)


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
