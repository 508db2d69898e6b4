"""Closure conversion: function-valued params that close over traced arrays.

A `HiPrim` param must be static and hashable, and its rules see only the
primitive's inputs, so a function param must not capture a value being
differentiated or batched: its derivative would be invisible (JAX then
reports an escaped tracer, or the derivative is silently missing).
`closure_convert` traces such a function once and splits it into

* a function of the original arguments *plus* the captured traced arrays,
  which closes over nothing traced and so can be a param, and
* the list of those traced arrays, to be passed as ordinary inputs, through
  which the primitive's rules differentiate and batch.

Unlike ``jax.closure_convert``, which hoists only values that may carry a
derivative, every tracer is hoisted (one captured under ``vmap`` too, so that
the batching rule sees its batch axis); concrete arrays stay inside.

Imports: jax and `hijax._internals` only.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.extend  # noqa: F401  (jax.extend.core)

from hijax._internals import core

__all__ = ["closure_convert", "closure_convert_params", "ClosureConverted"]


class ClosureConverted:
  """``fn`` with the traced arrays it captured turned into a last argument.

  ``converted(*args, consts)`` computes ``fn(*args)`` with ``consts`` (a list,
  as returned by `closure_convert`) in place of the captured values. It is
  hashable by identity, like any function, so it can be a `HiPrim` param.
  """

  __name__: str
  __qualname__: str

  def __init__(self, fn: Any, jaxpr: Any, consts: Any, hoisted: Any,
               in_tree: Any, out_tree: Any) -> None:
    self.fn = fn
    self._jaxpr, self._consts, self._hoisted = jaxpr, consts, hoisted
    self._in_tree, self._out_tree = in_tree, out_tree
    self.__name__ = getattr(fn, "__name__", type(fn).__name__)
    self.__qualname__ = getattr(fn, "__qualname__", self.__name__)

  def __call__(self, *args_and_consts: Any) -> Any:
    *args, hoisted = args_and_consts
    flat, tree = jax.tree.flatten(tuple(args))
    if tree != self._in_tree:
      raise TypeError(
          f"the closure-converted {self.__qualname__} was traced for "
          f"arguments with structure {self._in_tree}, but got {tree}")
    it_hoisted, it_kept = iter(hoisted), iter(self._consts)
    consts = [next(it_hoisted) if h else next(it_kept) for h in self._hoisted]
    out = _eval_jaxpr(self._jaxpr, consts, flat)
    return jax.tree.unflatten(self._out_tree, out)

  def __repr__(self) -> str:
    return f"closure_converted({self.__qualname__})"


def _eval_jaxpr(jaxpr, consts, args):
  return jax.extend.core.jaxpr_as_fun(
      jax.extend.core.ClosedJaxpr(jaxpr, consts))(*args)  # pyright: ignore[reportPrivateImportUsage]


def closure_convert(fn: Callable[..., Any], *example_args: Any
                    ) -> tuple[Callable[..., Any], list[Any]]:
  """Splits ``fn`` into a function that captures no tracer, and those tracers.

  Returns ``(converted, consts)``. If ``fn``, traced on arguments like
  ``example_args``, reads no traced value from its closure, ``converted`` is
  ``fn`` itself and ``consts`` is ``[]``. Otherwise ``converted`` is a
  `ClosureConverted` with ``converted(*args, consts) == fn(*args)``, and
  ``consts`` lists the captured traced arrays: pass them to a primitive as
  inputs (so its rules see their tangents and batch axes) and ``converted``
  as the param.

  Raises TypeError when the conversion is impossible: ``fn`` captures a
  traced value that is not an array (a mutable ref, a hi type), or has side
  effects, which an explicit input cannot carry.
  """
  closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*example_args)
  jaxpr, consts = closed.jaxpr, list(closed.consts)
  hoisted = [isinstance(c, core.Tracer) for c in consts]
  if not any(hoisted):
    return fn, []
  name = getattr(fn, "__qualname__", repr(fn))
  for c, h in zip(consts, hoisted):
    if h and not isinstance(core.typeof(c), core.ShapedArray):
      raise TypeError(
          f"closure_convert: {name} captures a traced value of type "
          f"{core.typeof(c).str_short()}, which is not an array and cannot "
          "be passed as an explicit input; pass it as an argument instead")
  if jaxpr.effects:
    raise TypeError(
        f"closure_convert: {name} has side effects "
        f"({', '.join(sorted({type(e).__name__ for e in jaxpr.effects}))}) "
        "and captures traced values; only a pure function can be closure-"
        "converted")
  in_tree = jax.tree.structure(tuple(example_args))
  out_tree = jax.tree.structure(out_shape)
  kept = [c for c, h in zip(consts, hoisted) if not h]
  converted = ClosureConverted(fn, jaxpr, kept, hoisted, in_tree, out_tree)
  return converted, [c for c, h in zip(consts, hoisted) if h]


class _ParamsWithConsts:
  """``fn(x, params)`` as a function of ``(x, (params, consts))``."""

  def __init__(self, converted: ClosureConverted):
    self.converted = converted
    self.__name__ = converted.__name__
    self.__qualname__ = converted.__qualname__

  def __call__(self, *args):
    *lead, (params, consts) = args
    return self.converted(*lead, params, consts)

  def __repr__(self):
    return repr(self.converted)


def closure_convert_params(fn: Callable, *example_args: Any) -> Any:
  """``(fn2, params2)`` with the traced arrays ``fn`` captures moved into its
  last argument.

  For a function ``fn(*args, params)`` whose last argument carries the
  parameters a primitive differentiates (``hijax.implicit``'s ``f(x,
  params)``): if ``fn`` captures no tracer, returns ``(fn, params)``
  unchanged; otherwise ``fn2(*args, (params, consts)) == fn(*args, params)``
  and ``params2 == (params, consts)``, so passing ``fn2`` as the static
  function and ``params2`` as the input differentiates with respect to the
  captured values too. Raises like `closure_convert`.
  """
  converted, consts = closure_convert(fn, *example_args)
  params = example_args[-1]
  if not consts:
    return fn, params
  return _ParamsWithConsts(converted), (params, consts)  # pyright: ignore[reportArgumentType]
