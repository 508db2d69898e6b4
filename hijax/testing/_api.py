"""The entry points: `check_rules` and `assert_rules`."""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._budget import SECONDS_PER_RULE, Budget, BudgetSpent
from hijax.testing._context import CheckContext, Settings
from hijax.testing._device import (accelerator, describe, device_context,
                                   device_half, host,
                                   on_accelerator)
from hijax.testing._discovery import find_custom_rules, find_hiprims
from hijax.testing._numerics import (check_arrays, defaults, is_float,
                                     on_device, real_or_int)
from hijax.testing._report import (INCONCLUSIVE, MODES, InconclusiveCheckError,
                                   RuleCheckError, RuleReport)
from hijax.testing._flow import (add_parts, blame_alone, function_raises,
                                 inner_first, plan_modes, raised_at,
                                 required_rules, run, stopped)
from hijax.testing._surrogate import Surrogates


def _to_dtype(x, dtype):
  """``x`` in ``dtype`` if it is floating (in the complex dtype of the same
  precision if complex), else in its own dtype, without a weak type."""
  own = jnp.result_type(x)
  if jnp.issubdtype(own, jnp.inexact):
    if jnp.issubdtype(own, jnp.complexfloating):
      dtype = jnp.result_type(dtype, jnp.complex64)
    return on_device(np.asarray(x), dtype)
  return on_device(np.asarray(x), own)


def _in_own_dtypes(args):
  """``args`` each in its own dtype, without weak types (`_to_dtype`, on the
  default device), and the name of the first floating dtype among them
  (None if there is none)."""
  own = jax.tree.map(lambda x: _to_dtype(x, jnp.result_type(x)), args)
  floats = [x.dtype for x in jax.tree.leaves(own) if is_float(x)]
  return own, str(floats[0]) if floats else None


def _runs(prim_fn, args) -> bool:
  """Whether ``prim_fn`` can be traced and run (compiled) on ``args``."""
  try:
    jax.block_until_ready(jax.jit(prim_fn)(*args))
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def _prepared_if_runs(prim_fn, args, dtype, context_at, jit, ahead):
  """``context_at(args, dtype)`` (a context and the modes to run) if
  ``prim_fn`` runs compiled at ``args``, else None. With ``jit``, the
  program the checks will run (``prim_fn`` and every transformation they
  evaluate, `hijax.testing._compiled`) is compiled here, and ``prim_fn``
  is evaluated by it at the point; ``ahead(plan)`` is called first (it
  starts the device's compile, where there is one)."""
  ctx, plan = None, None
  try:
    ctx, plan = context_at(args, dtype)
    if not jit:
      return (ctx, plan) if _runs(prim_fn, args) else None
    add_parts(ctx, plan)
    ahead(plan)
    jax.block_until_ready(ctx.compiled.evaluate([ctx.leaves]))
    return ctx, plan
  except BudgetSpent as e:  # the run ends: its report is this context's
    e.prepared = None if ctx is None else (ctx, plan)
    raise
  except Exception:  # pylint: disable=broad-except
    return None


def _prepare(prim_fn, args, x64, stack: contextlib.ExitStack, context_at,
             jit, ahead=lambda plan: None):
  """The context of the checks, the modes to run and what ``prim_fn``
  raises at the point in every dtype (None if it runs), at ``args`` in the
  dtype chosen: float64 (entering ``jax.enable_x64`` on ``stack``) unless
  ``x64`` is False or, with ``x64=None``, ``prim_fn`` cannot be run in
  float64 but can in the given dtypes. It is compiled and run, so that an
  `expand` whose output contradicts a declared type (a primitive that
  hard-codes float32) is found before the checks (which then reuse the
  compiled program); a function that fails in both is checked in float64
  (and the checks report why it fails). ``context_at(args, dtype)`` makes
  a context. ``ahead`` is `_prepared_if_runs`'s."""
  own, own_float = _in_own_dtypes(args)
  own_dtype = own_float or "no floating-point inputs"
  if x64 is False:
    return (*context_at(own, own_dtype), None)
  prepared = None
  with jax.enable_x64(True):
    args64 = jax.tree.map(lambda x: _to_dtype(x, jnp.float64), args)
    if x64:
      jax.make_jaxpr(prim_fn)(*args64)  # raises if it cannot be traced
      use64 = True
    else:
      prepared = _prepared_if_runs(prim_fn, args64, "float64", context_at,
                                   jit, ahead)
      use64 = prepared is not None
  error = None
  if not use64:
    prepared = _prepared_if_runs(prim_fn, own, own_dtype, context_at, jit,
                                 ahead)
    if prepared is None:
      error = raised_at(prim_fn, own)
      with jax.enable_x64(True):  # fails either way: report it in float64
        use64 = _traces(prim_fn, args64)
  if use64:
    stack.enter_context(jax.enable_x64(True))
    ctx, plan = prepared or context_at(args64, "float64")
  else:
    ctx, plan = prepared or context_at(own, own_dtype)
  return ctx, plan, error




def _traces(prim_fn, args) -> bool:
  try:
    jax.make_jaxpr(prim_fn)(*args)
    return True
  except Exception:  # pylint: disable=broad-except
    return False



def check_rules(prim_fn: Callable, *args: Any, modes: Iterable[str] | str | None = None,
                atol: float | None = None, rtol: float | None = None,
                eps: float | None = None, x64: bool | None = None,
                seed: int = 0, batch_size: int = 3,
                batch_in_axes: Sequence[Any] | None = None,
                linear_argnums: Sequence[int | Sequence[int]] | None = None,
                order: int = 2, jit: bool = True,
                raise_on_failure: bool = True,
                time_budget: float | str | None = "default",
                progress: bool | Callable[[str], None] | None = None,
                require_second_order: bool = False,
                accept_inconclusive: bool = False,
                surrogates: Iterable[Any] = (),
                device: Any = None) -> RuleReport:
  """Checks the rules of the hijax primitives that ``prim_fn`` binds.

  Args:
    prim_fn: a function of ``args`` that builds and applies a hijax primitive,
      like ``lambda x: Log1pExp(jax.typeof(x))(x)``. It is traced once with
      ``jax.make_jaxpr`` to find the primitives it binds (each equation of a
      hijax primitive carries its instance) and which rules they define.
      The checks transform ``prim_fn`` as a whole, so it may also do other
      JAX operations or bind several primitives; a mode runs when every
      primitive found defines its rule. Static data (functions, shapes) is
      closed over, not passed in ``args``. A function that binds no hijax
      primitive but calls ``jax.custom_jvp`` or ``jax.custom_vjp`` functions
      (or is one) has their rules checked the same way: the jvp rule against
      finite differences, reverse mode against forward mode (or finite
      differences for a custom_vjp), ``vmap`` against a loop, and the second
      order. With several of them, where the program fails, each is then
      checked alone, at the inputs the program gives it, so that a failure
      names the one at fault.
    *args: the point to check at: pytrees of arrays (or Python scalars) of
      floating, complex, integer or boolean dtypes (hi types are not
      supported as arguments or outputs of ``prim_fn``; the primitives
      inside may take and return hi values). Floating-point and complex
      leaves are differentiated, a complex number as the pair of its real
      and imaginary parts, with JAX's convention (a cotangent ``w`` pairs
      with a tangent ``t`` as ``Re(w t)``, without a conjugate: see the
      cookbook's complex numbers); integer and boolean leaves are not
      (they are held fixed, and kept equal across the batch in the
      batching check, since they may be indices).
      Finite differences step to either side of the point: an output
      element with a kink or a domain boundary within the step (relu at
      0, entr at 0), or that finite differences cannot resolve in the
      dtype, is reported under the report's ``inconclusive`` and not
      compared, and the other elements are judged as usual.
    modes: the checks to run, a subset of `MODES`. By default, every mode whose
      rules the primitives define. Naming a mode whose rule is not defined is a
      ``ValueError``.
    atol, rtol: the tolerance of comparisons between rules, ``|got - want| <=
      atol + rtol |want|``. By default it follows the dtype: 256 units in the
      last place of the compared values (at most 1/16), relative to each
      element and to the largest element of its leaf. Comparisons with finite
      differences also allow the error bound estimated for them; where a
      value is zero to rounding (the determinant of a singular matrix), an
      absolute floor measured from the function's own rounding applies.
    eps: a fixed relative finite-difference step (rounded to a power of two).
      By default steps from about ``eps^(1/3)`` of the dtype down to a few
      units in the last place are tried, and for each output element the one
      with the smallest estimated error is used (see the checking-rules page).
    x64: run in float64 (floating-point leaves of ``args`` are converted, under
      ``jax.enable_x64``). The default, None, tries float64 and falls back to
      the given dtypes if ``prim_fn`` cannot be traced and run in float64
      (e.g. a primitive that hard-codes float32 types).
    seed: seeds the random tangents, cotangents and batch perturbations.
    batch_size: the batch size of the batching checks.
    batch_in_axes: the ``in_axes`` values to check ``vmap`` with (one per
      entry), instead of every combination of batched (along the first or the
      last axis) and unbatched arguments. Use it for a `batch` rule that
      supports only some combinations. Without it, a rule that raises for
      some combinations and runs for others is taken to support only those
      (the others are listed as skipped); one that raises for all fails.
    linear_argnums: for the transpose check, the arguments in which
      ``prim_fn`` is linear, as a list whose entries are an argument index or
      a tuple of indices transposed together. By default each argument is
      tested numerically for linearity and the linear ones are transposed one
      at a time; where the rule raises in some of them and works in others,
      it is taken to handle only those (the others are listed as skipped).
    order: 2 (the default) also checks second derivatives: JAX's derivative
      of the backward pass and of the tangent map against their finite
      differences (which catches a rule that is right at first order but not
      differentiable again, e.g. a ``stop_gradient`` in a backward rule; the
      report's ``cost`` gives the evaluations it took), and the rules of the
      primitives that the first-order rules bind (see the ``"second_order"``
      mode). 1 checks first order only. Higher values recurse further.
    jit: compile every evaluation, together, as one program: ``prim_fn``
      at any number of points (a loop: all the points of a finite
      difference in one call) and each transformation under test
      (``jax.jvp``, ``jax.vjp``, ``jax.linearize``, ``jax.vmap``, second
      derivatives, and the first-order checks that the second-order mode
      runs again on derived functions whose rules bind hijax primitives),
      each a branch that a call runs alone. A transformation
      that cannot be traced, or a program that fails to compile or run, is
      compiled alone instead, so the check that needs it reports why.
      Compiling is most of what a check costs; the program depends only on
      ``prim_fn`` and the types, so JAX's persistent compilation cache
      (``jax_compilation_cache_dir``, with
      ``jax_persistent_cache_min_compile_time_secs`` at 0) keeps it for a
      later run of a test suite, which then compiles nothing. With False,
      everything runs eagerly: slower, but an `expand` that branches in
      Python on values works (leave out the ``"expand"`` mode, whose check
      includes a jitted call).
    raise_on_failure: when False, return the report whatever its verdict
      (with its ``failures``) instead of raising.
    accept_inconclusive: return an inconclusive report instead of raising
      `InconclusiveCheckError` (see Returns).
    surrogates: the custom derivative functions (``jax.custom_jvp``,
      ``jax.custom_vjp``, hijax's decorators) and `HiPrim` classes whose
      rules are deliberately not the derivative (a straight-through
      estimator, a gradient clipper): they are never compared with the
      function's finite differences, only with each other, with loops and
      for types, and the report lists them (``report.surrogates``). Those
      marked with `hijax.testing.surrogate` are surrogates too.
    device: where the rules run besides the host CPU. By default, JAX's
      default device where it is an accelerator (a TPU or a GPU): the
      checks then run on the host CPU (in float64, as on a CPU), and every
      part of their program is evaluated again on the device in the inputs'
      own dtype and compared with the host's float64 result, with a
      tolerance measured on the device (see `RuleReport.devices`). A
      `jax.Device` checks on that device (a CPU too); False checks on the
      host only. Needs ``jit=True``.
    time_budget: seconds the run may take; ``"default"`` allows
      30 seconds per rule checked, None no limit. Once it is
      spent, no further check starts: those are listed in the report's
      ``skipped_for_time`` and a warning says so. A check that has started
      runs to its end, but a compile still running at 1.4 times the budget
      is abandoned (it runs in a thread of its own) and the run ends there,
      so a run ends within about 1.5 times its budget.
    progress: where the run says what it is doing: None prints a line to
      ``stderr`` now and then once a run has taken 10 seconds, True from
      the start, False never; a function receives each line instead.
    require_second_order: a rule that declares that it cannot be
      differentiated again (JAX's forward mode of a ``jax.custom_vjp``
      function, reverse mode of a ``while_loop``, a
      ``NotImplementedError``) fails the second-order check instead of
      being listed in the report's ``first_order_only``.

  Returns:
    A `RuleReport` listing the checks that ran, the modes skipped, what was
    inconclusive (and why), the rules found first-order only and the checks
    skipped for time, with its verdict: ``"passed"`` only where no
    comparison failed and every rule checked was compared conclusively (at
    some output element, in some direction); ``"failed"`` where a
    comparison failed; ``"inconclusive"`` otherwise (nothing could be
    judged: finite differences that resolve nothing at this point, every
    check skipped for time, ...). A report that compared nothing never
    passes.

  Raises:
    RuleCheckError: (an ``AssertionError``) if a comparison fails. Its
      message has one paragraph per failure naming the rule, the check, the
      input and the largest error.
    InconclusiveCheckError: (an ``AssertionError``, not a `RuleCheckError`)
      if nothing failed but some rule was not compared conclusively, unless
      ``accept_inconclusive`` (or ``raise_on_failure=False``). Its message
      says which rules, why, and what would make them judgeable.
  """
  __tracebackhide__ = True  # pylint: disable=unused-variable
  if isinstance(modes, str):
    modes = (modes,)
  explicit = modes is not None
  modes = list(MODES if modes is None else modes)
  unknown = [m for m in modes if m not in MODES]
  if unknown:
    raise ValueError(f"unknown mode(s) {unknown}; the modes are {MODES}")

  check_arrays("argument", "args",
               jax.tree_util.tree_flatten_with_path(args)[0],
               lambda x: real_or_int(jnp.result_type(x)))
  declared = Surrogates(surrogates)
  budget = Budget.of(time_budget, progress, 1)  # one for the whole run
  def context_at(args, dtype):
    """The context of the checks at ``args``, and the modes to run."""
    closed = jax.make_jaxpr(prim_fn)(*args)
    prims = (find_hiprims(closed.jaxpr, [])
             or find_custom_rules(closed.jaxpr, []))
    if not prims:
      raise ValueError(
          "prim_fn binds no hijax primitive and calls no jax.custom_jvp or "
          "jax.custom_vjp function: pass a function that applies one, "
          "e.g. lambda x: MyPrim(jax.typeof(x))(x)")
    if time_budget == "default":  # per rule checked
      budget.seconds = SECONDS_PER_RULE * max(1, len(prims))
    settings = Settings(defaults(atol, rtol), eps, batch_size=batch_size,
                        batch_in_axes=batch_in_axes,
                        linear_argnums=linear_argnums, order=order, jit=jit,
                        require_second_order=require_second_order,
                        budget=budget, surrogates=declared)
    paths = jax.tree_util.tree_flatten_with_path(args)[0]
    names = [f"args[{p[0].idx}]" + jax.tree_util.keystr(p[1:])
             for p, _ in paths]
    report = RuleReport([repr(p) for p in prims], dtype)
    report.surrogates = [repr(p) for p in prims if p in declared]
    ctx = CheckContext(prim_fn, args, names, settings,
                       np.random.default_rng(seed), report, prims,
                       requested=tuple(modes))
    return ctx, plan_modes(ctx, modes, explicit)

  accel = accelerator(device) if jit else None
  # on an accelerator the checks themselves run on the host, in float64
  # (device=False too: it only leaves out the device's half)
  host_device = host() if accel is not None or on_accelerator() else None
  # the device's half runs the inputs in their own dtypes
  own, own_float = _in_own_dtypes(args) if accel is not None else (None, None)
  own_dtype = own_float or "float32"
  devices_ahead: dict = {}  # plan -> the device's context, compiling

  def ahead(plan):
    """Starts the device's half's compile for ``plan`` (once), so that it
    runs while the host's half does."""
    if accel is None or tuple(plan) in devices_ahead:
      return
    try:
      devices_ahead[tuple(plan)] = device_context(
          plan, own, own_dtype, accel, context_at, add_parts)
    except Exception:  # pylint: disable=broad-except  (the device half reports it)
      devices_ahead[tuple(plan)] = None
  try:  # no thread of the run outlives it (Budget.finish)
    with contextlib.ExitStack() as stack:
      if host_device is not None:
        stack.enter_context(jax.default_device(host_device))
      try:
        ctx, plan, error = _prepare(prim_fn, args, x64, stack, context_at,
                                    jit, ahead)
      except BudgetSpent as e:  # before the first check
        ctx, plan = e.prepared or context_at(args, "float64")
        error = None
        stopped(ctx, plan, e)
      else:
        if error is None:
          ahead(plan)
        ctx.report.required = required_rules(ctx, plan)
        try:
          if not function_raises(ctx, prim_fn, plan, error):
            run(ctx, plan)
          if ctx.report.failures and error is None:
            blame_alone(prim_fn, ctx.args, ctx.prims, ctx.settings, ctx.rng,
                         ctx.report, tuple(modes))
            inner_first(ctx, ctx.report)
        except BudgetSpent as e:
          stopped(ctx, plan, e)
      report, settings = ctx.report, ctx.settings
      report.devices["checks"] = describe(host_device or jax.devices()[0],
                                          report.dtype)
    if accel is not None and error is None and not (
        settings.budget.spent):
      try:
        device_half(ctx, plan, own, own_dtype, accel, host_device, context_at,
                    add_parts, devices_ahead.get(tuple(plan)))
      except BudgetSpent as e:
        stopped(ctx, [], e)
  finally:
    budget.finish()
  report.seconds = settings.budget.elapsed

  if report.skipped_for_time:
    warnings.warn(
        f"check_rules on {', '.join(report.primitives)}: the time budget "
        f"({settings.budget.seconds:g} s) was spent after "
        f"{report.seconds:.1f} s; {len(report.skipped_for_time)} check(s) "
        "did not run (the report's skipped_for_time lists them; pass "
        "time_budget=None for no limit)", stacklevel=2)
  if report.failures and raise_on_failure:
    raise RuleCheckError(report)
  if (report.verdict == INCONCLUSIVE and raise_on_failure
      and not accept_inconclusive):
    raise InconclusiveCheckError(report)
  return report



def assert_rules(prim_fn: Callable[..., Any], *args: Any, **kwargs: Any
                 ) -> RuleReport:
  """`check_rules` for test suites: same arguments, same `RuleCheckError`.

  Pytest hides this module's frames from the traceback, so a failing test
  shows the call and the message naming the rule, the input and the error.
  """
  __tracebackhide__ = True  # pylint: disable=unused-variable
  kwargs["raise_on_failure"] = True
  return check_rules(prim_fn, *args, **kwargs)

