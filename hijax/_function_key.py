"""What a function computes, as a hashable key: the one function-identity
module of hijax.

Two caches key on it: the eager cache of `hijax.implicit`
(``_api._eager_cached``), which compiles a solve once per function and
argument types, and the trace cache of `hijax.custom_vjp` and
`hijax.custom_jvp` (`by_value`), which traces a decorated function into its
primitive once per function, static arguments and argument types. A function written inline (a lambda
in a loop or in a notebook cell) is a new object at each call, so the object
cannot be the key. `split` cuts a function in two:

* a `FunctionSpec`, hashable and compared by value: the function's code and
  the values it reads (its closure cells, default arguments, the globals its
  code loads, a bound method's object, a partial's arguments), recursively;
* the JAX arrays it captures (in closures, defaults, a bound object or a
  partial), which become inputs of the compiled program instead of
  constants, so that a lambda closing over a new array at each call still
  finds its program.

``spec.rebuild(arrays)`` is the function with those arrays in place of the
captured ones; the program is traced from it. Two functions with equal specs
compute the same thing from the same arrays, so a hit never returns a
program traced for other values. A value is keyed

* JAX arrays (and tracers) the function captures: as inputs, by type;
* NumPy arrays and scalars: by dtype, shape and bytes; Python numbers by
  type and exact bits (``0.0`` and ``-0.0`` differ), strings, None by value;
* a Python function: by its code, closure, defaults and the globals it
  loads, recursively, when it is the function passed or reached through a
  closure, a default or the globals of such a function (the user's code);
  a function of another module's globals (a library's) by identity;
* tuples, lists, dicts and other pytrees: by structure, leaf by leaf;
* an object whose class defines ``__eq__`` and ``__hash__`` (a frozen
  dataclass, like the solvers): by that equality; an object of a plain
  Python class otherwise: by its class and attributes (``vars``);
* anything else (modules, classes, builtins, JAX's jitted functions, arrays
  read from globals): by identity, holding a reference so the identity is
  not reused.

What no key sees: an attribute of a module or a class that the function
does not read by name from its globals (``config.SCALE`` is seen, a
``getattr(config, name)`` is not), and state outside the function's reach
(a file, a random generator). Python's own ``jax.jit`` keys on less (the
function object alone).
"""
from __future__ import annotations

import dis
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from hijax._internals import core
from hijax._util import store_bounded

__all__ = ["FunctionSpec", "Uncacheable", "split", "by_identity", "by_value",
           "unwrap", "code_of", "definition"]

_BUDGET = 2000  # values looked at per split before giving up
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python


class Uncacheable(Exception):
  """The function cannot be keyed by value (a traced value where no input
  can carry it, a cycle through captured arrays, too many values)."""


class _Identity:
  """A key component equal only to itself: ``obj`` by identity (and kept
  alive, so that its id is not reused while the key exists)."""

  __slots__ = ("obj",)

  def __init__(self, obj: Any) -> None:
    self.obj = obj

  def __hash__(self) -> int:
    return id(self.obj)

  def __eq__(self, other: object) -> bool:
    return type(other) is _Identity and other.obj is self.obj

  def __repr__(self) -> str:
    return f"<identity of {type(self.obj).__name__}>"


Rebuild = Callable[[Iterator[Any]], Any]


class FunctionSpec:
  """A function's key (hashable, compared by value) and how to rebuild the
  function from its captured arrays (`rebuild`)."""

  __slots__ = ("key", "_hash", "_rebuild", "name")

  def __init__(self, key: Any, rebuild: Rebuild, name: str) -> None:
    self.key, self._rebuild, self.name = key, rebuild, name
    self._hash = hash(key)

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other: object) -> bool:
    return (type(other) is FunctionSpec and self._hash == other._hash
            and self.key == other.key)

  def rebuild(self, arrays: Any) -> Any:
    """The function, with ``arrays`` (as `split` returned them, or tracers
    of them) in place of the arrays it captured."""
    return self._rebuild(iter(arrays))

  def __repr__(self) -> str:
    return f"FunctionSpec({self.name})"


def split(fn: Any, dynamic: bool = True) -> tuple[FunctionSpec, list[Any]]:
  """``(spec, arrays)``: ``fn``'s key and the JAX arrays it captures.

  With ``dynamic=False`` no array is taken out: captured arrays are keyed by
  identity and ``arrays`` is empty (for options, and for functions that need
  their arrays as constants, e.g. to call ``float`` on one). Raises
  `Uncacheable` when ``fn`` cannot be keyed (see the class)."""
  t = type(fn)
  if t in _SCALARS or (t not in _SPLIT_TYPES and _value_class(t)):
    spec = _value_spec(fn)  # an option: a number, a flag, a solver
    if spec is not None:
      return spec, []
  s = _Splitter()
  key, rebuild = s.part(fn, dynamic)
  if s.cycle and s.leaves:
    # a function reaching itself would call the original, with the old arrays
    raise Uncacheable("a function that refers to itself captures arrays")
  if rebuild is None:
    rebuild = lambda it: fn
  return FunctionSpec(key, rebuild, _name(fn)), s.leaves


_VALUE_SPECS: dict[Any, FunctionSpec] = {}
# types whose own equality is not what they compute (a bound method's is
# its object's identity, not its attributes)
_SPLIT_TYPES = (types.FunctionType, types.MethodType)


def _value_class(t: type) -> bool:
  return t.__eq__ is not object.__eq__ and t.__hash__ is not None


def _value_spec(v: Any) -> FunctionSpec | None:
  """The spec of a value keyed by its own equality (a scalar, a frozen
  dataclass), kept: the options of every eager call are such values. None
  if it is not hashable, or not equal to itself."""
  try:
    memo = (type(v), _SCALARS[type(v)](v) if type(v) in _SCALARS else v)
    spec = _VALUE_SPECS.get(memo)
    if spec is None:
      if type(v) not in _SCALARS and (v == v) is not True:
        return None
      spec = store_bounded(_VALUE_SPECS, memo, FunctionSpec(
          ("value", *memo), lambda it: v, _name(v)), 1024)
    return spec
  except Exception:  # an unhashable field, an __eq__ returning arrays
    return None


def by_value(*values: Any) -> FunctionSpec:
  """The spec of ``values`` (a function and its static arguments, say), each
  walked as `split` walks a function with ``dynamic=False``: JAX arrays by
  identity, functions by their code and what they read (never by their own
  equality, which is identity). Raises `Uncacheable` where a traced value
  is reached, or too many values."""
  s = _Splitter()
  key, _ = s.part(values, False)
  return FunctionSpec(key, lambda it: values, "values")


def by_identity(fn: Any) -> FunctionSpec:
  """The spec of ``fn`` keyed by identity (what ``jax.jit`` does)."""
  return FunctionSpec(_Identity(fn), lambda it: fn, _name(fn))


def _name(fn: Any) -> str:
  return getattr(fn, "__qualname__", None) or type(fn).__name__


# --- where a function is defined: what names a rule -----------------------

def unwrap(fn: Any) -> Any:
  """The function under partials, ``__wrapped__`` and bound methods."""
  for _ in range(20):
    if isinstance(fn, functools.partial):
      fn = fn.func
    elif isinstance(fn, types.MethodType):
      fn = fn.__func__
    elif getattr(fn, "__wrapped__", None) is not None:
      fn = fn.__wrapped__
    else:
      break
  return fn


def code_of(fn: Any) -> types.CodeType:
  """The code of the function under ``fn``'s wrappers (`unwrap`), else of
  its class's ``__call__``; TypeError where there is none."""
  fn = unwrap(fn)
  code = getattr(fn, "__code__", None)
  if code is None:
    code = getattr(type(fn).__call__, "__code__", None)
  if code is None:
    raise TypeError(f"no code for {fn!r}")
  return code


def definition(fn: Any) -> tuple[str, str, int] | None:
  """``(name, file, first line)`` of the function under ``fn``'s wrappers
  (`unwrap`): what a jaxpr's debug information names a custom function's
  call by, so that a rule found in a program and a function marked (the
  checker's surrogates) compare equal. None where it has no Python code."""
  fn = unwrap(fn)
  code = getattr(fn, "__code__", None)
  if code is None:
    return None
  return getattr(fn, "__name__", "<unnamed>"), code.co_filename, \
      code.co_firstlineno


def _next(it: Iterator[Any]) -> Any:
  return next(it)


def _float_key(v: float) -> Any:
  return (float, v.hex())


_SCALARS: dict[type, Callable[[Any], Any]] = {
    bool: lambda v: (bool, v), int: lambda v: (int, v), float: _float_key,
    complex: lambda v: (complex, v.real.hex(), v.imag.hex()),
    str: lambda v: (str, v), bytes: lambda v: (bytes, v),
    type(None): lambda v: None, type(Ellipsis): lambda v: Ellipsis,
    types.CodeType: lambda v: v,
}

_BY_IDENTITY = (types.ModuleType, type, types.BuiltinFunctionType,
                types.MethodWrapperType, types.WrapperDescriptorType,
                types.MethodDescriptorType, types.GetSetDescriptorType,
                np.ufunc)

_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL",
                         "DELETE_GLOBAL", "LOAD_FROM_DICT_OR_GLOBALS"})
_GLOBAL_NAMES: dict[int, tuple[types.CodeType, tuple[tuple[str, ...], ...]]] = {}


def _global_names(code: types.CodeType) -> tuple[tuple[str, ...], ...]:
  """What ``code`` (and the functions defined in it) reads from its globals:
  each global name it loads with the attributes it then loads from it
  (``("config", "SCALE")`` for ``config.SCALE``, ``("x",)`` for ``x``)."""
  entry = _GLOBAL_NAMES.get(id(code))
  if entry is not None and entry[0] is code:
    return entry[1]
  paths: set[tuple[str, ...]] = set()
  stack = [code]
  while stack:
    c = stack.pop()
    path: tuple[str, ...] = ()
    for i in dis.get_instructions(c):
      if path and i.opname == "LOAD_ATTR":
        path += (i.argval,)
        continue
      if path:
        paths.add(path)
      path = (i.argval,) if i.opname in _GLOBAL_OPS else ()
    if path:
      paths.add(path)
    stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
  return store_bounded(_GLOBAL_NAMES, id(code), (code, tuple(sorted(paths))),
                       4096)[1]


_MISSING = ("missing",)
# What an attribute of a module or a class is keyed by value as: data a user
# may assign between calls (``config.SCALE = 3.0``); anything else by identity.
_DATA_TYPES = frozenset({*_SCALARS, np.ndarray, tuple, list, dict})


_PLAIN: dict[type, bool] = {}


_PLAIN_BUILTINS = (object, types.SimpleNamespace)


def _plain_class(t: type) -> bool:
  """Whether instances of ``t`` hold all their state in ``__dict__``: every
  class of its MRO but ``object`` (and ``types.SimpleNamespace``, a common
  holder of settings) is defined in Python, without slots."""
  plain = _PLAIN.get(t)
  if plain is None:
    plain = all(c in _PLAIN_BUILTINS or (c.__flags__ & _HEAPTYPE and not set(
        vars(c).get("__slots__", ())) - {"__dict__", "__weakref__"})
        for c in t.__mro__)
    _PLAIN[t] = plain
  return plain


class _Splitter:
  """One `split`: the arrays taken out so far and the functions being
  split (to find cycles)."""

  def __init__(self) -> None:
    self.leaves: list[Any] = []
    self.active: list[int] = []  # ids of the functions being split
    self.user_globals: set[int] = set()  # globals of the user's functions
    self.budget = _BUDGET
    self.cycle = False

  def part(self, v: Any, dynamic: bool) -> tuple[Any, Rebuild | None]:
    """``(key, rebuild)`` of a value; ``rebuild`` is None when the value
    holds no array taken out (it is then used as it is)."""
    self.budget -= 1
    if self.budget < 0:
      raise Uncacheable(f"more than {_BUDGET} values to key")
    t = type(v)
    scalar = _SCALARS.get(t)
    if scalar is not None:
      return scalar(v), None
    if t is types.FunctionType:
      return self.function(v, dynamic)
    if isinstance(v, (jax.Array, core.Tracer)):
      if dynamic:
        self.leaves.append(v)
        aval = jax.typeof(v)
        return ("array", aval.shape, aval.dtype,
                getattr(aval, "weak_type", False)), _next
      if isinstance(v, core.Tracer):
        raise Uncacheable("a traced value no input can carry")
      return _Identity(v), None
    if isinstance(v, (np.ndarray, np.generic)):
      a = np.asarray(v)
      if a.dtype.hasobject:
        return _Identity(v), None
      return ("numpy", t, a.dtype.str, a.shape, a.tobytes()), None
    if t is types.MethodType:
      return self.composite(
          "method", (v.__func__, v.__self__), dynamic,
          lambda parts: types.MethodType(*parts))
    if t is functools.partial:
      return self.composite(
          "partial", (v.func, v.args, v.keywords), dynamic,
          lambda parts: functools.partial(parts[0], *parts[1], **parts[2]))
    if isinstance(v, _BY_IDENTITY):
      return _Identity(v), None
    if t is tuple or t is list:
      return self.composite(t, tuple(v), dynamic, t)
    if t is dict and all(type(k) in _SCALARS for k in v):
      keys = tuple(v)
      key, rebuild = self.composite(dict, tuple(v.values()), dynamic,
                                    lambda vals: dict(zip(keys, vals)))
      return (key, keys), rebuild
    node = self.pytree(v, dynamic)
    return node if node is not None else self.obj(v, dynamic)

  def composite(self, tag: Any, items: tuple[Any, ...], dynamic: bool,
                make: Callable[[Any], Any]) -> tuple[Any, Rebuild | None]:
    parts = [self.part(x, dynamic) for x in items]
    key = (tag, tuple(k for k, _ in parts))
    if all(r is None for _, r in parts):
      return key, None
    return key, lambda it: make(tuple(x if r is None else r(it)
                                      for x, (_, r) in zip(items, parts)))

  def function(self, fn: types.FunctionType, dynamic: bool
               ) -> tuple[Any, Rebuild | None]:
    if id(fn) in self.active:
      self.cycle = True
      return ("cycle", self.active.index(id(fn))), None
    g = fn.__globals__
    if dynamic or not self.user_globals:  # the user's, or the one passed
      self.user_globals.add(id(g))
    elif id(g) not in self.user_globals:
      return _Identity(fn), None  # a library's function
    cells = fn.__closure__ or ()
    if not cells and fn.__defaults__ is None and fn.__kwdefaults__ is None:
      self.active.append(id(fn))
      try:
        read = self.globals_read(fn)
      finally:
        self.active.pop()
      return ("function", fn.__code__, (None, None), read), None
    self.active.append(id(fn))
    try:
      parts = [self.part(fn.__defaults__, dynamic),
               self.part(fn.__kwdefaults__, dynamic),
               *(self.cell(c, dynamic) for c in cells)]
      read = self.globals_read(fn)
    finally:
      self.active.pop()
    key = ("function", fn.__code__, tuple(k for k, _ in parts), read)
    if all(r is None for _, r in parts):
      return key, None

    def rebuild(it: Iterator[Any]) -> Any:
      (_, rd), (_, rk), *rc = parts
      defaults = fn.__defaults__ if rd is None else rd(it)
      kwdefaults = fn.__kwdefaults__ if rk is None else rk(it)
      closure = tuple(c if r is None else types.CellType(r(it))
                      for c, (_, r) in zip(cells, rc))
      new = types.FunctionType(fn.__code__, g, fn.__name__, defaults,
                               closure or None)
      new.__kwdefaults__ = kwdefaults
      new.__qualname__ = fn.__qualname__
      new.__dict__.update(fn.__dict__)
      return new
    return key, rebuild

  def globals_read(self, fn: types.FunctionType) -> tuple[Any, ...]:
    """The key of what ``fn`` reads from its globals: each global's value,
    and what it reads through a module or a class there (both keyed by
    identity, so ``config.SCALE = 3.0`` would go unseen otherwise): data
    (numbers, strings, NumPy arrays, tuples, lists, dicts) by value, other
    values (a library's function, an object) by identity."""
    g, read = fn.__globals__, []
    for path in _global_names(fn.__code__):
      v = g.get(path[0], _MISSING)  # missing: a builtin, or not defined yet
      walked = False
      for attr in path[1:]:
        if not isinstance(v, (types.ModuleType, type)):
          break
        walked = True
        try:
          v = getattr(v, attr)
        except Exception:  # noqa: BLE001 - a lazy module's import error, say
          v = _MISSING
          break
      if v is _MISSING:
        read.append((path, v))
      elif walked and type(v) not in _DATA_TYPES:
        read.append((path, _Identity(v)))  # walking a library's function costs
      else:
        read.append((path, self.part(v, False)[0]))
    return tuple(read)

  def cell(self, c: types.CellType, dynamic: bool) -> tuple[Any, Any]:
    try:
      v = c.cell_contents
    except ValueError:  # not yet assigned
      return ("empty cell",), None
    return self.part(v, dynamic)

  def pytree(self, v: Any, dynamic: bool) -> tuple[Any, Rebuild | None] | None:
    """A registered pytree node (a namedtuple, a dataclass pytree, an
    Equinox module), split one level down; None for a leaf."""
    children, treedef = jax.tree_util.tree_flatten(v, is_leaf=lambda x: x
                                                   is not v)
    if jax.tree_util.treedef_is_leaf(treedef):
      return None
    try:
      hash(treedef)
    except TypeError:
      return None
    key, rebuild = self.composite("pytree", tuple(children), dynamic,
                                  treedef.unflatten)
    return (key, treedef), rebuild

  def obj(self, v: Any, dynamic: bool) -> tuple[Any, Rebuild | None]:
    t = type(v)
    if t.__eq__ is not object.__eq__ and t.__hash__ is not None:
      try:
        hash(v)
        if (v == v) is True:
          return ("value", t, v), None
      except Exception:  # an unhashable field, an __eq__ returning arrays
        pass
    state = getattr(v, "__dict__", None)
    if type(state) is not dict or not _plain_class(t):
      return _Identity(v), None
    key, rebuild = self.part(state, dynamic)
    if rebuild is None:
      return ("object", t, key), None
    make = rebuild

    def rebuilt(it: Iterator[Any]) -> Any:
      # object.__new__ refuses a SimpleNamespace ("not safe")
      new = (types.SimpleNamespace.__new__(t) if issubclass(t, types.SimpleNamespace)
             else object.__new__(t))
      new.__dict__.update(make(it))
      return new
    return ("object", t, key), rebuilt

