"""The arguments of a decorated function: keywords bound to positions, as
JAX's decorators bind them; the non-differentiable ones set apart; the names
messages use. Imports: the standard library only.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["nondiff_positions", "resolve", "plain_arity", "Signature",
           "function_name"]


def function_name(fn: Any) -> str:
  while isinstance(fn, functools.partial):
    fn = fn.func
  return getattr(fn, "__name__", None) or type(fn).__name__


def _parameters(fun) -> list[inspect.Parameter] | None:
  if isinstance(fun, functools.partial):
    return None  # JAX treats a partial's signature as opaque
  try:
    return list(inspect.signature(fun).parameters.values())
  except (TypeError, ValueError):
    return None


def nondiff_positions(fun: Callable, nondiff_argnums: Sequence[int],
                      nondiff_argnames: Sequence[str], decorator: str
                      ) -> tuple[int, ...]:
  if isinstance(nondiff_argnums, int):
    nondiff_argnums = (nondiff_argnums,)
  if isinstance(nondiff_argnames, str):
    nondiff_argnames = (nondiff_argnames,)
  positions = {int(i) for i in nondiff_argnums}
  if nondiff_argnames:
    params = _parameters(fun)
    if params is None:
      raise TypeError(
          f"{decorator}: nondiff_argnames needs the signature of "
          f"{function_name(fun)}, which has none that Python can read; use "
          "nondiff_argnums")
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for name in nondiff_argnames:
      if name not in names:
        raise ValueError(
            f"{decorator}: nondiff_argnames names {name!r}, which is not a "
            f"positional parameter of {function_name(fun)} {tuple(names)}")
      positions.add(names.index(name))
  if any(i < 0 for i in positions):
    raise ValueError(f"{decorator}: nondiff_argnums must be non-negative, got "
                     f"{sorted(positions)}")
  return tuple(sorted(positions))


def plain_arity(fun: Callable) -> int | None:
  params = _parameters(fun)
  if params is None or any(
      p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
      or p.default is not p.empty for p in params):
    return None
  return len(params)


def resolve(fun: Callable, args: tuple, kwargs: dict, decorator: str
            ) -> tuple[Any, ...]:
  """``args`` and ``kwargs`` as positional arguments of ``fun``, defaults
  filled in; a TypeError in JAX's words where they do not bind, or bind to
  a keyword-only parameter."""
  target = fun
  if isinstance(fun, functools.partial):
    target = lambda *args, **kwargs: None  # noqa: E731 (opaque, as in JAX)
  try:
    signature = inspect.signature(target)
  except (TypeError, ValueError):
    signature = None  # no signature to read (a builtin)
  if signature is None and not kwargs:
    return args
  name = function_name(fun)

  def not_resolved(error: str) -> str:  # JAX's words
    return (f"The input arguments to the {decorator.removeprefix('hijax.')}"
            f"-decorated function {name} could not be resolved to "
            f"positional-only arguments. Binding failed with the error:\n"
            f"{error}\n{decorator} function {name}: ")
  if signature is None:
    raise TypeError(not_resolved("no signature to bind keyword arguments with")
                    + "pass its arguments by position")
  try:
    bound = signature.bind(*args, **kwargs)
  except TypeError as e:
    raise TypeError(not_resolved(str(e)) + (
        "it was called with "
        f"{len(args)} positional argument(s) and the keyword(s) "
        f"{sorted(kwargs)}, which do not fit its signature "
        f"{signature}")) from e
  bound.apply_defaults()
  passed = [k for k in bound.kwargs if k in kwargs]
  if passed:
    raise TypeError(not_resolved(
        "The following keyword arguments could not be resolved to positions: "
        f"{', '.join(passed)}") + (
        "its rules receive its arguments by "
        f"position, and {', '.join(passed)} is keyword-only; make it "
        "positional, or bind it with functools.partial before decorating"))
  return tuple(bound.args)


class Signature:
  """How a call's arguments split into differentiable and static ones;
  ``names[i]`` names the i-th differentiable argument for messages."""

  def __init__(self, fun: Callable, nondiff: tuple[int, ...], n_args: int):
    self.nondiff = tuple(i for i in nondiff if i < n_args)
    if len(self.nondiff) != len(nondiff):
      raise TypeError(
          f"{function_name(fun)} was called with {n_args} argument(s), but "
          f"nondiff_argnums names position(s) {list(nondiff)}")
    self.diff = tuple(i for i in range(n_args) if i not in nondiff)
    params = _parameters(fun) or []
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    self.names = [f"{positional[i]} (position {i})" if i < len(positional)
                  else f"at position {i}" for i in self.diff]

  def split(self, args: tuple) -> tuple[list[Any], tuple[Any, ...]]:
    statics = [args[i] for i in self.nondiff]
    return statics, tuple(args[i] for i in self.diff)

  def merge(self, statics: Sequence[Any], diff_args: Sequence[Any]) -> tuple:
    s, d = iter(statics), iter(diff_args)
    return tuple(next(s) if i in self.nondiff else next(d)
                 for i in range(len(statics) + len(diff_args)))
