"""A call of a decorated function: its arguments (bound as JAX's
decorators bind them), its traces (`Traced`), the traced values they close
over hoisted into inputs (`Hoisted`), and the calls running now (`find`)."""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend  # noqa: F401  (jax.extend.core)
from jax.extend.core.primitives import closed_call_p

from hijax._function_key import Uncacheable, by_value
from hijax._internals import core


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


def _positional(params: list[inspect.Parameter]) -> list[str]:
  return [p.name for p in params
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


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
    names = _positional(params)
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
  if params is None or len(_positional(params)) != len(params) or any(
      p.default is not p.empty for p in params):
    return None
  return len(params)


def resolve(fun: Callable, args: tuple, kwargs: dict, decorator: str
            ) -> tuple[Any, ...]:
  """``args`` and ``kwargs`` as positional arguments of ``fun``, defaults
  filled in; a TypeError in JAX's words where they do not bind, or bind to
  a keyword-only parameter."""
  try:  # (a partial's signature is opaque, as in JAX)
    signature = inspect.signature((lambda *a, **k: None) if isinstance(
        fun, functools.partial) else fun)
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
    positional = _positional(_parameters(fun) or [])
    self.names = [f"{positional[i]} (position {i})" if i < len(positional)
                  else f"at position {i}" for i in self.diff]

  def split(self, args: tuple) -> tuple[list[Any], tuple[Any, ...]]:
    statics = [args[i] for i in self.nondiff]
    return statics, tuple(args[i] for i in self.diff)

  def merge(self, statics: Sequence[Any], diff_args: Sequence[Any]) -> tuple:
    s, d = iter(statics), iter(diff_args)
    return tuple(next(s) if i in self.nondiff else next(d)
                 for i in range(len(statics) + len(diff_args)))


class Hoisted(list):
  """The traced values a call's functions close over, each once."""

  def slot(self, tracer: Any) -> int:
    for i, x in enumerate(self):
      if x is tracer:
        return i
    self.append(tracer)
    return len(self) - 1


class Traced:
  """A function as traced for one call: ``traced(hoisted_values, *args)``
  evaluates its jaxpr with the current hoisted values."""

  def __init__(self, closed: Any, slots: list[int | None], in_tree: Any,
               out_tree: Any):
    self.jaxpr, self.consts = closed.jaxpr, list(closed.consts)
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


def trace(fn: Callable[..., Any], args: tuple[Any, ...], hoisted: Hoisted
          ) -> tuple[Traced, Any]:
  """The `Traced` ``fn(*args)`` and its output shape; a fresh lambda, since
  ``make_jaxpr`` caches by identity."""
  closed, shape = jax.make_jaxpr(lambda *a: fn(*a), return_shape=True)(*args)
  slots = [hoisted.slot(c) if isinstance(c, core.Tracer) else None
           for c in closed.consts]
  return Traced(closed, slots, jax.tree.structure(args),
                jax.tree.structure(shape)), shape


class Entry:
  """A running call: the function called from its rule with the same
  signature binds ``call`` (mode "bind") or, while the rules are first
  traced, is evaluated in place (mode "inline")."""

  def __init__(self, call: Any, hoisted_values: Sequence[Any], mode: str):
    self.call, self.hoisted_values = call, list(hoisted_values)
    self.mode, self.reentered = mode, False


_RUNNING = threading.local()  # .stack: the entries running, innermost last


@contextlib.contextmanager
def running(call: Any, hoisted_values: Sequence[Any], mode: str = "bind"
            ) -> Iterator[Entry]:
  entry = Entry(call, hoisted_values, mode)
  stack = _RUNNING.__dict__.setdefault("stack", [])
  stack.append(entry)
  try:
    yield entry
  finally:
    stack.pop()


def find(decorator: Any, key: Any) -> Entry | None:
  """The innermost running call of ``decorator`` with the signature ``key``."""
  for entry in reversed(getattr(_RUNNING, "stack", ())):
    if entry.call.decorated is decorator and _same_key(entry.call.key, key):
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
