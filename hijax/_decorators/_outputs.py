"""What the user's rules return, checked against the decorated function's
types, with messages that name the function, the rule, the argument or
output, what was declared and what came back.

The checks are those `hijax._checks` makes for a primitive's rules (shape and
dtype; weak types ignored; no silent dtype conversion), run before the values
reach hijax's generic checks, so that a message speaks of ``f`` and
``f_bwd`` rather than of the primitive class behind them. Each message begins
with JAX's own wording of the error (`hijax._decorators._jax_words`), so
that what matches JAX's error matches hijax's, and goes on with hijax's
detail. The exception is the one JAX raises: a TypeError, and for a
cotangent of the wrong type `CotangentTypeError`, which is also the
``ValueError`` ``jax.custom_vjp`` raises for it (not raised while
``jax.config.jax_disable_bwd_checks`` is set, as JAX's is not).

Imports: `hijax._checks`, `hijax._cotangents`, `hijax._util`,
`hijax._internals`, the decorators' `_jax_words`, and jax.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from hijax import _checks
from hijax._cotangents import bwd_checks_disabled
from hijax._decorators import _jax_words
from hijax._internals import core
from hijax._util import describe_value, is_float0, is_zero

__all__ = ["RuleOwner", "CotangentTypeError", "pair", "primal_out",
           "cotangents", "tangent_out"]


class CotangentTypeError(_checks.RuleTypeError, ValueError):
  """The bwd rule of a `hijax.custom_vjp` function returned a cotangent
  whose type is not its argument's cotangent type (another shape, another
  dtype, or a symbolic zero of another type).

  A `RuleTypeError` (so a ``TypeError``) like every hijax rule-type error,
  and a ``ValueError`` like the error ``jax.custom_vjp`` raises for it; its
  message begins with JAX's. Not raised while
  ``jax.config.jax_disable_bwd_checks`` is set.
  """


def _is_symbolic(x) -> bool:
  return isinstance(x, SymbolicZero) or is_zero(x)


class RuleOwner:
  """Names for messages: ``hijax.custom_vjp function f``, its rules, its
  arguments (``names``, one per differentiable argument) and its output;
  ``fun`` is the function itself (JAX's messages name its source line)."""

  def __init__(self, decorator: str, fun: Any, fun_name: str,
               arg_names: list[str], in_tree: Any, in_avals_flat: list[Any],
               out_tree: Any, out_avals_flat: list[Any]):
    self.decorator, self.fun, self.fun_name = decorator, fun, fun_name
    self.arg_names = arg_names
    self.in_tree, self.in_avals_flat = in_tree, in_avals_flat
    self.out_tree, self.out_avals_flat = out_tree, out_avals_flat

  def __str__(self) -> str:
    return f"hijax.{self.decorator} function {self.fun_name}"

  def error(self, rule: str, message: str, cls: type = TypeError,
            jax_words: str | None = None) -> Exception:
    """``cls`` with JAX's wording of the error (if given), then hijax's
    detail: ``hijax.custom_vjp function f: the fwd rule f_fwd ...``."""
    detail = f"{self}: {rule} {message}"
    return cls(detail if jax_words is None else f"{jax_words}\n{detail}")


def _type_message(declared, value, kind: str) -> tuple[str, str]:
  actual = _checks.type_of(value)
  got = (f"a {type(value).__name__}, which is not a JAX value"
         if actual is None else f"a value of type {actual.str_short()}")
  return got, _checks._advice(declared, actual, kind)  # pyright: ignore[reportPrivateUsage]


def pair(owner: RuleOwner, rule: str, result: Any, what: str,
         jax_words: Callable[[Any], str] | None = None) -> tuple:
  """``result`` as a pair; TypeError (naming ``what`` it holds) if it is not.
  ``jax_words(result)`` is JAX's wording of that error, if JAX has one."""
  if not isinstance(result, (tuple, list)) or len(result) != 2:
    raise owner.error(rule, f"must return a pair {what}, but returned "
                      f"{describe_value(result)}", TypeError,
                      None if jax_words is None else jax_words(result))
  return tuple(result)


def _out_paths(owner: RuleOwner) -> list[str]:
  """``output``, or ``output['a'][0]`` and so on for each output leaf."""
  dummy = jax.tree.unflatten(owner.out_tree,
                             [0] * len(owner.out_avals_flat))
  return ["output" + jax.tree_util.keystr(p) for p, _ in
          jax.tree_util.tree_flatten_with_path(dummy)[0]]


def _types(owner: RuleOwner, tree: Any, leaves: list[Any]) -> str:
  """The types of ``leaves`` in the structure ``tree``, as JAX prints them."""
  avals = [_checks.type_of(x) for x in leaves]
  return _jax_words.types_tree(tree, [
      a if a is not None else _NotJax(x) for a, x in zip(avals, leaves)])


class _NotJax:
  """Stands for a leaf that is not a JAX value in `_types`."""

  def __init__(self, x):
    self.name = type(x).__name__

  def str_short(self) -> str:
    return self.name


PrimalWords = Callable[[bool, str, str, Any], str]
"""JAX's wording of a rule's primal output that differs from the function's:
``(shapes, got, expected, mismatch)``, ``shapes`` False for another
structure, ``mismatch`` ``(where, got_aval, declared)`` of the first leaf
whose type differs (or None)."""


def primal_out(owner: RuleOwner, rule: str, out: Any,
               jax_words: PrimalWords | None = None) -> list[Any]:
  """The primal output a rule returned, flattened and checked against the
  function's output (structure, then each leaf's shape and dtype)."""
  flat, tree = jax.tree.flatten(out)
  expected = lambda: _jax_words.types_tree(owner.out_tree,  # noqa: E731
                                           owner.out_avals_flat)
  if tree != owner.out_tree:
    words = None if jax_words is None else jax_words(
        False, _types(owner, tree, flat), expected(), None)
    raise owner.error(
        rule, f"returned a primal output with structure {tree}, but "
        f"{owner.fun_name} returns structure {owner.out_tree}: the primal "
        f"output must equal {owner.fun_name}(*args)", TypeError, words)
  for where, declared, x in zip(_out_paths(owner), owner.out_avals_flat, flat):
    if not _checks.matches(declared, _checks.type_of(x), "rule-primal"):
      got, advice = _type_message(declared, x, "rule-primal")
      words = None if jax_words is None else jax_words(
          True, _types(owner, tree, flat), expected(),
          (where, _types(owner, jax.tree.structure(0), [x]), declared))
      raise owner.error(
          rule, f"returned {got} as its primal {where}, but {owner.fun_name} "
          f"returns {declared.str_short()} there. {advice}The primal output "
          f"must equal {owner.fun_name}(*args).".rstrip(),
          _checks.RuleTypeError, words)
  return flat


def tangent_out(owner: RuleOwner, rule: str, tangent: Any,
                jvp_name: str | None = None) -> list[Any]:
  """The output tangent of a jvp rule, flattened, each leaf checked against
  its output's tangent type; None, a symbolic zero and a float0 tangent of a
  float output become None. ``jvp_name`` names the rule in JAX's wording."""
  flat = None
  for is_leaf in (lambda x: x is None or _is_symbolic(x), _is_symbolic):
    leaves, tree = jax.tree.flatten(tangent, is_leaf=is_leaf)
    if tree == owner.out_tree:
      flat = leaves
      break
  if flat is None:
    words = None if jvp_name is None else _jax_words.jvp_structures(
        jvp_name, owner.fun_name, owner.out_tree, jax.tree.structure(tangent))
    raise owner.error(
        rule, "returned an output tangent with structure "
        f"{jax.tree.structure(tangent, is_leaf=_is_symbolic)}, but "
        f"{owner.fun_name} returns structure {owner.out_tree}: the tangent "
        "has the structure of the primal output (None for a zero leaf)",
        TypeError, words)
  declared_all = [a.to_tangent_aval() for a in owner.out_avals_flat]
  out = []
  for where, aval, declared, t in zip(_out_paths(owner), owner.out_avals_flat,
                                      declared_all, flat):
    if t is None or _is_symbolic(t) or (is_float0(t) and not is_float0(declared)):
      if t is not None and _is_symbolic(t) and not _checks.matches(
          declared, t.aval, "tangent"):
        raise owner.error(
            rule, f"returned a symbolic zero of type {t.aval.str_short()} as "
            f"the tangent of {where}, whose tangent type is "
            f"{declared.str_short()}: return None for a zero tangent",
            _checks.RuleTypeError, _tangent_words(owner, declared_all, flat))
      out.append(None)
      continue
    if not _checks.matches(declared, _checks.type_of(t), "tangent"):
      got, advice = _type_message(declared, t, "tangent")
      raise owner.error(
          rule, f"returned {got} as the tangent of {where}, but that output is "
          f"{aval.str_short()}, so its tangent is {declared.str_short()}. "
          f"{advice}".rstrip(), _checks.RuleTypeError,
          _tangent_words(owner, declared_all, flat))
    out.append(t)
  return out


def _tangent_words(owner: RuleOwner, declared: list[Any], flat: list[Any]
                   ) -> str:
  """JAX's wording for output tangents of the wrong types (a None or
  non-JAX leaf is shown as what was declared)."""
  def aval_of(t, d):
    a = t.aval if _is_symbolic(t) else _checks.type_of(t)
    return d if t is None or a is None else a
  strong = lambda a: getattr(a, "strip_weak_type", lambda: a)()  # noqa: E731
  got = [strong(aval_of(t, d)) for t, d in zip(flat, declared)]
  return _jax_words.jvp_tangent_types(
      [strong(a) for a in owner.out_avals_flat],
      [strong(a) for a in declared], got)


def cotangents(owner: RuleOwner, rule: str, cts: Any) -> list[Any]:
  """What a bwd rule returned, as one cotangent or None per input leaf.

  ``cts`` has one entry per differentiable argument (a list is read as a
  tuple, as ``jax.custom_vjp`` does); None at any level of an entry stands
  for zeros, as does a symbolic zero. Each other leaf must have its input's
  cotangent type; for an integer or boolean input (cotangent type float0)
  anything of the input's shape is dropped.
  """
  n = len(owner.arg_names)
  if isinstance(cts, list):
    cts = tuple(cts)
  if not isinstance(cts, tuple) or len(cts) != n:
    raise owner.error(
        rule, f"must return a tuple with one cotangent per differentiable "
        f"argument of {owner.fun_name} ({n}: "
        f"{', '.join(owner.arg_names) or 'none'}), but returned "
        f"{describe_value(cts)}", TypeError,
        _jax_words.bwd_structure(jax.tree.structure(cts), owner.in_tree))
  arg_trees = owner.in_tree.children()
  flat: list[Any] = []
  avals = iter(owner.in_avals_flat)
  check = not bwd_checks_disabled()
  for i, (name, ct, tree) in enumerate(zip(owner.arg_names, cts, arg_trees)):
    leaves = _broadcast_none(owner, rule, name, ct, tree)
    for path, c in leaves:
      aval = next(avals)
      flat.append(_cotangent(owner, rule, f"argument {name}{path}",
                             f"[{i}]{path}", aval, c) if check else
                  _unchecked_cotangent(aval, c))
  return flat


def _broadcast_none(owner, rule, name, ct, tree) -> list[tuple[str, Any]]:
  """``(path, leaf)`` for each leaf of the argument's structure ``tree``.

  ``ct`` may be a prefix of that structure: a None (or any leaf) standing
  for a whole subtree applies to each of its leaves, as in ``jax.custom_vjp``.
  """
  dummy = jax.tree.unflatten(tree, [object() for _ in range(tree.num_leaves)])
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(dummy)[0]]
  parts: list[Any] | None = []
  try:
    # (returning c rebuilds ct as it was: a pytree node may refuse None)
    jax.tree.map(lambda c, d: parts.extend(  # pyright: ignore[reportOptionalMemberAccess]
        [c] * len(jax.tree.leaves(d))) or c, ct, dummy,
        is_leaf=lambda x: x is None)
  except (ValueError, TypeError):
    parts = None
  if parts is None or len(parts) != len(paths):
    is_leaf = lambda x: x is None or _is_symbolic(x)  # noqa: E731
    raise owner.error(
        rule, f"returned a cotangent with structure "
        f"{jax.tree.structure(ct, is_leaf=is_leaf)} for argument {name}, "
        f"whose structure is {tree}: return a cotangent of the argument's "
        "structure (None for zeros)", TypeError,
        _jax_words.bwd_structure(jax.tree.structure(ct), owner.in_tree))
  return list(zip(paths, parts))


def _unchecked_cotangent(aval, ct):
  """With ``jax_disable_bwd_checks``: zeros (None, a symbolic zero, a
  float0 input's cotangent) dropped, everything else passed on as it is."""
  if ct is None or _is_symbolic(ct) or is_float0(aval.to_ct_aval()):
    return None
  return ct


def _weak_float_mismatch(aval, declared, actual) -> bool:
  """A floating cotangent of another dtype for a weakly typed floating
  argument (a Python float, whose dtype is only the default: float64 under
  ``jax_enable_x64``). JAX accepts it; hijax converts it to the argument's
  dtype, as the gradient of a Python float has."""
  return (getattr(aval, "weak_type", False)
          and isinstance(actual, core.ShapedArray)
          and actual.shape == declared.shape
          and actual.dtype != declared.dtype
          and jnp.issubdtype(actual.dtype, jnp.floating)
          and jnp.issubdtype(declared.dtype, jnp.floating))


def _cotangent(owner, rule, where, path, aval, ct):
  declared = aval.to_ct_aval()
  if ct is None:
    return None
  if _is_symbolic(ct):
    if not _checks.matches(declared, ct.aval, "cotangent"):
      raise owner.error(
          rule, f"returned a symbolic zero of type {ct.aval.str_short()} as "
          f"the cotangent of {where}, but that argument has type "
          f"{aval.str_short()}, so its cotangent is {declared.str_short()}: "
          "return None for a zero cotangent", CotangentTypeError,
          _jax_words.bwd_type(owner.fun, path, ct.aval, declared, True))
    return None
  actual = _checks.type_of(ct)
  if is_float0(declared):
    if getattr(actual, "shape", None) == declared.shape:
      return None  # an integer input's cotangent is dropped, as JAX does
  if _weak_float_mismatch(aval, declared, actual):
    return jnp.asarray(ct, declared.dtype)
  if not _checks.matches(declared, actual, "cotangent"):
    got, advice = _type_message(declared, ct, "cotangent")
    words = None if actual is None else _jax_words.bwd_type(
        owner.fun, path, actual, declared, False)
    raise owner.error(
        rule, f"returned {got} as the cotangent of {where}, but that argument "
        f"has type {aval.str_short()}, so its cotangent is "
        f"{declared.str_short()}. {advice}".rstrip(), CotangentTypeError,
        words)
  return ct
