"""Which hijax primitives a function binds, which rules they define, and
evaluating a function with each primitive replaced by its `expand`."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

from hijax import derived
from hijax._internals import core as _core
from hijax.primitive import HiPrim

# JAX 0.11 and 0.12 both give `Jaxpr` objects with `.jaxpr` and `.consts`;
# older code paths may still produce a separate `ClosedJaxpr`.
_JAXPR_TYPES = tuple(t for t in (getattr(_core, "ClosedJaxpr", None),
                                 _core.Jaxpr) if t is not None)

# Call primitives whose inner jaxpr is evaluated in place (so that the hijax
# primitives inside are expanded too).
_INLINED_CALLS = ("pjit", "jit", "closed_call", "core_call", "checkpoint",
                  "remat")


def is_hiprim(x) -> bool:
  """Whether ``x`` is a constructed `HiPrim` instance (not a class)."""
  return isinstance(x, HiPrim) and hasattr(x, "in_avals")


def _overrides(cls, name) -> bool:
  return getattr(cls, name, None) is not getattr(HiPrim, name, None)


# JAX's primitives for calls of jax.custom_jvp and jax.custom_vjp functions
# (the same names in 0.11 and 0.12).
_CUSTOM_CALLS = {"custom_jvp_call": "custom_jvp", "custom_vjp_call": "custom_vjp"}


@dataclasses.dataclass(frozen=True)
class CustomRules:
  """A ``jax.custom_jvp`` or ``jax.custom_vjp`` function that ``prim_fn``
  calls: its rules are checked as a primitive's are (when ``prim_fn`` binds
  no hijax primitive).

  Attributes:
    name: the decorated function's name.
    kind: ``"custom_jvp"`` or ``"custom_vjp"``.
  """
  name: str
  kind: str
  file: str = ""  # where the function is defined, as its jaxpr says
  line: int = 0

  @property
  def key(self) -> tuple[str, str, int]:
    """``(name, file, line)`` of the function's definition."""
    return self.name, self.file, self.line

  def __repr__(self):
    return f"{self.name} ({self.kind})"

  def rules(self) -> dict[str, str]:
    """``{mode: rule name}``: what JAX derives from the rules it was given
    (the vjp of a custom_jvp function is the transpose of its jvp rule; a
    custom_vjp function has no forward mode)."""
    me = repr(self)
    if self.kind == "custom_jvp":
      return {"expand": f"{me}: the function", "jvp": f"{me}: the jvp rule",
              "vjp": f"{me}: the jvp rule, transposed by JAX",
              "lin": f"{me}: the jvp rule, linearized by JAX",
              "batch": f"{me}: vmap of the function and its jvp rule"}
    return {"expand": f"{me}: the function", "vjp": f"{me}: fwd/bwd",
            "batch": f"{me}: vmap of the function, fwd and bwd"}


def _custom_rules(eqn, kind) -> CustomRules:
  """The `CustomRules` of a call of a custom function: its name and where
  it is defined, from its jaxpr's debug info (``name at file:line``)."""
  jaxpr = getattr(eqn.params.get("call_jaxpr"), "jaxpr",
                  eqn.params.get("call_jaxpr"))
  info = getattr(jaxpr, "debug_info", None)
  src = getattr(info, "func_src_info", None) or ""
  name, _, where = src.partition(" at ")
  file, _, line = where.rpartition(":")
  return CustomRules(name or "<unnamed>", kind, file,
                     int(line) if line.isdigit() else 0)


def find_custom_rules(jaxpr, found: list) -> list:
  """Appends a `CustomRules` for each distinct ``jax.custom_jvp`` /
  ``jax.custom_vjp`` function called in ``jaxpr`` (not inside another)."""
  for eqn in jaxpr.eqns:
    kind = _CUSTOM_CALLS.get(eqn.primitive.name)
    if kind is not None:
      rules = _custom_rules(eqn, kind)
      if rules not in found:
        found.append(rules)
      continue
    for sub in _sub_jaxprs(eqn.params):
      find_custom_rules(sub, found)
  return found


def defined_rules(prim: Any) -> dict[str, str]:
  """The rules a `HiPrim` (instance or class) defines, as ``{mode: rule name}``.

  For example ``{"expand": "Log1pExp.expand", "jvp": "Log1pExp.jvp", "vjp":
  "Log1pExp.vjp_fwd/vjp_bwd_retval", "batch": "Log1pExp.batch_dim_rule"}``.
  Derived rules (``lin, linearized = linearize_from_jvp`` and the like) count
  as defined, and their name says where they come from. For a
  `CustomRules` (a ``jax.custom_jvp`` or ``jax.custom_vjp`` function), the
  rules JAX derives from the ones it was given.
  """
  if isinstance(prim, CustomRules):
    return prim.rules()
  cls = prim if isinstance(prim, type) else type(prim)
  name = cls.__name__
  fun = getattr(prim, "params", {}).get("fun") if not isinstance(
      prim, type) else None
  if isinstance(fun, str):  # a hijax decorator's call: name the function
    name = f"{name}[fun={fun}]"
  rules = {"expand": f"{name}.expand"}
  if _overrides(cls, "jvp"):
    rules["jvp"] = f"{name}.jvp" + {
        derived.jvp_from_lin: " (jvp_from_lin)",
        derived.jvp_from_vjp: " (jvp_from_vjp)"}.get(cls.jvp, "")
  # (vjp_bwd_retval_logs is a rule when it is a method, not the flag)
  logs = (_overrides(cls, "vjp_bwd_retval_logs")
          and callable(cls.vjp_bwd_retval_logs))
  if _overrides(cls, "vjp_fwd") and (_overrides(cls, "vjp_bwd") or logs
                                      or _overrides(cls, "vjp_bwd_retval")):
    bwd = ("vjp_bwd" if _overrides(cls, "vjp_bwd") else
           "vjp_bwd_retval_logs" if logs else "vjp_bwd_retval")
    how = {derived.vjp_from_lin.first: " (vjp_from_lin)",
           derived.vjp_from_jvp.first: " (vjp_from_jvp)"}.get(cls.vjp_fwd, "")
    rules["vjp"] = f"{name}.vjp_fwd/{bwd}{how}"
  if _overrides(cls, "lin") and _overrides(cls, "linearized"):
    rules["lin"] = f"{name}.lin/linearized" + (
        " (linearize_from_jvp)" if cls.lin is derived.linearize_from_jvp.first
        else "")
  if _overrides(cls, "transpose"):
    rules["transpose"] = f"{name}.transpose"
  if _overrides(cls, "batch"):
    rules["batch"] = f"{name}.batch"
  elif _overrides(cls, "batch_dim_rule"):
    rules["batch"] = f"{name}.batch_dim_rule"
  return rules


def prim_of(eqn):
  """The `HiPrim` instance an equation applies, or None.

  Found by type among the equation's params, so that it does not depend on
  the name of the param that carries it.
  """
  for v in eqn.params.values():
    if is_hiprim(v):
      return v
  return None


def _open_jaxpr(v):
  """(jaxpr, consts) of a closed or open jaxpr."""
  return getattr(v, "jaxpr", v), getattr(v, "consts", ())


def _sub_jaxprs(params):
  for val in params.values():
    for v in (val if isinstance(val, (tuple, list)) else (val,)):
      if isinstance(v, _JAXPR_TYPES):
        yield _open_jaxpr(v)[0]


def find_hiprims(jaxpr, found: list) -> list:
  """Appends the distinct hijax primitive instances bound in ``jaxpr``."""
  for eqn in jaxpr.eqns:
    prim = prim_of(eqn)
    if prim is not None and not any(prim is p for p in found):
      found.append(prim)
    for sub in _sub_jaxprs(eqn.params):
      find_hiprims(sub, found)
  return found


class ExpandStructureError(Exception):
  """`expand` returned a pytree of another structure than ``out_aval``."""

  def __init__(self, prim, tree):
    self.prim, self.tree = prim, tree
    super().__init__(f"{type(prim).__name__}.expand returned a value with "
                     f"structure {tree}, but out_aval has structure "
                     f"{prim.out_tree}")


def _rebind(eqn, invals):
  """Binds ``eqn.primitive`` again on ``invals`` with the equation's params.

  `get_bind_params` returns a dict in JAX 0.11 and 0.12 (call-like primitives
  put their functions in it under ``subfuns``); earlier releases returned
  ``(subfuns, params)`` with the functions bound positionally. The returned
  value itself says which shape it is, so this needs no `_compat` probe.
  """
  bind_params = eqn.primitive.get_bind_params(eqn.params)
  subfuns = ()
  if isinstance(bind_params, tuple):
    subfuns, bind_params = bind_params
  outs = eqn.primitive.bind(*subfuns, *invals, **bind_params)
  return outs if eqn.primitive.multiple_results else [outs]


def _evaluate(jaxpr, consts, args, apply):
  """Evaluates ``jaxpr`` on ``consts`` and ``args``; ``apply(eqn, invals)``
  gives the output values (a list) of each equation."""
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))

  def read(v):
    return v.val if isinstance(v, _core.Literal) else env[v]

  for eqn in jaxpr.eqns:
    env.update(zip(eqn.outvars, apply(eqn, [read(v) for v in eqn.invars])))
  return [read(v) for v in jaxpr.outvars]


def _inlined_body(eqn):
  """The jaxpr of ``eqn`` if it is a call evaluated in place, else None."""
  sub = eqn.params.get("jaxpr")
  if eqn.primitive.name in _INLINED_CALLS and isinstance(sub, _JAXPR_TYPES):
    return sub
  return None


def eval_expanded(jaxpr, consts, args, applications):
  """Evaluates ``jaxpr`` with each hijax primitive replaced by its `expand`.

  Records ``(prim, args, out, out_tree)`` for each top-level application in
  ``applications``.
  """
  def apply(eqn, invals):
    prim = prim_of(eqn)
    if prim is not None:
      p_args = jax.tree.unflatten(prim.in_tree, invals)
      out = prim.expand(*p_args)
      outs, tree = jax.tree.flatten(out)
      applications.append((prim, p_args, out, tree))
      if tree != prim.out_tree:
        raise ExpandStructureError(prim, tree)
      return outs
    sub = _inlined_body(eqn)
    if sub is not None:
      return eval_expanded(*_open_jaxpr(sub), invals, [])
    return _rebind(eqn, invals)
  return _evaluate(jaxpr, consts, args, apply)


def application_types(prim_fn, args) -> list[tuple]:
  """``(prim, types)`` for each hijax primitive ``prim_fn(*args)`` binds at
  its top level, in the order of `applications`: the types of its
  arguments (a pytree of avals in ``prim.in_tree``), from a trace alone."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  found = []
  for eqn in closed.jaxpr.eqns:
    prim = prim_of(eqn)
    if prim is not None:
      found.append((prim, jax.tree.unflatten(
          prim.in_tree, [v.aval for v in eqn.invars])))
  return found


def applications(prim_fn, args) -> list[tuple]:
  """``(prim, prim_args)`` for each hijax primitive ``prim_fn(*args)`` binds at
  its top level (evaluated through `expand`); empty if `expand` fails."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  found = []
  try:
    eval_expanded(closed.jaxpr, closed.consts, jax.tree.leaves(args), found)
  except Exception:  # pylint: disable=broad-except  (the expand check says why)
    pass
  return [(prim, p_args) for prim, p_args, _, _ in found]


def _interpret(jaxpr, consts, args, targets, found):
  """Evaluates ``jaxpr`` (inside ``jit`` calls too), recording the inputs of
  each equation in ``targets`` (by identity) in ``found``."""
  def apply(eqn, invals):
    if any(eqn is t for t in targets) and id(eqn) not in found:
      found[id(eqn)] = list(invals)
    sub = _inlined_body(eqn)
    if sub is not None:
      return _interpret(*_open_jaxpr(sub), invals, targets, found)
    return _rebind(eqn, invals)
  return _evaluate(jaxpr, consts, args, apply)


def custom_calls(prim_fn, args) -> list[tuple[CustomRules, Any, list]]:
  """``(rules, fn, inputs)`` for each distinct ``jax.custom_jvp`` /
  ``jax.custom_vjp`` function that ``prim_fn`` calls outside loops and
  conditionals (at its top level or inside ``jit``): the function alone
  (its call, bound again) and the values of its inputs at its first call,
  which one compiled evaluation of the program computes. Functions called
  only inside a loop or a branch are not listed."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  targets: dict[CustomRules, Any] = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      kind = _CUSTOM_CALLS.get(eqn.primitive.name)
      sub = _inlined_body(eqn)
      if kind is not None:
        targets.setdefault(_custom_rules(eqn, kind), eqn)
      elif sub is not None:
        walk(_open_jaxpr(sub)[0])
  walk(closed.jaxpr)
  eqns = list(targets.values())

  def inputs(*leaves):
    found = {}
    _interpret(closed.jaxpr, closed.consts, leaves, eqns, found)
    return [found[id(e)] for e in eqns]
  values = jax.jit(inputs)(*jax.tree.leaves(args)) if eqns else []

  def alone(eqn):
    def fn(*a):
      outs = _rebind(eqn, a)
      return outs[0] if len(outs) == 1 else tuple(outs)
    return fn
  return [(rules, alone(eqn), list(vals))
          for (rules, eqn), vals in zip(targets.items(), values)]
