"""Rules deliberately not the derivative (straight-through estimators,
gradient clippers): checked against each other, loops and types, never
against the function."""
from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any, TypeVar, cast

from hijax._function_key import definition
from hijax.primitive import HiPrim
from hijax.testing._discovery import CustomRules

T = TypeVar("T")

# Marked with `surrogate`: HiPrim classes, and functions by where they are
# defined (name, file, first line), as a jaxpr names a custom function.
_CLASSES: weakref.WeakSet = weakref.WeakSet()
_FUNCTIONS: set[tuple[str, str, int]] = set()


def _key(obj: Any) -> tuple[str, str, int] | None:
  """Where a decorated function's function is defined, as the program names
  it."""
  return definition(getattr(obj, "fun", obj))


def surrogate(obj: T) -> T:
  """Marks ``obj`` as a surrogate: its derivative rules are deliberately not
  the derivative of the function (a straight-through estimator, a gradient
  clipper), so `check_rules` never compares them with the function, only
  with each other, with loops and for types (see ``surrogates=``).

  ``obj`` is a ``jax.custom_jvp`` or ``jax.custom_vjp`` function, a
  ``hijax.custom_jvp`` or ``hijax.custom_vjp`` one, or a `HiPrim` subclass
  (its subclasses are not marked). Returns ``obj``, so it can be used as a
  decorator (outermost)::

      @hijax.testing.surrogate
      @jax.custom_vjp
      def round_ste(x):
        return jnp.round(x)
  """
  if isinstance(obj, type):
    if not issubclass(obj, HiPrim):
      raise TypeError(f"surrogate: {obj.__name__} is a class but not a "
                      "HiPrim subclass; mark a HiPrim subclass or a custom "
                      "derivative function (jax.custom_jvp, jax.custom_vjp, "
                      "hijax.custom_jvp, hijax.custom_vjp)")
    _CLASSES.add(obj)
    return cast(T, obj)
  key = _key(obj)
  if key is None:
    raise TypeError(f"surrogate: cannot mark {obj!r}: pass a custom "
                    "derivative function (jax.custom_jvp, jax.custom_vjp, "
                    "hijax.custom_jvp, hijax.custom_vjp) or a HiPrim "
                    "subclass")
  _FUNCTIONS.add(key)
  return obj


class Surrogates:
  """Which of a run's primitives are surrogates: those marked with
  `surrogate` and those ``declared`` (``check_rules``' ``surrogates=``)."""

  def __init__(self, declared: Iterable[Any] = ()):
    self.classes = set()
    self.functions = set()
    for obj in declared:
      if isinstance(obj, type):
        self.classes.add(obj)
        continue
      key = _key(obj)
      if key is None:
        raise TypeError(
            f"check_rules: surrogates= names {obj!r}, which is neither a "
            "HiPrim subclass nor a custom derivative function (jax.custom_jvp, "
            "jax.custom_vjp, hijax.custom_jvp, hijax.custom_vjp)")
      self.functions.add(key)

  def __contains__(self, prim: Any) -> bool:
    functions = self.functions | _FUNCTIONS
    if isinstance(prim, CustomRules):
      return prim.key in functions
    cls = type(prim)
    if cls in self.classes or cls in _CLASSES:
      return True
    call = getattr(prim, "params", {}).get("_call")
    decorated = getattr(call, "decorated", None)
    return decorated is not None and _key(decorated) in functions
