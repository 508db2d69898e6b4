"""The entry points: `check_rules` and `assert_rules`."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._context import CheckContext, Settings
from hijax.testing._discovery import find_custom_rules, find_hiprims
from hijax.testing._numerics import check_arrays, defaults, is_float, real_or_int
from hijax.testing._report import (DERIVATIVE_MODES, MODES, RuleCheckError,
                                   RuleReport)
from hijax.testing._run import run


def _to_dtype(x, dtype):
  x = jnp.asarray(x)
  if is_float(x):
    return jnp.array(x, dtype=dtype)
  return jnp.array(x, dtype=x.dtype)  # drops weak types


def _runs(prim_fn, args) -> bool:
  """Whether ``prim_fn`` can be traced and called on ``args``."""
  try:
    jax.make_jaxpr(prim_fn)(*args)
    jax.block_until_ready(prim_fn(*args))
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def _choose_dtype(prim_fn, args, x64, stack: contextlib.ExitStack):
  """The arguments to check at and the name of their floating-point dtype:
  float64 (entering ``jax.enable_x64`` on ``stack``) unless ``x64`` is False
  or, with ``x64=None``, ``prim_fn`` cannot be run in float64 but can in the
  given dtypes. It is traced and then called, so that an `expand` whose
  output contradicts a declared type (a primitive that hard-codes float32)
  is found before the checks; a function that fails in both is checked in
  float64 (and the checks report why it fails)."""
  own = jax.tree.map(lambda x: _to_dtype(x, jnp.result_type(x)), args)
  floats = [x.dtype for x in jax.tree.leaves(own) if is_float(x)]
  own_dtype = str(floats[0]) if floats else "no floating-point inputs"
  if x64 is False:
    return own, own_dtype
  with jax.enable_x64(True):
    args64 = jax.tree.map(lambda x: _to_dtype(x, jnp.float64), args)
    if x64:
      jax.make_jaxpr(prim_fn)(*args64)  # raises if it cannot be traced
      use64 = True
    else:
      use64 = _runs(prim_fn, args64)
  if not use64 and not _runs(prim_fn, own):
    with jax.enable_x64(True):  # fails either way: report it in float64
      use64 = _traces(prim_fn, args64)
  if use64:
    stack.enter_context(jax.enable_x64(True))
    return args64, "float64"
  return own, own_dtype


def _traces(prim_fn, args) -> bool:
  try:
    jax.make_jaxpr(prim_fn)(*args)
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def _plan(ctx: CheckContext, modes, explicit) -> list[str]:
  """The modes to run; the others are reported as skipped. Naming a mode
  whose rule a primitive does not define is a ValueError."""
  to_run = []
  for mode in modes:
    if mode == "second_order":
      if ctx.settings.order < 2:
        ctx.skip(mode, "order < 2")
      elif any(ctx.has(m) for m in DERIVATIVE_MODES if m in modes):
        to_run.append(mode)
      else:
        ctx.skip(mode, "no first-order derivative mode runs")
    elif ctx.has(mode):
      to_run.append(mode)
    elif explicit:
      missing = [type(p).__name__ for p, r in zip(ctx.prims, ctx.rules)
                 if mode not in r]
      raise ValueError(f"mode {mode!r} was requested, but {', '.join(missing)} "
                       f"define(s) no {mode} rule")
    else:
      ctx.skip(mode, "rule not defined")
  return to_run


def check_rules(prim_fn: Callable, *args: Any, modes: Iterable[str] | str | None = None,
                atol: float | None = None, rtol: float | None = None,
                eps: float | None = None, x64: bool | None = None,
                seed: int = 0, batch_size: int = 3,
                batch_in_axes: Sequence[Any] | None = None,
                linear_argnums: Sequence[int | Sequence[int]] | None = None,
                order: int = 2, jit: bool = True,
                raise_on_failure: bool = True) -> RuleReport:
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
      order.
    *args: the point to check at: pytrees of arrays (or Python scalars) of
      real or integer dtypes (hi types and complex numbers are not supported
      as arguments or outputs of ``prim_fn``; the primitives inside may take
      and return hi values). Floating-point leaves are differentiated;
      integer and boolean leaves are not (they are held fixed, and kept equal
      across the batch in the batching check, since they may be indices).
      Choose a point where the function is smooth: finite differences step
      to either side.
    modes: the checks to run, a subset of `MODES`. By default, every mode whose
      rules the primitives define. Naming a mode whose rule is not defined is a
      ``ValueError``.
    atol, rtol: the tolerance of comparisons between rules, ``|got - want| <=
      atol + rtol |want|``. By default it follows the dtype: 256 units in the
      last place of the compared values (at most 1/16), relative to each
      element and to the largest element of its leaf. Comparisons with finite
      differences also allow the error bound estimated for them.
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
      supports only some combinations.
    linear_argnums: for the transpose check, the arguments in which
      ``prim_fn`` is linear, as a list whose entries are an argument index or
      a tuple of indices transposed together. By default each argument is
      tested numerically for linearity and the linear ones are transposed one
      at a time.
    order: 2 (the default) also checks second derivatives: JAX's derivative
      of the backward pass and of the tangent map against their finite
      differences (which catches a rule that is right at first order but not
      differentiable again, e.g. a ``stop_gradient`` in a backward rule; the
      report's ``cost`` gives the evaluations it took), and the rules of the
      primitives that the first-order rules bind (see the ``"second_order"``
      mode). 1 checks first order only. Higher values recurse further.
    jit: compute the references (finite differences, loops over a batch,
      plain evaluations) with ``jax.jit(prim_fn)``, which compiles once for
      all of them. The transformations under test (``jax.jvp``, ``jax.vjp``,
      ``jax.vmap``, ...) are applied to ``prim_fn`` itself either way. With
      False, the references run eagerly too: slower, but an `expand` that
      branches in Python on values works (leave out the ``"expand"`` mode,
      whose check includes a jitted call).
    raise_on_failure: when False, return the report with its ``failures``
      instead of raising.

  Returns:
    A `RuleReport` listing the checks that ran and the modes skipped.

  Raises:
    RuleCheckError: (an ``AssertionError``) if a check fails. Its message has
      one paragraph per failure naming the rule, the check, the input and the
      largest error.
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
  with contextlib.ExitStack() as stack:
    args, dtype = _choose_dtype(prim_fn, args, x64, stack)
    tol = defaults(atol, rtol)
    closed = jax.make_jaxpr(prim_fn)(*args)
    prims = (find_hiprims(closed.jaxpr, [])
             or find_custom_rules(closed.jaxpr, []))
    if not prims:
      raise ValueError(
          "prim_fn binds no hijax primitive and calls no jax.custom_jvp or "
          "jax.custom_vjp function: pass a function that applies one, "
          "e.g. lambda x: MyPrim(jax.typeof(x))(x)")
    report = RuleReport([repr(p) for p in prims], dtype)
    paths = jax.tree_util.tree_flatten_with_path(args)[0]
    names = [f"args[{p[0].idx}]" + jax.tree_util.keystr(p[1:])
             for p, _ in paths]
    settings = Settings(tol, eps, batch_size=batch_size,
                        batch_in_axes=batch_in_axes,
                        linear_argnums=linear_argnums, order=order, jit=jit)
    ctx = CheckContext(prim_fn, args, names, settings,
                       np.random.default_rng(seed), report, prims,
                       requested=tuple(modes))
    run(ctx, _plan(ctx, modes, explicit))

  if report.failures and raise_on_failure:
    raise RuleCheckError(report)
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

