"""Which rule a call belongs to, and where that rule is defined.

A rule is identified by the code that defines it, not by the object called:
a ``jax.custom_jvp`` made anew on every call of a function is one rule. For
a decorated function that is the code of the function and of its rules
(``jvp``, or ``fwd`` and ``bwd``); for a `HiPrim`, its class.

Libraries wrap ``jax.custom_jvp`` in their own decorators (equinox's
``filter_custom_jvp`` decorates an inner ``fn_wrapper`` that calls the
user's function). So the function that names a rule, and gives the line it
is defined at, is found by following what the decorated function closes
over: a function, or an object holding functions as attributes, defined in
another file than the wrapper is the one wrapped (`named_function`).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import types
from typing import Any

from hijax._function_key import code_of, unwrap

# Rules defined in these packages are recorded only on request: JAX's and
# hijax's own test suites check them.
JAX_PACKAGES = ("jax", "jaxlib", "hijax")

# hijax's own primitive classes that its decorators and vmap bind: a call of
# those is the call of a decorated function (recorded as such) or of a
# batched primitive (recorded when the primitive itself was called).
_MACHINERY = ("hijax._decorators", "hijax.batching")


@dataclasses.dataclass
class RuleIdentity:
  """A rule: what it is called, where it is defined, and its key.

  Attributes:
    key: what identifies the rule (code objects, or the class).
    kind: ``"jax.custom_jvp"``, ``"jax.custom_vjp"``, ``"hijax.custom_jvp"``,
      ``"hijax.custom_vjp"`` or ``"HiPrim"``.
    name: the function's or class's qualified name.
    module: the module it is defined in.
    target: the function (for the file and line) or the class.
    in_jax: defined in JAX, jaxlib or hijax.
    fun: the decorated function (to bind keywords to positions).
    via: where the decorated function is defined, when a library's wrapper
      stands between it and ``target`` (else None).
  """
  key: Any
  kind: str
  name: str
  module: str
  target: Any
  in_jax: bool
  fun: Any = None
  via: Any = None

  def where(self) -> tuple[str, int]:
    """``(file, line)`` where the rule is defined (``("?", 0)`` if unknown)."""
    return _where(self.target)

  def where_via(self) -> tuple[str, int] | None:
    """``(file, line)`` of the library's wrapper, if any."""
    return None if self.via is None else _where(self.via)

  def label(self) -> str:
    return f"{self.name} ({self.kind})"

  def bind(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with the keywords that name positional
    parameters of the decorated function moved into ``args``."""
    bound = _signature(self.fun).bind(*args, **kwargs)
    return bound.args, bound.kwargs


def _where(target: Any) -> tuple[str, int]:
  try:
    if isinstance(target, type):
      line = inspect.getsourcelines(target)[1]
      return inspect.getsourcefile(target) or "?", line
    code = code_of(target)
    return code.co_filename, code.co_firstlineno
  except (OSError, TypeError, AttributeError):
    return "?", 0


@functools.lru_cache(maxsize=None)
def _signature_of_code(fun) -> inspect.Signature:
  return inspect.signature(fun)


def _signature(fun) -> inspect.Signature:
  try:
    return _signature_of_code(fun)
  except TypeError:  # unhashable
    return inspect.signature(fun)


def _functions_held(fn: Any) -> list[Any]:
  """The functions ``fn`` closes over: cell values that are functions, and
  the function attributes of objects in its cells."""
  found = []
  for cell in getattr(fn, "__closure__", None) or ():
    try:
      value = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    value = unwrap(value)
    if isinstance(value, types.FunctionType):
      found.append(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
      found += [unwrap(v) for v in vars(value).values()
                if isinstance(unwrap(v), types.FunctionType)]
  return found


def named_function(fun: Any) -> Any:
  """The function a decorated ``fun`` stands for: ``fun`` itself, or the
  first function it holds (`_functions_held`) defined in another file,
  followed down while that holds true."""
  fun = unwrap(fun)
  for _ in range(5):
    try:
      here = code_of(fun).co_filename
    except TypeError:
      return fun
    inner = [f for f in _functions_held(fun)
             if f.__code__.co_filename != here]
    if not inner:
      return fun
    fun = inner[0]
  return fun


def _code_key(fn: Any) -> Any:
  if fn is None:
    return None
  try:
    code = code_of(fn)
  except TypeError:
    return type(fn)
  held = tuple(f.__code__ for f in _functions_held(unwrap(fn)))
  return (code, held)


def _in_jax(module: str) -> bool:
  return module.split(".")[0] in JAX_PACKAGES


def of_function(kind: str, obj: Any) -> RuleIdentity:
  """The rule of a call of a decorated function ``obj`` (``jax.custom_jvp``,
  ``jax.custom_vjp`` or hijax's decorators)."""
  fun = getattr(obj, "fun", obj)
  rules = ([getattr(obj, "jvp", None)] if kind.endswith("custom_jvp")
           else [getattr(obj, "fwd", None), getattr(obj, "bwd", None)])
  key = (kind, _code_key(fun), *map(_code_key, rules))
  named = named_function(fun)
  module = getattr(named, "__module__", None) or ""
  name = getattr(named, "__qualname__", None) or getattr(
      named, "__name__", repr(named))
  via = None if named is unwrap(fun) else fun
  return RuleIdentity(key, kind, name, module, named, _in_jax(module), fun,
                      via)


def of_class(cls: type) -> RuleIdentity | None:
  """The rule of a call of a `HiPrim` of class ``cls`` (None for hijax's own
  machinery)."""
  module = cls.__module__ or ""
  if module.startswith(_MACHINERY):
    return None
  return RuleIdentity(cls, "HiPrim", cls.__qualname__, module, cls,
                      _in_jax(module))


def short_path(path: str, root: str) -> str:
  """``path`` relative to ``root`` if inside it, else from its package (the
  part after ``site-packages``)."""
  try:
    rel = os.path.relpath(path, root)
    if not rel.startswith(".."):
      return rel
  except ValueError:
    pass
  marker = "site-packages" + os.sep
  return path.split(marker, 1)[1] if marker in path else path
