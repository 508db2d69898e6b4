"""Type arithmetic for writing hi types, and a look at what autodiff saves.

A hi type usually keeps the types of its arrays (``ShapedArray`` values) as fields,
and answers JAX's questions about batching and sharding by asking the same
questions of those fields. These functions ask them, for any type: an array
type gets JAX's own answer, a hi type (or a hi component of a nested type) is
asked through its own method (`HiType.dec_rank`, `HiType.inc_rank`,
`HiType.shard`, `HiType.unshard`).

* `mapped_aval`, `unmapped_aval`: one slice of a batch, and a whole batch
  (for ``dec_rank``/``inc_rank``);
* `shard_aval`, `unshard_aval`: one device's piece inside ``jax.shard_map``,
  and the global type the pieces assemble into (for ``shard``/``unshard``);
* `saved_residuals`: the residuals reverse mode keeps, as data rather than
  the printout of ``jax.ad_checkpoint.print_saved_residuals``.
"""
# Imports: jax only.
from __future__ import annotations

from typing import Any, Callable

import jax.extend.core as _jex_core
from hijax._internals import ad_checkpoint as _ad_checkpoint
from hijax._internals import core as _core

__all__ = ["mapped_aval", "unmapped_aval", "shard_aval", "unshard_aval",
           "saved_residuals"]


def mapped_aval(size: int, axis: int | None, aval: Any) -> Any:
  """The type of one slice of ``size`` values of type ``aval`` stacked along ``axis``.

  ``axis`` is an integer for an array type (the axis is removed), a
  `MappingSpec` for a hi type (``aval.dec_rank(size, axis)`` is asked), or
  ``None`` for an unbatched value (``aval`` is returned unchanged). For
  example ``mapped_aval(4, 0, ShapedArray((4, 3), f32))`` is ``f32[3]``.
  """
  if axis is None:  # JAX would ask a hi type's dec_rank with None
    return aval
  return _jex_core.mapped_aval(size, axis, aval)


def unmapped_aval(size: int, axis: int | None, aval: Any) -> Any:
  """The type of ``size`` values of type ``aval`` stacked along ``axis``.

  The inverse of `mapped_aval`: an integer ``axis`` inserts an axis of length
  ``size`` into an array type, a `MappingSpec` asks a hi type's ``inc_rank``,
  and ``None`` returns ``aval`` unchanged.
  """
  if axis is None:
    return aval
  return _jex_core.unmapped_aval(size, axis, aval)


def shard_aval(mesh: Any, manual_axes: frozenset[Any], check_vma: bool,
               spec: Any, aval: Any) -> Any:
  """The per-device type, inside ``jax.shard_map``, of a value of type ``aval``.

  ``spec`` is the value's entry of ``in_specs``: a ``jax.P`` for an array type
  (each axis split by the mesh axes named for it, and the type marked as
  varying over the manual axes when ``check_vma``), or a `HiPspec` for a hi
  type, whose ``aval.shard(...)`` is asked. The arguments are those that
  `HiType.shard` receives, so a hi type holding array types forwards them.
  """
  return _core.shard_aval(mesh, manual_axes, check_vma, spec, aval)


def unshard_aval(mesh: Any, check_vma: bool, spec: Any, aval: Any) -> Any:
  """The global type that per-device values of type ``aval`` assemble into.

  The inverse of `shard_aval`, used for ``out_specs``: a ``jax.P`` multiplies
  an array type's axes by the sizes of the mesh axes named for them; a
  `HiPspec` asks a hi type's ``aval.unshard(...)``.
  """
  return _core.unshard_aval(mesh, check_vma, spec, aval)


def saved_residuals(f: Callable[..., Any], *args: Any, **kwargs: Any
                    ) -> list[tuple[Any, str]]:
  """The residuals that ``jax.vjp(f, *args, **kwargs)`` saves, as a list.

  One ``(aval, description)`` pair per residual, in the order that
  ``jax.ad_checkpoint.print_saved_residuals`` prints them: ``aval`` is the
  residual's type and ``description`` says where it comes from, e.g.
  ``"from the argument x"``, ``"output of cos from <file>:<line> (f)"`` or
  ``"named 'a' from ..."``. Only ``f`` is traced; nothing is computed.
  """
  return list(_ad_checkpoint.saved_residuals(f, *args, **kwargs))
