"""Which hijax primitives a function binds, which rules they define, and
evaluating a function with each primitive replaced by its `expand`."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.extend.core import primitives

from hijax import derived
from hijax._internals import core as _core
from hijax.primitive import HiPrim

# JAX 0.11 and 0.12 both give `Jaxpr` objects with `.jaxpr` and `.consts`;
# older code paths may still produce a separate `ClosedJaxpr`.
_JAXPR_TYPES = tuple(t for t in (getattr(_core, "ClosedJaxpr", None),
                                 _core.Jaxpr) if t is not None)

def is_hiprim(x) -> bool:
  """Whether ``x`` is a constructed `HiPrim` instance (not a class)."""
  return isinstance(x, HiPrim) and hasattr(x, "in_avals")


def _overrides(cls, name) -> bool:
  return getattr(cls, name, None) is not getattr(HiPrim, name, None)


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
  for eqn in equations(jaxpr, into=lambda e: custom_kind(e) is None):
    kind = custom_kind(eqn)
    if kind is not None and _custom_rules(eqn, kind) not in found:
      found.append(_custom_rules(eqn, kind))
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
        yield v


# The primitives of calls of jax.custom_jvp and jax.custom_vjp functions.
_CUSTOM_CALLS = {primitives.custom_jvp_call_p: "custom_jvp",
                 primitives.custom_vjp_call_p: "custom_vjp"}

# The primitives of calls that evaluate their jaxpr once, in place: jax.jit,
# jax.checkpoint (named `remat2` in JAX 0.11 and 0.12) and closed calls
# (`eval_jaxpr` in 0.12): recognized as objects, whatever their names.
_CALLS = (primitives.jit_p, primitives.remat_p, primitives.closed_call_p,
          primitives.call_p)


def custom_kind(eqn) -> str | None:
  """``"custom_jvp"`` or ``"custom_vjp"`` for a call of such a function."""
  return _CUSTOM_CALLS.get(eqn.primitive)


def equations(jaxpr, into=lambda eqn: True):
  """Each equation of ``jaxpr``, depth first, and those of the jaxprs an
  equation holds (a call's, a loop's, a branch's, a custom function's)
  where ``into(eqn)``: the package's one walk over a jaxpr's equations."""
  for eqn in jaxpr.eqns:
    yield eqn
    if into(eqn):
      for sub in _sub_jaxprs(eqn.params):
        yield from equations(_open_jaxpr(sub)[0], into)


def call_body(eqn):
  """``(jaxpr, consts)`` of a call (``jit``, ``jax.checkpoint``, a closed
  call) that evaluates its one jaxpr once on its own inputs, which can then
  be evaluated in place; None for any other equation (a loop, a branch, a
  custom function, ``shard_map``). A call is recognized by its primitive
  object and by what it holds: exactly one jaxpr whose inputs and outputs
  have the equation's types, one for one."""
  subs = list(_sub_jaxprs(eqn.params))
  if not any(eqn.primitive is p for p in _CALLS) or len(subs) != 1:
    return None
  jaxpr, consts = _open_jaxpr(subs[0])
  same = lambda xs, ys: len(xs) == len(ys) and all(
      _core.typematch(x.aval, y.aval) for x, y in zip(xs, ys))
  if not (same(jaxpr.invars, eqn.invars) and same(jaxpr.outvars, eqn.outvars)):
    return None
  return jaxpr, consts


def find_hiprims(jaxpr, found: list) -> list:
  """Appends the distinct hijax primitive instances bound in ``jaxpr``."""
  for eqn in equations(jaxpr):
    prim = prim_of(eqn)
    if prim is not None and not any(prim is p for p in found):
      found.append(prim)
  return found


class ExpandStructureError(Exception):
  """`expand` returned a pytree of another structure than ``out_aval``."""

  def __init__(self, prim, tree):
    self.prim, self.tree = prim, tree
    super().__init__(f"{type(prim).__name__}.expand returned a value with "
                     f"structure {tree}, but out_aval has structure "
                     f"{prim.out_tree}")


def _rebind(eqn, invals):
  """Binds ``eqn.primitive`` again on ``invals`` with the equation's params
  (`get_bind_params` gives a dict in JAX 0.11 and 0.12)."""
  outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(
      eqn.params))
  return outs if eqn.primitive.multiple_results else [outs]


def evaluate(jaxpr, consts, args, apply):
  """Evaluates ``jaxpr`` on ``consts`` and ``args``, each call (`call_body`)
  in place, so that ``apply(eqn, invals)`` sees the equations inside calls
  too: it gives an equation's output values (a list), or None to bind the
  equation again."""
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))

  def read(v):
    return v.val if isinstance(v, _core.Literal) else env[v]

  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    outs = apply(eqn, invals)
    if outs is None:
      body = call_body(eqn)
      outs = (_rebind(eqn, invals) if body is None
              else evaluate(*body, invals, apply))
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def eval_expanded(jaxpr, consts, args, applications):
  """Evaluates ``jaxpr`` with each hijax primitive replaced by its `expand`.

  Records ``(prim, args, out, out_tree)`` for each application outside
  loops and branches (at the top level or inside calls) in
  ``applications``.
  """
  def apply(eqn, invals):
    prim = prim_of(eqn)
    if prim is None:
      return None
    p_args = jax.tree.unflatten(prim.in_tree, invals)
    out = prim.expand(*p_args)
    outs, tree = jax.tree.flatten(out)
    applications.append((prim, p_args, out, tree))
    if tree != prim.out_tree:
      raise ExpandStructureError(prim, tree)
    return outs
  return evaluate(jaxpr, consts, args, apply)


def _outside_loops(eqn) -> bool:
  """Whether the walk goes into ``eqn``: a call evaluated in place."""
  return call_body(eqn) is not None


def application_types(prim_fn, args) -> list[tuple]:
  """``(prim, types)`` for each hijax primitive ``prim_fn(*args)`` binds
  outside loops and branches (at its top level or inside calls), in the
  order of `applications`: the types of its arguments (a pytree of avals
  in ``prim.in_tree``), from a trace alone."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  found = []
  for eqn in equations(closed.jaxpr, into=_outside_loops):
    prim = prim_of(eqn)
    if prim is not None:
      found.append((prim, jax.tree.unflatten(
          prim.in_tree, [v.aval for v in eqn.invars])))
  return found


def applications(prim_fn, args) -> list[tuple]:
  """``(prim, prim_args)`` for each hijax primitive ``prim_fn(*args)`` binds
  outside loops and branches (evaluated through `expand`); empty if
  `expand` fails."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  found = []
  try:
    eval_expanded(closed.jaxpr, closed.consts, jax.tree.leaves(args), found)
  except Exception:  # pylint: disable=broad-except  (the expand check says why)
    pass
  return [(prim, p_args) for prim, p_args, _, _ in found]


def custom_calls(prim_fn, args) -> list[tuple[CustomRules, Any, list]]:
  """``(rules, fn, inputs)`` for each distinct ``jax.custom_jvp`` /
  ``jax.custom_vjp`` function that ``prim_fn`` calls outside loops and
  conditionals (at its top level or inside ``jit``): the function alone
  (its call, bound again) and the values of its inputs at its first call,
  which one compiled evaluation of the program computes. Functions called
  only inside a loop or a branch are not listed."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  targets: dict[CustomRules, Any] = {}
  for eqn in equations(closed.jaxpr, into=_outside_loops):
    if custom_kind(eqn) is not None:
      targets.setdefault(_custom_rules(eqn, custom_kind(eqn)), eqn)
  eqns = list(targets.values())

  def inputs(*leaves):
    found = {}

    def record(eqn, invals):
      if any(eqn is t for t in eqns) and id(eqn) not in found:
        found[id(eqn)] = list(invals)
    evaluate(closed.jaxpr, closed.consts, leaves, record)
    return [found[id(e)] for e in eqns]
  values = jax.jit(inputs)(*jax.tree.leaves(args)) if eqns else []

  def alone(eqn):
    def fn(*a):
      outs = _rebind(eqn, a)
      return outs[0] if len(outs) == 1 else tuple(outs)
    return fn
  return [(rules, alone(eqn), list(vals))
          for (rules, eqn), vals in zip(targets.items(), values)]
