"""Tracing a decorated function and its rules once per call, the traced values
they close over hoisted into inputs (`Hoisted`, `Traced`): a rule run after
the trace of such a value has ended would meet a dead tracer. A rule that
calls the function itself reuses the running call (`Entry`, `find`).
Imports: jax and `hijax._internals` only.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend  # noqa: F401  (jax.extend.core)
import numpy as np
from jax.extend.core.primitives import closed_call_p

from hijax._internals import core

__all__ = ["Hoisted", "Traced", "trace", "Entry", "running", "find",
           "signature_key", "may_close_over_tracers"]


class Hoisted:
  """The traced values a call's functions close over, in order, each once
  (those of its non-differentiable arguments among them)."""

  def __init__(self):
    self.values: list[Any] = []
    self._index: dict[int, int] = {}

  def slot(self, tracer: Any) -> int:
    """The index of ``tracer`` among the hoisted values (added if new)."""
    i = self._index.get(id(tracer))
    if i is None:
      i = self._index[id(tracer)] = len(self.values)
      self.values.append(tracer)
    return i

  def truncate(self, n: int) -> None:
    """Drops the values added after the first ``n`` (a tracing not kept)."""
    for x in self.values[n:]:
      del self._index[id(x)]
    del self.values[n:]

  def __len__(self) -> int:
    return len(self.values)


class Traced:
  """A function as traced for one call: ``traced(hoisted_values, *args)``
  evaluates its jaxpr, the closed-over traced values replaced by the current
  ``hoisted_values``."""

  def __init__(self, name: str, closed: Any, slots: list[int | None],
               in_tree: Any, out_tree: Any):
    self.name = name
    self.jaxpr = closed.jaxpr
    self.consts = list(closed.consts)
    self.slots = slots
    self.in_tree, self.out_tree = in_tree, out_tree
    self.out_avals = list(closed.out_avals)
    self.effects = closed.jaxpr.effects
    self._call_jaxpr: tuple[Any, list[int]] | None = None

  @property
  def hoists(self) -> bool:
    """Whether the function closes over a traced value."""
    return any(s is not None for s in self.slots)

  def __call__(self, hoisted_values: Sequence[Any], *args: Any) -> Any:
    flat = self.in_tree.flatten_up_to(args)
    consts = [c if s is None else hoisted_values[s]
              for c, s in zip(self.consts, self.slots)]
    closed = jax.extend.core.ClosedJaxpr(self.jaxpr, consts)  # pyright: ignore[reportPrivateImportUsage]
    out = jax.extend.core.jaxpr_as_fun(closed)(*flat)
    return jax.tree.unflatten(self.out_tree, out)

  def as_call(self, hoisted_values: Sequence[Any], *args: Any) -> Any:
    """Like calling it, but recorded as one ``closed_call`` equation (what
    lowering a call under ``jit`` records, as JAX's decorators do)."""
    if self._call_jaxpr is None:
      self._call_jaxpr = self._with_hoisted_inputs()
    closed, used = self._call_jaxpr
    if closed is None:  # (types make_jaxpr cannot take: evaluated in place)
      return self(hoisted_values, *args)
    out = closed_call_p.bind(*[hoisted_values[s] for s in used],
                             *self.in_tree.flatten_up_to(args),
                             call_jaxpr=closed)
    return jax.tree.unflatten(self.out_tree, out)

  def _with_hoisted_inputs(self) -> tuple[Any, list[int]]:
    """The jaxpr with the hoisted values it reads as its first inputs (the
    other constants stay constants), and those values' slots."""
    used = sorted({s for s in self.slots if s is not None})
    hoisted_avals = {s: v.aval for s, v in zip(self.slots,
                                                self.jaxpr.constvars)
                     if s is not None}
    avals = [hoisted_avals[s] for s in used] + [v.aval
                                                for v in self.jaxpr.invars]
    if not all(type(a) is core.ShapedArray for a in avals):
      return None, used

    def with_inputs(*values):
      hoisted = dict(zip(used, values[:len(used)]))
      consts = [c if s is None else hoisted[s]
                for c, s in zip(self.consts, self.slots)]
      closed = jax.extend.core.ClosedJaxpr(self.jaxpr, consts)  # pyright: ignore[reportPrivateImportUsage]
      return jax.extend.core.jaxpr_as_fun(closed)(*values[len(used):])
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
             for a in avals]
    return jax.make_jaxpr(with_inputs)(*specs), used


def trace(name: str, fn: Callable[..., Any], args: tuple[Any, ...],
          hoisted: Hoisted) -> tuple[Traced, Any]:
  """The `Traced` ``fn(*args)`` and its output shape, each traced value it
  closes over added to ``hoisted``. A fresh function is traced each time
  (``jax.make_jaxpr`` caches by identity: a changed ``self.w`` is seen)."""
  closed, shape = jax.make_jaxpr(lambda *a: fn(*a), return_shape=True)(*args)
  slots = [hoisted.slot(c) if isinstance(c, core.Tracer) else None
           for c in closed.consts]
  traced = Traced(name, closed, slots, jax.tree.structure(args),
                  jax.tree.structure(shape))
  return traced, shape


# --- calls of a decorated function running now --------------------------------

class Entry:
  """A call of a decorated function whose rules are being traced or run:
  a call of the function itself from a rule, with the same static arguments
  and argument types, reuses ``call`` (``mode == "bind"``), or, while the
  rules are first traced to find what they close over, is evaluated in
  place (``mode == "inline"``), its hoisted inputs ``hoisted_values``."""

  def __init__(self, decorator: Any, key: Any, call: Any,
               hoisted_values: Sequence[Any], mode: str):
    self.decorator, self.key, self.call = decorator, key, call
    self.hoisted_values = list(hoisted_values)
    self.mode = mode
    self.reentered = False


class _Running(threading.local):
  def __init__(self) -> None:
    self.stack: list[Entry] = []


_RUNNING = _Running()


@contextlib.contextmanager
def running(entry: Entry) -> Iterator[Entry]:
  """Makes ``entry`` findable by `find` while the block runs."""
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
  """The static arguments (compared by identity or equality) and the
  argument types of a call."""
  leaves, tree = jax.tree.flatten(diff_args)
  return (tuple(statics), tree, [core.typeof(x) for x in leaves])


def _same_key(a, b) -> bool:
  statics_a, tree_a, avals_a = a
  statics_b, tree_b, avals_b = b
  return (tree_a == tree_b and len(statics_a) == len(statics_b)
          and all(_same_static(x, y) for x, y in zip(statics_a, statics_b))
          and all(core.typematch(x, y) for x, y in zip(avals_a, avals_b)))


def _same_static(x, y) -> bool:
  if x is y:
    return True
  if type(x) is not type(y) or isinstance(x, core.Tracer):
    return False
  try:
    return bool(x == y)
  except Exception:  # noqa: BLE001 (arrays, tracers: not comparable here)
    return False


# --- whether a rule can close over a traced value -------------------------------

_SCAN_LIMIT = 5000
_ATOMS = (str, bytes, int, float, complex, bool, type(None), type,
          types.ModuleType, types.BuiltinFunctionType, np.ndarray, np.generic,
          jax.Array)


def may_close_over_tracers(*objects: Any) -> bool:
  """Whether a traced value is reachable from ``objects``: through
  closures, defaults, bound objects, ``partial`` arguments, the globals a
  code names, containers and attributes. Rules are traced at a call only
  where it is True (else they run as JAX's decorators run them); past a few
  thousand objects it answers True, the safe answer."""
  seen: set[int] = set()
  stack = list(objects)
  for _ in range(_SCAN_LIMIT):
    if not stack:
      return False
    x = stack.pop()
    if isinstance(x, core.Tracer):  # (first: a tracer is also a jax.Array)
      return True
    if id(x) in seen or isinstance(x, _ATOMS):
      continue
    seen.add(id(x))
    stack.extend(_held_by(x))
  return bool(stack)


def _held_by(x) -> list[Any]:
  if isinstance(x, functools.partial):
    return [x.func, *x.args, *x.keywords.values()]
  if isinstance(x, types.MethodType):
    return [x.__func__, x.__self__]
  if isinstance(x, types.FunctionType):
    held = [c.cell_contents for c in x.__closure__ or ()
            if _cell_is_set(c)]
    held += list(x.__defaults__ or ()) + list((x.__kwdefaults__ or {}).values())
    held += [x.__globals__[n] for n in _global_names(x.__code__)
             if n in x.__globals__]
    return held
  if isinstance(x, (list, tuple, set, frozenset)):
    return list(x)
  if isinstance(x, dict):
    return list(x.values())
  held = list(getattr(x, "__dict__", {}).values())
  for name in getattr(type(x), "__slots__", ()):
    if hasattr(x, name):
      held.append(getattr(x, name))
  if not held:
    try:  # a registered pytree node (a named tuple is a tuple, above)
      leaves = jax.tree.leaves(x)
    except Exception:  # noqa: BLE001
      leaves = []
    held = [] if leaves == [x] else leaves
  return held


def _cell_is_set(cell) -> bool:
  try:
    cell.cell_contents  # noqa: B018
    return True
  except ValueError:  # an empty cell
    return False


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
  names = list(code.co_names)
  for c in code.co_consts:
    if isinstance(c, types.CodeType):
      names.extend(_global_names(c))
  return tuple(names)
