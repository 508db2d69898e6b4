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


_OFFLOAD_PROBE = dict(names_which_can_be_saved=["__hijax_saved__"],
                      names_which_can_be_offloaded=["__hijax_offloaded__"],
                      offload_src="__hijax_src__", offload_dst="__hijax_dst__")


def _offload_reader(factory) -> Callable[[object], tuple | None]:
  """A function giving ``(saved, offloaded, src, dst)`` of a policy built by
  ``factory`` (a dataclass on 0.11, a closure on 0.12), or None."""
  sample = factory(**_OFFLOAD_PROBE)
  probes = [frozenset(v) if isinstance(v, list) else v
            for v in _OFFLOAD_PROBE.values()]

  def normal(v):
    return frozenset(v) if isinstance(v, (set, frozenset)) else v
  if dataclasses.is_dataclass(sample):
    values = {f.name: normal(getattr(sample, f.name))
              for f in dataclasses.fields(sample)}
    found = [next((n for n, v in values.items() if v == p), None)
             for p in probes]
    names = [n for n in found if n is not None]
    cls = type(sample)
    if len(names) != len(probes):
      return lambda p: None
    return lambda p: (tuple(normal(getattr(p, n)) for n in names)
                      if type(p) is cls else None)
  code, cells = getattr(sample, "__code__", None), sample.__closure__ or ()
  contents = [normal(c.cell_contents) for c in cells]
  index = [next((i for i, v in enumerate(contents) if v == p), None)
           for p in probes]
  if code is None or None in index:
    return lambda p: None  # an unknown layout: no policy is recognized
  return lambda p: (tuple(normal(p.__closure__[i].cell_contents)  # pyright: ignore[reportOptionalSubscript, reportAttributeAccessIssue]
                          for i in index)
                    if getattr(p, "__code__", None) is code else None)


offload_fields_of = _offload_reader(
    jax.checkpoint_policies.save_and_offload_only_these_names)
"""``(names saved, names offloaded, src, dst)`` of a
``jax.checkpoint_policies.save_and_offload_only_these_names`` policy, or None."""
