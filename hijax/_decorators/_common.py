"""What `hijax.custom_vjp` and `hijax.custom_jvp` share: the decorator object
(`Decorated`) and `Call`, one call signature of the decorated function.

A call with no transformation running calls the function itself, as JAX's
decorators do. Otherwise it binds the primitive of a `Call` for the
signature: the running one when a rule calls the function itself, a kept
one (`Decorated._calls_key`), or a new one, which traces the function (and
the rules, if they may close over traced values) once. A function that
cannot be traced with abstract arguments is handed to JAX's own decorator.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.custom_derivatives import SymbolicZero

from hijax._decorators import _tracing
from hijax._decorators._arguments import (Signature, function_name,
                                          nondiff_positions, plain_arity,
                                          resolve)
from hijax._decorators._batching import BatchRules
from hijax._decorators._dce import PrunesOutputs
from hijax._decorators._outputs import RuleOwner
from hijax._function_key import Uncacheable, by_value
from hijax._internals import config, core
from hijax._util import is_float0, is_zero, store_bounded
from hijax.autodiff import instantiate_zeros
from hijax.primitive import HiPrim

__all__ = ["Decorated", "Call", "CallPrimitive", "example_of",
           "to_rule_zeros"]


def example_of(aval: Any) -> Any:
  """An abstract stand-in for a value of type ``aval`` to trace a rule with
  (a float0 array itself, which has no abstract form ``make_jaxpr`` takes)."""
  if is_float0(aval):
    return np.zeros(aval.shape, aval.dtype)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


def to_rule_zeros(tree: Any, symbolic_zeros: bool) -> Any:
  """Tangents or cotangents as a user rule sees them: hijax's `Zero` becomes
  a ``jax.custom_derivatives.SymbolicZero`` with ``symbolic_zeros``, an array
  of zeros otherwise."""
  def convert(x):
    if not is_zero(x):
      return x
    return SymbolicZero(x.aval) if symbolic_zeros else instantiate_zeros(x)
  return jax.tree.map(convert, tree, is_leaf=is_zero)


class CallPrimitive[C: Call](PrunesOutputs, BatchRules, HiPrim):
  """The primitive of one call signature of a decorated function: the base
  of `custom_jvp`'s and `custom_vjp`'s, which add their rules. Its inputs are
  the function's differentiable arguments and, last, the tuple of traced
  values it (or a rule) closes over; ``expand`` runs the traced function."""

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]
  _call: C

  def __init__(self, call: C, in_avals: tuple[Any, ...], out_aval: Any) -> None:
    self.in_avals, self.out_aval = in_avals, out_aval
    self.params = dict(fun=call.name, _call=call)
    self.effects = call.effects
    super().__init__()

  def expand(self, *args: Any) -> Any:
    *xs, hvals = args
    return self._call.primal.as_call(hvals, *xs)

  def check_args(self, args: tuple[Any, ...]) -> Sequence[Any]:
    """A Python scalar argument reaches the rules as it is, as JAX's
    decorators hand it on (an eager ``jax.jvp`` whose rules compute on
    Python floats returns Python floats, as with JAX)."""
    checked = super().check_args(args)
    given = args if self._args_are_leaves else jax.tree.leaves(args)
    return [x if type(x) in (bool, int, float, complex) else c
            for x, c in zip(given, checked)]


class Call:
  """One call signature of a decorated function: the traced function, the
  traced values hoisted out of it and its rules, and the primitive.

  ``rules`` maps a rule's name to its `Traced` form when the rule closes over
  a traced value (it must then be evaluated with the hoisted inputs); a rule
  absent from it is called directly, as JAX's decorators call it.
  """

  primitive_class: type

  def __init__(self, decorated: Decorated, signature: Signature,
               statics: list[Any], diff_args: tuple[Any, ...], key: Any):
    self.decorated, self.signature = decorated, signature
    self.statics, self.key = statics, key
    self.name = function_name(decorated.fun)
    self.hoisted = _tracing.Hoisted()
    fun = decorated.fun
    self.primal, _ = _tracing.trace(
        self.name, lambda *d: fun(*signature.merge(statics, d)), diff_args,
        self.hoisted)
    leaves, self.in_tree = jax.tree.flatten(diff_args)
    self.in_avals_flat = [core.typeof(x) for x in leaves]
    self.owner = RuleOwner(
        decorated.kind, fun, self.name, signature.names, self.in_tree,
        self.in_avals_flat, self.primal.out_tree, self.primal.out_avals)
    self.rules: dict[str, _tracing.Traced] = {}
    self.effects = self.primal.effects
    # (set before the rules are traced: a rule that calls the function
    # itself binds this call's primitive while it is traced again)
    self._instance: Any = None
    self.trace_rules(diff_args)  # may add hoisted values

  # --- tracing the rules once -------------------------------------------------

  def trace_rules(self, diff_args: tuple[Any, ...]) -> None:
    """Traces the rules to find the traced values they close over."""
    raise NotImplementedError

  def _trace_rule(self, name: str, fn: Callable[..., Any],
                  args: tuple[Any, ...], mode: str):
    """``(Traced, shape, reentered)`` of a rule, or None where it cannot be
    traced here (it then runs directly, when it is used, as in JAX)."""
    entry = _tracing.Entry(self.decorated, self.key, self,
                           self.hoisted.values, mode)
    before = len(self.hoisted)
    try:
      with _tracing.running(entry):
        traced, shape = _tracing.trace(name, fn, args, self.hoisted)
    except Exception:  # noqa: BLE001 (reported when the rule is used)
      self.hoisted.truncate(before)
      return None
    return traced, shape, entry.reentered

  def _trace_first_and_again(
      self, traces: list[tuple[str, Any, Callable[..., Any], tuple[Any, ...]]]
  ) -> None:
    """Keeps the rules that close over traced values in `rules`.

    ``traces`` holds ``(name, first, fn, args)``: what `_trace_rule` gave in
    mode ``"inline"`` (calls of the function itself evaluated in place, to
    find every hoisted value first), the rule and its example arguments. A
    rule that called the function itself is traced again with those calls
    bound to this call's primitive (its inputs are now known), so that the
    rule's own derivatives use the function's rules.
    """
    n_hoisted = len(self.hoisted)
    for name, first, fn, args in traces:
      if first is None or not first[0].hoists:
        continue
      traced, _, reentered = first
      if reentered:
        again = self._trace_rule(name, fn, args, "bind")
        if again is not None and len(self.hoisted) == n_hoisted:
          traced = again[0]
        else:  # keep the first tracing: its first derivatives are the same
          self.hoisted.truncate(n_hoisted)
      self.rules[name] = traced

  # --- binding --------------------------------------------------------------------

  @property
  def instance(self) -> Any:
    """The primitive of this call (built once: its types are now fixed)."""
    if self._instance is None:
      in_avals = (*jax.tree.unflatten(self.in_tree, self.in_avals_flat),
                  tuple(core.typeof(h) for h in self.hoisted.values))
      out_aval = jax.tree.unflatten(self.primal.out_tree, self.primal.out_avals)
      self._instance = self.primitive_class(self, in_avals, out_aval)
    return self._instance

  def bind(self, diff_args: tuple[Any, ...], hoisted_values: Sequence[Any]
           ) -> Any:
    return self.instance(*diff_args, tuple(hoisted_values))

  @contextlib.contextmanager
  def running(self, hoisted_values: Sequence[Any]):
    """While a rule runs directly: a call of the function itself from inside
    it, with this signature, binds this call's primitive."""
    entry = _tracing.Entry(self.decorated, self.key, self, hoisted_values,
                           "bind")
    with _tracing.running(entry):
      yield

  def full_args(self, diff_args: Sequence[Any]) -> tuple[Any, ...]:
    """All the arguments of the function, the static ones put back."""
    return self.signature.merge(self.statics, diff_args)

  # --- closed-over values being differentiated --------------------------------

  def primal_of_hoisted(self, xs: Sequence[Any], hvals: Sequence[Any],
                        which: list[int]) -> Callable[..., Any]:
    """The function of the hoisted values ``which`` (the arguments held at
    ``xs``): the rules give no derivative with respect to closed-over values
    (nor traced values in non-differentiable arguments); its code does."""
    def f(*chosen):
      values = list(hvals)
      for i, v in zip(which, chosen):
        values[i] = v
      return self.primal(values, *xs)
    return f

  def closure_error(self, e: Exception) -> Exception:
    """``e`` with the explanation of what was being differentiated."""
    return type(e)(
        f"{self.owner} closes over traced values that are being "
        "differentiated. Its rules give derivatives with respect to its "
        f"arguments only, so hijax differentiates {self.name}'s own code with "
        "respect to those values, which failed:\n\n"
        f"{e}\n\nPass them as arguments instead (jax.closure_convert finds "
        f"them) and return their cotangents from the rule.")


_CALLS_KEPT = 64
"""Calls kept per decorated function (its argument types and statics)."""

_rules_version = [0]
"""Bumped whenever a decorated function's rules are (re)defined: a kept call
of another function whose code calls this one then stops being found."""


class Decorated:
  """The part of `hijax.custom_vjp` and `hijax.custom_jvp` that is the same.

  A `Call` is kept for the next call with the same key (`_calls_key`): the
  function's code and what it reads (`hijax._function_key.by_value`), the
  static arguments, the argument types, JAX's trace context and the rules'
  version; a call whose function or rules close over traced values is not
  kept (those values belong to one trace).
  """

  kind: str = ""
  _call_class: type[Call]
  fun: Callable[..., Any]
  nondiff_argnums: tuple[int, ...]
  batch_rule: Callable[..., Any] | None = None

  def __init__(self, fun: Callable[..., Any],
               nondiff_argnums: Sequence[int] = (),
               nondiff_argnames: Sequence[str] = ()) -> None:
    functools.update_wrapper(self, fun)
    self.fun = fun
    self.nondiff_argnums = nondiff_positions(
        fun, nondiff_argnums, nondiff_argnames, f"hijax.{self.kind}")
    self._calls: dict[Any, Call] = {}
    self._arity = plain_arity(fun)
    self._signatures: dict[int, Signature] = {}

  # Keyed by identity in what a function reads (`hijax._function_key`): the
  # rules are read when they run, and redefining them changes the version.
  def __eq__(self, other: object) -> bool:
    return self is other

  def __hash__(self) -> int:
    return id(self)

  def _rules_defined(self) -> None:
    _rules_version[0] += 1

  def __getattr__(self, name: str) -> Any:
    # As JAX's decorators do: a `def...` method of a decorated decorated
    # function (a custom_vmap inside, say) is reached through this one.
    if name.startswith("def") and "fun" in vars(self):
      return getattr(self.fun, name)
    raise AttributeError(
        f"{type(self).__name__!r} object has no attribute {name!r}")

  def defbatch(self, rule: Callable[..., Any]) -> Callable[..., Any]:
    """Defines how ``vmap`` computes the function on a batch.

    ``rule(axis_size, in_batched, *args) -> (out, out_batched)``, the
    signature of ``jax.custom_batching.custom_vmap``'s ``def_vmap``: ``args``
    are all the arguments of the function, a batched one with its batch axis
    first; ``in_batched`` has one entry per argument, a pytree of booleans
    like it (True for a batched leaf); ``out_batched`` says the same of
    ``out``, as a pytree of booleans like it or one boolean for all of it.

    The derivatives of the batched function (``grad`` of ``vmap``, ``vmap``
    of ``grad``, any order) are the function's own rules, vmapped, so the
    rule need not be differentiable. The rule is used when only arguments are
    batched; when a value the function closes over is batched, the function
    itself is vmapped instead. Returns ``rule``, so that it can be used as a
    decorator.
    """
    self.batch_rule = rule
    self._rules_defined()
    return rule

  def _has_rules(self) -> bool:
    raise NotImplementedError

  def _missing_rules_error(self) -> Exception:
    raise NotImplementedError

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if not self._has_rules():
      raise self._missing_rules_error()
    if kwargs or len(args) != self._arity:
      args = resolve(self.fun, args, kwargs, f"hijax.{self.kind}")
    if core.trace_state_clean():
      return self.fun(*args)  # eagerly, as JAX's decorators do
    signature = self._signatures.get(len(args))
    if signature is None:
      signature = self._signatures[len(args)] = Signature(
          self.fun, self.nondiff_argnums, len(args))
    statics, diff_args = signature.split(args)
    key = _tracing.signature_key(statics, diff_args)
    entry = _tracing.find(self, key)
    if entry is not None:
      entry.reentered = True
      if entry.mode == "inline":
        return entry.call.primal(entry.hoisted_values, *diff_args)
      return entry.call.bind(diff_args, entry.hoisted_values)
    calls_key = self._calls_key(statics, key)
    call = self._calls.get(calls_key) if calls_key is not None else None
    if call is None:
      try:
        call = self._call_class(self, signature, statics, diff_args, key)
      except jax.errors.ConcretizationTypeError:
        # The function branches in Python on the values of its arguments, so
        # it cannot be traced once for all values of their types. JAX's own
        # decorator runs it on concrete values under eager autodiff; do that.
        return self.as_jax()(*args)
      if calls_key is not None and not len(call.hoisted) and not call.rules:
        store_bounded(self._calls, calls_key, call, _CALLS_KEPT)
    return call.bind(diff_args, call.hoisted.values)

  def _calls_key(self, statics: list[Any], key: Any) -> Any:
    """The key of the kept calls (see the class), None where the function
    or a static argument reaches a traced value (or too many values)."""
    try:
      spec = by_value(self.fun, *statics)
    except Uncacheable:
      return None
    _, tree, avals = key
    return (spec, tree, tuple(avals), config.trace_context(),
            _rules_version[0])

  def as_jax(self) -> Callable[..., Any]:
    """The same function and rules under JAX's own decorator."""
    raise NotImplementedError

