"""How a solve reports failure: `Status`, the default tolerances, and the
run-time error raised for a failed solve (eagerly, under ``jit`` and ``vmap``).

A solver returns ``(x, Status)``. With ``throw=True`` (the default of the
public functions) the primitive's ``expand`` calls `raise_if_failed`: a
``lax.cond`` on whether any instance failed, whose failing branch calls the
host to raise `SolveError`. The passing branch costs one predicate and no host
round trip. Under ``vmap`` the predicate is reduced over the batch by
`_AcrossBatch`, a primitive whose batching rule reduces instead of mapping, so
that the ``cond`` stays a ``cond`` and not a ``select`` of both branches.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hijax.primitive import HiPrim

__all__ = ["Status", "SolveError", "REASONS", "default_tol",
           "raise_if_failed", "status", "solved", "all_finite"]

#: What ``Status.reason`` means, by its value.
REASONS = ("converged", "max_iter reached before the tolerance",
           "non-finite iterate (inf or nan)",
           "matrix not symmetric positive definite (required by CG)",
           "the linear solve of a Newton step failed")
CONVERGED, MAX_ITER, NONFINITE, NOT_SPD, LINEAR_FAILED = range(5)


class Status(NamedTuple):
  """How a solve ended, returned beside the solution when ``throw=False``.

  Attributes:
    converged: True when the tolerance was met with finite values.
    steps: the number of iterations taken (1 for a direct solve).
    error: the quantity the tolerance bounds, measured at the end, relative to
      the solver's scale (see each solver's docstring); inf when non-finite.
    reason: an index into `REASONS` (0: converged).
  """
  converged: jax.Array
  steps: jax.Array
  error: jax.Array
  reason: jax.Array


class SolveError(RuntimeError):
  """A solve of `hijax.implicit` failed (raised eagerly; under ``jit`` it is
  wrapped in JAX's runtime error, whose message contains this one)."""


class _QuietSolveErrors(logging.Filter):
  """Drops JAX's log of a host callback that raised our `SolveError`: the
  error itself reaches the caller, so the logged traceback is only noise."""

  def filter(self, record: Any) -> Any:
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, SolveError)


# The logger of JAX's callback module, by name (its module is internal).
logging.getLogger("jax._src.callback").addFilter(_QuietSolveErrors())


def status(reason: Any, steps: Any, error: Any) -> Status:
  """A `Status` from a reason code, a step count and an error measure."""
  reason = jnp.asarray(reason, jnp.int32)
  return Status(reason == CONVERGED, jnp.asarray(steps, jnp.int32),
                jnp.asarray(error, jnp.float32), reason)


def solved(result: Any, where: str) -> Any:
  """``(x, Status)`` from what a solver returned: that pair, or ``x`` alone
  (a user's solver), whose Status then says only whether it is finite."""
  if (isinstance(result, tuple) and len(result) == 2
      and isinstance(result[1], Status)):
    return result
  if isinstance(result, Status):
    raise TypeError(f"{where}: the solver returned a Status alone; return "
                    "(x, Status) or x")
  finite = all_finite(result)
  return result, status(jnp.where(finite, CONVERGED, NONFINITE), 1,
                        jnp.where(finite, 0., jnp.inf))


def default_tol(dtype: Any) -> float:
  """The default tolerance for unknowns of ``dtype``: 1e-12 for 64-bit floats
  (and complex128), 1e-6 for 32-bit, 10 eps for narrower ones (bfloat16,
  float16), which cannot resolve 1e-6."""
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.inexact):
    dtype = jnp.dtype(jnp.result_type(float))
  bits = jnp.finfo(dtype).bits
  if bits >= 64:
    return 1e-12
  return 1e-6 if bits == 32 else 10 * float(jnp.finfo(dtype).eps)


# --- reducing over a batch ----------------------------------------------------

class _AcrossBatch(HiPrim):
  """The identity on an array, except under ``vmap``, where it reduces over the
  batch (``any`` or ``max``) and returns an unbatched result."""

  def __init__(self, aval: Any, *, reduce: Any):
    self.in_avals, self.out_aval = (aval,), aval
    self.params = dict(reduce=reduce)
    super().__init__()

  def expand(self, x: Any) -> Any:
    return x

  def batch(self, axis_data: Any, args: Any, dims: Any) -> Any:
    (x,), (d,) = args, dims
    out = getattr(jnp, self.reduce)(x, axis=d)
    return _AcrossBatch(jax.typeof(out), reduce=self.reduce)(out), None


def _across_batch(x: Any, reduce: Any) -> Any:
  return _AcrossBatch(jax.typeof(x), reduce=reduce)(x)


# --- raising ------------------------------------------------------------------

_STEP_BITS = 24  # a step count above 2**24 - 1 is reported as that


def _message(where: Any, worst: Any) -> Any:
  # Under vmap the (already reduced) value arrives broadcast to the batch.
  worst = int(np.max(worst))
  reason, steps = worst >> _STEP_BITS, worst & ((1 << _STEP_BITS) - 1)
  text = REASONS[reason] if 0 <= reason < len(REASONS) else f"code {reason}"
  return (f"{where} failed: {text} (after {steps} step(s); under vmap, the "
          "worst instance). Loosen `tol`, raise `max_iter`, start closer, or "
          "pass `throw=False` to get the solution with its Status (whose "
          "`error` is the final error) and handle the failure yourself")


def raise_if_failed(x: Any, st: Status, where: str) -> Any:
  """``x``, or a `SolveError` at run time if ``st`` says the solve failed.

  The reason and the step count are packed into one integer (the reason in
  the high bits: a failure is a nonzero reason), reduced over a batch with
  one ``max`` (that of the worst instance); the check is one ``lax.cond`` on
  it, whose failing branch calls the host. ``x`` does not pass through the
  ``cond`` (which would copy it and split the fused computations around it):
  the ``cond`` returns a flag, and ``x`` is read through a select on that
  flag, which ties it to the check (it is NaN if the host call returned
  instead of raising). The Status's error is not part of it: the ``cond``
  would need it computed first, and for an iteration that costs (an HVP of
  a Newton root: 84 -> 150 us).
  """
  steps = jnp.minimum(st.steps, (1 << _STEP_BITS) - 1)
  worst = _across_batch((st.reason << _STEP_BITS) | steps, "max")

  def fail(worst: Any) -> Any:
    def raise_error(worst: Any) -> Any:
      raise SolveError(_message(where, worst))
    return jax.pure_callback(raise_error, jax.ShapeDtypeStruct((), jnp.bool_),
                             worst, vmap_method="broadcast_all")

  raised = jax.lax.cond(worst >> _STEP_BITS != CONVERGED, fail,
                        lambda _: jnp.bool_(False), worst)
  return jax.tree.map(lambda a: jnp.where(raised, jnp.nan, a).astype(a.dtype),
                      x)


def all_finite(tree: Any) -> Any:
  """Whether every entry of ``tree`` is finite."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)

