"""The static arguments of a `hijax.custom_remat` call, as ``jax.jit`` reads
``static_argnums`` and ``static_argnames``.

`StaticSpec` holds what ``custom_remat`` was given; `StaticSpec.split` takes
a call apart into the traced arguments and the `Statics`, hashable values
that the primitive keeps in its params and puts back for each rule.

Imports: the standard library only.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any

__all__ = ["StaticSpec", "Statics", "fn_name"]


def fn_name(fn: Any) -> str:
  """How an error message names a user function."""
  return getattr(fn, "__name__", repr(fn))


class StaticSpec:
  """``static_argnums`` and ``static_argnames`` of a function ``f``."""

  def __init__(self, f: Any, static_argnums: Any, static_argnames: Any) -> None:
    nums = ((static_argnums,) if isinstance(static_argnums, int)
            else tuple(static_argnums))
    if not all(isinstance(i, int) for i in nums):
      raise TypeError(f"custom_remat: static_argnums must be ints, got {nums!r}")
    names = ((static_argnames,) if isinstance(static_argnames, str)
             else tuple(static_argnames))
    if not all(isinstance(n, str) for n in names):
      raise TypeError(f"custom_remat: static_argnames must be strings, got "
                      f"{names!r}")
    self.f, self.nums, self.names = f, frozenset(nums), frozenset(names)
    try:
      self.signature: inspect.Signature | None = inspect.signature(f)
    except (TypeError, ValueError):
      self.signature = None
    # The positions of the parameters static_argnames names (as jit reads them).
    params = [] if self.signature is None else list(
        self.signature.parameters.values())
    self.named_positions = frozenset(
        i for i, p in enumerate(params) if p.name in self.names
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))

  def split(self, args: tuple, kwargs: dict) -> tuple[tuple, Statics]:
    """``(args, statics)`` of the call ``f(*args, **kwargs)``, an argument
    passed by keyword to a positional parameter moved to ``args``."""
    name = fn_name(self.f)
    if kwargs and self.signature is not None:
      try:  # keywords of positional parameters become positional
        bound = self.signature.bind(*args, **kwargs)
      except TypeError as e:
        raise TypeError(f"custom_remat function {name}: {e}") from None
      args, kwargs = bound.args, bound.kwargs
    dynamic_kwargs = sorted(set(kwargs) - self.names)
    if dynamic_kwargs:
      raise TypeError(
          f"custom_remat function {name} takes its traced arguments as "
          f"positional arguments; {', '.join(dynamic_kwargs)} is a keyword "
          "argument: name it in static_argnames if it is static")
    n = len(args)
    for i in self.nums:
      if not -n <= i < n:
        raise TypeError(
            f"custom_remat function {name} has static_argnums {i}, but "
            f"was called with {n} positional argument(s)")
    positions = sorted({i % n for i in self.nums}
                       | {i for i in self.named_positions if i < n})
    statics = Statics(n, tuple((i, args[i]) for i in positions),
                      tuple(sorted(kwargs.items())))
    try:
      hash(statics)
    except TypeError:
      kinds = [type(v).__name__ for _, v in statics.positional + statics.keywords]
      raise TypeError(
          f"custom_remat function {name}: static arguments must be hashable "
          f"(as for jax.jit's static_argnums), got {kinds}") from None
    return tuple(args), statics


@dataclasses.dataclass(frozen=True)
class Statics:
  """The static arguments of one call: positions and values, and keywords."""

  n_args: int
  """How many positional arguments the call had, static ones included."""
  positional: tuple[tuple[int, Any], ...]
  """``(position, value)`` of each static positional argument."""
  keywords: tuple[tuple[str, Any], ...]
  """``(name, value)`` of each static keyword argument."""

  def dynamic(self, args: tuple) -> tuple:
    """The traced arguments: ``args`` less the static ones."""
    static = {i for i, _ in self.positional}
    return tuple(a for i, a in enumerate(args) if i not in static)

  def call(self, fn: Any, dynamic: Any, *leading: Any) -> Any:
    """``fn(*leading, *args, **static keywords)`` with the statics put back."""
    dyn, static = iter(dynamic), dict(self.positional)
    args = [static[i] if i in static else next(dyn) for i in range(self.n_args)]
    return fn(*leading, *args, **dict(self.keywords))

  def traced_cotangents(self, f: Any, f_bwd: Any, cts: Any) -> tuple:
    """The cotangents of the traced arguments, from what ``f_bwd`` returned
    (one per argument of ``f``); a static one must be None."""
    n = self.n_args
    if not isinstance(cts, (tuple, list)) or len(cts) != n:
      raise TypeError(
          f"custom_remat: {fn_name(f_bwd)} must return a tuple with one "
          f"cotangent per argument of {fn_name(f)} ({n}), got "
          f"{type(cts).__name__}"
          + (f" of length {len(cts)}" if isinstance(cts, (tuple, list)) else ""))
    static = {i for i, _ in self.positional}
    for i in sorted(static):
      if cts[i] is not None:
        raise TypeError(
            f"custom_remat: {fn_name(f_bwd)} returned a cotangent for "
            f"argument {i} of {fn_name(f)}, which is static: return None "
            "for it")
    return tuple(ct for i, ct in enumerate(cts) if i not in static)
