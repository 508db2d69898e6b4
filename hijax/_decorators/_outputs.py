"""What the user's rules return, checked against the decorated function's
types, with messages that name the function, the rule, the argument or
output, what was declared and what came back.

The checks are those `hijax._checks` makes for a primitive's rules (shape and
dtype; weak types ignored; no silent dtype conversion), run before the values
reach hijax's generic checks, so that a message speaks of ``f`` and
``f_bwd`` rather than of the primitive class behind them. A cotangent of the
wrong type raises `CotangentTypeError`, which is also a ``ValueError``, the
exception ``jax.custom_vjp`` raises for it.

Imports: `hijax._checks`, `hijax._util` and jax.
"""
from __future__ import annotations

from typing import Any

import jax
from jax.custom_derivatives import SymbolicZero

from hijax import _checks
from hijax._util import describe_value, is_float0, is_zero

__all__ = ["RuleOwner", "CotangentTypeError", "pair", "primal_out",
           "cotangents", "tangent_out"]


class CotangentTypeError(_checks.RuleTypeError, ValueError):
  """A backward rule returned a cotangent whose type is not its argument's.

  A ``TypeError`` like every hijax rule-type error, and a ``ValueError`` like
  the error ``jax.custom_vjp`` raises for it.
  """


def _is_symbolic(x) -> bool:
  return isinstance(x, SymbolicZero) or is_zero(x)


class RuleOwner:
  """Names for messages: ``hijax.custom_vjp function f``, its rules, its
  arguments (``names``, one per differentiable argument) and its output."""

  def __init__(self, decorator: str, fun_name: str, arg_names: list[str],
               in_tree: Any, in_avals_flat: list[Any], out_tree: Any,
               out_avals_flat: list[Any]):
    self.decorator, self.fun_name = decorator, fun_name
    self.arg_names = arg_names
    self.in_tree, self.in_avals_flat = in_tree, in_avals_flat
    self.out_tree, self.out_avals_flat = out_tree, out_avals_flat

  def __str__(self) -> str:
    return f"hijax.{self.decorator} function {self.fun_name}"

  def error(self, rule: str, message: str, cls: type = TypeError
            ) -> Exception:
    return cls(f"{self}: {rule} {message}")


def _type_message(declared, value, kind: str) -> tuple[str, str]:
  actual = _checks.type_of(value)
  got = (f"a {type(value).__name__}, which is not a JAX value"
         if actual is None else f"a value of type {actual.str_short()}")
  return got, _checks._advice(declared, actual, kind)  # pyright: ignore[reportPrivateUsage]


def pair(owner: RuleOwner, rule: str, result: Any, what: str) -> tuple:
  """``result`` as a pair; TypeError (naming ``what`` it holds) if it is not."""
  if not isinstance(result, (tuple, list)) or len(result) != 2:
    raise owner.error(rule, f"must return a pair {what}, but returned "
                      f"{describe_value(result)}")
  return tuple(result)


def _out_paths(owner: RuleOwner) -> list[str]:
  """``output``, or ``output['a'][0]`` and so on for each output leaf."""
  dummy = jax.tree.unflatten(owner.out_tree,
                             [0] * len(owner.out_avals_flat))
  return ["output" + jax.tree_util.keystr(p) for p, _ in
          jax.tree_util.tree_flatten_with_path(dummy)[0]]


def primal_out(owner: RuleOwner, rule: str, out: Any) -> list[Any]:
  """The primal output a rule returned, flattened and checked against the
  function's output (structure, then each leaf's shape and dtype)."""
  flat, tree = jax.tree.flatten(out)
  if tree != owner.out_tree:
    raise owner.error(
        rule, f"returned a primal output with structure {tree}, but "
        f"{owner.fun_name} returns structure {owner.out_tree}: the primal "
        f"output must equal {owner.fun_name}(*args)")
  for where, declared, x in zip(_out_paths(owner), owner.out_avals_flat, flat):
    if not _checks.matches(declared, _checks.type_of(x), "rule-primal"):
      got, advice = _type_message(declared, x, "rule-primal")
      raise owner.error(
          rule, f"returned {got} as its primal {where}, but {owner.fun_name} "
          f"returns {declared.str_short()} there. {advice}The primal output "
          f"must equal {owner.fun_name}(*args).".rstrip(),
          _checks.RuleTypeError)
  return flat


def tangent_out(owner: RuleOwner, rule: str, tangent: Any) -> list[Any]:
  """The output tangent of a jvp rule, flattened, each leaf checked against
  its output's tangent type; None, a symbolic zero and a float0 tangent of a
  float output become None."""
  flat = None
  for is_leaf in (lambda x: x is None or _is_symbolic(x), _is_symbolic):
    leaves, tree = jax.tree.flatten(tangent, is_leaf=is_leaf)
    if tree == owner.out_tree:
      flat = leaves
      break
  if flat is None:
    raise owner.error(
        rule, "returned an output tangent with structure "
        f"{jax.tree.structure(tangent, is_leaf=_is_symbolic)}, but "
        f"{owner.fun_name} returns structure {owner.out_tree}: the tangent "
        "has the structure of the primal output (None for a zero leaf)")
  out = []
  for where, aval, t in zip(_out_paths(owner), owner.out_avals_flat, flat):
    declared = aval.to_tangent_aval()
    if t is None or _is_symbolic(t) or (is_float0(t) and not is_float0(declared)):
      if t is not None and _is_symbolic(t) and not _checks.matches(
          declared, t.aval, "tangent"):
        raise owner.error(
            rule, f"returned a symbolic zero of type {t.aval.str_short()} as "
            f"the tangent of {where}, whose tangent type is "
            f"{declared.str_short()}: return None for a zero tangent",
            _checks.RuleTypeError)
      out.append(None)
      continue
    if not _checks.matches(declared, _checks.type_of(t), "tangent"):
      got, advice = _type_message(declared, t, "tangent")
      raise owner.error(
          rule, f"returned {got} as the tangent of {where}, but that output is "
          f"{aval.str_short()}, so its tangent is {declared.str_short()}. "
          f"{advice}".rstrip(), _checks.RuleTypeError)
    out.append(t)
  return out


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
        f"{describe_value(cts)}")
  arg_trees = owner.in_tree.children()
  flat: list[Any] = []
  avals = iter(owner.in_avals_flat)
  for name, ct, tree in zip(owner.arg_names, cts, arg_trees):
    leaves = _broadcast_none(owner, rule, name, ct, tree)
    for path, c in leaves:
      aval = next(avals)
      flat.append(_cotangent(owner, rule, f"argument {name}{path}", aval, c))
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
    jax.tree.map(lambda c, d: parts.extend([c] * len(jax.tree.leaves(d))),  # pyright: ignore[reportOptionalMemberAccess]
                 ct, dummy, is_leaf=lambda x: x is None)
  except (ValueError, TypeError):
    parts = None
  if parts is None or len(parts) != len(paths):
    is_leaf = lambda x: x is None or _is_symbolic(x)  # noqa: E731
    raise owner.error(
        rule, f"returned a cotangent with structure "
        f"{jax.tree.structure(ct, is_leaf=is_leaf)} for argument {name}, "
        f"whose structure is {tree}: return a cotangent of the argument's "
        "structure (None for zeros)")
  return list(zip(paths, parts))


def _cotangent(owner, rule, where, aval, ct):
  declared = aval.to_ct_aval()
  if ct is None:
    return None
  if _is_symbolic(ct):
    if not _checks.matches(declared, ct.aval, "cotangent"):
      raise owner.error(
          rule, f"returned a symbolic zero of type {ct.aval.str_short()} as "
          f"the cotangent of {where}, but that argument has type "
          f"{aval.str_short()}, so its cotangent is {declared.str_short()}: "
          "return None for a zero cotangent", CotangentTypeError)
    return None
  actual = _checks.type_of(ct)
  if is_float0(declared):
    if getattr(actual, "shape", None) == declared.shape:
      return None  # an integer input's cotangent is dropped, as JAX does
  if not _checks.matches(declared, actual, "cotangent"):
    got, advice = _type_message(declared, ct, "cotangent")
    raise owner.error(
        rule, f"returned {got} as the cotangent of {where}, but that argument "
        f"has type {aval.str_short()}, so its cotangent is "
        f"{declared.str_short()}. {advice}".rstrip(), CotangentTypeError)
  return ct

