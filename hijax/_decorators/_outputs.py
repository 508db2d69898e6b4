"""What the user's rules return, checked against the decorated function's
types (shape and dtype, weak types ignored). Each message begins with JAX's
wording of the error, then names the function, the rule, the argument or
output, what was declared and what came back.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from hijax import _checks
from hijax._cotangents import bwd_checks_disabled
from hijax._internals import core
from hijax._util import describe_value, is_float0, is_zero


class CotangentTypeError(_checks.RuleTypeError, ValueError):
  """The bwd rule of a `hijax.custom_vjp` function returned a cotangent
  whose type is not its argument's cotangent type. A `RuleTypeError` (so a
  ``TypeError``) and a ``ValueError``, as ``jax.custom_vjp``'s error is; not
  raised while ``jax.config.jax_disable_bwd_checks`` is set, as JAX's is
  not."""


def _is_symbolic(x) -> bool:
  return isinstance(x, SymbolicZero) or is_zero(x)


def _shown(tree: Any, names: list[str]) -> str:
  return str(jax.tree.unflatten(tree, names)).replace("'", "")


def _source_info(fun: Callable[..., Any]) -> str:
  fun = inspect.unwrap(fun)
  while isinstance(fun, functools.partial):
    fun = inspect.unwrap(fun.func)
  code = getattr(fun, "__code__", None)
  name = getattr(fun, "__name__", None) or type(fun).__name__
  return name if code is None else (
      f"{name} at {code.co_filename}:{code.co_firstlineno}")


def _types(tree: Any, leaves: list[Any]) -> str:
  return _shown(tree, [type(x).__name__ if a is None else a.str_short()
                       for a, x in zip(map(_checks.type_of, leaves), leaves)])


def pair(owner: Any, rule: str, result: Any, what: str,
         jax_words: Callable[[Any], str] | None = None) -> tuple:
  if not isinstance(result, (tuple, list)) or len(result) != 2:
    raise owner.error(rule, f"must return a pair {what}, but returned "
                      f"{describe_value(result)}", TypeError,
                      None if jax_words is None else jax_words(result))
  return tuple(result)


def _paths(tree: Any, prefix: str = "") -> list[str]:
  dummy = jax.tree.unflatten(tree, [0] * tree.num_leaves)
  return [prefix + jax.tree_util.keystr(p) for p, _ in
          jax.tree_util.tree_flatten_with_path(dummy)[0]]


def primal_out(owner: Any, rule: str, out: Any,
               head: Callable[[bool], str], rule_output: str,
               mismatch: bool = False) -> None:
  """Checks a rule's primal output; JAX's words are ``head(shapes)``, then
  what differs (and, with ``mismatch``, the first leaf that does)."""
  flat, tree = jax.tree.flatten(out)

  def words(shapes: bool, where: str = "", x: Any = None,
            declared: Any = None) -> str:
    what = "shapes/dtypes of" if shapes else "container/pytree structure"
    expected = _shown(owner.fun_tree,
                      [a.str_short() for a in owner.fun_avals])
    text = (f"{head(shapes)}, but instead the {rule_output}'s first element "
            f"had {what}:\n    {_types(tree, flat)}\nwhile the "
            f"{owner.decorated.kind}-decorated function {owner.name} had "
            f"output {what}:\n    {expected}{'' if shapes else '.'}")
    if mismatch and shapes:
      text += (f"\nat {where}, got fwd output type "
               f"{_types(jax.tree.structure(0), [x])} which doesn't match "
               f"primal output type {declared.str_short()}")
    return text
  if tree != owner.fun_tree:
    raise owner.error(
        rule, f"returned a primal output with structure {tree}, but "
        f"{owner.name} returns structure {owner.fun_tree}: the primal "
        f"output must equal {owner.name}(*args)", TypeError, words(False))
  paths = _paths(owner.fun_tree, "output")
  for where, declared, x in zip(paths, owner.fun_avals, flat):
    if not _checks.matches(declared, _checks.type_of(x), "rule-primal"):
      got, advice = _checks.described(declared, x, "rule-primal")
      raise owner.error(
          rule, f"returned {got} as its primal {where}, but {owner.name} "
          f"returns {declared.str_short()} there. {advice}The primal output "
          f"must equal {owner.name}(*args).".rstrip(),
          _checks.RuleTypeError, words(True, where, x, declared))


def tangent_out(owner: Any, rule: str, tangent: Any,
                jvp_name: str) -> list[Any]:
  flat = None
  for is_leaf in (lambda x: x is None or _is_symbolic(x), _is_symbolic):
    leaves, tree = jax.tree.flatten(tangent, is_leaf=is_leaf)
    if tree == owner.fun_tree:
      flat = leaves
      break
  if flat is None:
    raise owner.error(
        rule, "returned an output tangent with structure "
        f"{jax.tree.structure(tangent, is_leaf=_is_symbolic)}, but "
        f"{owner.name} returns structure {owner.fun_tree}: the tangent "
        "has the structure of the primal output (None for a zero leaf)",
        TypeError, f"Custom JVP rule {jvp_name} for function "
        f"{owner.name} must produce primal and tangent outputs with equal "
        f"container (pytree) structures, but got {owner.fun_tree} and "
        f"{jax.tree.structure(tangent)} respectively.")
  declared_all = [a.to_tangent_aval() for a in owner.fun_avals]
  out = []
  for where, aval, declared, t in zip(_paths(owner.fun_tree, "output"),
                                      owner.fun_avals, declared_all, flat):
    symbolic = _is_symbolic(t)
    if symbolic and not _checks.matches(declared, t.aval, "tangent"):
      raise owner.error(
          rule, f"returned a symbolic zero of type {t.aval.str_short()} as "
          f"the tangent of {where}, whose tangent type is "
          f"{declared.str_short()}: return None for a zero tangent",
          _checks.RuleTypeError, _tangent_words(owner, declared_all, flat))
    if t is None or symbolic:
      out.append(None)
      continue
    if not _checks.matches(declared, _checks.type_of(t), "tangent"):
      got, advice = _checks.described(declared, t, "tangent")
      raise owner.error(
          rule, f"returned {got} as the tangent of {where}, but that output is "
          f"{aval.str_short()}, so its tangent is {declared.str_short()}. "
          f"{advice}".rstrip(), _checks.RuleTypeError,
          _tangent_words(owner, declared_all, flat))
    out.append(t)
  return out


def _tangent_words(owner: Any, declared: list[Any], flat: list[Any]
                   ) -> str | None:
  """JAX's words; none where a tangent is not a JAX value (no type to name)."""
  avals = [d if t is None else t.aval if _is_symbolic(t) else
           _checks.type_of(t) for t, d in zip(flat, declared)]
  if any(a is None for a in avals):
    return None
  strong = lambda a: getattr(a, "strip_weak_type", lambda: a)()  # noqa: E731
  primals = [strong(a) for a in owner.fun_avals]
  expected = [strong(a) for a in declared]
  got = [strong(a) for a in avals]
  head = ("Custom JVP rule must produce primal and tangent outputs with "
          "corresponding shapes and dtypes")
  if len(expected) == 1:
    return (f"{head}. Expected {expected[0].str_short()} (tangent type of "
            f"{primals[0].str_short()}) but got {got[0].str_short()}.")
  return f"{head}, but got:\n" + "\n".join(
      f"  primal {p.str_short()} with tangent {t.str_short()}, expecting "
      f"tangent {e}" for p, e, t in zip(primals, expected, got) if e != t)


def _bwd_structure_words(cts: Any, in_tree: Any) -> str:
  return ("Custom VJP bwd rule must produce an output with the same container "
          "(pytree) structure as the args tuple of the primal function, and in "
          "particular must produce a tuple of length equal to the number of "
          "arguments to the primal function, but got bwd output structure "
          f"{jax.tree.structure(cts)} for primal input structure {in_tree}.")


def cotangents(owner: Any, rule: str, cts: Any) -> list[Any]:
  n = len(owner.signature.names)
  if isinstance(cts, list):
    cts = tuple(cts)
  if not isinstance(cts, tuple) or len(cts) != n:
    raise owner.error(
        rule, f"must return a tuple with one cotangent per differentiable "
        f"argument of {owner.name} ({n}: "
        f"{', '.join(owner.signature.names) or 'none'}), but returned "
        f"{describe_value(cts)}", TypeError,
        _bwd_structure_words(cts, owner.arg_tree))
  flat: list[Any] = []
  avals = iter(owner.arg_avals)
  check = not bwd_checks_disabled()
  for i, (name, ct, tree) in enumerate(zip(owner.signature.names, cts,
                                           owner.arg_tree.children())):
    for path, c in _broadcast_none(owner, rule, name, ct, tree):
      flat.append(_cotangent(owner, rule, f"argument {name}{path}",
                             f"[{i}]{path}", next(avals), c, check))
  return flat


def _broadcast_none(owner, rule, name, ct, tree) -> list[tuple[str, Any]]:
  dummy, paths = jax.tree.unflatten(tree, [0] * tree.num_leaves), _paths(tree)
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
        _bwd_structure_words(ct, owner.arg_tree))
  return list(zip(paths, parts))


def _bwd_type_words(owner, path, got, expected, aval, symbolic: bool) -> str:
  source = _source_info(owner.decorated.fun)
  words = (f"at output{path} the bwd rule attached to {source} produced an "
           f"output of type {got.str_short()} which doesn't match expected "
           f"type {expected.str_short()}")
  if symbolic:
    return (words + ". Consider just returning a None here instead of a "
            "SymbolicZero object.")
  return (f"{words}\nCustom VJP bwd rule attached to {source} must produce "
          "an output with the same type as the args tuple of the primal "
          f"function, but at output{path} the bwd rule produced an output of "
          f"type {got.str_short()} corresponding to an input of type "
          f"{aval.str_short()}")


def _cotangent(owner, rule, where, path, aval, ct, check: bool):
  declared = aval.to_ct_aval()
  if ct is None or not check and (_is_symbolic(ct) or is_float0(declared)):
    return None
  if not check:
    return ct
  if _is_symbolic(ct):
    if not _checks.matches(declared, ct.aval, "cotangent"):
      raise owner.error(
          rule, f"returned a symbolic zero of type {ct.aval.str_short()} as "
          f"the cotangent of {where}, but that argument has type "
          f"{aval.str_short()}, so its cotangent is {declared.str_short()}: "
          "return None for a zero cotangent", CotangentTypeError,
          _bwd_type_words(owner, path, ct.aval, declared, aval, True))
    return None
  actual = _checks.type_of(ct)
  if is_float0(declared):
    if getattr(actual, "shape", None) == declared.shape:
      return None  # an integer input's cotangent is dropped, as JAX does
  if (getattr(aval, "weak_type", False)  # a weak float input: its dtype
      and isinstance(actual, core.ShapedArray)
      and actual.shape == declared.shape and actual.dtype != declared.dtype
      and jnp.issubdtype(actual.dtype, jnp.floating)
      and jnp.issubdtype(declared.dtype, jnp.floating)):
    return jnp.asarray(ct, declared.dtype)
  if not _checks.matches(declared, actual, "cotangent"):
    got, advice = _checks.described(declared, ct, "cotangent")
    words = None if actual is None else _bwd_type_words(
        owner, path, actual, declared, aval, False)
    raise owner.error(
        rule, f"returned {got} as the cotangent of {where}, but that argument "
        f"has type {aval.str_short()}, so its cotangent is "
        f"{declared.str_short()}. {advice}".rstrip(), CotangentTypeError,
        words)
  return ct
