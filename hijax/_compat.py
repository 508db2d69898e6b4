"""The few places where supported JAX versions (>=0.11.2,<0.13) differ.

Every difference is found by probing the installed JAX for the feature, never by
comparing version strings, so a backport or a patch release is handled for free.
"""
from __future__ import annotations

import inspect

from jax._src.interpreters import partial_eval as pe
from jax._src.interpreters import remat as _remat

# JAX 0.12 calls DCE rules as ``rule(used_outs, live_ins, eqn)``; 0.11 as
# ``rule(used_outs, eqn)``. Probe JAX's own default rule.
DCE_RULES_GET_LIVE_INS: bool = (
    len(inspect.signature(pe._default_dce_rule).parameters) == 3)

# JAX 0.12's remat rules return ``(out, res, rem)`` and call ``rem(res, *args)``;
# 0.11's return ``(out, rem)`` and call ``rem(*args)``.
REMAT_RULES_RETURN_RESIDUALS: bool = (
    "out_primal, res, rem = rules[prim]" in inspect.getsource(_remat.RematTrace.process_primitive))


def register_dce_rule(primitive, rule):
  """Registers ``rule(used_outs, live_ins, eqn)``; ``live_ins`` is None on 0.11."""
  if DCE_RULES_GET_LIVE_INS:
    pe.dce_rules[primitive] = rule
  else:
    pe.dce_rules[primitive] = lambda used_outs, eqn: rule(used_outs, None, eqn)


def register_remat_rule(primitive, rule):
  """Registers ``rule(trace, *args, **params) -> (out, res, rem(res, *args))``."""
  if REMAT_RULES_RETURN_RESIDUALS:
    _remat.rules[primitive] = rule
  else:
    def rule_without_residuals(trace, *args, **params):
      out, res, rem = rule(trace, *args, **params)
      return out, lambda *args: rem(res, *args)
    _remat.rules[primitive] = rule_without_residuals
