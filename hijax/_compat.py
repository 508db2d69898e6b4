"""The few places where supported JAX versions (>=0.11.2,<0.13) differ.

Every difference is found by probing the installed JAX for the feature, never by
comparing version strings, so a backport or a patch release is handled for free.

Imports: jax only; any hijax module may use it.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import jax

from hijax._internals import partial_eval as pe
from hijax._internals import remat as _remat

# JAX 0.12 calls DCE rules as ``rule(used_outs, live_ins, eqn)``; 0.11 as
# ``rule(used_outs, eqn)``. Probe JAX's own default rule.
DCE_RULES_GET_LIVE_INS: bool = (
    len(inspect.signature(pe._default_dce_rule).parameters) == 3)

# JAX 0.12's remat rules return ``(out, res, rem)`` and call ``rem(res, *args)``;
# 0.11's return ``(out, rem)`` and call ``rem(*args)``.
def _remat_rules_return_residuals() -> bool:
  try:
    src = inspect.getsource(_remat.RematTrace.process_primitive)
  except (OSError, TypeError):
    src = ""
  if "out_primal, res, rem = rules[prim]" in src:
    return True
  if "out_primal, rem = rules[prim]" in src:
    return False
  raise ImportError(
      "hijax cannot tell how this JAX calls remat rules (neither form found in "
      "jax._src.interpreters.remat.RematTrace.process_primitive); hijax "
      "supports jax>=0.11.2,<0.13")


REMAT_RULES_RETURN_RESIDUALS: bool = _remat_rules_return_residuals()


def register_dce_rule(primitive, rule):
  """Registers ``rule(used_outs, live_ins, eqn)``; ``live_ins`` is None on 0.11."""
  if DCE_RULES_GET_LIVE_INS:
    pe.dce_rules[primitive] = rule
  else:
    pe.dce_rules[primitive] = lambda used_outs, eqn: rule(used_outs, None, eqn)  # pyright: ignore[reportArgumentType]


def register_remat_rule(primitive, rule):
  """Registers ``rule(trace, *args, **params) -> (out, res, rem(res, *args))``."""
  if REMAT_RULES_RETURN_RESIDUALS:
    _remat.rules[primitive] = rule
  else:
    def rule_without_residuals(trace, *args, **params):
      out, res, rem = rule(trace, *args, **params)
      return out, lambda *args: rem(res, *args)
    _remat.rules[primitive] = rule_without_residuals


# JAX's name policies are dataclasses of its own on 0.11 (``saveable_names``,
# ``names``) and closures over the set of names on 0.12. Probe each factory
# with a sample name to learn where a policy keeps its names.
_PROBE_NAME = "__hijax_probe__"


def _names_reader(factory) -> Callable[[object], frozenset | None]:
  """A function giving the names a policy built by ``factory`` holds, or None
  for a policy ``factory`` did not build."""
  sample = factory(_PROBE_NAME)
  if dataclasses.is_dataclass(sample):
    field = next(f.name for f in dataclasses.fields(sample)
                 if getattr(sample, f.name) == {_PROBE_NAME})
    cls = type(sample)
    return lambda p: frozenset(getattr(p, field)) if type(p) is cls else None
  code, cells = getattr(sample, "__code__", None), sample.__closure__ or ()
  i = next((i for i, c in enumerate(cells) if c.cell_contents == {_PROBE_NAME}),
           None)
  if code is None or i is None:
    return lambda p: None  # an unknown layout: no policy is recognized
  return lambda p: (frozenset(p.__closure__[i].cell_contents)  # pyright: ignore[reportAttributeAccessIssue]
                    if getattr(p, "__code__", None) is code else None)


saved_names_of = _names_reader(jax.checkpoint_policies.save_only_these_names)
"""The names of a ``jax.checkpoint_policies.save_only_these_names`` policy, or None."""

unsaved_names_of = _names_reader(
    jax.checkpoint_policies.save_any_names_but_these)
"""The names of a ``jax.checkpoint_policies.save_any_names_but_these`` policy, or None."""
