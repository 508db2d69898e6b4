"""Hi types: new JAX types, with their own lowering, derivatives, batching and sharding.

A *hi type* describes values that are not arrays: a quantized matrix (int8
values plus scales), a low-rank matrix kept as factors, a record of arrays. You
write two classes:

* the **value class**, e.g. ``QArray``, whose instances hold concrete arrays;
* the **type class**, a `HiType` subclass (usually a frozen dataclass), whose
  instances are what ``jax.typeof`` returns for a value, and what a jaxpr
  variable of that type carries.

`register_hitype` connects the two. From then on a value is one argument of
``jit``, one jaxpr variable (printed with `HiType.str_short`), and one input or
output of a `HiPrim`. JAX asks the type for everything else through the methods
below, each needed only once the corresponding transformation is used:

============================  =============================================
method                        needed for
============================  =============================================
``lo_ty``, ``lower_val``,     lowering (``jit``, ``scan``, ``shard_map``):
``raise_val``                 the arrays a value is made of, and back
``to_tangent_aval``           autodiff (the type of tangents/cotangents)
``dec_rank``, ``inc_rank``    ``vmap`` with a `MappingSpec`
``leading_axis_spec``         ``lax.scan`` over, or stacking, hi values
``shard``, ``unshard``        ``jax.shard_map`` with a `HiPspec`
============================  =============================================

JAX looks each method up on the type when it needs it, so a method attached
to the class after it was created (``QArrayTy.dec_rank = ...``) is used as if
it had been written in the class body.

JAX core recognises hi types, mapping specs and hi partition specs with
``isinstance`` checks against its own base classes in ``jax._src.hijax``.
That is why `HiType`, `MappingSpec` and `HiPspec` here subclass those bases:
it is the only way for ``vmap``, ``scan`` and ``shard_map`` to accept them.
Every method defined here, and every check, is this package's own.
"""
# Imports: jax only. It is independent of `HiPrim`; the check of what
# `HiType.lower_val` returns lives here, next to the class it checks.
from __future__ import annotations

import functools
from typing import Any, Callable, NoReturn

import jax
import numpy as np

import jax.experimental.hijax as _jax_hijax

from hijax._internals import core
from hijax._internals import dtypes

__all__ = ["HiType", "MappingSpec", "HiPspec", "register_hitype",
           "aval_method", "aval_property"]

aval_method: type[Any] = core.aval_method
"""Marks a function on a `HiType` as a method of the *traced values* of that type.

``QArrayTy.dequantize = aval_method(f)`` makes ``x.dequantize()`` call
``f(x)`` for a tracer ``x`` of type ``QArrayTy``. (JAX's tracers forward
attribute lookups to their type and recognise this marker by its class, so it
is JAX's own ``core.aval_method``, re-exported.)
"""

aval_property: type[Any] = core.aval_property
"""Like `aval_method`, for a property: ``x.attr`` calls ``fget(x)`` on a tracer.

JAX's own ``core.aval_property``, re-exported for the same reason.
"""


def _missing(ty, method: str, needed_for: str, hint: str = "") -> NoReturn:
  raise NotImplementedError(
      f"{needed_for} needs the hi type {type(ty).__name__} to implement "
      f"`{method}`{hint}")


class HiType(_jax_hijax.HiType):
  """Base class of hi types: the type of a JAX value that is not an array.

  Write a subclass as a frozen dataclass (types are compared and hashed, and
  JAX caches on them) whose fields are the static description of a value, e.g.
  its shape. Implement the methods that the transformations you use need:

  * lowering: `lo_ty`, `lower_val`, `raise_val` (required by ``jit``);
  * autodiff: `to_tangent_aval` (and `vspace_zero`/`vspace_add` if this type
    is itself a tangent type);
  * ``vmap``: `dec_rank`, `inc_rank`; ``scan``: `leading_axis_spec`;
  * ``shard_map``: `shard`, `unshard` (and `nospec` to differentiate it).

  A traced value of a hi type is opaque: reading one of the value class's
  fields from it raises ``AttributeError``. Compute with hi values through
  `HiPrim` primitives, whose ``expand`` sees the concrete fields.
  """

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    # What lower_val returns is checked against lo_ty where JAX calls it.
    if "lower_val" in cls.__dict__:
      cls.lower_val = _checked_lower_val(cls.__dict__["lower_val"])

  # --- lowering -------------------------------------------------------------

  def lo_ty(self) -> list[Any]:
    """The types of the arrays that a value of this type lowers to, in order.

    Every entry must be an array type: a type with hi components flattens
    them into their own ``lo_ty()`` (and `lower_val`/`raise_val` likewise).
    """
    _missing(self, "lo_ty", "Lowering (jit, scan, shard_map)",
             ": the list of array types a value is made of")

  def lower_val(self, hi_val: Any, /) -> list[Any]:
    """Splits a value into its arrays, one per entry of `lo_ty`."""
    _missing(self, "lower_val", "Lowering (jit, scan, shard_map)",
             ": split a value into the arrays listed by lo_ty")

  def raise_val(self, *lo_vals: Any, **kwargs: Any) -> Any:
    """Rebuilds a value from its arrays (the inverse of `lower_val`)."""
    _missing(self, "raise_val", "Lowering (jit, scan, shard_map)",
             ": rebuild a value from the arrays listed by lo_ty")

  def str_short(self, short_dtypes: Any=False,
                mesh_axis_types: Any=False) -> str:
    """The short name of the type used in jaxprs and error messages.

    The default is the class name; override it to show the type's fields,
    e.g. ``q8[2,3]``.
    """
    del short_dtypes, mesh_axis_types
    return type(self).__name__

  # --- autodiff -------------------------------------------------------------

  def to_tangent_aval(self) -> Any:
    """The type of tangents (and, by default, cotangents) of this type.

    Often an ordinary array type: the tangent of a quantized matrix is a float
    matrix of the same shape.
    """
    _missing(self, "to_tangent_aval", "Autodiff",
             ": the type of this type's tangents, e.g. a float ShapedArray")

  def to_ct_aval(self) -> Any:
    """The type of cotangents; the default is `to_tangent_aval`."""
    return self.to_tangent_aval()

  def vspace_zero(self) -> Any:
    """A zero value of this type; needed only if this type is a tangent type."""
    _missing(self, "vspace_zero", "Using it as a tangent or cotangent type")

  def vspace_add(self, x: Any, y: Any) -> Any:
    """Sum of two values; needed only if this type is a tangent type."""
    _missing(self, "vspace_add", "Using it as a tangent or cotangent type")

  # --- batching (vmap, scan) ------------------------------------------------

  def dec_rank(self, size: int | None, spec: Any) -> HiType:
    """The type of one slice of a batch of ``size`` values mapped along ``spec``.

    ``spec`` is the `MappingSpec` given to ``vmap`` (``in_axes``) or returned
    by a batching rule.
    """
    _missing(self, "dec_rank", "vmap",
             ": the per-example type of a batched value, given a MappingSpec")

  def inc_rank(self, size: int | None, spec: Any) -> HiType:
    """The type of ``size`` values of this type stacked along ``spec``."""
    _missing(self, "inc_rank", "vmap",
             ": the type of a batch of values stacked along a MappingSpec")

  def leading_axis_spec(self) -> Any:
    """The `MappingSpec` meaning "along the leading axis of every array".

    ``lax.scan`` uses it to slice a scanned-over hi value and to stack hi
    outputs; for it to agree with the lowering, every array in `lo_ty` must be
    mapped along its axis 0 under this spec.
    """
    _missing(self, "leading_axis_spec", "lax.scan over (or stacking) hi values")

  # --- sharding -------------------------------------------------------------

  def shard(self, mesh: Any, manual_axes: frozenset[Any], check_vma: bool,
            spec: Any) -> HiType:
    """The per-device type inside ``shard_map`` of a value sharded by ``spec``."""
    _missing(self, "shard", "jax.shard_map",
             ": the per-device type of a value split according to a HiPspec")

  def unshard(self, mesh: Any, check_vma: bool, spec: Any) -> HiType:
    """The global type of per-device values of this type assembled by ``spec``."""
    _missing(self, "unshard", "jax.shard_map",
             ": the global type of per-device values joined by a HiPspec")

  def nospec(self, mesh: Any, check_vma: bool, all_names: Any) -> Any:
    """The `HiPspec` of a value replicated over ``all_names``."""
    _missing(self, "nospec", "Autodiff through jax.shard_map")

  def reshard(self, sharding: Any) -> HiType:
    """This type with its arrays resharded to ``sharding`` (``jax.reshard``)."""
    _missing(self, "reshard", "jax.reshard")

  # --- errors -----------------------------------------------------------------

  def __getattr__(self, name: Any) -> Any:
    # Only reached when ordinary lookup fails. JAX's tracers forward attribute
    # reads to their type, so this is where reading a field of a traced hi
    # value ends up; say why it cannot work. An operator on a tracer (x + 1)
    # reads the type's `_add`.
    if name.startswith("__"):
      raise AttributeError(name)
    cls = type(self).__name__
    if name.startswith("_"):
      raise AttributeError(
          f"the array operator `{name[1:]}` was applied to a traced value of "
          f"hi type {cls}, which is not an array (hi type {cls} has no "
          f"attribute {name!r}). {_compute_through_hiprim(cls, name)}")
    raise AttributeError(
        f"hi type {cls} has no attribute {name!r}. A traced "
        f"value of a hi type is opaque: the fields of its value class exist "
        f"only on concrete values. {_compute_through_hiprim(cls, name)}")

  # jax.numpy converts what it is given with `__jax_array__`, which a tracer
  # looks up on its type: a hi value reaching jnp (or an array operator with
  # an array on the left) fails here, with the class and the fix.
  __jax_array__: Any = aval_method(lambda x: _not_an_array(x.aval))


def _compute_through_hiprim(cls: str, name: str) -> str:
  return (f"Compute with it through a HiPrim (whose `expand` receives the "
          f"concrete value), or attach a method to the type with "
          f"`{cls}.{name} = aval_method(fn)`")


def _not_an_array(ty, what="a traced value") -> NoReturn:
  cls = type(ty).__name__
  raise TypeError(
      f"{what} of hi type {cls} ({ty.str_short()}) was passed to a "
      "jax.numpy function or array operator, which take arrays only (jnp "
      "asked for its `__jax_array__`). Compute with it through a HiPrim "
      "whose `expand` receives the concrete value (e.g. one that converts it "
      "to an array), or give the type an array conversion with "
      f"`{cls}.__jax_array__ = aval_method(fn)`, fn returning an array")


def _checked_lower_val(lower_val):
  """``HiType.lower_val`` wrapped with `_check_lowered` (once per lowering)."""
  if getattr(lower_val, "_hijax_checked", False):
    return lower_val

  @functools.wraps(lower_val)
  def checked(self, hi_val, /):
    lo_vals = lower_val(self, hi_val)
    _check_lowered(self, lo_vals)
    return lo_vals
  checked._hijax_checked = True  # pyright: ignore[reportFunctionMemberAccess, reportAttributeAccessIssue]
  return checked


def _check_lowered(ty, lo_vals) -> None:
  """Checks that ``ty.lower_val`` returned one array per entry of ``ty.lo_ty()``.

  Raises ``ValueError`` (a wrong number of values), which ``jit`` passes on as
  it is; it would replace a ``TypeError`` raised while it reads its arguments'
  types with a message about static arguments.
  """
  if type(ty).lo_ty is HiType.lo_ty:
    return  # no lowering declared: JAX says so when it needs one
  lo_tys = ty.lo_ty()
  if not isinstance(lo_vals, (list, tuple)) or len(lo_vals) != len(lo_tys):
    got = (f"{len(lo_vals)} array(s)" if isinstance(lo_vals, (list, tuple))
           else f"a {type(lo_vals).__name__}")
    raise ValueError(
        f"{type(ty).__name__}.lower_val returned {got}, but lo_ty lists "
        f"{len(lo_tys)} ({', '.join(t.str_short() for t in lo_tys)}): return "
        "a list with one array per entry of lo_ty, in the same order (and "
        "make raise_val take them back)")


class MappingSpec(_jax_hijax.MappingSpec):
  """Base class of mapping specs: how a batch of hi values is laid out.

  For arrays ``vmap`` describes batching with an integer axis; for a hi type
  you define what "batched" means with a subclass of this class (usually a
  frozen dataclass, since specs are compared for equality), e.g. "every
  array along axis 0". Instances are used

  * as ``in_axes``/``out_axes`` of ``jax.vmap`` for hi-typed arguments and
    results (``in_axes`` needs ``axis_size``: a hi value has no shape to infer
    it from);
  * as the ``dims`` that a `HiPrim` ``batch`` rule receives for hi-typed
    arguments, and the output dims it returns;
  * as the argument of `HiType.dec_rank`/`HiType.inc_rank`, and the result of
    `HiType.leading_axis_spec`.

  ``vmap`` never converts between two different specs: the spec a rule
  returns must equal the requested ``out_axes``.
  """


class HiPspec(_jax_hijax.HiPspec):
  """Base class of partition specs for hi values in ``jax.shard_map``.

  A subclass describes how each array of a hi value is split over a mesh.
  `to_lo` gives one ``PartitionSpec`` per array of the type's ``lo_ty``; the
  hi type's `HiType.shard`/`HiType.unshard` compute the per-device and global
  types. Pass instances in ``in_specs``/``out_specs`` where the values are hi.
  """

  def to_lo(self) -> tuple[Any, ...]:
    """One ``jax.P`` per lowered array, in the order of the type's ``lo_ty``."""
    raise NotImplementedError(
        f"jax.shard_map needs {type(self).__name__}.to_lo(): one PartitionSpec "
        "per array of the hi value, in lo_ty order")

  def to_tangent_spec(self) -> HiPspec:
    """The spec of the tangents of values with this spec (for autodiff)."""
    raise NotImplementedError(
        f"Autodiff through jax.shard_map needs "
        f"{type(self).__name__}.to_tangent_spec()")

  def to_ct_spec(self) -> HiPspec:
    """The spec of the cotangents; the default is `to_tangent_spec`."""
    return self.to_tangent_spec()


# --- registering value classes ---------------------------------------------------


def register_hitype(value_class: type,
                    typeof_fn: Callable[[Any], HiType]) -> None:
  """Makes ``jax.typeof(v)`` return ``typeof_fn(v)`` for ``v`` a ``value_class``.

  ``typeof_fn`` must return a `HiType`. After registration, instances of
  ``value_class`` can be passed to ``jit``-ed functions, to `HiPrim`
  primitives, to ``vmap``, ``scan`` and ``shard_map``.

  A value object must be built from concrete arrays (or inside a `HiPrim`'s
  ``expand``): one assembled from traced arrays in traced code is rejected
  with a ``TypeError`` where JAX first asks for its type, e.g. when it is
  returned from a ``jit``-ed function.
  """
  if not isinstance(value_class, type):
    raise TypeError("register_hitype(value_class, typeof_fn) takes the value "
                    f"class first, got {value_class!r}")
  if not callable(typeof_fn):
    raise TypeError(f"register_hitype: typeof_fn must be callable, got "
                    f"{typeof_fn!r}")

  def typeof(value):
    ty = typeof_fn(value)
    if not isinstance(ty, _jax_hijax.HiType):
      raise TypeError(
          f"the typeof function registered for {value_class.__name__} returned "
          f"a {type(ty).__name__}, not a HiType instance")
    _check_not_built_from_tracers(value_class, ty, value)
    return ty

  core.pytype_aval_mappings[value_class] = typeof
  if getattr(value_class, "__jax_array__", None) is None:
    # What jnp asks a concrete value (as `HiType.__jax_array__` does a traced one).
    value_class.__jax_array__ = lambda self: _not_an_array(
        typeof(self), f"a {value_class.__name__} value")
  dtypes.register_canonicalize_value_handler(value_class, None)


def _check_not_built_from_tracers(value_class, ty, value):
  # While JAX lowers a jaxpr it rebuilds hi values from the arrays of a
  # lowering trace (``requires_low``); those are fine. Any other tracer inside
  # a value object means user code assembled the object in traced code, where
  # JAX cannot see it as one value. The value's fields are searched, not its
  # `lower_val`: a type needs no lowering until it is lowered, and `typeof`
  # runs on every call.
  for lo in _tracers_in(value, _MAX_DEPTH):
    if not getattr(lo._trace, "requires_low", False):
      raise TypeError(
          f"a {value_class.__name__} value was built from traced arrays "
          f"(e.g. {lo.aval.str_short()}) inside a transformed function. "
          f"JAX treats a {ty.str_short()} value as one opaque value, so it "
          "must come from concrete arrays or from a HiPrim: write a "
          "constructor primitive whose `expand` builds the "
          f"{value_class.__name__}, and call it instead")


_MAX_DEPTH = 4  # value object -> field -> container -> ... -> array
_ATOMS = (jax.Array, np.ndarray, np.generic, str, bytes, int, float, complex,
          type(None), type, Callable)


def _tracers_in(x, depth):
  """The tracers among ``x``'s fields, in containers and nested objects."""
  if isinstance(x, core.Tracer):
    yield x
  elif depth == 0 or isinstance(x, _ATOMS):  # pyright: ignore[reportArgumentType]
    return
  elif isinstance(x, (tuple, list, set, frozenset)):
    for item in x:
      yield from _tracers_in(item, depth - 1)
  elif isinstance(x, dict):
    for item in x.values():
      yield from _tracers_in(item, depth - 1)
  else:
    for item in _fields(x):
      yield from _tracers_in(item, depth - 1)


def _fields(obj) -> list:
  """The attribute values of an object: its ``__dict__`` and ``__slots__``."""
  fields = list(getattr(obj, "__dict__", {}).values())
  for cls in type(obj).__mro__:
    for slot in getattr(cls, "__slots__", ()):
      if isinstance(slot, str) and hasattr(obj, slot):
        fields.append(getattr(obj, slot))
  return fields
