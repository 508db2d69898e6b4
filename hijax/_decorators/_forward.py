"""Forward mode of `hijax.custom_vjp` where it is not `jvp_from_vjp`'s: the
value, vmap and jvp of the equation whose transpose runs ``bwd`` (the tangent
of a ``bwd`` not linear in ``g``, and of a function with logs), the error for
a ``bwd`` not linear in ``g``, and the methods of ``jax.custom_vjp`` refused.
"""
from __future__ import annotations

from typing import Any

import jax

from hijax.autodiff import Zero, instantiate_zeros
from hijax.derived import NonlinearBackwardError, tangent_from_backward

__all__ = ["linearized_value", "linearized_batched", "linearized_jvp",
           "nonlinear_bwd_error", "remat_refused"]


def linearized_value(*args: Any, prim: Any, res_tree: Any,
                     nzs_in: tuple[bool, ...], nzs_out: tuple[bool, ...],
                     has_sres: bool) -> list[Any]:
  """The value of the tangent equation of `CustomVJPCall`'s
  `_transpose_only_tangent` (its
  inputs: the residuals, then the nonzero input tangents): bwd transposed in
  g (`tangent_from_backward`); for a bwd not linear in g, the error that
  says why forward mode is refused."""
  call = prim._call
  if call.forward_mode_error is not None:
    raise _copy(call.forward_mode_error)
  n_res = res_tree.num_leaves
  res = jax.tree.unflatten(res_tree, args[:n_res])
  res, sres = res if has_sres else (res, None)
  nz_tangents = iter(args[n_res:])
  tangents_flat = [next(nz_tangents) if nz else Zero(a.to_tangent_aval())
                   for a, nz in zip(prim.in_avals_flat, nzs_in)]
  try:
    t_out = tangent_from_backward(prim, list(nzs_in), list(nzs_out), res, sres,
                                  tangents_flat)
  except NonlinearBackwardError as e:
    if e.prim is not prim:
      raise
    call.forward_mode_error = nonlinear_bwd_error(call, e)
    raise _copy(call.forward_mode_error) from None
  return [instantiate_zeros(Zero(a.to_tangent_aval())) if t is None else t
          for t, a, nz in zip(t_out, prim.out_avals_flat, nzs_out) if nz]


def linearized_batched(axis_data: Any, args: Any, dims: Any, **params: Any
                       ) -> Any:
  """vmap of the tangent equation: its value, vmapped."""
  out = jax.vmap(lambda *a: linearized_value(*a, **params),
                 in_axes=tuple(dims), axis_size=axis_data.size,
                 axis_name=axis_data.name)(*args)
  return out, [0] * len(out)


def linearized_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
  """Forward mode of the tangent equation: that of its value."""
  return jax.jvp(lambda *a: linearized_value(*a, **params), tuple(primals),
                 tuple(instantiate_zeros(t) for t in tangents))


def nonlinear_bwd_error(call: Any, e: NonlinearBackwardError
                        ) -> NonlinearBackwardError:
  """`jvp_from_vjp`'s error for a bwd rule that is not linear in ``g``, in
  the terms of the decorated function: JAX's words for forward mode of a
  custom_vjp function, then why hijax cannot derive it here. A
  `NonlinearBackwardError` (a TypeError, as JAX's), so that it can be told
  from JAX's refusal by type."""
  detail = call.owner.error(
      f"the bwd rule {call.bwd_name}",
      "is not linear in the cotangent g, so forward mode (jax.jvp, "
      f"jax.jacfwd, jax.hessian, jax.linearize) cannot be derived from it: "
      f"{e.reason}. hijax.custom_vjp derives forward mode by transposing bwd "
      "in g, which is right only for a rule linear in g (the chain rule "
      "multiplies g by the Jacobian). If the rule is meant to change g (a "
      "clipped or scaled gradient), give forward mode a rule of its own with "
      "hijax.custom_jvp; otherwise fix the rule", TypeError,
      "can't apply forward-mode autodiff (jvp) to a custom_vjp function.")
  return NonlinearBackwardError(str(detail), e.prim, e.method, e.reason)


def _copy(e: NonlinearBackwardError) -> NonlinearBackwardError:
  """A fresh exception like ``e`` (one raised again keeps its traceback)."""
  return NonlinearBackwardError(str(e), e.prim, e.method, e.reason)


def remat_refused(method: str) -> NotImplementedError:
  """The error for ``jax.custom_vjp``'s ``defremat`` (or its ``_with_logs``
  form), which hijax does not have, naming the alternatives."""
  logs = "_with_logs" if method.endswith("_with_logs") else ""
  return NotImplementedError(
      f"hijax.custom_vjp has no {method}: its rematerialization is that of "
      f"jax.checkpoint, whose policy applies to the fwd rule of defvjp{logs} "
      "(mark the residuals to save with jax.ad_checkpoint.checkpoint_name). "
      "For rules of your own, use hijax.custom_remat: its (fwd, rem, bwd) "
      f"are those of JAX's {method}, and its fwd also receives the "
      "checkpoint policy")
