"""What `hijax.custom_vjp` and `hijax.custom_jvp` share: the decorator
(`Decorated`) and the primitive of one call signature (`CallPrimitive`)."""
from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.custom_derivatives import SymbolicZero

from hijax._decorators import _tracing
from hijax._decorators._batching import batch_by_rule, batch_unbatched_call
from hijax._function_key import Uncacheable, by_value
from hijax._internals import batching, config, core
from hijax._util import is_float0, is_zero, store_bounded
from hijax.autodiff import Zero, instantiate_zeros
from hijax.batching import batch_from_dim_rule
from hijax.primitive import HiPrim


def example_of(aval: Any) -> Any:
  """A stand-in of type ``aval`` to trace a rule with (float0: an array)."""
  if is_float0(aval):
    return np.zeros(aval.shape, aval.dtype)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


def to_rule_zeros(tree: Any, symbolic_zeros: bool) -> Any:
  """hijax's `Zero` as a rule sees it: a ``SymbolicZero``, or zeros."""
  def convert(x):
    if not is_zero(x):
      return x
    return SymbolicZero(x.aval) if symbolic_zeros else instantiate_zeros(x)
  return jax.tree.map(convert, tree, is_leaf=is_zero)


class CallPrimitive(HiPrim):
  """The primitive of one call signature: its inputs are the differentiable
  arguments and, last, the tuple of hoisted values; ``rules`` holds the
  rules traced once (those that close over a traced value). Its outputs
  are the function's (``fun_tree``, ``fun_avals``), or those ``kept`` by
  dead-code elimination (the rules' outputs are checked against all)."""

  _call: Any  # the whole call (a `_call` param names the decorated function)
  kept: tuple[bool, ...] | None = None
  # ``(name, first, fn, args)`` per rule traced here (see ``__init__``)
  trace_rules: Callable[[tuple[Any, ...]], list[Any]]

  def __init__(self, decorated: Decorated, signature: _tracing.Signature,
               statics: list[Any], diff_args: tuple[Any, ...], key: Any,
               primal: _tracing.Traced, hoisted: _tracing.Hoisted) -> None:
    self.decorated, self.signature = decorated, signature
    self.statics, self.key = statics, key
    self.name = _tracing.function_name(decorated.fun)
    self.primal, self.hoisted = primal, hoisted
    leaves, self.arg_tree = jax.tree.flatten(diff_args)
    self.arg_avals = [core.typeof(x) for x in leaves]
    self.fun_tree, self.fun_avals = primal.out_tree, primal.out_avals
    self.rules: dict[str, _tracing.Traced] = {}
    traces = self.trace_rules(diff_args)
    self.in_avals = (*jax.tree.unflatten(self.arg_tree, self.arg_avals),
                     tuple(core.typeof(h) for h in hoisted))
    self.out_aval = jax.tree.unflatten(self.fun_tree, self.fun_avals)
    self.params = dict(fun=self.name, _call=self)
    self.effects = primal.effects
    super().__init__()
    # a rule that hoists is kept; one that called the function is traced
    # again binding this primitive (its derivatives then use the rules), if
    # that hoists nothing new
    n_hoisted = len(hoisted)
    for name, first, fn, args in traces:
      if first is not None and first[0].hoists:
        again = first[2] and self._trace_rule(fn, args, "bind")
        if again and len(hoisted) == n_hoisted:
          first = again
        del hoisted[n_hoisted:]
        self.rules[name] = first[0]

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)  # (HiPrim's installs its batcher)
    own = batching.fancy_primitive_batchers[cls._primitive]

    def rule(axis_data, args_flat, dims_flat, **params):
      # (an unnamed vmap's name is a bare object(): no code can name it)
      if (type(axis_data.name) is object
          or any(d is not None for d in dims_flat)):
        return own(axis_data, args_flat, dims_flat, **params)
      return batch_unbatched_call(params["_prim"], axis_data, args_flat)
    batching.fancy_primitive_batchers[cls._primitive] = rule

  __hash__ = object.__hash__  # (``params`` holds the instance itself)

  def __eq__(self, other: object) -> bool:
    return self is other

  def __str__(self) -> str:
    return f"hijax.{self.decorated.kind} function {self.name}"

  def error(self, rule: str, message: str, cls: type = TypeError,
            jax_words: str | None = None) -> Exception:
    """``cls``: JAX's words for it (if any), then hijax's, naming ``rule``."""
    detail = f"{self}: {rule} {message}"
    return cls(detail if jax_words is None else f"{jax_words}\n{detail}")

  def _trace_rule(self, fn: Callable[..., Any], args: tuple[Any, ...],
                  mode: str):
    """``(Traced, shape, reentered)``, or None (it then runs directly)."""
    before = len(self.hoisted)
    try:
      with _tracing.running(self, self.hoisted, mode) as entry:
        traced, shape = _tracing.trace(fn, args, self.hoisted)
    except Exception:  # noqa: BLE001 (reported when the rule is used)
      del self.hoisted[before:]
      return None
    return traced, shape, entry.reentered

  def kept_leaves(self, flat: list[Any]) -> list[Any]:
    """The leaves of this call's outputs among the function's ``flat``."""
    if self.kept is None:
      return flat
    return [x for x, k in zip(flat, self.kept) if k]

  def select(self, out: Any) -> Any:
    """This call's outputs of the function's ``out``."""
    if self.kept is None:
      return out
    return tuple(self.kept_leaves(self.fun_tree.flatten_up_to(out)))

  def full(self, ct: Any) -> Any:
    """``ct`` of this call's outputs as the function's (dropped: zeros)."""
    if self.kept is None:
      return ct
    it = iter(self.out_tree.flatten_up_to(ct))
    return jax.tree.unflatten(self.fun_tree, [
        next(it) if k else Zero(a.to_ct_aval())
        for a, k in zip(self.fun_avals, self.kept)])

  def expand(self, *args: Any) -> Any:
    *xs, hvals = args
    return self.select(self.primal.as_call(hvals, *xs))

  def dce(self, used_outs: Any, live_ins: Any) -> Any:
    used = [bool(u) for u in jax.tree.leaves(used_outs)]
    if all(used):
      return True, True, self
    if not any(used) and not self.effects:
      return False, False, None
    it = iter(used)
    kept = tuple(k and next(it) for k in self.kept or [True] * len(used))
    pruned = copy.copy(self)  # the same call and rules, fewer outputs
    pruned.kept = kept
    pruned.out_aval = tuple(a for a, k in zip(self.fun_avals, kept) if k)
    pruned.params = dict(fun=self.name, _call=self._call, kept=kept)
    HiPrim.__init__(pruned)
    return True, used_outs, pruned

  def batch_dim_rule(self, axis_data: Any, in_dims: Any) -> Any:
    return jax.tree.map(lambda _: 0, self.out_aval)

  def batch(self, axis_data: Any, args: Any, dims: Any) -> Any:
    rule = self.decorated.batch_rule
    if rule is None or any(d is not None for d in dims[-1]):
      return batch_from_dim_rule(self, axis_data, args, dims)
    return batch_by_rule(self, rule, axis_data, args, dims)

  def check_args(self, args: tuple[Any, ...]) -> Sequence[Any]:
    # a Python scalar argument reaches the rules as it is, as in JAX
    checked = super().check_args(args)
    given = args if self._args_are_leaves else jax.tree.leaves(args)
    return [x if type(x) in (bool, int, float, complex) else c
            for x, c in zip(given, checked)]

  def full_args(self, diff_args: Sequence[Any]) -> tuple[Any, ...]:
    return self.signature.merge(self.statics, diff_args)

  def primal_of_hoisted(self, xs: Sequence[Any], hvals: Sequence[Any],
                        which: list[int]) -> Callable[..., Any]:
    """The function of the hoisted values ``which``, the rest fixed."""
    def f(*chosen):
      values = list(hvals)
      for i, v in zip(which, chosen):
        values[i] = v
      return self.primal(values, *xs)
    return f

  def differentiating(self, transform: Callable[..., Any], *args: Any) -> Any:
    """``transform(*args)`` on the function's own code; a failure explained."""
    try:
      return transform(*args)
    except Exception as e:  # noqa: BLE001
      raise type(e)(
          f"{self} closes over traced values that are being differentiated. "
          "Its rules give derivatives with respect to its arguments only, so "
          f"hijax differentiates {self.name}'s own code with respect to those "
          f"values, which failed:\n\n{e}\n\nPass them as arguments instead "
          "(jax.closure_convert finds them) and return their cotangents from "
          "the rule.") from e


_CALLS_KEPT = 64  # per decorated function
_rules_version = [0]  # bumped when rules are defined: kept calls not found


class Decorated:
  """What `hijax.custom_vjp` and `hijax.custom_jvp` share. A primitive is kept
  for the next call with the same key (`_calls_key`) unless it hoists."""

  kind: str = ""
  _rule_names: tuple[str, ...]  # the rules that must be defined
  fun: Callable[..., Any]
  nondiff_argnums: tuple[int, ...]
  batch_rule: Callable[..., Any] | None = None
  _call_class: type[CallPrimitive]
  as_jax: Callable[[], Callable[..., Any]]  # JAX's decorator, same rules

  def __init__(self, fun: Callable[..., Any],
               nondiff_argnums: Sequence[int] = (),
               nondiff_argnames: Sequence[str] = ()) -> None:
    functools.update_wrapper(self, fun)
    self.fun = fun
    self.nondiff_argnums = _tracing.nondiff_positions(
        fun, nondiff_argnums, nondiff_argnames, f"hijax.{self.kind}")
    self._calls: dict[Any, CallPrimitive] = {}
    self._arity = _tracing.plain_arity(fun)
    # how a call with n arguments splits: ``self._signature(n)``
    self._signature = functools.cache(functools.partial(
        _tracing.Signature, fun, self.nondiff_argnums))

  # by identity in a function key: redefined rules change `_rules_version`
  def __eq__(self, other: object) -> bool:
    return self is other

  def __hash__(self) -> int:
    return id(self)

  def _rules_defined(self) -> None:
    _rules_version[0] += 1

  def __getattr__(self, name: str) -> Any:
    # as JAX's: a `def...` method of a decorated decorated function
    if name.startswith("def") and "fun" in vars(self):
      return getattr(self.fun, name)
    raise AttributeError(
        f"{type(self).__name__!r} object has no attribute {name!r}")

  def defbatch(self, rule: Callable[..., Any]) -> Callable[..., Any]:
    """Defines how ``vmap`` computes the function on a batch (a decorator):
    ``rule(axis_size, in_batched, *args) -> (out, out_batched)``, as for
    ``jax.custom_batching.custom_vmap.def_vmap`` (a batched argument has its
    batch axis first; ``out_batched`` may be one boolean). The batched
    function's derivatives are its rules, vmapped. Where a value the function
    closes over is batched, or the rule reads a traced value the function
    does not, the function itself is vmapped instead.
    """
    self.batch_rule = rule
    self._rules_defined()
    return rule

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if any(getattr(self, r) is None for r in self._rule_names):
      d = self.kind[-3:]  # as JAX's words
      raise AttributeError(f"No {d.upper()} defined for {self.kind} function "
                           f"{_tracing.function_name(self.fun)} using def{d}.")
    if kwargs or len(args) != self._arity:
      args = _tracing.resolve(self.fun, args, kwargs, f"hijax.{self.kind}")
    if core.trace_state_clean():
      return self.fun(*args)  # eagerly, as JAX's decorators do
    signature = self._signature(len(args))
    statics, diff_args = signature.split(args)
    key = _tracing.signature_key(statics, diff_args)
    entry = _tracing.find(self, key)
    if entry is not None:  # called from its own rule
      entry.reentered = True
      if entry.mode == "inline":
        return entry.call.primal(entry.hoisted_values, *diff_args)
      return entry.call._call(*diff_args, tuple(entry.hoisted_values))
    try:  # None where the function or a static argument reaches a tracer
      calls_key = (by_value(self.fun, *statics), key[1], tuple(key[2]),
                   config.trace_context(), _rules_version[0])
    except Uncacheable:
      calls_key = None
    call = self._calls.get(calls_key) if calls_key is not None else None
    if call is None:
      hoisted = _tracing.Hoisted()
      try:
        primal, _ = _tracing.trace(
            lambda *d: self.fun(*signature.merge(statics, d)), diff_args,
            hoisted)
      except jax.errors.ConcretizationTypeError:
        # it branches on its arguments' values: JAX's decorator runs it on
        # concrete values under eager autodiff
        return self.as_jax()(*args)
      call = self._call_class(self, signature, statics, diff_args, key,
                              primal, hoisted)
      if calls_key is not None and not len(call.hoisted) and not call.rules:
        store_bounded(self._calls, calls_key, call, _CALLS_KEPT)
    return call(*diff_args, tuple(call.hoisted))

