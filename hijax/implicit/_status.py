"""How a solve reports failure: `Status`, the default tolerances, and the
run-time error raised for a failed solve (eagerly, under ``jit`` and ``vmap``).

A solver returns ``(x, Status)``. With ``throw=True`` (the default of the
public functions) the primitive's ``expand`` calls `raise_if_failed`: a
``lax.cond`` on whether any instance failed, whose failing branch calls the
host to raise `SolveError`. The passing branch costs one predicate and no host
round trip. Under ``vmap`` the predicate is reduced over the batch by
`_AcrossBatch`, a primitive whose batching rule reduces instead of mapping, so
that the ``cond`` stays a ``cond`` and not a ``select`` of both branches. The
failing branch is a primitive of its own (``hijax_solve_failed``), lowered to
a host callback, except under ``jax.export``, which it refuses in words
(naming ``throw=False``); under ``jit`` it logs the reason before raising.

`solved` reads what a solver returned and names a user's solver that
returned the wrong thing.
"""
from __future__ import annotations

import functools
import logging
import threading
from typing import Any, NamedTuple

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.interpreters import batching, mlir

from hijax._internals.core import ShapedArray
from hijax.implicit._precision import check_precision
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
  wrapped in JAX's runtime error, whose message ends with this one, and its
  message is logged first on the ``hijax.implicit`` logger)."""


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


def solved(result: Any, where: str, like: Any = None,
           solver: Any = None) -> Any:
  """``(x, Status)`` from what a solver returned: that pair, or ``x`` alone
  (a user's solver), whose Status then says only whether it is finite.

  With ``like`` (the unknown, or its types), ``x`` must have its structure,
  shapes and dtypes, and a Status must hold one scalar per field: anything
  else raises a TypeError naming ``solver`` (the solver called, for the
  message), what it returned, what was expected and the fix."""
  pair = (isinstance(result, tuple) and len(result) == 2
          and isinstance(result[1], Status))
  if isinstance(result, Status):
    raise _returned_error(where, solver, like,
                          "a Status alone: return (x, Status) or x")
  x = result[0] if pair else result
  if like is not None and not _like(x, like):
    expected = jax.tree.map(lambda a: jax.typeof(a).str_short(), like)
    if (isinstance(result, tuple) and len(result) == 2
        and _like(result[0], like)):
      problem = (f"{_describe(result)}, whose second element is not a "
                 "hijax.implicit.Status: return (x, Status(converged, steps, "
                 "error, reason)), or x alone (its Status then says only "
                 "whether x is finite)")
    elif pair:
      problem = (f"(x, Status) with x {_describe(x)}, but the unknown is "
                 f"{expected}: return x with the unknown's shapes and dtypes")
    else:
      problem = (f"{_describe(result)}, but the unknown is {expected}: "
                 "return the solution x, with the unknown's shapes and "
                 "dtypes, or (x, Status)")
    raise _returned_error(where, solver, like, problem)
  if pair:
    if getattr(solver, "_status_is_declared", False):
      return result  # one of hijax's solvers: its Status is built by status
    return x, _normalized(result[1], where, solver)
  finite = all_finite(result)
  return result, status(jnp.where(finite, CONVERGED, NONFINITE), 1,
                        jnp.where(finite, 0., jnp.inf))


def _types(tree: Any) -> Any:
  return jax.tree.map(lambda a: (tuple(a.shape), jnp.dtype(a.dtype)),
                      tree)


def _like(x: Any, like: Any) -> bool:
  try:
    return (jax.tree.structure(x) == jax.tree.structure(like)
            and _types(x) == _types(like))
  except (AttributeError, TypeError):  # a leaf that is not an array
    return False


def _describe(v: Any) -> str:
  """What a solver returned, in words: its pytree of types."""
  if isinstance(v, Status):
    return "Status(...)"
  if isinstance(v, (tuple, list)):
    inner = ", ".join(_describe(e) for e in v)
    return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
  if hasattr(v, "shape") and hasattr(v, "dtype"):
    return jax.typeof(v).str_short()
  return repr(v) if isinstance(v, (bool, int, float)) else (
      f"a {type(v).__name__}")


def _solver_name(solver: Any) -> str:
  if solver is None:
    return "the solver"
  return getattr(solver, "__qualname__", None) or repr(solver)


def _returned_error(where: str, solver: Any, like: Any,
                    problem: str) -> TypeError:
  return TypeError(f"{where}: your solver {_solver_name(solver)} returned "
                   f"{problem}")


def _normalized(st: Status, where: str, solver: Any) -> Status:
  """A solver's Status with the declared dtypes (one scalar per field), its
  ``converged`` and ``reason`` made to agree: not converged is a failure."""
  fields = []
  for field, dtype in zip(Status._fields, (jnp.bool_, jnp.int32, jnp.float32,
                                           jnp.int32)):
    value = getattr(st, field)
    if jnp.shape(value) != ():
      raise TypeError(
          f"{where}: your solver {_solver_name(solver)} returned a Status "
          f"whose `{field}` is {_describe(value)}: each field is one scalar "
          "per solve (under vmap too: the batch is added for you)")
    fields.append(jnp.asarray(value).astype(dtype))
  converged, steps, error, reason = fields
  failed = ~converged | (reason != CONVERGED)
  reason = jnp.where(failed & (reason == CONVERGED), MAX_ITER, reason)
  return Status(~failed, steps, error, reason)


def default_tol(dtype: Any) -> float:
  """The default tolerance for unknowns of ``dtype``: 1e-12 for 64-bit floats
  (and complex128), 1e-6 for 32-bit, 10 eps for narrower ones (bfloat16,
  float16), which cannot resolve 1e-6. It holds on any backend: where a
  matrix product at the precision in force is coarser than the dtype (a
  TPU), the solvers compute theirs at ``"highest"``
  (``hijax/implicit/_precision.py``)."""
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.inexact):
    dtype = jnp.dtype(jnp.result_type(float))
  bits = jnp.finfo(dtype).bits
  if bits >= 64:
    return 1e-12
  return 1e-6 if bits == 32 else 10 * float(jnp.finfo(dtype).eps)


# --- reducing over a batch ----------------------------------------------------

class _AcrossBatch(HiPrim):
  """The identity on a boolean array, except under ``vmap``, where it says
  whether any instance of the batch is True, unbatched."""

  def __init__(self, aval: Any):
    self.in_avals, self.out_aval = (aval,), aval
    self.params = dict[str, Any]()
    super().__init__()

  def expand(self, x: Any) -> Any:
    return x

  def batch(self, axis_data: Any, args: Any, dims: Any) -> Any:
    (x,), (d,) = args, dims
    # a count by a product with ones: XLA's CPU reduction over a long
    # batch is a chain of partial reductions, the product one call. A sum
    # of zeros and ones is positive when one term is, rounded or not, at
    # any precision (set as the checks' products are). The ones are a
    # NumPy constant: jnp.ones is a kernel of its own to compile
    count = jnp.tensordot(x.astype(jnp.float32),
                          np.ones(x.shape[d], np.float32), axes=([d], [0]),
                          precision=check_precision(jnp.float32))
    out = count > 0
    return _AcrossBatch(jax.typeof(out))(out), None


def _across_batch(x: Any) -> Any:
  """Whether ``x`` is True, or under ``vmap`` whether any instance's is."""
  return _AcrossBatch(jax.typeof(x))(x)


# --- raising ------------------------------------------------------------------

_STEP_BITS = 24  # a step count above 2**24 - 1 is reported as that


def _worst(reason: Any, steps: Any) -> int:
  """The worst instance's reason and step count, packed in one integer (the
  reason in the high bits), from arrays of either (under ``vmap``, of a
  batch; a step count unbatched beside batched reasons applies to all)."""
  reason, steps = np.asarray(reason), np.asarray(steps)
  if steps.shape != reason.shape:
    try:
      steps = np.broadcast_to(steps, reason.shape)
    except ValueError:  # batched differently: the largest count of all
      steps = np.full(reason.shape, steps.max(initial=0))
  steps = np.minimum(steps.astype(np.int64), (1 << _STEP_BITS) - 1)
  packed = (reason.astype(np.int64) << _STEP_BITS) | steps
  return int(packed.max(initial=0))


def _message(where: Any, worst: Any) -> Any:
  worst = int(worst)
  reason, steps = worst >> _STEP_BITS, worst & ((1 << _STEP_BITS) - 1)
  text = REASONS[reason] if 0 <= reason < len(REASONS) else f"code {reason}"
  return (f"{where} failed: {text} (after {steps} step(s); under vmap, the "
          "worst instance). Loosen `tol`, raise `max_iter`, start closer, or "
          "pass `throw=False` to get the solution with its Status (whose "
          "`error` is the final error) and handle the failure yourself")


def raise_if_failed(x: Any, st: Status, where: str) -> Any:
  """``x``, or a `SolveError` at run time if ``st`` says the solve failed.

  The check is one ``lax.cond`` on whether the reason is not "converged"
  (over a batch: whether any instance's is not, by a count), whose failing
  branch hands each instance's reason and step count to the host, which
  finds the worst instance (`_worst`) and raises: the branch holds the host
  call alone, no kernel of its own for XLA to compile (it packed and
  reduced them itself: one or two kernels per checked solve). ``x`` does
  not pass through the ``cond`` (which would copy it
  and split the fused computations around it): the ``cond`` returns a flag,
  and ``x`` is returned through an ``optimization_barrier`` with that flag,
  which ties it to the check at no cost (JAX does not remove an operand of
  a barrier whose output is used; XLA keeps the host call, which has a side
  effect).
  It was read through a select on the flag, a pass over ``x``, which cost
  5 to 10% of a vmapped scalar root's time. The Status's error is not part
  of it: the ``cond`` would need it computed first, and for an iteration
  that costs (an HVP of a Newton root: 84 -> 150 us).
  """
  def failed(reason: Any, steps: Any) -> Any:
    return _failed_p.bind(reason, steps, where=where)

  raised = jax.lax.cond(_across_batch(st.reason != CONVERGED), failed,
                        lambda *_: jnp.bool_(False), st.reason, st.steps)
  return jax.lax.optimization_barrier((x, raised))[0]


# The failing branch's host call, as a primitive of its own: its lowering is
# where jax.export (which cannot serialize a host callback) is told what to
# do, in words naming hijax and throw=False, instead of JAX's message.
_failed_p = jax.extend.core.Primitive("hijax_solve_failed")
_LOG = logging.getLogger("hijax.implicit")
# How many eager calls that turn errors into ours are running. Process-wide,
# not per thread: an accelerator's runtime calls the host from a thread of
# its own (a thread-local flag logged every eager failure on a TPU).
_QUIET = {"depth": 0}
_QUIET_LOCK = threading.Lock()


def _raise_solve_error(where: str, reason: Any, steps: Any) -> Any:
  message = _message(where, _worst(reason, steps))
  if not _QUIET["depth"]:
    # Under jit JAX wraps this error in its own, whose first lines are its
    # callback machinery; the log line puts the reason first.
    _LOG.error("SolveError: %s", message)
  raise SolveError(message)


def _failed_lowering(ctx: Any, reason: Any, steps: Any, *, where: str) -> Any:
  parameters = getattr(ctx.module_context, "lowering_parameters", None)
  if getattr(parameters, "for_export", False):
    raise ValueError(
        f"{where}: jax.export cannot serialize this solve's check: with "
        "throw=True (the default) a failed solve raises through a host "
        "callback, which exported programs cannot contain. Pass "
        "throw=False to the solve in the function you export, and check "
        "the returned Status (`converged`) yourself")
  callback = functools.partial(_raise_solve_error, where)
  # A callback with a side effect: XLA keeps it though nothing reads the
  # flag it returns (`raise_if_failed` returns x through an
  # optimization_barrier with the flag, which keeps the cond from JAX's DCE,
  # not from XLA's). Unordered: it needs no token.
  return mlir.lower_fun(lambda r, s: io_callback(
      callback, jax.ShapeDtypeStruct((), jnp.bool_), r, s, ordered=False),
      multiple_results=False)(ctx, reason, steps)


def _failed_batch(args: Any, dims: Any, *, where: str) -> Any:
  # the batched reasons and step counts go to the host as they are (it
  # finds the worst instance: `_worst`), with the batch axis first; the
  # flag is unbatched (None: JAX's "not mapped")
  args = [a if d is None else jnp.moveaxis(a, d, 0)
          for a, d in zip(args, dims)]
  return _failed_p.bind(*args, where=where), None


_failed_p.def_impl(lambda reason, steps, *, where: _raise_solve_error(
    where, reason, steps))
_failed_p.def_abstract_eval(
    lambda reason, steps, *, where: ShapedArray((), jnp.bool_))
mlir.register_lowering(_failed_p, _failed_lowering)
batching.primitive_batchers[_failed_p] = _failed_batch


class quiet_solve_errors:
  """While active (an eager call that raises `SolveError` itself), a failed
  solve is not logged, from whichever thread the host is called (a jitted
  solve failing in another thread meanwhile is not logged either: its
  caller still gets JAX's error, which carries the reason)."""

  def __enter__(self) -> None:
    with _QUIET_LOCK:
      _QUIET["depth"] += 1

  def __exit__(self, *exc: Any) -> None:
    with _QUIET_LOCK:
      _QUIET["depth"] -= 1


def all_finite(tree: Any) -> Any:
  """Whether every entry of ``tree`` is finite."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)

