"""Recording the calls of custom derivative rules while a test suite runs
(for ``pytest --hijax-check-rules``, `hijax.testing._plugin`).

`CallRecorder.install` wraps the ``__call__`` of ``jax.custom_jvp``,
``jax.custom_vjp``, hijax's decorators and `HiPrim` (so a subclass that
overrides ``__call__`` itself is not seen), and `CallRecorder.remove` puts
them back. Each call is attributed to a rule, found once per decorated
object or primitive class (`._rule_identity`), and the rule keeps a
bounded sample of its inputs, at most ``samples`` of them, chosen to vary
(`variety`): calls with values before calls seen as types only, then
distinct input signatures (pytree structure, shapes and dtypes), distinct
test functions, distinct tests, and distinct regions of the inputs (signs,
magnitude above 1). A call replaces a kept sample only where that makes
the samples more varied, so a smoke test and its neighbour do not fill
the slots before the tests that exercise the rule's domain. The
``in_axes`` of the calls made under ``vmap`` are kept too (`RecordedRule.
batched`): the batching patterns the suite used.

What a sample holds:

* a call made eagerly: the values (copied to NumPy, so that a later
  donation or mutation does not change them);
* a call made while a transformation traces (inside ``jit``, ``grad``,
  ``vmap``, ``scan``...): the values where JAX still knows them (an eager
  ``grad``, ``jvp`` or ``linearize`` traces with concrete primal values),
  else only the types; `hijax.testing._plugin` then finds values for them
  (see `Sample.values`);
* non-array arguments (``nondiff_argnums``, functions, static fields of a
  pytree) by reference, to be passed again as they were.

A rule whose samples are all concrete costs one dictionary lookup per call
from then on; recording never raises into the test (an error is counted and
the call goes on).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax import primitive
from hijax._decorators import _common
from hijax._internals import core
from hijax._internals.batching import BatchTrace
from hijax.testing._plugin import _rule_identity
from hijax.testing._plugin._rule_identity import RuleIdentity

# A sample with more elements than this keeps only its types (checking it
# would take long; a smaller one of the same rule is preferred).
MAX_ELEMENTS = 100_000

_SCALARS = (bool, int, float, complex)


class _Static:
  """A ``nondiff_argnums`` argument, kept whole (a leaf of no pytree)."""

  def __init__(self, value: Any) -> None:
    self.value = value


def _unwrap_static(x: Any) -> Any:
  return x.value if isinstance(x, _Static) else x


@dataclasses.dataclass
class Sample:
  """The inputs of one call of a rule (see the module docstring).

  Attributes:
    fn: what was called (the decorated function, the `HiPrim` instance).
    treedef: the structure of ``(args, kwargs)``.
    leaves: per leaf: a NumPy array or Python scalar (an input), a
      ``jax.ShapeDtypeStruct`` (a traced input whose value is unknown), or
      None (a non-array leaf, in ``statics``).
    statics: the non-array leaves, by position.
    source: ``"eager"``, ``"traced, values known"`` or ``"traced"``.
    test: the test that made the call.
  """
  fn: Any
  treedef: Any
  leaves: list[Any]
  statics: dict[int, Any]
  source: str
  test: str
  signature: Any = None  # pytree structure, shapes and dtypes
  region: Any = None  # per floating leaf: (any < 0, any > 0, any |x| > 1)

  @property
  def concrete(self) -> bool:
    return not any(isinstance(x, jax.ShapeDtypeStruct) for x in self.leaves)

  @property
  def size(self) -> int:
    return sum(math.prod(np.shape(x)) for x in self.leaves if x is not None)

  def types(self) -> list[str]:
    """One short type per array input, like ``f32[3]``."""
    return [_short_type(x) for x in self.leaves if x is not None]

  def call(self, arrays: list[Any]) -> Any:
    """Calls ``fn`` with ``arrays`` in place of the array leaves."""
    it = iter(arrays)
    leaves = [self.statics[i] if x is None else next(it)
              for i, x in enumerate(self.leaves)]
    args, kwargs = jax.tree.unflatten(self.treedef, leaves)
    return self.fn(*map(_unwrap_static, args), **kwargs)


def _short_type(x: Any) -> str:
  if isinstance(x, _SCALARS):
    return type(x).__name__
  dtype = np.dtype(x.dtype)
  short = {"f": "f", "c": "c", "i": "i", "u": "u", "b": "bool"}.get(
      dtype.kind, dtype.name)
  bits = "" if short == "bool" else str(dtype.itemsize * 8)
  if dtype.name == "bfloat16":
    short, bits = "bf", "16"
  return f"{short}{bits}[{','.join(map(str, np.shape(x)))}]"


@dataclasses.dataclass
class RecordedRule:
  """A rule the tests called: who it is, how often, and its samples."""
  identity: RuleIdentity
  calls: int = 0
  samples: dict[Any, Sample] = dataclasses.field(default_factory=dict)
  full: bool = False  # as many concrete samples as kept
  # the tests whose calls were weighed once the rule was full: their further
  # calls cost a lookup
  tests_done: set[str] = dataclasses.field(default_factory=set)
  # per pytree structure, the in_axes (one per array input, an int or None)
  # of the calls made under vmap
  batched: dict[Any, set[tuple]] = dataclasses.field(default_factory=dict)

  @property
  def first_test(self) -> str:
    return next(iter(self.samples.values())).test if self.samples else ""


def _test_function(nodeid: str) -> str:
  return nodeid.split("[", 1)[0]


def variety(samples: list[Sample]) -> tuple[int, ...]:
  """How varied ``samples`` are, compared as a tuple: the number with
  values, then of distinct signatures, test functions, tests, regions."""
  return (sum(s.concrete for s in samples),
          len({s.signature for s in samples}),
          len({_test_function(s.test) for s in samples}),
          len({s.test for s in samples}), len({s.region for s in samples}))


def _region(leaves: list[Any]) -> tuple:
  out = []
  for x in leaves:
    if x is None or isinstance(x, jax.ShapeDtypeStruct):
      continue
    a = np.asarray(x)
    if a.dtype.kind in "fc" and a.size:
      a = a.real
      out.append((bool(np.any(a < 0)), bool(np.any(a > 0)),
                  bool(np.any(np.abs(a) > 1))))
  return tuple(out)


def _batched(args: tuple) -> bool:
  return any(isinstance(getattr(a, "_trace", None), BatchTrace)
             for a in args)


def _is_extended(dtype: Any) -> bool:
  """A PRNG key's dtype, or another that is not a number: kept as it is."""
  return jnp.issubdtype(dtype, jax.dtypes.extended)


def _leaf_of(x: Any) -> tuple[Any, str]:
  """``(what the sample keeps, how it was known)`` for one argument leaf:
  the value (``"eager"``), a traced value JAX knows (``"known"``), the type
  of a traced value (``"traced"``), or ``(None, "static")``."""
  if isinstance(x, core.Tracer):
    aval = jax.typeof(x)
    if not hasattr(aval, "shape") or _is_extended(aval.dtype):
      return None, "static"
    value = x.to_concrete_value()
    if value is not None:
      return np.array(value, dtype=aval.dtype), "known"
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype), "traced"
  if isinstance(x, _SCALARS):
    return x, "eager"
  if isinstance(x, (jax.Array, np.ndarray, np.generic)):
    if _is_extended(x.dtype):
      return None, "static"
    return np.array(x), "eager"
  return None, "static"


class CallRecorder:
  """Records the calls of custom rules while installed (see the module
  docstring).

  Args:
    samples: how many distinct input signatures to keep per rule.
    include_jax: also record the rules defined in JAX, jaxlib and hijax
      (otherwise they are counted in `skipped_rules` only).
  """

  def __init__(self, samples: int = 3, include_jax: bool = False) -> None:
    self.max_samples = max(1, samples)
    self.include_jax = include_jax
    self.rules: dict[Any, RecordedRule] = {}
    self.skipped_rules: set[Any] = set()  # out of scope, by key
    self.calls = 0
    self.errors: list[str] = []
    self.seconds = 0.0  # spent recording
    self.test = ""
    self._by_object: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    self._by_class: dict[type, RecordedRule | None] = {}
    self._saved: list[tuple[Any, str, Any]] = []

  # --- installing ----------------------------------------------------------

  def install(self) -> None:
    """Wraps the four ``__call__`` methods (idempotent)."""
    if self._saved:
      return
    targets = [(jax.custom_jvp, "jax.custom_jvp"),
               (jax.custom_vjp, "jax.custom_vjp"),
               (_common.Decorated, None),  # hijax.custom_jvp / custom_vjp
               (primitive.HiPrim, "HiPrim")]
    for cls, kind in targets:
      original = cls.__dict__["__call__"]
      self._saved.append((cls, "__call__", original))
      setattr(cls, "__call__", self._wrap(original, kind))

  def remove(self) -> None:
    """Restores the ``__call__`` methods `install` wrapped."""
    while self._saved:
      cls, name, original = self._saved.pop()
      setattr(cls, name, original)

  def _wrap(self, original: Callable, kind: str | None) -> Callable:
    record = self.record

    @functools.wraps(original)
    def __call__(obj, *args, **kwargs):  # noqa: N807
      __tracebackhide__ = True  # pylint: disable=unused-variable
      record(kind or f"hijax.{obj.kind}", obj, args, kwargs)
      return original(obj, *args, **kwargs)
    return __call__

  # --- recording -----------------------------------------------------------

  def record(self, kind: str, obj: Any, args: tuple, kwargs: dict) -> None:
    """Records one call; never raises."""
    start = time.perf_counter()
    self.calls += 1
    try:
      rule = self._rule_of(kind, obj)
      if rule is not None:
        rule.calls += 1
        if (not rule.full or self.test not in rule.tests_done
            or _batched(args)):
          self._sample(rule, obj, args, kwargs)
    except Exception as e:  # pylint: disable=broad-except  (never break a test)
      if len(self.errors) < 20:
        self.errors.append(f"{kind} {obj!r:.80}: {type(e).__name__}: {e}")
    self.seconds += time.perf_counter() - start

  def _rule_of(self, kind: str, obj: Any) -> RecordedRule | None:
    if kind == "HiPrim":
      cls = type(obj)
      try:
        return self._by_class[cls]
      except KeyError:
        rule = self._by_class[cls] = self._new_rule(
            _rule_identity.of_class(cls))
        return rule
    try:
      return self._by_object[obj]
    except KeyError:
      pass
    except TypeError:  # not weakly referenceable: look it up each time
      return self._new_rule(_rule_identity.of_function(kind, obj))
    rule = self._by_object[obj] = self._new_rule(
        _rule_identity.of_function(kind, obj))
    return rule

  def _new_rule(self, identity: RuleIdentity | None) -> RecordedRule | None:
    if identity is None:  # hijax's own machinery (the decorators' primitives)
      return None
    if identity.in_jax and not self.include_jax:
      self.skipped_rules.add(identity.key)
      return None
    rule = self.rules.get(identity.key)
    if rule is None:
      rule = self.rules[identity.key] = RecordedRule(identity)
    return rule

  def _sample(self, rule: RecordedRule, obj: Any, args: tuple,
              kwargs: dict) -> None:
    nondiff = getattr(obj, "nondiff_argnums", ())
    if nondiff:
      if kwargs:  # keywords that name positions (as JAX resolves them)
        args, kwargs = rule.identity.bind(args, kwargs)
      args = tuple(_Static(a) if i in nondiff else a
                   for i, a in enumerate(args))
    flat, treedef = jax.tree.flatten((args, kwargs))
    leaves, statics, sources, axes = [], {}, set(), []
    for i, x in enumerate(flat):
      kept, source = _leaf_of(x)
      if source == "static":
        if isinstance(x, core.Tracer):
          return  # a traced value of a type that cannot be drawn
        statics[i] = _unwrap_static(x) if isinstance(x, _Static) else x
      else:
        axis = getattr(x, "batch_dim", None) if isinstance(
            getattr(x, "_trace", None), BatchTrace) else None
        axes.append(axis if isinstance(axis, int) else None)
      sources.add(source)
      leaves.append(kept)
    if any(a is not None for a in axes):
      patterns = rule.batched.setdefault(treedef, set())
      if len(patterns) < 8:
        patterns.add(tuple(axes))
    signature = (treedef, tuple(None if x is None else (
        np.shape(x), str(getattr(x, "dtype", type(x).__name__)))
                               for x in leaves))
    source = ("traced" if "traced" in sources else
              "traced, values known" if "known" in sources else "eager")
    sample = Sample(obj, treedef, leaves, statics, source, self.test,
                    signature)
    if sample.concrete and sample.size > MAX_ELEMENTS:
      sample.leaves = [x if x is None else jax.ShapeDtypeStruct(
          np.shape(x), np.asarray(x).dtype) for x in leaves]
      sample.source = "too large to keep"
    sample.region = _region(sample.leaves)
    self._keep(rule, sample)
    rule.full = (len(rule.samples) >= self.max_samples
                 and all(s.concrete for s in rule.samples.values()))
    if rule.full and sample.concrete:
      rule.tests_done.add(self.test)

  def _keep(self, rule: RecordedRule, sample: Sample) -> None:
    """Keeps ``sample`` where that makes the rule's samples more varied
    (see the module docstring)."""
    key = (sample.signature, sample.test, sample.region)
    same = [k for k, s in rule.samples.items()
            if s.signature == sample.signature]
    if not sample.concrete and same:  # the same types: nothing new
      return
    for k in same:  # a call with values replaces one of the same types
      if not rule.samples[k].concrete:
        del rule.samples[k]
        rule.samples[key] = sample
        return
    if key in rule.samples:
      return
    if len(rule.samples) < self.max_samples:
      rule.samples[key] = sample
      return
    kept = list(rule.samples.items())
    best, best_variety = None, variety([s for _, s in kept])
    for k, _ in kept:
      v = variety([s for j, s in kept if j != k] + [sample])
      if v > best_variety:
        best, best_variety = k, v
    if best is not None:
      del rule.samples[best]
      rule.samples[key] = sample
