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
from collections.abc import Collection

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
  own = {"in_avals", "out_aval", "params", "effects", "vjp_bwd_retval_logs"}
  return frozenset(methods | own | SET_BY_INIT)


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


def _hashable(x) -> bool:
  try:
    hash(x)
  except TypeError:
    return False
  return True


def split_retval_logs(prim, out):
  """``(cotangents, logs)`` from `vjp_bwd_retval`; TypeError if not a pair."""
  # The logs are None or a dict; a second entry that is neither is a cotangent
  # of a two-input primitive whose rule forgot the logs.
  if not (isinstance(out, tuple) and len(out) == 2
          and (out[1] is None or type(out[1]) is dict)):
    raise TypeError(
        f"{type(prim).__name__}.vjp_bwd_retval returned {describe_value(out)}, but "
        "the class sets vjp_bwd_retval_logs = True, so vjp_bwd_retval must "
        "return a pair (cotangents, logs) with logs None or a dict: return "
        "`(cts, logs)`, or remove `vjp_bwd_retval_logs = True`")
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

