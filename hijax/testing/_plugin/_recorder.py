"""`CallRecorder`: the custom rules a test suite calls (``jax.custom_jvp``/
``custom_vjp``, hijax's decorators, `HiPrim`, `library_primitives`) and per
rule a few varied samples, the ``in_axes`` under ``vmap``, the inputs
differentiated. Recording never raises into a test."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import time
import types
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from hijax import primitive
from hijax._decorators import _common
from hijax._function_key import code_of, unwrap
from hijax._internals import core
from hijax._internals.ad import (JVPTrace, LinearizeTrace, Zero,
                                 instantiate_zeros, primitive_jvps)
from hijax._internals.batching import BatchTrace

# Rules defined here are recorded only on request (their suites check them)
JAX_PACKAGES = ("jax", "jaxlib", "hijax")
# hijax's own primitives (its decorators' and vmap's): not rules of a user.
_MACHINERY = ("hijax._decorators", "hijax.batching")
MAX_ELEMENTS = 100_000  # a sample with more elements keeps only its types
_SCALARS = (bool, int, float, complex)


@dataclasses.dataclass
class RuleIdentity:
  """A rule: ``target`` names it, ``fun`` is decorated, ``via`` wraps it."""
  key: Any
  kind: str
  name: str
  target: Any
  in_jax: bool
  fun: Any = None
  via: Any = None

  def where(self, via: bool = False) -> tuple[str, int]:
    """``(file, line)`` defining the rule (or its wrapper)."""
    target = self.via if via else self.target
    try:
      if isinstance(target, type):
        return (inspect.getsourcefile(target) or "?",
                inspect.getsourcelines(target)[1])
      return code_of(target).co_filename, code_of(target).co_firstlineno
    except (OSError, TypeError, AttributeError):
      return "?", 0

  def label(self) -> str:
    return f"{self.name} ({self.kind})"


def _in_jax(obj: Any, default: str = "") -> bool:
  return (getattr(obj, "__module__", None) or default).split(".")[0] \
      in JAX_PACKAGES


def _functions_held(fn: Any) -> list[Any]:
  """The functions ``fn`` closes over, or an object it closes over holds."""
  found = []
  for cell in getattr(fn, "__closure__", None) or ():
    with contextlib.suppress(ValueError):  # (an empty cell)
      value = unwrap(cell.cell_contents)
      held = [value] if not hasattr(value, "__dict__") or isinstance(
          value, (type, types.FunctionType)) else vars(value).values()
      found += [f for f in map(unwrap, held)
                if isinstance(f, types.FunctionType)]
  return found


def named_function(fun: Any) -> Any:
  """The function a decorated ``fun`` stands for: itself, or the first
  function it holds defined in another file (not JAX's), followed down."""
  fun = unwrap(fun)
  for _ in range(5):
    with contextlib.suppress(TypeError):  # (not a function: itself)
      here = code_of(fun).co_filename
      if inner := [f for f in _functions_held(fun)
                   if f.__code__.co_filename != here and not _in_jax(f)]:
        fun = inner[0]
        continue
    break
  return fun


def identity_of(kind: str, obj: Any) -> RuleIdentity | None:
  """The rule of a call of ``obj`` (None for hijax's own machinery)."""
  if kind == "Primitive":
    named = named_function(primitive_jvps[obj.prim])
    return RuleIdentity(("Primitive", obj.prim), kind, obj.prim.name, named,
                        False, obj.prim)
  if kind == "HiPrim":
    return None if ((cls := type(obj)).__module__ or "").startswith(
        _MACHINERY) else RuleIdentity(cls, kind, cls.__qualname__, cls,
                                      _in_jax(cls))

  def code_key(fn):
    try:
      return None if fn is None else (code_of(fn), tuple(
          f.__code__ for f in _functions_held(unwrap(fn))))
    except TypeError:
      return type(fn)
  fun = getattr(obj, "fun", obj)
  rules = ([getattr(obj, "jvp", None)] if kind.endswith("custom_jvp")
           else [getattr(obj, "fwd", None), getattr(obj, "bwd", None)])
  named = named_function(fun)
  return RuleIdentity(
      (kind, code_key(fun), *map(code_key, rules)), kind, getattr(
          named, "__qualname__", None) or getattr(named, "__name__", repr(
              named)), named, _in_jax(named), fun,
      None if named is unwrap(fun) else fun)


class PrimitiveCall:
  """A bind of a library's ``prim`` as a ``jax.custom_jvp`` of its arrays
  whose rule is the registered jvp rule: `check_rules` checks it (and the
  transpose and batching rules it reaches) against the impl."""

  def __init__(self, prim: Any, params: dict[str, Any]) -> None:
    self.prim, self.params = prim, params

  @functools.cached_property
  def custom_jvp(self) -> Any:
    prim, params, many = self.prim, self.params, self.prim.multiple_results

    def bound(*args):
      out = prim.bind(*args, **params)
      return tuple(out) if many else out
    bound.__name__ = bound.__qualname__ = prim.name

    def jvp(primals, tangents):
      out, t_out = primitive_jvps[prim](list(primals), [
          Zero(t.aval) if isinstance(t, SymbolicZero) else t
          for t in tangents], **params)
      return ((tuple(out), tuple(map(instantiate_zeros, t_out))) if many
              else (out, instantiate_zeros(t_out)))
    fun = jax.custom_jvp(bound)
    fun.defjvp(jvp, symbolic_zeros=True)
    return fun

  def __call__(self, *args: Any) -> Any:
    return self.custom_jvp(*args)


def library_primitives(seen: Any) -> list[Any]:
  """The primitives not in ``seen`` whose jvp rule is registered outside
  JAX and hijax (like lineax's ``linear_solve_p``)."""
  return [p for p, rule in list(primitive_jvps.items()) if p not in seen
          and "bind" not in vars(p) and not _in_jax(unwrap(rule), "jax")]


@dataclasses.dataclass
class _Static:
  """A ``nondiff_argnums`` argument, kept whole (a leaf of no pytree)."""
  value: Any


_unwrap_static = lambda x: x.value if isinstance(x, _Static) else x


@dataclasses.dataclass
class Sample:
  """One call's inputs: per leaf of ``(args, kwargs)`` a value, a
  ``ShapeDtypeStruct`` (traced) or None (non-array, in ``statics``)."""
  fn: Any
  treedef: Any
  leaves: list[Any]
  statics: dict[int, Any]
  source: str
  test: str
  signature: Any = None  # pytree structure, shapes and dtypes
  region: Any = None  # per floating leaf: (any < 0, any > 0, any |x| > 1)
  seconds: float = 0.0  # CPU time the call took in the test

  @property
  def concrete(self) -> bool:
    return not any(isinstance(x, jax.ShapeDtypeStruct) for x in self.leaves)

  @property
  def size(self) -> int:
    return sum(math.prod(np.shape(x)) for x in self.leaves if x is not None)

  def types(self) -> list[str]:
    return [type(x).__name__ if isinstance(x, _SCALARS) else core.ShapedArray(
        np.shape(x), x.dtype).str_short(short_dtypes=True)
            for x in self.leaves if x is not None]

  def call(self, arrays: list[Any], fn: Any = None) -> Any:
    """Calls ``fn`` (this call's) with ``arrays`` for the array leaves."""
    it = iter(arrays)
    args, kwargs = jax.tree.unflatten(self.treedef, [
        self.statics[i] if x is None else next(it)
        for i, x in enumerate(self.leaves)])
    return (fn or self.fn)(*map(_unwrap_static, args), **kwargs)


@dataclasses.dataclass
class RecordedRule:
  """A rule the tests called: who it is, how often, and its samples."""
  identity: RuleIdentity
  calls: int = 0
  samples: dict[Any, Sample] = dataclasses.field(default_factory=dict)
  full: bool = False  # as many concrete samples as kept
  tests_done: set[str] = dataclasses.field(default_factory=set)  # once full
  # per pytree structure: the in_axes under vmap; the inputs differentiated
  batched: dict[Any, set[tuple]] = dataclasses.field(default_factory=dict)
  differentiated: dict[Any, set[int]] = dataclasses.field(
      default_factory=dict)
  refused: bool = False  # a primitive whose jvp raised in the tests


def _region(leaves: list[Any]) -> tuple:
  arrays = [np.asarray(x).real for x in leaves if x is not None
            and not isinstance(x, jax.ShapeDtypeStruct)
            and np.asarray(x).dtype.kind in "fc" and np.size(x)]
  return tuple((bool(np.any(a < 0)), bool(np.any(a > 0)),
                bool(np.any(np.abs(a) > 1))) for a in arrays)


def _batch_axis(x: Any) -> int | None:
  return axis if isinstance(getattr(x, "_trace", None), BatchTrace) and \
      isinstance(axis := getattr(x, "batch_dim", None), int) else None


def _differentiated(x: Any) -> bool:
  return isinstance(getattr(x, "_trace", None), (JVPTrace, LinearizeTrace))


def _leaf_of(x: Any) -> tuple[Any, str]:
  """``(what a sample keeps of a leaf, "eager"|"known"|"traced"|"static")``."""
  if isinstance(x, core.Tracer):
    aval = jax.typeof(x)
    if not hasattr(aval, "shape") or jnp.issubdtype(aval.dtype,
                                                    jax.dtypes.extended):
      return None, "static"
    if (value := x.to_concrete_value()) is not None:
      return np.array(value, dtype=aval.dtype), "known"
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype), "traced"
  if isinstance(x, _SCALARS):
    return x, "eager"
  if isinstance(x, (jax.Array, np.ndarray, np.generic)) and not (
      jnp.issubdtype(x.dtype, jax.dtypes.extended)):
    return np.array(x), "eager"
  return None, "static"


class CallRecorder:
  """Records the calls of custom rules while installed (``include_jax``: JAX's
  too, else counted in `skipped_rules`; ``values_inside_jit``: `_when_run`)."""

  def __init__(self, samples: int = 3, include_jax: bool = False,
               values_inside_jit: bool = True) -> None:
    self.max_samples = max(1, samples)
    self.include_jax, self.values_inside_jit = include_jax, values_inside_jit
    self.rules: dict[Any, RecordedRule] = {}
    self.skipped_rules: set[Any] = set()  # out of scope, by key
    self.test, self.calls, self.seconds = "", 0, 0.0  # (s spent recording)
    self.errors: list[str] = []
    self._known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    self._saved: list[tuple[Any, Any]] = []
    self._watched: weakref.WeakSet = weakref.WeakSet()
    self._jvps_seen = -1
    self._arrived: list[tuple[RecordedRule, Sample]] = []  # (`_when_run`)

  def watch(self) -> None:
    """Wraps the ``bind`` of `library_primitives` registered since."""
    if self._saved and len(primitive_jvps) != self._jvps_seen:
      self._jvps_seen = len(primitive_jvps)
      for prim in library_primitives(self._watched):
        self._watched.add(prim)
        prim.bind = self._wrap(prim.bind, "Primitive", prim)

  def install(self) -> None:
    """Wraps the four ``__call__`` methods (idempotent), and `watch`."""
    for cls, kind in () if self._saved else (
        (jax.custom_jvp, "jax.custom_jvp"), (jax.custom_vjp, "jax.custom_vjp"),
        (_common.Decorated, None), (primitive.HiPrim, "HiPrim")):
      self._saved.append((cls, cls.__dict__["__call__"]))
      setattr(cls, "__call__", self._wrap(self._saved[-1][1], kind))
    self.watch()

  def remove(self) -> None:
    """Restores what `install` and `watch` wrapped."""
    with contextlib.suppress(Exception):  # (a test's callback that failed)
      jax.effects_barrier()  # (the values `_when_run` still sends)
    self._take_arrived()
    while self._saved:
      cls, original = self._saved.pop()
      setattr(cls, "__call__", original)
    for prim in self._watched:
      vars(prim).pop("bind", None)
    self._watched, self._jvps_seen = weakref.WeakSet(), -1

  def _wrap(self, original, kind: str | None, prim: Any = None):
    @functools.wraps(original)
    def __call__(*args, **kwargs):  # noqa: N807
      __tracebackhide__ = True  # pylint: disable=unused-variable
      sample = (self.record(kind or f"hijax.{args[0].kind}", args[0],
                            args[1:], kwargs) if prim is None else
                self.record("Primitive", PrimitiveCall(prim, kwargs), args, {}))
      start = time.process_time()
      try:
        out = original(*args, **kwargs)
      except Exception:
        if prim is not None and (rule := self._known.get(prim)) and any(
            map(_differentiated, args)):
          rule.refused = True  # (its rule raises on purpose)
        raise
      if sample is not None:
        sample.seconds = time.process_time() - start
        if self.values_inside_jit and prim is not None and (
            sample.source == "traced") and not any(
            _batch_axis(a) is not None for a in args):
          self._when_run(sample, args)
      return out
    return __call__

  def _when_run(self, sample: Sample, args: tuple) -> None:
    """Has a bind traced in ``jit`` (not ``vmap``) of a kept sample's types
    send its inputs when its program first runs (taken in at a later call)."""
    rule = self._known.get(sample.fn.prim)
    if rule is None or sample.size > MAX_ELEMENTS or not any(
        s.signature == sample.signature and not s.concrete
        for s in rule.samples.values()):
      return
    arrays = [x for x, kept in zip(jax.tree.leaves((args, {})),
                                   sample.leaves) if kept is not None]
    sent = []

    def arrived(*values):
      if self._saved and not sent:
        it = iter(values)
        sent.append((rule, dataclasses.replace(
            sample, source="traced, values at run time", leaves=[
                x if x is None else np.array(next(it))
                for x in sample.leaves])))
        self._arrived.append(sent[0])
    try:
      jax.debug.callback(arrived, *arrays)
    except Exception as e:  # pylint: disable=broad-except  (never break a test)
      self.errors.append(f"{rule.identity.name}: values at run time: {e}")

  def _take_arrived(self) -> None:
    while self._arrived:
      self._keep(*self._arrived.pop())

  def record(self, kind: str, obj: Any, args: tuple,
             kwargs: dict) -> Sample | None:
    """Records one call (the sample made of it, if any); never raises."""
    start, sample = time.perf_counter(), None
    self.calls += 1
    try:
      self._take_arrived()
      key = (type(obj) if kind == "HiPrim" else obj.prim
             if kind == "Primitive" else obj)
      try:
        if (rule := self._known.get(key, self)) is self:
          rule = self._known[key] = self._new_rule(identity_of(kind, obj))
      except TypeError:  # not weakly referenceable: looked up each time
        rule = self._new_rule(identity_of(kind, obj))
      if rule is not None:
        rule.calls += 1
        if (not rule.full or self.test not in rule.tests_done
            or any(_batch_axis(a) is not None for a in args)
            or kind == "Primitive" and any(map(_differentiated, args))):
          sample = self._sample(rule, obj, args, kwargs)
    except Exception as e:  # pylint: disable=broad-except  (never break a test)
      if len(self.errors) < 20:
        self.errors.append(f"{kind} {obj!r:.80}: {type(e).__name__}: {e}")
    self.seconds += time.perf_counter() - start
    return sample

  def _new_rule(self, identity: RuleIdentity | None) -> RecordedRule | None:
    if identity is not None and identity.in_jax and not self.include_jax:
      self.skipped_rules.add(identity.key)
    elif identity is not None:
      return self.rules.setdefault(identity.key, RecordedRule(identity))
    return None

  def _sample(self, rule: RecordedRule, obj: Any, args: tuple,
              kwargs: dict) -> Sample | None:
    nondiff = getattr(obj, "nondiff_argnums", ())
    if nondiff and kwargs:  # keywords that name positions (as JAX does)
      bound = inspect.signature(rule.identity.fun).bind(*args, **kwargs)
      args, kwargs = bound.args, bound.kwargs
    flat, treedef = jax.tree.flatten((tuple(
        _Static(a) if i in nondiff else a for i, a in enumerate(args)),
                                      kwargs))
    kept = [_leaf_of(x) for x in flat]
    if any(how == "static" and isinstance(x, core.Tracer)
           for x, (_, how) in zip(flat, kept)):
      return None  # a traced value of a type that cannot be drawn
    leaves, sources = [k for k, _ in kept], {how for _, how in kept}
    statics = {i: _unwrap_static(x) for i, (x, (_, how))
               in enumerate(zip(flat, kept)) if how == "static"}
    arrays = [x for i, x in enumerate(flat) if i not in statics]
    rule.differentiated.setdefault(treedef, set()).update(
        i for i, x in enumerate(arrays) if _differentiated(x))
    axes, patterns = tuple(map(_batch_axis, arrays)), rule.batched.setdefault(
        treedef, set())
    if any(a is not None for a in axes) and len(patterns) < 8:
      patterns.add(axes)
    sample = Sample(obj, treedef, leaves, statics, (
        "traced" if "traced" in sources else "traced, values known"
        if "known" in sources else "eager"), self.test, (treedef, tuple(
            None if x is None else (np.shape(x), str(getattr(
                x, "dtype", type(x).__name__))) for x in leaves)))
    if sample.concrete and sample.size > MAX_ELEMENTS:
      sample.leaves = [x if x is None else jax.ShapeDtypeStruct(
          np.shape(x), np.asarray(x).dtype) for x in leaves]
      sample.source = "too large to keep"
    self._keep(rule, sample)
    if rule.full and sample.concrete:
      rule.tests_done.add(self.test)
    return sample

  def _keep(self, rule: RecordedRule, sample: Sample) -> None:
    """Keeps ``sample`` if the samples get more varied, in place of one of its
    types without values, else of the one it varies most."""
    sample.region = _region(sample.leaves)

    def variety(ss):  # with values, distinct types, functions, tests, regions
      return (sum(s.concrete for s in ss), len({s.signature for s in ss}),
              len({s.test.split("[", 1)[0] for s in ss}),
              len({s.test for s in ss}), len({s.region for s in ss}))
    key, kept = (sample.signature, sample.test, sample.region), rule.samples
    same = [k for k, s in kept.items() if s.signature == sample.signature]
    if same and not sample.concrete:  # the same types: nothing new
      return
    out = next((k for k in same if not kept[k].concrete), None)
    if out is None and key in kept:
      return
    if out is None and len(kept) >= self.max_samples:
      varied = lambda k: variety(
          [s for j, s in kept.items() if j != k] + [sample])
      out = max(kept, key=varied)
      if varied(out) <= variety(list(kept.values())):
        return
    kept.pop(out, None)
    kept[key] = sample
    rule.full = (len(kept) >= self.max_samples
                 and all(s.concrete for s in kept.values()))
