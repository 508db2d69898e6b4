"""JAX's own wording of the errors its decorators raise, which hijax's
messages begin with.

Code written against ``jax.custom_vjp`` and ``jax.custom_jvp`` (JAX's own
tests among it) matches errors by their text; each function here gives the
sentence JAX's decorator raises for one mistake, and the decorators append
hijax's detail (the rule, the argument, the fix) after it. The wording
follows JAX 0.12 (and 0.11.2, where it is the same); where JAX's newer
``custom_vjp`` words an error differently (a cotangent of the wrong type),
the newer wording is used.

Imports: the standard library and jax only.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = ["source_info", "types_tree", "jvp_not_pair", "jvp_structures",
           "jvp_primal", "jvp_tangent_types", "fwd_not_pair", "fwd_primal", "fwd_output_type",
           "bwd_structure", "bwd_type", "logs_not_pair", "logs_not_dict", "accums_logs_not_dict", "overbatched",
           "not_resolved", "FORWARD_MODE"]

FORWARD_MODE = ("can't apply forward-mode autodiff (jvp) to a custom_vjp "
                "function.")
"""JAX's error for forward mode of a ``custom_vjp`` function (hijax raises it
only where it cannot derive forward mode)."""


def source_info(fun: Callable[..., Any]) -> str:
  """``name at file:line`` of a function, as JAX's messages name it."""
  fun = inspect.unwrap(fun)
  while isinstance(fun, functools.partial):
    fun = inspect.unwrap(fun.func)
  code = getattr(fun, "__code__", None)
  name = getattr(fun, "__name__", None) or type(fun).__name__
  if code is None:
    return name
  return f"{name} at {code.co_filename}:{code.co_firstlineno}"


def types_tree(tree: Any, avals: Sequence[Any]) -> str:
  """The structure ``tree`` with each leaf's type, unquoted
  (``(float32[], float32[])``)."""
  shown = jax.tree.unflatten(tree, [a.str_short() for a in avals])
  return str(shown).replace("'", "")


def jvp_not_pair(jvp: str, fun: str, got: Any) -> str:
  return (f"Custom JVP rule {jvp} for function {fun} must produce a pair "
          "(list or tuple of length two) representing primal and tangent "
          f"outputs, but got {got}.")


def jvp_structures(jvp: str, fun: str, primal_tree: Any,
                   tangent_tree: Any) -> str:
  return (f"Custom JVP rule {jvp} for function {fun} must produce primal and "
          "tangent outputs with equal container (pytree) structures, but got "
          f"{primal_tree} and {tangent_tree} respectively.")


def _first_element(decorator: str, fun: str, shapes: bool, head: str,
                   rule_output: str, got: str, expected: str) -> str:
  what = ("shapes/dtypes of" if shapes else "container/pytree structure")
  end = "" if shapes else "."
  return (f"{head}, but instead the {rule_output}'s first element had "
          f"{what}:\n    {got}\nwhile the {decorator}-decorated function "
          f"{fun} had output {what}:\n    {expected}{end}")


def jvp_primal(jvp: str, fun: str, shapes: bool, got: str, expected: str
               ) -> str:
  """The jvp rule's primal output has another structure (``shapes`` False)
  or other leaf types than the function's."""
  particular = ("with leaves of the same shape/dtype" if shapes
                else "of the same container/pytree structure")
  return _first_element(
      "custom_jvp", fun, shapes,
      f"Custom JVP rule {jvp} for function {fun} must produce a pair (list or "
      "tuple of length two) where the first element represents the primal "
      "output (equal in value to the output of the custom_jvp-decorated "
      f"function {fun}, and in particular {particular})", "JVP rule output",
      got, expected)


def jvp_tangent_types(primal_avals: Sequence[Any], expected: Sequence[Any],
                      got: Sequence[Any]) -> str:
  """Output tangents whose types are not the outputs' tangent types."""
  if len(expected) == 1:
    return ("Custom JVP rule must produce primal and tangent outputs with "
            "corresponding shapes and dtypes. Expected "
            f"{expected[0].str_short()} (tangent type of "
            f"{primal_avals[0].str_short()}) but got {got[0].str_short()}.")
  lines = [f"  primal {p.str_short()} with tangent {t.str_short()}, expecting "
           f"tangent {e}" for p, e, t in zip(primal_avals, expected, got)
           if e != t]
  return ("Custom JVP rule must produce primal and tangent outputs with "
          "corresponding shapes and dtypes, but got:\n" + "\n".join(lines))


_RESIDUALS = ("and the second element represents residuals (i.e. values "
              "stored from the forward pass for use on the backward pass)")


def fwd_not_pair(fwd: str, fun: str, got: Any) -> str:
  return (f"Custom VJP fwd rule {fwd} for function {fun} must produce a pair "
          "(list or tuple of length two) where the first element represents "
          "the primal output (equal to those of the custom_vjp-decorated "
          f"function {fun}) {_RESIDUALS}, but instead of a pair the fwd rule "
          f"{fwd} produced {got}.")


def fwd_primal(fwd: str, fun: str, shapes: bool, got: str, expected: str
               ) -> str:
  """The fwd rule's primal output has another structure (``shapes`` False)
  or other leaf types than the function's."""
  return _first_element(
      "custom_vjp", fun, shapes,
      f"Custom VJP fwd rule {fwd} for function {fun} must produce a pair (list "
      "or tuple of length two) where the first element represents the primal "
      f"output (equal to the output of the custom_vjp-decorated function {fun}) "
      f"{_RESIDUALS}", "fwd rule output", got, expected)


def fwd_output_type(where: str, got: str, expected: Any) -> str:
  """JAX's newer wording for a leaf of fwd's primal output of another type."""
  return (f"at {where}, got fwd output type {got} which doesn't match primal "
          f"output type {expected.str_short()}")


def bwd_structure(got_tree: Any, in_tree: Any) -> str:
  return ("Custom VJP bwd rule must produce an output with the same container "
          "(pytree) structure as the args tuple of the primal function, and in "
          "particular must produce a tuple of length equal to the number of "
          "arguments to the primal function, but got bwd output structure "
          f"{got_tree} for primal input structure {in_tree}.")


def bwd_type(fun: Callable[..., Any], path: str, got: Any, expected: Any,
             symbolic: bool) -> str:
  """A cotangent (at ``output{path}``) whose type is not its input's."""
  where = f"at output{path} " if path else ""
  message = (f"{where}the bwd rule attached to {source_info(fun)} produced an "
             f"output of type {got.str_short()} which doesn't match expected "
             f"type {expected.str_short()}")
  if symbolic:
    message += (". Consider just returning a None here instead of a "
                "SymbolicZero object.")
  return message


def logs_not_pair(got: Any) -> str:
  return ("Custom VJP bwd rule was registered with defvjp_with_logs and so "
          f"must produce a pair (in_cts, logs), but got {got}.")


def logs_not_dict(got: Any) -> str:
  return ("Custom VJP bwd rule was registered with defvjp_with_logs, and so "
          "the second element of the pair it returns must be None or a dict "
          f"of backward-pass log entries, but got {type(got).__name__}.")


def accums_logs_not_dict(got: Any) -> str:
  return ("Custom VJP bwd rule was registered with defvjp_with_accums, and so "
          "must return None or a dict of backward-pass log entries, but got "
          f"{type(got).__name__}.")


def overbatched(member: str, fun: str) -> str:
  """A rule's output batched under ``vmap`` where the call is not."""
  return (f"under vmap, the {member} of {fun} produced an output batched "
          "along the mapped axis where the application itself was inferred "
          "to be unbatched.")


def not_resolved(decorator: str, fun: str, error: str) -> str:
  """Arguments that do not bind to the function's positional parameters."""
  return (f"The input arguments to the {decorator}-decorated function {fun} "
          "could not be resolved to positional-only arguments. Binding failed "
          f"with the error:\n{error}")
