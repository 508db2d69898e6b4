"""Cotangents returned by backward rules: checked, then added into accumulators.

`accumulate` is what the default `HiPrim.vjp_bwd` does with the cotangents
that `HiPrim.vjp_bwd_retval` returns; `check_cotangent` is also applied by
`hijax.autodiff` to what an overriding rule passes to ``acc.accum``.

Imports: `hijax._checks` and `hijax._util` only (it sits below `hijax.primitive`, which calls
`accumulate`). `hijax.autodiff.accumulate` re-exports it.
"""
from __future__ import annotations

from typing import Any

import jax
from jax.ref import AbstractRef

from hijax import _checks
from hijax._internals import core
from hijax._internals import dtypes
from hijax._util import describe_value

__all__ = ["accumulate", "check_cotangent", "bwd_checks_disabled"]


def bwd_checks_disabled() -> bool:
  """Whether ``jax.config.jax_disable_bwd_checks`` is set ("disables all bwd
  pass checks"): cotangents are then passed on unchecked, as JAX does."""
  return bool(jax.config.jax_disable_bwd_checks)


def accumulate(prim: Any, arg_accums: Any, cts: Any,
               method: str = "vjp_bwd_retval") -> None:
  """Adds cotangents returned by a retval-style rule into the accumulators.

  ``prim`` is a `HiPrim`. ``cts`` has one entry per input of ``prim``, each a
  pytree matching that input's type (None, anywhere, means a zero cotangent).
  ``method`` is the rule that returned them, for the error messages.
  """
  name = type(prim).__name__
  if not isinstance(cts, (tuple, list)) or len(cts) != len(prim.in_avals):
    what, got = ("(cotangents, logs) with cotangents a tuple", "cotangents"
                 ) if method == "vjp_bwd_retval_logs" else ("a tuple", "")
    raise TypeError(
        f"{name}.{method} must return {what} with one cotangent per "
        f"input ({len(prim.in_avals)}), got {got}{' ' * bool(got)}"
        f"{describe_value(cts)}")
  if prim._args_are_leaves:  # one accumulator per input: no pytrees to match
    for i, (acc, ct) in enumerate(zip(arg_accums, cts)):
      if ct is not None and check_cotangent(prim, method, i, acc.aval, ct):
        acc.accum(ct)
    return
  for i, (accs, ct, aval_tree) in enumerate(zip(arg_accums, cts, prim.in_avals)):
    if ct is None:
      continue
    treedef = jax.tree.structure(aval_tree)
    try:
      ct_leaves = treedef.flatten_up_to(ct)
    except (ValueError, TypeError):
      raise TypeError(
          f"{name}.{method}: the cotangent for input {i} has structure "
          f"{jax.tree.structure(ct)}, but the input has structure {treedef}"
      ) from None
    for acc, c in zip(jax.tree.leaves(accs), ct_leaves):
      if c is not None and check_cotangent(prim, method, i, acc.aval, c):
        acc.accum(c)


def check_cotangent(prim, method, i, ct_aval, ct, how="returned") -> bool:
  """Checks a cotangent for input ``i``; False if it is to be dropped.

  A ``float0`` cotangent type (an integer or boolean input) takes None, a
  float0 value, or anything of the right shape, which is dropped. With
  ``jax_disable_bwd_checks`` set, nothing else is checked.
  """
  if type(ct_aval) is core.ShapedArray and ct_aval.dtype == dtypes.float0:
    actual = _checks.type_of(ct)
    if getattr(actual, "shape", None) == ct_aval.shape:
      return actual.dtype == dtypes.float0  # pyright: ignore[reportAttributeAccessIssue, reportOptionalMemberAccess]
  elif isinstance(ct_aval, AbstractRef):
    return True  # JAX checks what is added to a reference
  elif bwd_checks_disabled():
    return True
  _checks.check_type(prim, method, f"the cotangent of input {i}", ct_aval, ct,
                     "cotangent", "in_avals",
                     "A cotangent has the type of its input's to_ct_aval().",
                     how)
  return True


