"""Small helpers shared by the rule modules.

Imports: jax only; any hijax module may use it.
"""
from __future__ import annotations

import jax

from jax.dtypes import float0
from jax.interpreters.ad import Zero


def store_bounded(cache: dict, key, value, limit: int):
  """``cache[key] = value``, first emptying ``cache`` if it already holds
  ``limit`` entries; returns ``value``. For the memos keyed on what callers
  pass (functions, types, options), which must not grow without bound over a
  long session: an emptied memo is only recomputed."""
  if len(cache) >= limit:
    cache.clear()
  cache[key] = value
  return value


def is_none(x) -> bool:
  return x is None


def is_zero(x) -> bool:
  return isinstance(x, Zero)


def is_float0(x) -> bool:
  """Whether ``x`` (a value or a type) has dtype float0, "not differentiable"."""
  return getattr(x, "dtype", None) == float0


@jax.tree_util.register_static
class Static:
  """Carries a hashable-by-structure Python value (flags, batch dims) through a
  pytree of residuals without making it a leaf."""

  def __init__(self, value):
    self.value = value
    self._memo = None

  def _key(self):
    # (computed once: JAX hashes and compares the params that hold it at
    # every abstract evaluation; the value is never changed in place)
    if self._memo is None:
      leaves, tree = jax.tree.flatten(self.value, is_leaf=is_none)
      self._memo = tree, tuple(
          x if isinstance(x, (bool, int, type(None))) else id(x)
          for x in leaves)
    return self._memo

  def __hash__(self):
    return hash(self._key())

  def __eq__(self, other):
    return isinstance(other, Static) and self._key() == other._key()


def describe_value(x) -> str:
  """How an error message names what a rule returned: its type, and its length if a sequence."""
  if isinstance(x, (tuple, list)):
    return f"a {type(x).__name__} of length {len(x)}"
  return f"a {type(x).__name__}"
