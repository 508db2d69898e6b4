"""`hijax.custom_jvp` and its primitive, `CustomJVPCall` (reverse mode
transposes the linearized jvp rule, as JAX's does)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
from jax.custom_derivatives import zero_from_primal

from hijax import _linearity
from hijax._decorators import _tracing
from hijax._decorators._common import (CallPrimitive, Decorated,
                                       example_of, to_rule_zeros)
from hijax._decorators._outputs import pair, primal_out, tangent_out
from hijax._function_key import Uncacheable, by_value
from hijax._internals import config, core
from hijax._util import Static, is_float0, is_zero, store_bounded
from hijax.autodiff import GradAccum, instantiate_zeros
from hijax.derived import linearize_flat, linearize_from_jvp, vjp_from_lin


_LINS_KEPT = 64  # kept eager linearizations per call
_LINEARITY_LEAVES = 32  # leaves tested (one pass over the equations each)


def _nonzero(t) -> bool:
  return not (t is None or is_zero(t) or is_float0(t))


class CustomJVPCall(CallPrimitive):
  """The primitive of one call signature of a `custom_jvp` function: the
  function and its jvp rule; ``transposable`` where it is linear in some
  input."""

  transposable: bool

  def trace_rules(self, diff_args: tuple[Any, ...]) -> list[Any]:
    self._lins: dict[Any, Any] = {}  # kept linearizations (eager grad)
    # linear in some input (a jvp rule may apply the function to tangents)
    self.transposable = _linear_in_some_input(self.primal)
    self.jvp_name = _tracing.function_name(self.decorated.jvp)
    if not (len(self.hoisted) or _tracing.may_close_over_tracers(
        self.decorated.jvp, self.statics)):
      return []  # the rule runs directly, when differentiated, as in JAX
    args = (diff_args, tuple(jax.tree.map(
        lambda x: example_of(core.typeof(x).to_tangent_aval()), a)
        for a in diff_args))
    return [("jvp", self._trace_rule(self._jvp_direct, args, "inline"),
             self._jvp_direct, args)]

  def _jvp_direct(self, primals: Any, tangents: Any) -> Any:
    return self.decorated.jvp(*self.statics, tuple(primals), tuple(tangents))

  def run_jvp(self, xs: Sequence[Any], txs: Sequence[Any],
              hvals: Sequence[Any]) -> tuple[Any, list[Any]]:
    """The primal output and its tangent leaves (None for zero)."""
    traced = self.rules.get("jvp")
    if traced is not None:
      result = traced(hvals, tuple(xs), to_rule_zeros(tuple(txs), False))
    else:
      with _tracing.running(self, hvals):
        result = self._jvp_direct(
            xs, to_rule_zeros(tuple(txs), self.decorated.symbolic_zeros))
    rule, jvp, fun = f"the jvp rule {self.jvp_name}", self.jvp_name, self.name
    head = (f"Custom JVP rule {jvp} for function {fun} must produce a pair "
            "(list or tuple of length two)")
    out, tangent = pair(self, rule, result,
                        "(primal output, tangent output)", lambda got: (
                            f"{head} representing primal and tangent outputs, "
                            f"but got {got}."))
    primal_out(self, rule, out, lambda shapes: (
        f"{head} where the first element represents the primal output (equal "
        f"in value to the output of the custom_jvp-decorated function {fun}, "
        "and in particular " + ("with leaves of the same shape/dtype" if shapes
                                else "of the same container/pytree structure")
        + ")"), "JVP rule output")
    return out, tangent_out(self, rule, tangent, self.jvp_name)

  def jvp(self, primals: Any, tangents: Any) -> Any:
    *xs, hvals = primals
    *txs, th = tangents
    out, t_flat = None, [None] * len(self.fun_avals)
    if any(_nonzero(t) for t in jax.tree.leaves(txs, is_leaf=is_zero)):
      out, t_flat = self.run_jvp(xs, txs, hvals)  # (as in JAX: only then)
    closed = [i for i, t in enumerate(th) if _nonzero(t)]
    if closed:
      _, t_closed = self.differentiating(
          jax.jvp, self.primal_of_hoisted(xs, hvals, closed),
          tuple(hvals[i] for i in closed),
          tuple(instantiate_zeros(th[i]) for i in closed))
      t_flat = [b if a is None else a + b for a, b in  # (None: a zero)
                zip(t_flat, self.fun_tree.flatten_up_to(t_closed))]
    out = self(*primals) if out is None else self.select(out)
    return out, jax.tree.unflatten(self.out_tree, self.kept_leaves(t_flat))

  def lin(self, nzs_in: Any, *args: Any) -> Any:
    """Eager, from the second call with the same `_kept_key` on: compiled."""
    leaves = jax.tree.leaves(args)
    key = self._kept_key(jax.tree.leaves(nzs_in), leaves)
    if key is not None and key in self._lins and self._lins[key] is None:
      self._lins[key] = self._traced_lin(*key[:2]) or ()
    elif key is not None and key not in self._lins:
      store_bounded(self._lins, key, None, _LINS_KEPT)
    if key is None or not self._lins[key]:  # first call, or not traceable
      return linearize_from_jvp.first(self, nzs_in, *args)
    compiled, n_out, nzs_out, linear_map = self._lins[key]
    outs = compiled(*leaves)
    return (jax.tree.unflatten(self.out_tree, outs[:n_out]),
            (outs[n_out:], Static(linear_map)),
            jax.tree.unflatten(self.out_tree, list(nzs_out)))

  def _kept_key(self, nzs_flat: list[Any], leaves: list[Any]) -> Any:
    """None where an input is not a concrete array or the rule reaches a
    traced value."""
    if not all(isinstance(x, jax.Array) and not isinstance(x, core.Tracer)
               and type(core.typeof(x)) is core.ShapedArray for x in leaves):
      return None
    try:
      rule = by_value(self.decorated.jvp, *self.statics)
    except Uncacheable:
      return None
    return (tuple(nzs_flat), tuple(core.typeof(x) for x in leaves), rule,
            config.trace_context(), self.kept)

  def _traced_lin(self, nzs_flat: tuple[bool, ...], types: Any) -> Any:
    """(compiled outputs and residuals, number of outputs, their nonzero
    flags, linear map), or None where the rule cannot be traced."""
    found = []

    def forward(*xs):
      out, nzs_out, consts, linear_map = linearize_flat(self, list(nzs_flat),
                                                        list(xs))
      found.append((len(out), nzs_out, linear_map))
      return [*out, *consts]
    try:
      closed = jax.make_jaxpr(forward)(*[jax.ShapeDtypeStruct(
          t.shape, t.dtype, weak_type=t.weak_type) for t in types])
    except Exception:  # noqa: BLE001 (the direct call raises it, or works)
      return None
    return (jax.jit(jax.extend.core.jaxpr_as_fun(closed)), *found[0])

  def transpose(self, ct: Any, *args: Any) -> Any:
    if not self.transposable:
      return super().transpose(ct, *args)
    leaves, tree = jax.tree.flatten(
        args, is_leaf=lambda x: isinstance(x, GradAccum))
    accums: list[Any] = [x for x in leaves if isinstance(x, GradAccum)]

    def f(*linear):
      it = iter(linear)
      *xs, hvals = jax.tree.unflatten(tree, [
          next(it) if isinstance(x, GradAccum) else x for x in leaves])
      return self.primal(hvals, *xs)
    cts = jax.linear_transpose(f, *[
        jax.ShapeDtypeStruct(a.aval.shape, a.aval.dtype) for a in accums])(
            jax.tree.map(instantiate_zeros, self.full(ct), is_leaf=is_zero))
    for acc, c in zip(accums, cts):
      acc.accum(c)

  linearized = linearize_from_jvp.second
  vjp_fwd, vjp_bwd_retval = vjp_from_lin
  # grad transposes what `linearized` records, as for jax.custom_jvp
  _grad_by_lin = True


def _linear_in_some_input(traced: Any) -> bool:
  avals = [v.aval for v in traced.jaxpr.invars]
  for i, aval in enumerate(avals[:_LINEARITY_LEAVES]):
    dtype = getattr(aval, "dtype", None)  # a hi type has none
    if (dtype is not None and jnp.issubdtype(dtype, jnp.inexact)
        and _linearity.nonlinear_reason(
            traced.jaxpr, [j == i for j in range(len(avals))]) is None):
      return True
  return False


class custom_jvp(Decorated):  # noqa: N801 (the name of jax.custom_jvp)
  """A function with a custom forward-mode rule, like ``jax.custom_jvp``
  (same signatures and behaviour: ``f = custom_jvp(fun, nondiff_argnums=(),
  nondiff_argnames=())``, then ``@f.defjvp`` or `defjvps`).

  What it adds: traced values that ``fun``, the rule or a non-differentiable
  argument hold are inputs (no escaped tracer; differentiated with respect
  to one, ``f`` has the derivative of ``fun``'s own code, where JAX's gives a
  silent zero); `custom_jvp.defbatch` for ``vmap``, differentiated with the
  jvp rule; every value the rule returns checked, with an error naming the
  function, the rule and the output; and what a `HiPrim` has (residual
  reports, ``jax.checkpoint``, `hijax.testing.check_rules`).
  """

  kind: str = "custom_jvp"
  _rule_names = ("jvp",)
  jvp: Callable[..., Any] | None = None
  symbolic_zeros: bool = False

  def defjvp(self, jvp: Callable[..., Any], symbolic_zeros: bool = False
             ) -> Callable[..., Any]:
    """Defines the jvp rule, as ``jax.custom_jvp.defjvp`` does (a
    decorator): ``jvp(*nondiff_args, primals, tangents) -> (out,
    tangent_out)``, ``out`` equal to the function's output. With
    ``symbolic_zeros``, a zero tangent is a ``SymbolicZero`` (a rule that
    closes over traced values is traced once, with array tangents).
    """
    self.jvp = jvp
    self.symbolic_zeros = symbolic_zeros
    self._rules_defined()
    return jvp

  def defjvps(self, *jvps: Callable[..., Any] | None) -> None:
    """One rule per argument, as ``jax.custom_jvp.defjvps``:
    ``jvps[i](t_i, out, *primals)`` (None: no dependence), added."""
    if self.nondiff_argnums:
      raise TypeError("Can't use ``defjvps`` with ``nondiff_argnums``.")

    def jvp(primals, tangents):
      out = self(*primals)
      parts = [rule(t, out, *primals) for rule, t in zip(jvps, tangents)
               if rule is not None]
      if not parts:
        return out, zero_from_primal(out)
      return out, jax.tree.map(
          lambda *ts: ts[0] if is_float0(ts[0]) else sum(ts[1:], ts[0]),
          *parts)
    names = ", ".join(_tracing.function_name(j) for j in jvps if j)
    jvp.__name__ = f"defjvps({names})"
    self.defjvp(jvp)

  _call_class = CustomJVPCall

  def as_jax(self) -> Callable[..., Any]:
    f = jax.custom_jvp(self.fun, nondiff_argnums=self.nondiff_argnums)
    f.defjvp(self.jvp, symbolic_zeros=self.symbolic_zeros)  # pyright: ignore[reportArgumentType]
    return f
