"""Tracing a decorated function or rule once per call, the traced values it
closes over hoisted into inputs (`Hoisted`, `Traced`); the calls running now
(`Entry`, `find`), which a rule's call of the function itself reuses.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend  # noqa: F401  (jax.extend.core)
from jax.extend.core.primitives import closed_call_p

from hijax._function_key import Uncacheable, by_value
from hijax._internals import core

__all__ = ["Hoisted", "Traced", "trace", "Entry", "running", "find",
           "signature_key", "may_close_over_tracers"]


class Hoisted:
  """The traced values a call's functions close over, each once."""

  def __init__(self):
    self.values: list[Any] = []
    self._index: dict[int, int] = {}

  def slot(self, tracer: Any) -> int:
    i = self._index.get(id(tracer))
    if i is None:
      i = self._index[id(tracer)] = len(self.values)
      self.values.append(tracer)
    return i

  def truncate(self, n: int) -> None:
    for x in self.values[n:]:
      del self._index[id(x)]
    del self.values[n:]

  def __len__(self) -> int:
    return len(self.values)


class Traced:
  """A function as traced for one call: ``traced(hoisted_values, *args)``
  evaluates its jaxpr with the current hoisted values."""

  def __init__(self, name: str, closed: Any, slots: list[int | None],
               in_tree: Any, out_tree: Any):
    self.name, self.jaxpr, self.consts = name, closed.jaxpr, list(closed.consts)
    self.slots, self.in_tree, self.out_tree = slots, in_tree, out_tree
    self.out_avals = list(closed.out_avals)
    self.effects = closed.jaxpr.effects
    self._call_jaxpr: tuple[Any, list[int]] | None = None

  @property
  def hoists(self) -> bool:
    return any(s is not None for s in self.slots)

  def _run(self, hoisted: Any, flat: Sequence[Any]) -> list[Any]:
    consts = [c if s is None else hoisted[s]
              for c, s in zip(self.consts, self.slots)]
    closed = jax.extend.core.ClosedJaxpr(self.jaxpr, consts)  # pyright: ignore[reportPrivateImportUsage]
    return jax.extend.core.jaxpr_as_fun(closed)(*flat)

  def __call__(self, hoisted_values: Sequence[Any], *args: Any) -> Any:
    out = self._run(hoisted_values, self.in_tree.flatten_up_to(args))
    return jax.tree.unflatten(self.out_tree, out)

  def as_call(self, hoisted_values: Sequence[Any], *args: Any) -> Any:
    """Like calling it, recorded as one ``closed_call`` (as JAX's
    decorators are lowered), the hoisted values it reads first."""
    if self._call_jaxpr is None:
      used = sorted({s for s in self.slots if s is not None})
      by_slot = {s: v.aval for s, v in zip(self.slots, self.jaxpr.constvars)}
      avals = [by_slot[s] for s in used] + [v.aval for v in self.jaxpr.invars]
      closed = None
      if all(type(a) is core.ShapedArray for a in avals):
        closed = jax.make_jaxpr(lambda *v: self._run(
            dict(zip(used, v[:len(used)])), v[len(used):]))(*[
                jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                for a in avals])
      self._call_jaxpr = closed, used
    closed, used = self._call_jaxpr
    if closed is None:  # (types make_jaxpr cannot take)
      return self(hoisted_values, *args)
    out = closed_call_p.bind(*[hoisted_values[s] for s in used],
                             *self.in_tree.flatten_up_to(args),
                             call_jaxpr=closed)
    return jax.tree.unflatten(self.out_tree, out)


def trace(name: str, fn: Callable[..., Any], args: tuple[Any, ...],
          hoisted: Hoisted) -> tuple[Traced, Any]:
  """The `Traced` ``fn(*args)`` and its output shape; a fresh lambda, since
  ``make_jaxpr`` caches by identity."""
  closed, shape = jax.make_jaxpr(lambda *a: fn(*a), return_shape=True)(*args)
  slots = [hoisted.slot(c) if isinstance(c, core.Tracer) else None
           for c in closed.consts]
  return Traced(name, closed, slots, jax.tree.structure(args),
                jax.tree.structure(shape)), shape


class Entry:
  """A running call: the function called from its rule with the same
  signature binds ``call`` (mode "bind") or, while the rules are first
  traced, is evaluated in place (mode "inline")."""

  def __init__(self, decorator: Any, key: Any, call: Any,
               hoisted_values: Sequence[Any], mode: str):
    self.decorator, self.key, self.call = decorator, key, call
    self.hoisted_values, self.mode = list(hoisted_values), mode
    self.reentered = False


class _Running(threading.local):
  def __init__(self) -> None:
    self.stack: list[Entry] = []


_RUNNING = _Running()


@contextlib.contextmanager
def running(entry: Entry) -> Iterator[Entry]:
  _RUNNING.stack.append(entry)
  try:
    yield entry
  finally:
    _RUNNING.stack.pop()


def find(decorator: Any, key: Any) -> Entry | None:
  """The innermost running call of ``decorator`` with the signature ``key``."""
  for entry in reversed(_RUNNING.stack):
    if entry.decorator is decorator and _same_key(entry.key, key):
      return entry
  return None


def signature_key(statics: Sequence[Any], diff_args: tuple[Any, ...]) -> Any:
  leaves, tree = jax.tree.flatten(diff_args)
  return (tuple(statics), tree, [core.typeof(x) for x in leaves])


def _same_key(a, b) -> bool:
  (statics_a, tree_a, avals_a), (statics_b, tree_b, avals_b) = a, b
  return (tree_a == tree_b and len(statics_a) == len(statics_b)
          and all(map(_same_static, statics_a, statics_b))
          and all(map(core.typematch, avals_a, avals_b)))


def _same_static(x, y) -> bool:
  if x is y:
    return True
  if type(x) is not type(y) or isinstance(x, core.Tracer):
    return False
  try:
    return bool(x == y)
  except Exception:  # noqa: BLE001 (arrays: not comparable here)
    return False


def may_close_over_tracers(*objects: Any) -> bool:
  """Whether a traced value may be reachable from ``objects`` (what
  `hijax._function_key.by_value` walks; True where it cannot tell)."""
  try:
    by_value(*objects)
  except Uncacheable:
    return True
  return False
