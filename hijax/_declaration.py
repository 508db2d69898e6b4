"""Checks of what a `HiPrim` subclass declares, and the errors that name the fix.

`HiPrim.__init__` and `HiPrim.__call__` (in `hijax.primitive`) call these: the
declared types are flattened once per instance (`flatten_types`), a param
may not shadow a method (`reserved_names`), params and types must be hashable,
and an argument of the wrong type gets a message with its position and pytree
path (`argument_type_error`).

Imports: jax and `hijax._util` only. Nothing here knows the `HiPrim` class; it takes instances.
"""
from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Collection
from typing import Any

import jax
from jax import tree_util
from jax.core import AbstractValue
from jax.extend.core import Effect

from hijax._internals import core
from hijax._util import describe_value

# The attributes `HiPrim.__init__` sets; a param may not take their names.
SET_BY_INIT = frozenset({
    "_key", "_hash", "_params_key", "in_avals_flat", "in_tree",
    "out_avals_flat", "out_tree", "_args_are_leaves", "_single_output"})


def reserved_names(cls) -> frozenset:
  """Names a param may not take: methods and HiPrim's own attributes.

  Params become instance attributes, which would shadow them.
  """
  methods = {n for n in dir(cls) if callable(getattr(cls, n, None))
             or isinstance(inspect.getattr_static(cls, n, None), property)}
  own = {"in_avals", "out_aval", "params", "effects", "vjp_bwd_retval_logs",
         "skip_linearization_on_zero_tangents", "jet_from_expand"}
  return frozenset(methods | own | SET_BY_INIT)


def owner(cls, name) -> type:
  """The class of ``cls``'s method resolution order that defines ``name``."""
  return next(c for c in cls.__mro__ if name in c.__dict__)


# --- the hooks a subclass overrides ---------------------------------------------

def hook_flags(cls, base) -> None:
  """Sets what the rules read of ``cls``'s hooks (``base`` is `HiPrim`).

  ``_has_check`` and ``_has_staging``: the class overrides `HiPrim.check` or
  `HiPrim.staging`; ``_dce_takes_live_ins``: its `dce` takes ``(used_outs,
  live_ins)`` (JAX 0.12's form) rather than ``(used_outs)`` (0.11.2's).
  Refuses ``physicalize`` and a `vjp_bwd_retval_logs` that is neither a flag
  nor a method.
  """
  if "physicalize" in dir(cls):
    raise TypeError(
        f"{cls.__name__} defines `physicalize`, the hook through which the "
        "Pallas fuser of JAX's own hijax turns fusible dtypes into physical "
        "arrays. JAX calls it only for primitives of jax.experimental.hijax, "
        "so on a hijax primitive it would never run; hijax does not support "
        "the Pallas fuser. Remove `physicalize` (or keep the class on "
        "jax.experimental.hijax)")
  logs = inspect.getattr_static(cls, "vjp_bwd_retval_logs")
  if not (isinstance(logs, bool) or callable(logs)
          or hasattr(logs, "__get__")):
    raise TypeError(
        f"{cls.__name__}.vjp_bwd_retval_logs is {logs!r:.60}: it is either "
        "a flag (`vjp_bwd_retval_logs = True`: vjp_bwd_retval returns "
        "(cotangents, logs)) or a method `vjp_bwd_retval_logs(self, res, g)` "
        "returning (cotangents, logs)")
  cls._has_check = owner(cls, "check") is not base
  cls._has_staging = owner(cls, "staging") is not base
  cls._dce_takes_live_ins = _dce_takes_live_ins(cls)


def _dce_takes_live_ins(cls) -> bool:
  try:
    params = list(inspect.signature(cls.dce).parameters.values())[1:]
  except (TypeError, ValueError):
    return True  # not introspectable: JAX 0.12's form
  if any(p.kind is p.VAR_POSITIONAL for p in params):
    return True
  positional = [p for p in params
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  required = [p for p in params if p.default is p.empty
              and p.kind is not p.VAR_KEYWORD]
  if len(positional) >= 2 and len(required) <= 2:
    return True
  if len(positional) == 1 and len(required) <= 1:
    return False
  raise TypeError(
      f"{cls.__name__}.dce takes {len(positional)} positional parameter(s) "
      "after self: write `dce(self, used_outs, live_ins)` (JAX 0.12's form) "
      "or `dce(self, used_outs)` (0.11.2's)")


def check_backward_rules(cls, base) -> None:
  """Rejects a class whose `vjp_bwd_retval` would never be called.

  The default `HiPrim.vjp_bwd` (``base.vjp_bwd``) is what calls
  `vjp_bwd_retval` (or an overriding `vjp_bwd_retval_logs`), so a `vjp_bwd`
  defined in the same class, or in a subclass of the one defining the
  retval rule, hides it. (A subclass may replace an inherited retval rule
  with its own `vjp_bwd`.)
  """
  bwd = owner(cls, "vjp_bwd")
  if bwd is base:
    return
  for rule in ("vjp_bwd_retval", "vjp_bwd_retval_logs"):
    retval = owner(cls, rule)
    if retval is base or isinstance(retval.__dict__[rule], bool):
      continue  # (the flag form of vjp_bwd_retval_logs is not a rule)
    if cls.__mro__.index(retval) <= cls.__mro__.index(bwd):
      name = cls.__name__
      raise TypeError(
          f"{name}.vjp_bwd (from {bwd.__name__}) and {name}.{rule} "
          f"(from {retval.__name__}) are both defined, so {rule} would "
          "never be called: reverse mode calls vjp_bwd. Define only one "
          f"backward rule: {rule}(self, res, g) returning cotangents, or "
          "vjp_bwd(self, res, g, *accums) accumulating them")


def missing_jvp_fix(cls, base) -> str:
  """What to write for forward mode, given the rules ``cls`` defines."""
  if owner(cls, "lin") is not base:
    return ("implement `jvp(self, primals, tangents)`, or derive it from "
            "`lin`/`linearized` with `jvp = jvp_from_lin` in the class body")
  if owner(cls, "vjp_fwd") is not base:
    return ("implement `jvp(self, primals, tangents)`, or derive it from the "
            "reverse-mode rules with `jvp = jvp_from_vjp` in the class body")
  return "implement `jvp(self, primals, tangents)`"


class falsy_method:  # noqa: N801 - used as a decorator, like `property`
  """A method whose bound form reads as False.

  `HiPrim.vjp_bwd_retval_logs` is a method in jax 0.11.2 and 0.12, and a
  boolean flag in JAX's earlier API; its default is both: callable, and False
  in ``if self.vjp_bwd_retval_logs:``.
  """

  def __init__(self, func: Callable[..., Any]) -> None:
    self.func = func
    functools.update_wrapper(self, func)  # pyright: ignore[reportArgumentType]

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    return self if obj is None else _FalsyBound(self.func, obj)

  def __call__(self, obj: Any, *args: Any) -> Any:
    """Called on the class: ``HiPrim.vjp_bwd_retval_logs(prim, res, g)``."""
    return self.func(obj, *args)


class _FalsyBound:
  __slots__ = ("func", "obj")

  def __init__(self, func, obj):
    self.func, self.obj = func, obj

  def __call__(self, *args):
    return self.func(self.obj, *args)

  def __bool__(self):
    return False


def param_name_error(prim, key) -> TypeError:
  """A params key that is not a string, or that would shadow a method."""
  name = type(prim).__name__
  if type(key) is not str:
    return TypeError(
        f"{name}.params keys must be strings (each param becomes an "
        f"attribute of the instance), got {key!r}")
  what = ("method" if callable(getattr(type(prim), key, None))
          else "attribute")
  return TypeError(
      f"{name}.params[{key!r}] would shadow the {what} {name}.{key} (each "
      "param becomes an attribute of the instance): rename the param")


def missing_attribute_error(prim) -> AttributeError:
  """Names the attribute ``__init__`` did not set before ``super().__init__()``."""
  missing = next(a for a in ("in_avals", "out_aval", "params")
                 if not hasattr(prim, a))
  return AttributeError(
      f"{type(prim).__name__}.__init__ must set `self.{missing}` before "
      "calling `super().__init__()`")


def effect_set(prim) -> frozenset:
  """``prim.effects`` as a frozenset, from any collection of effects."""
  effects = prim.effects
  if isinstance(effects, frozenset) and all(
      isinstance(e, Effect) for e in effects):
    return effects
  if (isinstance(effects, Collection) and not isinstance(effects, str)
      and all(isinstance(e, Effect) for e in effects)):
    return frozenset(effects)
  raise TypeError(
      f"{type(prim).__name__}.effects must be a collection (e.g. a set) of JAX "
      f"effects, got {effects!r:.80}; write `self.effects = {{effect}}`")


def unhashable_error(prim) -> TypeError:
  """Names the param or type that made ``hash(prim)`` fail."""
  name = type(prim).__name__
  for key, value in prim.params.items():
    if not _hashable(value):
      return TypeError(
          f"{name}.params[{key!r}] is a {type(value).__name__}, which is not "
          "hashable. Params are static and must be hashable (use a tuple "
          "instead of a list, or pass array data as an input)")
  for attr, avals in (("in_avals", prim.in_avals_flat),
                      ("out_aval", prim.out_avals_flat)):
    for aval in avals:
      if not _hashable(aval):
        return TypeError(
            f"{name}.{attr} contains the type {type(aval).__name__}, which is "
            "not hashable: write a hi type as a frozen dataclass")
  return TypeError(f"{name}: its effects must be hashable")


# Values a param may hold that can hide a traced value, and how to look inside.
_SCALAR_PARAMS = (bool, int, float, complex, str, bytes, type(None), type)


def captured_tracer(params: dict[str, Any]) -> tuple[str, Any] | None:
  """``(key, tracer)`` for the first param holding a traced value, or None.

  Looks inside functions (closure cells, default arguments), partials, bound
  methods and containers, where a traced value hides from ``hash``: a param
  is static, so such a value would be invisible to every rule.
  """
  for key, value in params.items():
    if isinstance(value, _SCALAR_PARAMS):
      continue  # the common case, checked without a walk
    tracer = _find_tracer(value)
    if tracer is not None:
      return key, tracer
  return None


def _find_tracer(value: Any, budget: int = 500) -> Any:
  stack, seen = [value], set()
  while stack and budget > 0:
    v = stack.pop()
    budget -= 1
    if isinstance(v, core.Tracer):
      return v
    if isinstance(v, _SCALAR_PARAMS) or id(v) in seen:
      continue
    seen.add(id(v))
    if isinstance(v, types.FunctionType):
      for cell in v.__closure__ or ():
        try:
          stack.append(cell.cell_contents)
        except ValueError:  # a cell not yet assigned
          pass
      stack.extend(v.__defaults__ or ())
      stack.extend((v.__kwdefaults__ or {}).values())
    elif isinstance(v, functools.partial):
      stack.extend((v.func, *v.args, *v.keywords.values()))
    elif isinstance(v, types.MethodType):
      stack.extend((v.__func__, v.__self__))
    elif isinstance(v, (tuple, list, set, frozenset)):
      stack.extend(v)
    elif isinstance(v, dict):
      stack.extend(v.values())
  return None


def captured_tracer_error(prim, key: str, tracer: Any) -> Exception:
  """The error for a traced value captured in ``prim.params[key]``."""
  name = type(prim).__name__
  return jax.errors.UnexpectedTracerError(
      f"{name}.params[{key!r}] holds a traced value of type "
      f"{core.typeof(tracer).str_short()} (a function closing over it, "
      "a partial or a container holding it). Params are static: no rule of "
      f"{name} would see that value, so its derivative or batching would be "
      "lost. Pass the value as an argument of the primitive (declared in "
      "in_avals) instead; for a function param `f(x, a)` whose last argument "
      "is an input, `f, a = hijax.closure_convert_params(f, x, a)` moves the "
      "captured values into that argument")


def _hashable(x) -> bool:
  try:
    hash(x)
  except TypeError:
    return False
  return True


def split_retval_logs(prim, out, method="vjp_bwd_retval"):
  """``(cotangents, logs)`` from ``prim.method``; TypeError if not a pair.

  ``method`` is "vjp_bwd_retval" (the class sets the flag) or
  "vjp_bwd_retval_logs" (the class overrides that method).
  """
  # The logs are None or a dict; a second entry that is neither is a cotangent
  # of a two-input primitive whose rule forgot the logs.
  if not (isinstance(out, tuple) and len(out) == 2
          and (out[1] is None or type(out[1]) is dict)):
    name = type(prim).__name__
    why = ("the class sets vjp_bwd_retval_logs = True, so vjp_bwd_retval must "
           "return" if method == "vjp_bwd_retval" else "it must return")
    fix = ("`(cts, logs)`, or remove `vjp_bwd_retval_logs = True`"
           if method == "vjp_bwd_retval" else "`(cts, logs)`, or `(cts, None)`")
    raise TypeError(
        f"{name}.{method} returned {describe_value(out)}, but {why} a pair "
        f"(cotangents, logs) with logs None or a dict: return {fix}")
  return out


def flatten_types(name, attr, tree):
  """``(leaves, treedef, kind)`` of a tree of types, ``kind`` "leaf" for a
  single type, "tuple" for a tuple of types and None otherwise; TypeError
  names a non-type leaf."""
  # Fast paths for the common cases, a single type or a tuple of types.
  if isinstance(tree, AbstractValue):
    return [tree], _LEAF, "leaf"
  if type(tree) is tuple:
    for t in tree:
      if not isinstance(t, AbstractValue):
        break
    else:
      return list(tree), _tuple_of_leaves(len(tree)), "tuple"
  leaves, treedef = tree_util.tree_flatten(tree)
  for leaf in leaves:
    if not isinstance(leaf, AbstractValue):
      raise TypeError(
          f"{name}.{attr} must contain types (e.g. jax.typeof(x) or "
          f"ShapedArray(shape, dtype)), but contains a {type(leaf).__name__}: "
          f"{leaf!r:.80}")
  # Only the fast paths' inputs flatten to one leaf or a tuple of leaves
  # (a pytree of types that is neither has another node), so None is exact.
  return leaves, treedef, None


_LEAF = tree_util.tree_structure(0)


@functools.cache
def _tuple_of_leaves(n):
  return tree_util.tree_structure((0,) * n)


def argument_type_error(prim, args) -> TypeError:
  """Names the first argument (and pytree path) whose type is not declared."""
  expected_leaves = jax.tree_util.tree_flatten_with_path(prim.in_avals)[0]
  actual_leaves = jax.tree_util.tree_flatten_with_path(args)[0]
  if len(expected_leaves) != len(actual_leaves):
    return TypeError(
        f"{type(prim).__name__}: the arguments have pytree structure "
        f"{jax.tree.structure(args)}, but in_avals has structure {prim.in_tree}")
  for (path, expected), (_, x) in zip(expected_leaves, actual_leaves):
    position = str(path[0].idx) + jax.tree_util.keystr(path[1:])
    try:
      actual = core.typeof(x)
    except TypeError:
      return TypeError(
          f"{type(prim).__name__}: argument {position} is a {type(x).__name__}, "
          f"not a JAX value; in_avals declares {expected.str_short()}")
    if not core.typematch(actual, expected):
      return TypeError(
          f"{type(prim).__name__}: argument {position} has type "
          f"{actual.str_short()}, but in_avals declares "
          f"{expected.str_short()}. Build the primitive from the arguments' "
          "types, e.g. with jax.typeof")
  raise AssertionError("no mismatching argument")

