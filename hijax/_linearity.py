"""Whether a jaxpr is linear in its inputs, read off its equations.

`jvp_from_vjp` transposes a backward rule in its cotangent, which is right
only if the rule is linear in it. JAX's transposition catches most
non-linear operations itself (``max``, ``exp``, a product of the cotangent
with itself have no transpose), but not an *affine* one: transposing
``g * s + 1`` silently drops the ``+ 1``. So every equation is classified
here before anything is transposed. Each value is

* ``ZERO``: a known zero (a literal 0, or zeros broadcast or reshaped);
* ``LIN``: computed from the inputs, linearly so far;
* ``CONST``: independent of the inputs (a residual, a non-zero constant).

An equation that combines a ``CONST`` with a ``LIN`` value where the result
would be affine (``add``, ``select_n``, ``concatenate``, ``pad``, ...), that
multiplies two ``LIN`` values, that uses a ``LIN`` value as an index or a
predicate, or that applies to a ``LIN`` value a primitive with no transpose
rule, makes the jaxpr non-linear; `nonlinear_reason` says which and where.
An outer ``LIN`` value of a primitive it does not know (and JAX can transpose)
passes only when all its operands are ``LIN`` or ``ZERO``.

Imports: jax and `hijax._internals` only.
"""
from __future__ import annotations

import numpy as np
import jax
import jax.extend  # noqa: F401  (jax.extend.core)
from jax.extend import source_info_util
from jax.interpreters import ad as public_ad

from hijax._internals import ad

ZERO, LIN, CONST = "zero", "linear", "constant"

# Primitives linear jointly in the operands at these positions (None: all):
# each of those must be LIN or ZERO, and no other operand may be LIN.
_JOINT = {"add": None, "sub": None, "add_any": None, "concatenate": None,
          "complex": None, "pad": (0, 1), "dynamic_update_slice": (0, 1),
          "scatter-add": (0, 2), "scatter_add": (0, 2), "scatter": (0, 2),
          "select_n": "cases"}
# Linear in exactly one of their operands, whichever it is.
_BILINEAR = {"mul", "dot_general", "conv_general_dilated",
             "ragged_dot_general"}
# Linear in the operands at these positions only; the others are constants.
_LINEAR_IN = {"div": (0,), "dynamic_slice": (0,), "gather": (0,),
              "triangular_solve": (1,)}
# Applied to a zero, these give a zero.
_KEEP_ZERO = {"broadcast_in_dim", "reshape", "convert_element_type", "squeeze",
              "expand_dims", "transpose", "copy", "copy_p", "slice", "rev",
              "reduce_sum", "neg", "dynamic_slice", "gather", "real", "imag",
              "conj", "cumsum"}


class NotLinear(Exception):
  """Raised inside the walk with the reason; `nonlinear_reason` returns it."""


def nonlinear_reason(closed_jaxpr, linear_in) -> str | None:
  """None if ``closed_jaxpr`` is linear in the inputs flagged in ``linear_in``.

  Otherwise a sentence naming the first equation that is not, with its
  source line. The outputs must all be linear (or known zeros).
  """
  jaxpr, consts = _open(closed_jaxpr)
  del consts
  try:
    outs = _walk(jaxpr, [LIN if lin else CONST for lin in linear_in])
  except NotLinear as e:
    return str(e)
  for i, state in enumerate(outs):
    if state == CONST:
      return (f"its output {i} does not depend on the cotangent (a rule "
              "linear in g returns zero, or None, where g does not reach)")
  return None


def _open(closed):
  return getattr(closed, "jaxpr", closed), getattr(closed, "consts", ())


def _literal_state(v) -> str:
  try:
    return ZERO if np.all(np.asarray(v.val) == 0) else CONST
  except Exception:  # an unusual literal: assume nothing
    return CONST


def _walk(jaxpr, in_states, outer=None) -> list[str]:
  """The states of ``jaxpr``'s outputs; ``outer`` is the enclosing call's
  (name, location), for the message about an equation inside it."""
  env = {}

  def read(v):
    if isinstance(v, jax.extend.core.Literal):
      return _literal_state(v)
    return env.get(v, CONST)  # constvars are constants

  for v, s in zip(jaxpr.invars, in_states):
    env[v] = s
  for eqn in jaxpr.eqns:
    states = [read(v) for v in eqn.invars]
    outs = _equation(eqn, states, outer)
    for v, s in zip(eqn.outvars, outs):
      env[v] = s
  return [read(v) for v in jaxpr.outvars]


def _context(eqn, outer):
  """(description, location) of ``eqn``, inside the call ``outer`` if any."""
  where = source_info_util.summarize(eqn.source_info)
  label = eqn.params.get("name") or eqn.primitive.name
  if outer is None:
    return f"`{label}`", where
  outer_label, outer_where = outer
  return f"{outer_label} (`{label}`)", outer_where or where


def _fail(eqn, what: str, outer=None):
  label, where = _context(eqn, outer)
  if outer is not None:
    label = f"`{eqn.primitive.name}` inside {outer[0]}"
  at = f" at {where}" if where and where != "unknown" else ""
  raise NotLinear(f"{label}{at} {what}")


def _equation(eqn, states, outer=None) -> list[str]:
  name = eqn.primitive.name
  n_out = len(eqn.outvars)
  inner = _inner_jaxpr(eqn)
  if inner is not None:
    return _walk(_open(inner)[0], states, outer or _context(eqn, None))
  if name == "cond":
    return _cond(eqn, states, outer)  # pyright: ignore[reportReturnType]
  if name == "scan":
    return _scan(eqn, states, outer)
  if LIN not in states:
    return [_constant_state(name, states)] * n_out
  if name in _JOINT:
    _joint(eqn, states, _JOINT[name], outer)
  elif name in _BILINEAR:
    if states.count(LIN) > 1:
      _fail(eqn, "multiplies the cotangent by itself", outer)
  elif name in _LINEAR_IN:
    _only_at(eqn, states, _LINEAR_IN[name], outer)
  elif name == "convert_element_type":
    if not jax.numpy.issubdtype(eqn.params["new_dtype"], np.inexact):
      _fail(eqn, "converts the cotangent to an integer or boolean type",
            outer)
  elif not _transposable(eqn.primitive):
    _fail(eqn, "is applied to the cotangent, and is not linear (JAX has no "
          "transpose rule for it)", outer)
  elif CONST in states:
    _fail(eqn, "combines the cotangent with values that do not depend on "
          "it, and hijax cannot tell whether that is linear", outer)
  return [LIN] * n_out


def _transposable(prim) -> bool:
  return prim in public_ad.primitive_transposes or prim in ad.fancy_transposes


def _constant_state(name, states) -> str:
  if name in _KEEP_ZERO and states and states[0] == ZERO:
    return ZERO
  if name in _BILINEAR and ZERO in states:
    return ZERO
  if name in _JOINT and states and all(s == ZERO for s in
                                       _positions(_JOINT[name], states)):
    return ZERO
  return CONST


def _positions(spec, states):
  if spec is None:
    return states
  if spec == "cases":
    return states[1:]
  return [states[i] for i in spec if i < len(states)]


def _joint(eqn, states, spec, outer):
  if spec is None:
    joint = range(len(states))
  elif spec == "cases":
    joint = range(1, len(states))
  else:
    joint = spec
  for i, s in enumerate(states):
    if i in joint and s == CONST:
      _fail(eqn, "combines the cotangent with a value that does not depend "
            "on it (the rule is affine in g, not linear)", outer)
    if i not in joint and s == LIN:
      _fail(eqn, "uses the cotangent as an index or a predicate", outer)


def _only_at(eqn, states, positions, outer):
  for i, s in enumerate(states):
    if s == LIN and i not in positions:
      _fail(eqn, "uses the cotangent where it is not linear in it (e.g. a "
            "divisor or an index)", outer)


def _inner_jaxpr(eqn):
  """The jaxpr a call-like equation (jit, custom_jvp_call, ...) runs, or None."""
  for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
    inner = eqn.params.get(key)
    if inner is None or eqn.primitive.name == "scan":
      continue
    jaxpr = _open(inner)[0]
    if (hasattr(jaxpr, "eqns") and len(jaxpr.invars) == len(eqn.invars)
        and len(jaxpr.outvars) == len(eqn.outvars)):
      return inner
  return None


def _join(eqn, a, b, outer):
  if a == b:
    return a
  if CONST in (a, b) and LIN in (a, b):
    _fail(eqn, "gives the cotangent on one path and a value that does not "
          "depend on it on another (the rule is affine in g, not linear)",
          outer)
  return LIN if LIN in (a, b) else CONST


def _cond(eqn, states, outer):
  if states[0] == LIN:
    _fail(eqn, "branches on the cotangent", outer)
  outs = None
  for branch in eqn.params["branches"]:
    got = _walk(_open(branch)[0], states[1:], outer)
    outs = got if outs is None else [_join(eqn, a, b, outer)
                                     for a, b in zip(outs, got)]
  return outs


def _scan(eqn, states, outer):
  params = eqn.params
  if "num_consts" in params:
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts = states[:n_consts]
    carry = states[n_consts:n_consts + n_carry]
    xs = states[n_consts + n_carry:]
  else:  # JAX 0.11 and 0.12: a FlatTree of (consts, carry, xs)
    consts, carry, xs = (list(p) for p in
                         params["ft_in"].update(states).unpack())
  n_carry = len(carry)
  body = _open(params["jaxpr"])[0]
  for _ in range(n_carry + 2):  # each pass can only raise a carry's state
    outs = _walk(body, consts + carry + xs, outer)
    new = [_join(eqn, a, b, outer) for a, b in zip(carry, outs[:n_carry])]
    if new == carry:
      return new + outs[n_carry:]
    carry = new
  return carry + outs[n_carry:]  # pyright: ignore[reportPossiblyUnboundVariable]
