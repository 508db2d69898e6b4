"""The primitives and custom functions a function binds, their rules, and
its evaluation through `expand`: over one walk of a jaxpr (`equations`)."""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable
from typing import Any, TypeVar, cast

import jax
from jax.extend.core import primitives

from hijax import derived
from hijax._function_key import definition
from hijax._internals import core as _core
from hijax.primitive import HiPrim


@dataclasses.dataclass(frozen=True)
class CustomRules:
  """A ``jax.custom_jvp`` / ``custom_vjp`` function ``prim_fn`` calls: its
  name, ``kind`` and where its jaxpr says it is defined."""
  name: str
  kind: str
  file: str
  line: int

  def __repr__(self):
    return f"{self.name} ({self.kind})"

  def rules(self) -> dict[str, str]:
    """``{mode: rule name}``, as JAX derives them."""
    me = repr(self)
    if self.kind == "custom_jvp":
      return {"expand": f"{me}: the function", "jvp": f"{me}: the jvp rule",
              "vjp": f"{me}: the jvp rule, transposed by JAX",
              "lin": f"{me}: the jvp rule, linearized by JAX",
              "batch": f"{me}: vmap of the function and its jvp rule"}
    return {"expand": f"{me}: the function", "vjp": f"{me}: fwd/bwd",
            "batch": f"{me}: vmap of the function, fwd and bwd"}


# The derived rules (`hijax.derived`) a rule's name says it comes from.
_DERIVED = ("jvp_from_lin", "jvp_from_vjp", "vjp_from_lin", "vjp_from_jvp",
            "linearize_from_jvp")


def defined_rules(prim: Any) -> dict[str, str]:
  """The rules a `HiPrim` (instance or class) defines, ``{mode: rule name}``:
  ``{"expand": "Log1pExp.expand", "jvp": "Log1pExp.jvp", ...}``. A derived
  rule (``jvp = jvp_from_vjp``) counts, its name saying so. For a
  `CustomRules`, the rules JAX derives from those it was given."""
  if isinstance(prim, CustomRules):
    return prim.rules()
  cls = prim if isinstance(prim, type) else type(prim)
  name = cls.__name__
  fun = None if prim is cls else getattr(prim, "params", {}).get("fun")
  if isinstance(fun, str):  # a hijax decorator's call: name the function
    name = f"{name}[fun={fun}]"
  has = lambda attr: getattr(cls, attr, None) is not getattr(HiPrim, attr,
                                                            None)
  how = lambda rule: "".join(f" ({n})" for n in _DERIVED if rule is getattr(
      getattr(derived, n), "first", getattr(derived, n)))
  rules = {"expand": f"{name}.expand"}
  if has("jvp"):
    rules["jvp"] = f"{name}.jvp" + how(cls.jvp)
  # (vjp_bwd_retval_logs is a rule when it is a method, not the flag)
  logs = has("vjp_bwd_retval_logs") and callable(cls.vjp_bwd_retval_logs)
  bwd = ("vjp_bwd" if has("vjp_bwd") else "vjp_bwd_retval_logs" if logs
         else "vjp_bwd_retval" if has("vjp_bwd_retval") else None)
  if has("vjp_fwd") and bwd:
    rules["vjp"] = f"{name}.vjp_fwd/{bwd}" + how(cls.vjp_fwd)
  if has("lin") and has("linearized"):
    rules["lin"] = f"{name}.lin/linearized" + how(cls.lin)
  for mode, rule in (("transpose", "transpose"), ("batch", "batch"),
                     ("batch", "batch_dim_rule")):
    # (a decorator's call says itself whether it is transposable)
    if has(rule) and (rule != "transpose" or getattr(prim, "transposable",
                                                      True)):
      rules.setdefault(mode, f"{name}.{rule}")
  return rules


# -- surrogates: rules deliberately not the derivative --

T = TypeVar("T")

# Marked with `surrogate`: classes, and functions by (name, file, line).
_CLASSES: weakref.WeakSet = weakref.WeakSet()
_FUNCTIONS: set[tuple[str, str, int]] = set()
_KINDS = ("a HiPrim subclass or a custom derivative function (jax.custom_jvp, "
          "jax.custom_vjp, hijax.custom_jvp, hijax.custom_vjp)")


def _marked(obj: Any, who: str) -> Any:
  """A HiPrim subclass itself, else where its function is defined; a
  TypeError naming ``who`` for anything else."""
  if isinstance(obj, type):
    if issubclass(obj, HiPrim):
      return obj
    raise TypeError(f"{who} {obj.__name__}, a class but not a HiPrim "
                    f"subclass; pass {_KINDS}")
  key = definition(getattr(obj, "fun", obj))
  if key is None:
    raise TypeError(f"{who} {obj!r}, which is not {_KINDS}")
  return key


def surrogate(obj: T) -> T:
  """Marks ``obj`` as a surrogate: its derivative rules are deliberately not
  the derivative of the function (a straight-through estimator, a gradient
  clipper), so `check_rules` never compares them with the function, only
  with each other, with loops and for types (see ``surrogates=``).

  ``obj`` is a ``jax.custom_jvp`` or ``jax.custom_vjp`` function, a
  ``hijax.custom_jvp`` or ``hijax.custom_vjp`` one, or a `HiPrim` subclass
  (its subclasses are not marked). Returns ``obj``, so it can be used as a
  decorator (outermost)::

      @hijax.testing.surrogate
      @jax.custom_vjp
      def round_ste(x):
        return jnp.round(x)
  """
  key = _marked(obj, "surrogate: cannot mark")
  if isinstance(key, type):
    _CLASSES.add(key)
  else:
    _FUNCTIONS.add(key)
  return obj


class Surrogates:
  """The surrogates of a run: those marked and those ``declared``."""

  def __init__(self, declared: Iterable[Any] = ()):
    self.declared = {_marked(obj, "check_rules: surrogates= names")
                     for obj in declared}

  def __contains__(self, prim: Any) -> bool:
    marked = self.declared | _FUNCTIONS | set(_CLASSES)
    if isinstance(prim, CustomRules):
      return (prim.name, prim.file, prim.line) in marked
    decorated = getattr(getattr(prim, "params", {}).get("_call"),
                        "decorated", None)
    return type(prim) in marked or (
        decorated is not None and definition(getattr(
            decorated, "fun", decorated)) in marked)


# -- the walk --

_CUSTOM_CALLS = {primitives.custom_jvp_call_p: "custom_jvp",
                 primitives.custom_vjp_call_p: "custom_vjp"}

# Calls that evaluate their jaxpr once: jax.jit, jax.checkpoint (`remat2`),
# closed calls (`eval_jaxpr` in 0.12): objects, whatever their names.
_CALLS = (primitives.jit_p, primitives.remat_p, primitives.closed_call_p,
          primitives.call_p)


def _prim_of(eqn):
  """The `HiPrim` instance an equation applies (a param of its), or None."""
  for v in eqn.params.values():
    if isinstance(v, HiPrim) and hasattr(v, "in_avals"):
      return v
  return None


def _sub_jaxprs(params):
  """``(jaxpr, consts)`` of each jaxpr among an equation's params."""
  for val in params.values():
    for v in (val if isinstance(val, (tuple, list)) else (val,)):
      if isinstance(v, _core.Jaxpr):
        yield getattr(v, "jaxpr", v), getattr(v, "consts", ())


def equations(jaxpr, into=lambda eqn: True):
  """Each equation of ``jaxpr``, depth first, with those of the jaxprs an
  equation holds where ``into(eqn)``."""
  for eqn in jaxpr.eqns:
    yield eqn
    if into(eqn):
      for sub, _ in _sub_jaxprs(eqn.params):
        yield from equations(sub, into)


def call_body(eqn):
  """``(jaxpr, consts)`` of a call that evaluates its one jaxpr once, of its
  own types (jit, checkpoint); None for another equation."""
  subs = list(_sub_jaxprs(eqn.params))
  if eqn.primitive not in _CALLS or len(subs) != 1:
    return None
  same = lambda xs, ys: len(xs) == len(ys) and all(
      _core.typematch(x.aval, y.aval) for x, y in zip(xs, ys))
  jaxpr = subs[0][0]
  return subs[0] if (same(jaxpr.invars, eqn.invars)
                     and same(jaxpr.outvars, eqn.outvars)) else None


_in_place = lambda eqn: call_body(eqn) is not None


def _custom_rules(eqn) -> CustomRules | None:
  """The `CustomRules` of a custom function's call (else None)."""
  kind = _CUSTOM_CALLS.get(eqn.primitive)
  if kind is None:
    return None
  jaxpr = getattr(eqn.params.get("call_jaxpr"), "jaxpr",
                  eqn.params.get("call_jaxpr"))
  src = getattr(getattr(jaxpr, "debug_info", None), "func_src_info",
                None) or ""
  name, _, where = src.partition(" at ")
  file, _, line = where.rpartition(":")
  return CustomRules(name or "<unnamed>", kind, file,
                     int(line) if line.isdigit() else 0)


def find_custom_rules(jaxpr) -> list:
  """Each distinct custom function called in ``jaxpr`` (not inside
  another)."""
  return list(dict.fromkeys(
      rules for eqn in equations(
          jaxpr, into=lambda e: e.primitive not in _CUSTOM_CALLS)
      if (rules := _custom_rules(eqn)) is not None))


def find_hiprims(jaxpr) -> list:
  """The distinct hijax primitive instances bound in ``jaxpr``."""
  found = {}
  for eqn in equations(jaxpr):
    if (prim := _prim_of(eqn)) is not None:
      found.setdefault(id(prim), prim)
  return list(found.values())


# -- evaluations --

class ExpandStructureError(Exception):
  """`expand` returned a pytree of another structure than ``out_aval``."""

  def __init__(self, prim, tree):
    self.prim, self.tree = prim, tree
    super().__init__(f"{type(prim).__name__}.expand returned a value with "
                     f"structure {tree}, but out_aval has structure "
                     f"{prim.out_tree}")


def _rebind(eqn, invals):
  outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(
      eqn.params))
  return outs if eqn.primitive.multiple_results else [outs]


def evaluate(jaxpr, consts, args, apply):
  """Evaluates ``jaxpr``, calls in place; ``apply(eqn, invals)``: the
  outputs, or None to bind it."""
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  read = lambda v: v.val if isinstance(v, _core.Literal) else env[v]
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
  """Evaluates ``jaxpr`` through each primitive's `expand`, appending
  ``(prim, args, out, out_tree)`` to ``applications``."""
  def apply(eqn, invals):
    prim = _prim_of(eqn)
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


def application_types(prim_fn, args) -> list[tuple]:
  """`applications` with the arguments' types, from a trace alone."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  return [(prim, jax.tree.unflatten(prim.in_tree,
                                    [v.aval for v in eqn.invars]))
          for eqn in equations(closed.jaxpr, into=_in_place)
          if (prim := _prim_of(eqn)) is not None]


def applications(prim_fn, args) -> list[tuple]:
  """``(prim, prim_args)`` of each primitive ``prim_fn(*args)`` binds
  outside loops and branches, up to one whose `expand` fails."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  found = []
  try:
    eval_expanded(closed.jaxpr, closed.consts, jax.tree.leaves(args), found)
  except Exception:  # pylint: disable=broad-except  (the expand check says why)
    pass
  return [(prim, p_args) for prim, p_args, _, _ in found]


def custom_calls(prim_fn, args) -> list[tuple[CustomRules, Any, list]]:
  """``(rules, fn, inputs)`` of each distinct custom function ``prim_fn``
  calls outside loops and branches: its call alone, and its inputs at its
  first call."""
  closed = jax.make_jaxpr(prim_fn)(*args)
  targets: dict[CustomRules, Any] = {}
  for eqn in equations(closed.jaxpr, into=_in_place):
    rules = _custom_rules(eqn)
    if rules is not None:
      targets.setdefault(rules, eqn)
  eqns = list(targets.values())

  def inputs(*leaves):
    found = {}

    def record(eqn, invals):
      if any(eqn is t for t in eqns):
        found.setdefault(id(eqn), list(invals))
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
