"""`hijax.custom_vjp` and its primitive, `CustomVJPCall`: forward mode is
``bwd`` transposed in ``g``, or an equation whose transpose runs ``bwd``."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax
from jax.custom_derivatives import CustomVJPPrimal

from hijax._decorators import _tracing
from hijax._decorators._common import (CallPrimitive, Decorated,
                                       example_of, to_rule_zeros)
from hijax._decorators._outputs import cotangents, pair, primal_out
from hijax._internals import ad, batching
from hijax._util import Static, is_zero
from hijax.autodiff import ValAccum, Zero, _bind_linearized, instantiate_zeros
from hijax.derived import (NonlinearBackwardError, jvp_from_vjp,
                           linearize_from_jvp, tangent_from_backward)


class CustomVJPCall(CallPrimitive):
  """The primitive of one call signature of a `custom_vjp` function: the
  function, ``fwd`` and ``bwd``."""

  forward_mode_error: NonlinearBackwardError | None = None  # once found

  def trace_rules(self, diff_args: tuple[Any, ...]) -> list[Any]:
    d = self.decorated
    self.fwd_name = _tracing.function_name(d.fwd)
    self.bwd_name = _tracing.function_name(d.bwd)
    if not (len(self.hoisted) or _tracing.may_close_over_tracers(
        d.fwd, d.bwd, self.statics)):
      return []  # the rules run directly, when differentiated, as in JAX
    fwd = self._fwd_with(None)
    first_fwd = self._trace_rule(fwd, diff_args, "inline")
    first_bwd, bwd_args, shape = None, (), first_fwd and first_fwd[1]
    if isinstance(shape, (tuple, list)) and len(shape) == 2:
      bwd_args = (shape[1], jax.tree.unflatten(self.fun_tree, [
          example_of(a.to_ct_aval()) for a in self.fun_avals]))
      first_bwd = self._trace_rule(self._bwd_direct, bwd_args, "inline")
    return [("fwd", first_fwd, fwd, diff_args),
            ("bwd", first_bwd, self._bwd_direct, bwd_args)]

  def _fwd_with(self, nzs: Any) -> Callable[..., Any]:
    """``fwd`` of the differentiable arguments (perturbed as ``nzs`` says,
    all if None, with ``symbolic_zeros``)."""
    def fwd(*xs):
      if self.decorated.symbolic_zeros:
        xs = jax.tree.map(CustomVJPPrimal, xs, jax.tree.map(
            lambda _: True, xs) if nzs is None else nzs)
      return self.decorated.fwd(*self.full_args(xs))
    return fwd

  def _bwd_direct(self, res: Any, g: Any) -> Any:
    d = self.decorated
    if not d.with_accums:
      return d.bwd(*self.statics, res, g)
    accums = [ValAccum(a.to_ct_aval()) for a in self.arg_avals]
    logs = self._logs(d.bwd(*self.statics, res, g, *jax.tree.unflatten(
        self.arg_tree, accums)), "defvjp_with_accums", "it must return", "")
    return tuple(jax.tree.unflatten(self.arg_tree, [
        a.freeze() for a in accums])), logs

  def _logs(self, logs: Any, method: str, what: str, jax_what: str) -> Any:
    if logs is not None and type(logs) is not dict:
      got = type(logs).__name__
      raise self.error(
          f"the bwd rule {self.bwd_name}", f"was defined with {method}, so "
          f"{what} None or a dict of backward-pass logs, but it is a {got}",
          TypeError, f"Custom VJP bwd rule was registered with {method}, and "
          f"so {jax_what}must {'be' if jax_what else 'return'} None or a "
          f"dict of backward-pass log entries, but got {got}.")
    return logs

  def run_fwd(self, nzs: Any, xs: Sequence[Any], hvals: Sequence[Any]):
    traced = self.rules.get("fwd")
    if traced is not None:
      result = traced(hvals, *xs)
    else:
      with _tracing.running(self, hvals):
        result = self._fwd_with(nzs)(*xs)
    rule, fwd, fun = f"the fwd rule {self.fwd_name}", self.fwd_name, self.name
    head = lambda equal: (
        f"Custom VJP fwd rule {fwd} for function {fun} must produce a pair "
        "(list or tuple of length two) where the first element represents "
        f"the primal output (equal to {equal} of the custom_vjp-decorated "
        f"function {fun}) and the second element represents residuals (i.e. "
        "values stored from the forward pass for use on the backward pass)")
    out, res = pair(self, rule, result, "(primal output, residuals)",
                    lambda got: f"{head('those')}, but instead of a pair the "
                    f"fwd rule {fwd} produced {got}.")
    primal_out(self, rule, out, lambda _: head("the output"),
               "fwd rule output", mismatch=True)
    return out, res

  def run_bwd(self, res: Any, g: Any, hvals: Sequence[Any]):
    traced = self.rules.get("bwd")
    if traced is not None:
      result = traced(hvals, res, to_rule_zeros(g, False))
    else:
      result = self._bwd_direct(
          res, to_rule_zeros(g, self.decorated.symbolic_zeros))
    rule, logs = f"the bwd rule {self.bwd_name}", None
    if self.decorated.with_logs:
      result, logs = pair(
          self, rule, result, "(cotangents, logs)", lambda got:
          "Custom VJP bwd rule was registered with defvjp_with_logs and so "
          f"must produce a pair (in_cts, logs), but got {got}.")
      self._logs(logs, "defvjp_with_logs", "the second entry of the pair it "
                 "returns must be", "the second element of the pair it "
                 "returns ")
    return cotangents(self, rule, result), logs

  def vjp_fwd(self, nzs_in: Any, *args: Any) -> Any:
    *xs, hvals = args
    if not any(jax.tree.leaves(nzs_in)):
      # Nothing is differentiated: the function runs, not its fwd rule.
      return self(*args), None, jax.tree.map(lambda _: False, self.out_aval)
    out, res = self.run_fwd(tuple(nzs_in[:-1]), xs, hvals)
    bwd_hvals = None
    if "bwd" in self.rules:
      used = {s for s in self.rules["bwd"].slots if s is not None}
      bwd_hvals = tuple(h if i in used else None for i, h in enumerate(hvals))
    closed = [i for i, nz in enumerate(nzs_in[-1]) if nz]
    closure_vjp = closed and self.differentiating(
        jax.vjp, self.primal_of_hoisted(xs, hvals, closed),
        *[hvals[i] for i in closed])[1]
    return self.select(out), (res, bwd_hvals, closure_vjp or None,
                              Static(tuple(closed)))

  def vjp_bwd(self, res: Any, g: Any, *arg_accums: Any) -> Any:
    user_res, bwd_hvals, closure_vjp, closed = res
    g = self.full(g)
    cts_flat, logs = self.run_bwd(user_res, g, bwd_hvals or ())
    ct_h: list[Any] = [None] * len(self.hoisted)
    if closure_vjp is not None:
      g_full = jax.tree.map(instantiate_zeros, g, is_leaf=is_zero)
      for i, ct in zip(closed.value, self.differentiating(closure_vjp, g_full)):
        ct_h[i] = ct
    for acc, ct in zip(self.in_tree.flatten_up_to(arg_accums),
                       [*cts_flat, *ct_h]):
      if ct is not None:
        acc.accum(ct)
    return logs if self.decorated.with_logs else None

  def jvp(self, primals: Any, tangents: Any) -> Any:
    derived = None
    if not self.decorated.with_logs:
      try:
        derived = jvp_from_vjp(self, primals, tangents)
      except NonlinearBackwardError as e:
        self.nonlinear(e)
    out, tangent = derived or self._transpose_only_tangent(primals, tangents)
    if self.decorated.optimize_remat:
      out = self(*primals)  # fwd is for residuals only, as in JAX
    return out, tangent

  def _transpose_only_tangent(self, primals: Any, tangents: Any) -> Any:
    # (JAX passes every zero tangent as a symbolic Zero, and applies the
    # primitive, not its jvp, where all are)
    tangents_flat = self.in_tree.flatten_up_to(tangents)
    nzs_flat = [not is_zero(t) for t in tangents_flat]
    out, res = self.vjp_fwd(jax.tree.unflatten(self.in_tree, nzs_flat),
                            *primals)
    t_out = _bind_linearized(self, nzs_flat, [True] * len(
        self.out_avals_flat))(res, None, *tangents_flat)
    return out, jax.tree.unflatten(self.out_tree, t_out)

  def nonlinear(self, e: NonlinearBackwardError) -> None:
    """Keeps why forward mode fails (``e`` of another primitive: raised)."""
    if e.prim is not self:
      raise e
    self.forward_mode_error = NonlinearBackwardError(str(self.error(
        f"the bwd rule {self.bwd_name}",
        "is not linear in the cotangent g, so forward mode (jax.jvp, "
        f"jax.jacfwd, jax.hessian, jax.linearize) cannot be derived from it: "
        f"{e.reason}. hijax.custom_vjp derives forward mode by transposing "
        "bwd in g, which is right only for a rule linear in g (the chain rule "
        "multiplies g by the Jacobian). If the rule is meant to change g (a "
        "clipped or scaled gradient), give forward mode a rule of its own "
        "with hijax.custom_jvp; otherwise fix the rule", TypeError,
        "can't apply forward-mode autodiff (jvp) to a custom_vjp function.")),
        e.prim, e.method, e.reason)

  lin, linearized = linearize_from_jvp


# `_transpose_only_tangent`'s equation (its transpose runs bwd): its value is
# bwd transposed in g, or the error saying why there is none.
def _linearized_value(*args: Any, prim: Any, res_tree: Any,
                      nzs_in: tuple[bool, ...], nzs_out: tuple[bool, ...],
                      has_sres: bool) -> list[Any]:
  if prim.forward_mode_error is None:
    n_res = res_tree.num_leaves
    res = jax.tree.unflatten(res_tree, args[:n_res])
    res, sres = res if has_sres else (res, None)
    nz_tangents = iter(args[n_res:])
    tangents_flat = [next(nz_tangents) if nz else Zero(a.to_tangent_aval())
                     for a, nz in zip(prim.in_avals_flat, nzs_in)]
    try:
      t_out = tangent_from_backward(prim, list(nzs_in), list(nzs_out), res,
                                    sres, tangents_flat)
    except NonlinearBackwardError as e:
      prim.nonlinear(e)
    else:
      return [instantiate_zeros(Zero(a.to_tangent_aval())) if t is None else t
              for t, a, nz in zip(t_out, prim.out_avals_flat, nzs_out) if nz]
  err: Any = prim.forward_mode_error  # a copy raised: the same error each time
  raise NonlinearBackwardError(str(err), err.prim, err.method,
                               err.reason) from None


def _linearized_batched(axis_data: Any, args: Any, dims: Any, **params: Any
                        ) -> Any:
  out = jax.vmap(lambda *a: _linearized_value(*a, **params),
                 in_axes=tuple(dims), axis_size=axis_data.size,
                 axis_name=axis_data.name)(*args)
  return out, [0] * len(out)


def _linearized_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
  return jax.jvp(lambda *a: _linearized_value(*a, **params), tuple(primals),
                 tuple(instantiate_zeros(t) for t in tangents))


_LINEARIZED = CustomVJPCall._linearized_primitive
_LINEARIZED.to_lojax = _linearized_value
batching.fancy_primitive_batchers[_LINEARIZED] = _linearized_batched
ad.primitive_jvps[_LINEARIZED] = _linearized_jvp


def _refused(method: str) -> Callable[..., NoReturn]:
  def refuse(self: Any, *_: Any, **__: Any) -> NoReturn:
    raise NotImplementedError(
        f"hijax.custom_vjp has no {method}: its rematerialization is that of "
        "jax.checkpoint, whose policy applies to the fwd rule of defvjp"
        f"{method[8:]} (mark the residuals to save with "
        "jax.ad_checkpoint.checkpoint_name). For rules of your own, use "
        "hijax.custom_remat: its (fwd, rem, bwd) are those of JAX's "
        f"{method}, and its fwd also receives the checkpoint policy")
  refuse.__doc__ = (f"Refused (NotImplementedError): use `defvjp` under "
                    f"``jax.checkpoint``, or `hijax.custom_remat` ({method}).")
  return refuse


class custom_vjp(Decorated):  # noqa: N801 (the name of jax.custom_vjp)
  """A function with a custom reverse-mode rule, like ``jax.custom_vjp``
  (same signatures and behaviour: ``f = custom_vjp(fun, nondiff_argnums=(),
  nondiff_argnames=())``, then ``f.defvjp(fwd, bwd)``).

  What it adds: forward mode (``jax.jvp``, ``jacfwd``, ``hessian``,
  ``linearize``) by transposing ``bwd`` in ``g``, checked linear; traced
  values that ``fun``, the rules or a non-differentiable argument hold are
  inputs (no escaped tracer; differentiated with respect to one, ``f`` has
  the derivative of ``fun``'s own code, where JAX's raises); ``vmap`` of the
  rules, or of `custom_vjp.defbatch`'s rule, differentiated with the rules;
  every value the rules return checked, with an error naming the function,
  the rule and the argument; and what a `HiPrim` has (residual reports,
  ``jax.checkpoint``, `hijax.testing.check_rules`).
  """

  kind: str = "custom_vjp"
  _rule_names = ("fwd", "bwd")
  fwd: Callable[..., Any] | None = None
  bwd: Callable[..., Any] | None = None
  symbolic_zeros: bool = False
  optimize_remat: bool = False
  with_logs: bool = False
  with_accums: bool = False

  def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any],
             symbolic_zeros: bool = False, optimize_remat: bool = False,
             generic_batching: bool = False) -> None:
    """Defines the reverse-mode rule, as ``jax.custom_vjp.defvjp`` does:
    ``fwd(*args) -> (out, residuals)``, ``out`` equal to ``fun(*args)``;
    ``bwd(*nondiff_args, residuals, g)`` returns a tuple with one cotangent
    per differentiable argument (None for zeros). ``symbolic_zeros`` and
    ``optimize_remat`` as in JAX (rules that close over traced values are
    then traced once, every input perturbed, every cotangent an array);
    ``generic_batching`` is accepted (``vmap`` batches every output).
    """
    self._define(fwd, bwd, symbolic_zeros, optimize_remat, False, False)

  def _define(self, fwd, bwd, symbolic_zeros, optimize_remat, with_logs,
              with_accums) -> None:
    if symbolic_zeros and optimize_remat:
      raise NotImplementedError(
          "remat optimization for custom_vjp does not support symbolic zeros")
    self.fwd, self.bwd = fwd, bwd
    self.symbolic_zeros, self.optimize_remat = symbolic_zeros, optimize_remat
    self.with_logs, self.with_accums = with_logs, with_accums
    self._rules_defined()

  def defvjp_with_logs(self, fwd: Callable[..., Any], bwd: Callable[..., Any],
                       symbolic_zeros: bool = False,
                       optimize_remat: bool = False,
                       generic_batching: bool = False) -> None:
    """Like `defvjp`, but ``bwd`` returns ``(cotangents, logs)``: None or a
    dict of values read with the ``with_logs`` method of the function that
    ``jax.vjp`` returns, as for ``jax.custom_vjp.defvjp_with_logs``."""
    self._define(fwd, bwd, symbolic_zeros, optimize_remat, True, False)

  def defvjp_with_accums(self, fwd: Callable[..., Any],
                         bwd: Callable[..., Any], symbolic_zeros: bool = False,
                         optimize_remat: bool = False,
                         generic_batching: bool = False) -> None:
    """Like `defvjp`, but ``bwd(*nondiff_args, res, g, *arg_accums)`` adds
    its cotangents to accumulators (a pytree like each argument, of
    ``ValAccum``: ``acc.accum(ct)``) and returns None or a dict of logs, as
    for ``jax.custom_vjp.defvjp_with_accums`` (jax 0.12)."""
    self._define(fwd, bwd, symbolic_zeros, optimize_remat, True, True)

  defremat: Callable[..., NoReturn] = _refused("defremat")
  defremat_with_logs: Callable[..., NoReturn] = _refused("defremat_with_logs")

  _call_class = CustomVJPCall

  def as_jax(self) -> Callable[..., Any]:
    f = jax.custom_vjp(self.fun, nondiff_argnums=self.nondiff_argnums)
    define = (f.defvjp_with_accums if self.with_accums  # pyright: ignore[reportAttributeAccessIssue]
              else f.defvjp_with_logs if self.with_logs else f.defvjp)
    define(self.fwd, self.bwd, symbolic_zeros=self.symbolic_zeros,  # pyright: ignore[reportArgumentType]
           optimize_remat=self.optimize_remat)
    return f
