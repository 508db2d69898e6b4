"""The entry points: `check_rules` and `assert_rules`."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from hijax.testing._compiled import Budget
from hijax.testing._context import Settings
from hijax.testing._discovery import Surrogates
from hijax.testing._device import accelerator, host, on_accelerator
from hijax.testing._flow import Request, check
from hijax.testing._numerics import check_arrays, defaults, real_or_int
from hijax.testing._report import (INCONCLUSIVE, MODES, InconclusiveCheckError,
                                   RuleCheckError, RuleReport)


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
      ``jax.make_jaxpr`` to find the primitives it binds and the rules they
      define; the checks transform ``prim_fn`` as a whole, so it may do other
      JAX operations or bind several primitives (a mode runs when every
      primitive found defines its rule). Static data is closed over, not
      passed in ``args``. A function that binds no hijax primitive but calls
      ``jax.custom_jvp`` or ``jax.custom_vjp`` functions (or is one) has
      their rules checked the same way: the jvp rule against finite
      differences, reverse mode against forward mode (or finite differences
      for a custom_vjp), ``vmap`` against a loop, and the second order.
      With several of them, where the program fails, each is then checked
      alone, at the inputs the program gives it, so that a failure names
      the one at fault.
    *args: the point to check at: pytrees of arrays (or Python scalars) of
      floating, complex, integer or boolean dtypes (not hi types; the
      primitives inside may take and return hi values). Floating-point and
      complex leaves are differentiated, a complex number as the pair of its
      parts, with JAX's convention (a cotangent ``w`` pairs with a tangent
      ``t`` as ``Re(w t)``, without a conjugate: see the cookbook's complex
      numbers); integer and boolean leaves are held fixed (and equal across
      the batch in the batching check, since they may be indices).
      Finite differences step to either side of the point: an output element
      with a kink or a domain boundary within the step (relu at 0, entr at
      0), or that they cannot resolve in the dtype, is listed under the
      report's ``inconclusive`` and not compared; the others are judged.
    modes: the checks to run, a subset of `MODES`. By default, every mode whose
      rules the primitives define. Naming a mode whose rule is not defined is a
      ``ValueError``.
    atol, rtol: the tolerance of comparisons between rules, ``|got - want| <=
      atol + rtol |want|``. By default 256 units in the last place of the
      compared values (at most 1/16), relative to each element and to the
      largest element of its leaf. Comparisons with finite differences also
      allow their estimated error bound; where a value is zero to rounding
      (the determinant of a singular matrix), an absolute floor measured from
      the function's own rounding applies.
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
      last axis) and unbatched arguments: for a `batch` rule that supports
      only some. Without it, a rule that raises for some combinations and
      runs for others is taken to support only those (the others are listed
      as skipped); one that raises for all fails.
    linear_argnums: for the transpose check, the arguments in which
      ``prim_fn`` is linear: a list of argument indices or tuples of indices
      transposed together. By default each argument is tested numerically
      for linearity and the linear ones are transposed one at a time; where
      the rule raises in some and works in others, it is taken to handle only
      those (the others are listed as skipped).
    order: 2 (the default) also checks second derivatives: the backward pass
      and the tangent map differentiated again against their finite
      differences (which catches a rule right at first order but not
      differentiable again, e.g. a ``stop_gradient`` in a backward rule; the
      report's ``cost`` gives the evaluations it took), and the rules of the
      primitives that the first-order rules bind (the ``"second_order"``
      mode). 1 checks first order only; higher values recurse further.
    jit: compile every evaluation together, as one program: ``prim_fn`` at
      any number of points (a loop) and each transformation under test, each
      a branch that a call runs alone. A transformation that cannot be
      traced, or a program that fails to compile or run, is compiled alone,
      so the check that needs it reports why. Compiling is most of what a
      check costs; the program depends only on ``prim_fn`` and the types, so
      JAX's persistent compilation cache (``jax_compilation_cache_dir``, with
      ``jax_persistent_cache_min_compile_time_secs`` at 0) keeps it for a
      later run, which then compiles nothing. With False, everything runs
      eagerly: slower, but an `expand` that branches in Python on values
      works (leave out the ``"expand"`` mode, whose check includes a jitted
      call).
    raise_on_failure: when False, return the report whatever its verdict
      (with its ``failures``) instead of raising.
    accept_inconclusive: return an inconclusive report instead of raising
      `InconclusiveCheckError` (see Returns).
    surrogates: the custom derivative functions (``jax.custom_jvp``,
      ``jax.custom_vjp``, hijax's decorators) and `HiPrim` classes whose
      rules are deliberately not the derivative (a straight-through
      estimator, a gradient clipper): never compared with the function's
      finite differences, only with each other, with loops and for types;
      the report lists them (``report.surrogates``). Those marked with
      `hijax.testing.surrogate` are surrogates too.
    device: where the rules run besides the host CPU. By default, JAX's
      default device where it is an accelerator (a TPU or a GPU): the checks
      then run on the host CPU (in float64), and every part of their program
      is evaluated again on the device in the inputs' own dtype and compared
      with the host's float64 result, within a tolerance measured on the
      device (see `RuleReport.devices`). A `jax.Device` checks on that device
      (a CPU too); False checks on the host only. Needs ``jit=True``.
    time_budget: seconds the run may take; ``"default"`` allows 30 seconds
      per rule checked, None no limit. Once it is spent, no further check
      starts: those are listed in the report's ``skipped_for_time`` and a
      warning says so. A check that has started runs to its end; a compile
      cannot be interrupted, so none starts that would end past 1.4 times the
      budget by its estimate (a program too long is compiled in pieces), and
      a run ends within about 1.5 times its budget.
    progress: where the run says what it is doing: None prints a line to
      ``stderr`` now and then once a run has taken 10 seconds, True from
      the start, False never; a function receives each line instead.
    require_second_order: a rule that declares that it cannot be
      differentiated again (JAX's forward mode of a ``jax.custom_vjp``
      function, reverse mode of a ``while_loop``, a ``NotImplementedError``)
      fails the second-order check instead of being listed in the report's
      ``first_order_only``.

  Returns:
    A `RuleReport` of the checks that ran, those skipped (and why), what was
    inconclusive, the rules found first-order only and the checks skipped
    for time, with its verdict: ``"passed"`` only where no comparison failed
    and every rule checked was compared conclusively (at some output
    element, in some direction); ``"failed"`` where a comparison failed;
    ``"inconclusive"`` otherwise. A report that compared nothing never
    passes.

  Raises:
    RuleCheckError: (an ``AssertionError``) if a comparison fails; one
      paragraph per failure naming the rule, the check, the input and the
      largest error.
    InconclusiveCheckError: (an ``AssertionError``, not a `RuleCheckError`)
      if nothing failed but some rule was not compared conclusively, unless
      ``accept_inconclusive`` (or ``raise_on_failure=False``); it says which
      rules, why, and what would make them judgeable.
  """
  __tracebackhide__ = True  # pylint: disable=unused-variable
  explicit = modes is not None
  modes = ((modes,) if isinstance(modes, str)
           else tuple(MODES if modes is None else modes))
  if unknown := [m for m in modes if m not in MODES]:
    raise ValueError(f"unknown mode(s) {unknown}; the modes are {MODES}")
  for name, tol in (("atol", atol), ("rtol", rtol)):
    if tol is not None and not tol >= 0:
      raise ValueError(f"check_rules: {name}={tol!r} is not a tolerance (a "
                       "number >= 0); pass a value >= 0, or None for the "
                       "dtype's default")
  check_arrays("argument", "args",
               jax.tree_util.tree_flatten_with_path(args)[0],
               lambda x: real_or_int(jnp.result_type(x)))
  settings = Settings(defaults(atol, rtol), eps, batch_size=batch_size,
                      batch_in_axes=batch_in_axes,
                      linear_argnums=linear_argnums, order=order, jit=jit,
                      require_second_order=require_second_order,
                      budget=Budget.of(time_budget, progress, 1),
                      surrogates=Surrogates(surrogates), modes=modes)
  # on an accelerator the checks themselves run on the host, in float64
  # (device=False too: it only leaves out the device's half)
  accel = accelerator(device) if jit else None
  checks_on = host() if accel is not None or on_accelerator() else None
  report = check(Request(prim_fn, explicit, settings, seed,
                         time_budget == "default", checks_on),
                 args, x64, accel)
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

