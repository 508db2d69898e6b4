"""The one place where hijax compares what a rule returned with what was declared.

A primitive declares its types (``in_avals``, ``out_aval``, and the tangent and
cotangent types that follow from them); its rules are user code. Every rule
output that JAX would otherwise take on trust goes through `check_type`, which
compares *abstract types* (never values), so the cost is a few attribute
comparisons per output, once per trace or per eager call.

What is compared depends on the kind of value:

* ``"primal"``: an output of `expand` (see `conform_outputs`). Shape and
  dtype must match. Under ``jit`` the declared type is what the rest of the
  program sees, while eagerly the returned value is, so a different weak type
  (which changes dtype promotion) would make eager and ``jit`` disagree; a
  value that differs only in its weak type is therefore converted to the
  declared weak type, which changes no data.
* ``"rule-primal"``: the primal output of `jvp`, `vjp_fwd` or `lin`. Shape and
  dtype, as ``jax.custom_jvp`` does; the weak type is not compared.
* ``"tangent"`` and ``"cotangent"``: shape and dtype against the declared type's
  ``to_tangent_aval()`` / ``to_ct_aval()``, weak type ignored. The tangent type
  of an integer or boolean value has dtype ``float0``: return None (a symbolic
  zero) for it.

Array types are compared field by field (shape, dtype, weak type) and never by
sharding or varying manual axes, which the rule does not choose. Any other
type must match with ``core.typematch``, or, for a hi type, be of the same
class with arrays (``lo_ty()``) of the same shapes and dtypes.

A mismatch raises `RuleTypeError` (a ``TypeError``) with a message naming the
class, the method, the declared type, the returned type and the fix.

Imports: jax only. It sits below every rule module and knows no hijax class:
hi types are recognised by JAX's base class.
"""
from __future__ import annotations

import contextlib

import numpy as np
import jax.experimental.hijax as _jax_hijax
from jax.interpreters.ad import Zero

from hijax._internals import core
from hijax._internals import dtypes
from hijax._internals import lax as _lax

_ShapedArray = core.ShapedArray
_float0 = dtypes.float0

# Whether each kind compares the weak type of array types.
_KINDS = {"primal": True, "rule-primal": False, "tangent": False,
          "cotangent": False}


class RuleTypeError(TypeError):
  """A rule returned a value whose type is not the declared one."""


def type_of(x):
  """The abstract type of ``x`` (a symbolic `Zero` has its own); None if not JAX."""
  if type(x) is Zero:
    return x.aval
  aval = getattr(x, "aval", None)
  if type(aval) is _ShapedArray:
    return aval
  try:
    return core.typeof(x)
  except TypeError:
    return None


def matches(declared, actual, kind: str) -> bool:
  """Whether ``actual`` may stand where ``declared`` was declared (see module doc)."""
  if actual is declared:
    return True
  if type(declared) is _ShapedArray and type(actual) is _ShapedArray:
    return (declared.shape == actual.shape and declared.dtype == actual.dtype
            and (not _KINDS[kind] or declared.weak_type == actual.weak_type))
  if actual is None:
    return False
  return core.typematch(declared, actual) or _same_hi_type(declared, actual)


def _same_hi_type(declared, actual) -> bool:
  # Hi types are user dataclasses that may carry shardings (of their arrays),
  # which an eager value does not choose; compare their arrays' types instead.
  if type(declared) is not type(actual) or not isinstance(
      declared, _jax_hijax.HiType):
    return False
  try:
    lo_declared, lo_actual = declared.lo_ty(), actual.lo_ty()
  except NotImplementedError:
    return True  # nothing more to compare
  return len(lo_declared) == len(lo_actual) and all(
      matches(d, a, "rule-primal") for d, a in zip(lo_declared, lo_actual))


def _where(owner, method: str) -> str:
  name = owner if isinstance(owner, str) else type(owner).__name__
  return f"{name}.{method}" if method else name


def check_type(owner, method: str, what: str, declared, value, kind: str,
               declared_by: str, fix: str = "", how: str = "returned") -> None:
  """Raises ``TypeError`` unless ``value``'s type matches ``declared``.

  ``owner`` is the primitive (its class is named) or a label;
  ``owner.method`` is where the value came from. ``what`` names the value
  ("the output", "the cotangent of input 1");
  ``declared_by`` says where the declared type comes from ("out_aval",
  "in_avals"); ``fix`` is the caller's advice, added after the generic one.
  ``how`` replaces "returned" for a value the rule handed over otherwise
  ("passed to acc.accum").
  """
  actual = type_of(value)
  if not matches(declared, actual, kind):
    raise type_error(_where(owner, method), what, declared, value, kind,
                     declared_by, fix, how)


def check_types(owner, method: str, what: str, declared_flat, values_flat,
                kind: str, declared_by: str, fix: str = "") -> None:
  """`check_type` for each leaf. ``what`` is a noun ("output"): the message says
  "the output", or "output 2" when there are several leaves."""
  several = len(declared_flat) > 1
  for i, (declared, value) in enumerate(zip(declared_flat, values_flat)):
    actual = type_of(value)
    if not matches(declared, actual, kind):
      leaf = f"{what} {i}" if several else f"the {what}"
      raise type_error(_where(owner, method), leaf, declared, value, kind,
                       declared_by, fix)


def conform_outputs(owner, method: str, declared_flat, values_flat) -> list:
  """`check_types` for outputs of `expand`, returning the values to use.

  A value that differs from its declared type only in its weak type is
  converted to the declared one (eager results then agree with ``jit``
  results, which have the declared type); any other difference raises.
  """
  out = values_flat
  several = len(declared_flat) > 1
  for i, (declared, value) in enumerate(zip(declared_flat, values_flat)):
    actual = type_of(value)
    if matches(declared, actual, "primal"):
      continue
    if type(declared) is _ShapedArray and matches(declared, actual,
                                                  "rule-primal"):
      if out is values_flat:
        out = list(values_flat)
      out[i] = _lax._convert_element_type(value, None, declared.weak_type)
      continue
    what = f"output {i}" if several else "the output"
    raise type_error(_where(owner, method), what, declared, value, "primal",
                     "out_aval")
  return out


def type_error(where, what, declared, value, kind, declared_by, fix="",
               how="returned") -> RuleTypeError:
  """The message of a failed check: declared X, got Y, and the fix."""
  got, advice = described(declared, value, kind)
  action = (f"returned {got} for {what}" if how == "returned"
            else f"{how} {got} as {what}")
  return RuleTypeError(f"{where} {action}, but {declared_by} declares "
                       f"{declared.str_short()}. {advice}{fix}".rstrip())


def described(declared, value, kind) -> tuple[str, str]:
  """What a rule returned in words, and the advice for returning a
  ``declared`` instead (hijax's messages, the decorators' too)."""
  actual = type_of(value)
  got = (f"a {type(value).__name__}, which is not a JAX value"
         if actual is None else f"a value of type {actual.str_short()}")
  return got, _advice(declared, actual, kind)


def _advice(declared, actual, kind) -> str:
  if not (type(declared) is _ShapedArray and type(actual) is _ShapedArray):
    return "Return a value of the declared type. "
  if declared.dtype == _float0 and actual.dtype != _float0:
    return ("An integer or boolean value's tangent and cotangent have dtype "
            "float0: return None there (hijax reads it as a zero, as "
            "jax.custom_vjp's bwd does). ")
  if declared.shape != actual.shape:
    return f"Return a value of shape {declared.shape}. "
  if declared.dtype != actual.dtype:
    return (f"Convert it with `.astype(jnp.{np.dtype(declared.dtype).name})` "
            "(hijax does not convert silently). ")
  return "Return a value of the declared type. "


# --- errors raised inside user rules --------------------------------------------------

@contextlib.contextmanager
def rule_context(where: str):
  """Adds the rule's name and a remedy to errors from arithmetic on a `Zero`.

  A rule that does arithmetic on a symbolic zero tangent or cotangent gets an
  error from Python or JAX that names neither the rule nor the cause. The
  exception keeps its type; only its message grows.
  """
  try:
    yield
  except TypeError as e:
    if "Zero" not in str(e) or "symbolic zero" in str(e):
      raise
    new = _with_zero_advice(e, where)
    if new is e:
      raise
    raise new from e


def _with_zero_advice(e: Exception, where: str) -> Exception:
  return with_advice(
      e, f"{where} did arithmetic on a symbolic zero (a hijax.Zero, which "
      "stands for a tangent or cotangent that is zero and is not an array). "
      "Either turn it into an array first with `hijax.instantiate_zeros(t)`, "
      "or skip it: test `isinstance(t, hijax.Zero)` (or the `nzs_in` flags "
      "of vjp_fwd/lin) and return None for a zero result")


def with_advice(e: Exception, advice: str) -> Exception:
  """An exception of the same type as ``e`` whose message adds ``advice``."""
  try:
    return type(e)(f"{e}\n\n{advice}")
  except Exception:  # an exception type with another signature: keep it as is
    return e


# Where an exception raised while a batch rule ran came from: a user's rule
# refusing (an assert, a ValueError of its own), or hijax's check of what a
# rule returned. hijax.testing tells the two apart: a rule that refuses some
# combinations of batched arguments handles only the others, while a rule
# whose output fails hijax's check is wrong.
_RAISED_BY = "_hijax_raised_by"
HIJAX_CHECK = "hijax"


def mark_raised_by(e: BaseException, where: str) -> None:
  """Records that ``e`` was raised by ``where`` (a rule's name, or
  `HIJAX_CHECK` for hijax's own checks), unless a nearer frame recorded it
  already (a rule that binds another primitive whose check failed)."""
  if getattr(e, _RAISED_BY, None) is not None:
    return
  try:
    setattr(e, _RAISED_BY, where)
  except (AttributeError, TypeError):  # an exception type without a __dict__
    pass


def raised_by(e: BaseException) -> str | None:
  """What `mark_raised_by` recorded for ``e``, or None."""
  return getattr(e, _RAISED_BY, None)
