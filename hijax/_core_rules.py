"""The JAX primitive behind each `HiPrim` subclass, and its core rules.

`install_core_rules` (the first entry of `hijax.primitive.RULE_INSTALLERS`)
registers, for the subclass's ``jax.extend.core.Primitive``:

* abstract evaluation (the declared ``out_aval``) and the effects;
* lowering: the primitive is "high", and ``to_lojax`` calls `HiPrim.expand`
  (eagerly on the spot, under ``jit`` when the jaxpr is lowered), checking its
  output against ``out_aval``;
* staging (one equation, marking the jaxpr as needing lowering, or what an
  overriding `HiPrim.staging` records), the jaxpr type check (which calls
  `HiPrim.check` again), pretty-printing (``Square[k=2] a``, the params of
  `HiPrim.pp_params`), dead-code elimination (`HiPrim.dce`, taking
  ``(used_outs, live_ins)`` or jax 0.11.2's ``(used_outs)``) and
  rematerialization (`HiPrim.remat`, returning jax 0.12's ``(out, res, rem)``
  or 0.11.2's ``(out, rem)``).

Imports: `hijax._checks`, `hijax._compat` and `hijax._util`. The rules
receive the `HiPrim` instance as the equation's one param, ``_prim``, and
never import its class; what they need to know of the class (which hooks it
overrides) `hijax._declaration.hook_flags` set on it.
"""
from __future__ import annotations

import sys

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Primitive)

from hijax import _checks, _compat
from hijax._util import describe_value
from hijax._internals import api
from hijax._internals import core
from hijax._internals import partial_eval as pe
from hijax._internals import pretty_printer as pp

__all__ = ["new_primitive", "taking_prim", "install_core_rules",
           "flatten_output", "format_params"]


def format_params(prim) -> str:
  """The params shown in a jaxpr and by ``repr`` (`HiPrim.pp_params`):
  ``[k=2 f=fn]``, or nothing."""
  shown = prim.pp_params()
  if type(shown) is not dict:
    raise TypeError(
        f"{type(prim).__name__}.pp_params must return a dict of the params "
        f"to print, got {type(shown).__name__}")
  if not shown:
    return ""
  return "[" + " ".join(f"{k}={_short(v)}" for k, v in shown.items()) + "]"


def _short(v) -> str:
  if callable(v) and hasattr(v, "__name__"):
    return v.__name__
  if isinstance(v, core.AbstractValue):
    return v.str_short()
  return str(v)


def new_primitive(name):
  """A multiple-results ``jax.extend.core.Primitive`` called ``name``."""
  p = jax.extend.core.Primitive(name)
  p.multiple_results = True
  return p


# The one param of a primitive's equations is the HiPrim instance, named `_prim`
# (as in JAX's own hijax): JAX calls a checkpoint policy as
# ``policy(primitive, *avals, **params)``, whose first parameter is ``prim``.
def taking_prim(rule):
  """Adapts ``rule(*args, prim=...)`` to JAX's call with the equation's params."""
  return lambda *args, _prim: rule(*args, prim=_prim)


def install_core_rules(cls):
  """Registers the core rules of ``cls._primitive`` (see the module docstring)."""
  p = cls._primitive
  p.skip_canonicalization = True
  p.is_high = lambda *avals, _prim: True
  p.is_effectful = lambda params: bool(params["_prim"].effects)
  p.def_effectful_abstract_eval(
      lambda *avals, _prim: (_prim.out_avals_flat, _prim.effects))
  p.to_lojax = _expand_flat
  pe.custom_staging_rules[p] = _stage
  core.custom_typechecks[p] = _typecheck
  core.pp_eqn_rules[p] = _pp_eqn
  _compat.register_dce_rule(p, _dce)
  _compat.register_remat_rule(p, _remat)


def _expand_flat(*args_flat, _prim):
  prim = _prim
  if type(core.trace_ctx.trace) is not core.EvalTrace:
    _refuse_jet_unless_allowed(prim)
  if prim._args_are_leaves:
    out = prim.expand(*args_flat)
  else:
    out = prim.expand(*jax.tree.unflatten(prim.in_tree, args_flat))
  out_flat = flatten_output(prim, "expand", out)
  # Eagerly the returned value is the result; under jit the declared type is.
  return _checks.conform_outputs(prim, "expand", prim.out_avals_flat, out_flat)


def _refuse_jet_unless_allowed(prim):
  """A TypeError under ``jax.experimental.jet`` unless the class sets
  ``jet_from_expand``: jet cannot apply first-order rules, so it would
  differentiate `expand`, which may disagree with the primitive's rules."""
  jet = sys.modules.get("jax.experimental.jet")
  prim = prim._jet_subject()
  if jet is None or prim.jet_from_expand:
    return
  # Under jet directly, or in a jaxpr that jet's trace is lowering (a `jit`
  # inside jet): a JetTrace is then the parent of the lowering trace.
  trace = core.trace_ctx.trace
  while trace is not None and not isinstance(trace, jet.JetTrace):
    trace = getattr(trace, "parent_trace", None)
  if trace is None:
    return
  name = type(prim).__name__
  rules = prim._derivative_rules()
  uses = (f"{name}.{rules[0]}" if rules else "its derivative rules")
  raise TypeError(
      f"{name} under jax.experimental.jet: jet cannot apply a hijax "
      f"primitive's rules, so it would differentiate {name}.expand, and "
      f"the series could disagree with {uses} (a straight-through or safe "
      f"rule, say). If the derivatives of expand are the ones you want, set "
      f"`jet_from_expand = True` in the class body of {name}; otherwise "
      f"take derivatives with nested jax.jvp, which applies {uses}.")


# What JAX operations return: arrays eagerly, tracers under a transformation.
JAX_VALUES = (jax.Array, core.Tracer)


def flatten_output(prim, method, out) -> list:
  """Flattens what ``prim.method`` returned, checking it against ``out_aval``."""
  if prim._single_output and isinstance(out, JAX_VALUES):
    return [out]  # the common case, without a pytree traversal
  out_flat, tree = jax.tree.flatten(out)
  if tree != prim.out_tree:
    raise TypeError(
        f"{type(prim).__name__}.{method} returned a value with structure "
        f"{tree}, but out_aval has structure {prim.out_tree}")
  return out_flat


def _stage(trace, source_info, *args_flat, _prim):
  trace.frame.is_high = True  # the jaxpr must be lowered with `expand`
  if not _prim._has_staging:
    return trace.default_process_primitive(
        _prim._primitive, args_flat, dict(_prim=_prim), source_info)
  # An overriding `staging` (JAX's hook) records what it likes into `trace`.
  with jax.extend.core.set_current_trace(trace):
    out = _prim.staging(trace, source_info,
                        *jax.tree.unflatten(_prim.in_tree, args_flat))
  out_flat = flatten_output(_prim, "staging", out)
  return _checks.conform_outputs(_prim, "staging", _prim.out_avals_flat,
                                 out_flat)


def _typecheck(_ctx_factory, *in_atoms, _prim):
  prim = _prim
  for i, (atom, expected) in enumerate(zip(in_atoms, prim.in_avals_flat)):
    if not core.typematch(atom.aval, expected):
      raise TypeError(
          f"{type(prim).__name__}: jaxpr input {i} has type "
          f"{atom.aval.str_short()}, expected {expected.str_short()}")
  if prim._has_check:
    prim.check(*prim.in_avals)  # where JAX's own type check calls it
  return prim.out_avals_flat, prim.effects


def _pp_eqn(eqn, context, settings):
  prim = eqn.params["_prim"]
  lhs = core.pp_vars(eqn.outvars, context, print_shapes=settings.print_shapes,
                     is_binder=True)
  rhs = pp.text(type(prim).__name__ + format_params(prim) + " ") + core.pp_vars(
      eqn.invars, context)
  return pp.concat([lhs, pp.text(" = "), rhs]) if eqn.outvars else rhs


def _dce(used_outs_flat, live_ins_flat, eqn):
  prim = eqn.params["_prim"]
  used_outs = jax.tree.unflatten(prim.out_tree, used_outs_flat)
  live_ins = (None if live_ins_flat is None
              else jax.tree.unflatten(prim.in_tree, live_ins_flat))
  if prim._dce_takes_live_ins:
    result = prim.dce(used_outs, live_ins)
  else:  # jax 0.11.2's form, `dce(self, used_outs)`
    result = prim.dce(used_outs)
  if not isinstance(result, tuple) or len(result) != 3:
    raise TypeError(
        f"{type(prim).__name__}.dce must return (used_ins, produced_outs, "
        f"new_prim or None), got {describe_value(result)}")
  used_ins, produced_outs, new_prim = result
  if new_prim is None:
    return [False] * len(eqn.invars), None
  used_ins_flat = _broadcast_flags(prim, "dce", "used inputs", used_ins,
                                   prim.in_tree)
  produced_flat = _broadcast_flags(prim, "dce", "produced outputs",
                                   produced_outs, prim.out_tree)
  if new_prim is prim and all(used_ins_flat) and all(produced_flat):
    return used_ins_flat, eqn
  new_eqn = eqn.replace(
      primitive=new_prim._primitive,
      invars=[v for v, u in zip(eqn.invars, used_ins_flat) if u],
      outvars=[v for v, u in zip(eqn.outvars, produced_flat) if u],
      params=dict(_prim=new_prim))
  return used_ins_flat, new_eqn


def _broadcast_flags(prim, method, what, flags, treedef) -> list[bool]:
  """Broadcasts a pytree prefix of booleans to the leaves of ``treedef``."""
  return api.tuptree_flags(flags, treedef, what,
                           f"the {what} returned by {type(prim).__name__}.{method}")


def _remat(trace, *args_flat, _prim):
  prim = _prim
  args = jax.tree.unflatten(prim.in_tree, args_flat)
  result = prim.remat(trace, *args)
  if (isinstance(result, tuple) and len(result) == 3
      and callable(result[2])):
    out, res, rem = result  # jax 0.12's form: rem(res, *args)
  elif (isinstance(result, tuple) and len(result) == 2
        and callable(result[1])):
    out, res, rem_args = result[0], (), result[1]  # 0.11.2's: rem(*args)
    rem = lambda _, *args: rem_args(*args)
  else:
    raise TypeError(
        f"{type(prim).__name__}.remat must return (out, res, rem) with "
        "rem(res, *args) recomputing out (JAX 0.12's form) or (out, rem) "
        f"with rem(*args) (0.11.2's), got {describe_value(result)}")

  def rem_flat(res, *args_flat):
    args = jax.tree.unflatten(prim.in_tree, args_flat)
    return flatten_output(prim, "remat", rem(res, *args))
  return flatten_output(prim, "remat", out), res, rem_flat
