"""Per-function rematerialization: `custom_remat`, and name policies to inspect.

``jax.checkpoint`` decides what to save for the backward pass with a *policy*
consulted value by value. `custom_remat` lets one function take that decision
itself, given the ambient policy:

* ``f_fwd(policy, *args) -> (out, res)`` runs on the forward pass and returns
  the residuals ``res`` it chose to save;
* ``f_rem(res, *args) -> (out, res2)`` runs on the backward pass, recomputing
  what was not saved;
* ``f_bwd(res2, g) -> cotangents`` turns the output cotangent into one
  cotangent per argument.

It is built on the `HiPrim.remat` method, which ``jax.checkpoint`` calls (with
``jax_remat3`` enabled) for every hijax primitive it rematerializes.

Policies are plain functions in JAX, so ``f_fwd`` could not ask them anything.
`SaveOnlyTheseNames` is a policy that is also a record: ``f_fwd`` can test
``isinstance(policy, SaveOnlyTheseNames)`` and look at ``.saveable_names``.
JAX's own ``save_only_these_names`` and ``save_any_names_but_these`` policies
reach ``f_fwd`` converted to these records.
"""
# Imports: `hijax.primitive`, `hijax._checks` and `hijax._compat`.
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from hijax import _checks
from hijax import _compat
from hijax._internals import ad_checkpoint as _ad_checkpoint
from hijax.primitive import HiPrim

__all__ = ["custom_remat", "SaveOnlyTheseNames", "save_only_these_names",
           "SaveAnyNamesButThese", "save_any_names_but_these"]

_name_p = _ad_checkpoint.name_p  # what policies see for `checkpoint_name`


# --- inspectable name policies ----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SaveOnlyTheseNames:
  """A ``jax.checkpoint`` policy saving only values named in ``saveable_names``.

  Behaves like ``jax.checkpoint_policies.save_only_these_names`` (values are
  named with ``jax.ad_checkpoint.checkpoint_name``), but is an inspectable
  object: a `custom_remat` forward rule receiving it as its policy can read
  ``policy.saveable_names``.
  """

  saveable_names: frozenset[str]
  """The names whose values may be saved for the backward pass."""

  def __call__(self, prim: Any, *_: Any, **params: Any) -> bool:
    """The policy: True (save) for a value named in `saveable_names`."""
    return prim is _name_p and params.get("name") in self.saveable_names


@dataclasses.dataclass(frozen=True)
class SaveAnyNamesButThese:
  """A policy saving every named value except those in ``names_not_saveable``.

  The inspectable counterpart of
  ``jax.checkpoint_policies.save_any_names_but_these``.
  """

  names_not_saveable: frozenset[str]
  """The names whose values are recomputed rather than saved."""

  def __call__(self, prim: Any, *_: Any, **params: Any) -> bool:
    """The policy: True (save) for a named value not in `names_not_saveable`."""
    return prim is _name_p and params.get("name") not in self.names_not_saveable


def as_inspectable(policy: Any) -> Any:
  """``policy``, with JAX's own name policies replaced by their hijax equivalents.

  ``jax.checkpoint_policies.save_only_these_names`` gives a `SaveOnlyTheseNames`
  and ``save_any_names_but_these`` a `SaveAnyNamesButThese` (equal to those
  that hijax's functions build); None, ``jax.checkpoint``'s default, gives
  ``nothing_saveable``. Other policies are returned as they are.
  """
  if policy is None:
    return jax.checkpoint_policies.nothing_saveable
  names = _compat.saved_names_of(policy)
  if names is not None:
    return SaveOnlyTheseNames(names)
  names = _compat.unsaved_names_of(policy)
  if names is not None:
    return SaveAnyNamesButThese(names)
  return policy


def save_only_these_names(*names: str) -> SaveOnlyTheseNames:
  """Policy saving only the values named ``names`` (see `SaveOnlyTheseNames`)."""
  _check_names("save_only_these_names", names)
  return SaveOnlyTheseNames(frozenset(names))


def save_any_names_but_these(*names: str) -> SaveAnyNamesButThese:
  """Policy saving every named value except ``names`` (`SaveAnyNamesButThese`)."""
  _check_names("save_any_names_but_these", names)
  return SaveAnyNamesButThese(frozenset(names))


def _check_names(fn, names):
  for n in names:
    if not isinstance(n, str):
      raise TypeError(f"{fn} takes names (strings) as separate arguments, got "
                      f"{n!r}")


# --- custom_remat ---------------------------------------------------------------------

def custom_remat(f: Callable, f_fwd: Callable, f_rem: Callable,
                 f_bwd: Callable) -> Callable:
  """Returns ``f`` with its own rematerialization rules for reverse mode.

  Args:
    f: the function, used whenever it is not differentiated (evaluation,
      ``jit``, lowering).
    f_fwd: ``f_fwd(policy, *args) -> (out, res)``, the forward pass. Under
      ``jax.checkpoint`` (with ``jax_remat3``) ``policy`` is the checkpoint's
      policy (``jax.checkpoint_policies.nothing_saveable`` if none was given;
      JAX's own name policies arrive as the equivalent `SaveOnlyTheseNames`
      or `SaveAnyNamesButThese`, see `as_inspectable`); under plain ``grad``/``vjp`` it is
      ``jax.checkpoint_policies.everything_saveable``. ``res`` (any pytree of
      arrays, None to save nothing) is saved for the backward pass.
    f_rem: ``f_rem(res, *args) -> (out, res2)``, the rematerialization: given
      the saved residuals it recomputes the output and returns the residuals
      ``res2`` that ``f_bwd`` needs. Under ``jax.checkpoint`` it runs on the
      backward pass; otherwise right after ``f_fwd``.
    f_bwd: ``f_bwd(res2, g) -> cotangents``, a tuple with one cotangent per
      argument of ``f`` (None for a zero cotangent).

  Only reverse mode is defined: ``jax.jvp`` and ``jax.linearize`` raise a
  ``TypeError``. Arguments are positional; ``f``, ``f_fwd``, ``f_rem`` and
  ``f_bwd`` must not close over traced values (pass them as arguments).
  """
  for name, fn in (("f", f), ("f_fwd", f_fwd), ("f_rem", f_rem),
                   ("f_bwd", f_bwd)):
    if not callable(fn):
      raise TypeError(f"custom_remat: {name} must be callable, got {fn!r}")

  @functools.wraps(f)
  def wrapped(*args, **kwargs):
    if kwargs:
      raise TypeError(f"custom_remat function {_name(f)} takes positional "
                      "arguments only")
    in_avals = jax.tree.map(jax.typeof, args)
    out_aval = _out_types(f, args)
    return CustomRemat(in_avals, out_aval, f, f_fwd, f_rem, f_bwd)(*args)

  return wrapped


def _name(fn) -> str:
  return getattr(fn, "__name__", repr(fn))


def _out_types(f, args):
  jaxpr, shapes = jax.make_jaxpr(f, return_shape=True)(*args)
  return jax.tree.unflatten(jax.tree.structure(shapes), jaxpr.out_avals)


class CustomRemat(HiPrim):
  """The primitive behind a `custom_remat` function (one per call signature)."""

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, in_avals: Any, out_aval: Any, f: Any, f_fwd: Any,
               f_rem: Any, f_bwd: Any) -> None:
    self.in_avals = tuple(in_avals)
    self.out_aval = out_aval
    self.params = dict(f=f, f_fwd=f_fwd, f_rem=f_rem, f_bwd=f_bwd)
    super().__init__()

  def __repr__(self) -> str:
    return f"CustomRemat[f={_name(self.f)}]"

  def expand(self, *args: Any) -> Any:
    """Evaluation and lowering: ``f`` itself."""
    return self.f(*args)

  def remat(self, trace: Any, *args: Any) -> Any:
    """Under ``jax.checkpoint``: save what ``f_fwd`` chooses; ``f_rem`` later."""
    policy = as_inspectable(trace.policy)
    out, res = _checked_pair(self, "f_fwd", self.f_fwd(policy, *args),
                             "(out, res)")
    return out, res, self._rematerialize

  def _rematerialize(self, res, *args):
    # Recorded in the backward-pass computation; its own VJP runs f_rem.
    res_avals = jax.tree.map(jax.typeof, res)
    return Rematerialize(self, res_avals)(res, *args)

  def vjp_fwd(self, nzs_in: Any, *args: Any) -> Any:
    """Outside ``jax.checkpoint`` everything is saveable: run both rules now."""
    policy = jax.checkpoint_policies.everything_saveable
    out, res = _checked_pair(self, "f_fwd", self.f_fwd(policy, *args),
                             "(out, res)")
    _, res2 = _checked_pair(self, "f_rem", self.f_rem(res, *args),
                            "(out, res2)")
    return out, res2

  def vjp_bwd_retval(self, res2: Any, g: Any) -> Any:
    """The backward pass: ``f_bwd``, one cotangent per argument."""
    return _cotangents(self, self.f_bwd(res2, g))

  def jvp(self, primals: Any, tangents: Any) -> Any:
    """Forward mode is not defined: raises ``TypeError``."""
    raise _forward_mode_error(self.f)

  def lin(self, nzs_in: Any, *args: Any) -> Any:
    """Linearization is not defined: raises ``TypeError``."""
    raise _forward_mode_error(self.f)

  def batch(self, axis_data: Any, args: Any, dims: Any) -> Any:
    """``vmap`` is not supported: raises ``NotImplementedError``."""
    raise NotImplementedError(
        f"custom_remat function {_name(self.f)} cannot be vmapped: vmap inside "
        "it, or apply custom_remat to the batched function")


class Rematerialize(HiPrim):
  """``f_rem`` of a `CustomRemat`, as recorded in the backward-pass recompute.

  Takes the saved residuals and the arguments; its output is the primal
  output, and its VJP is ``f_bwd`` applied to the residuals ``f_rem`` returns.
  """

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, remat_prim: CustomRemat, res_avals: Any) -> None:
    self.remat_prim = remat_prim
    self.in_avals = (res_avals, *remat_prim.in_avals)
    self.out_aval = remat_prim.out_aval
    self.params = dict(remat_prim=remat_prim)
    super().__init__()

  def __repr__(self) -> str:
    return f"Rematerialize[f={_name(self.remat_prim.f)}]"

  def expand(self, res: Any, *args: Any) -> Any:
    """The output that ``f_rem`` recomputes from the saved residuals."""
    prim = self.remat_prim
    out, _ = _checked_pair(prim, "f_rem", prim.f_rem(res, *args), "(out, res2)")
    return out

  def vjp_fwd(self, nzs_in: Any, res: Any, *args: Any) -> Any:
    """Runs ``f_rem``, keeping its ``res2`` for ``f_bwd``."""
    prim = self.remat_prim
    return _checked_pair(prim, "f_rem", prim.f_rem(res, *args), "(out, res2)")

  def vjp_bwd_retval(self, res2: Any, g: Any) -> Any:
    """``f_bwd``; the saved residuals get no cotangent."""
    return (None, *_cotangents(self.remat_prim, self.remat_prim.f_bwd(res2, g)))

  def jvp(self, primals: Any, tangents: Any) -> Any:
    """Forward mode is not defined: raises ``TypeError``."""
    raise _forward_mode_error(self.remat_prim.f)

  def lin(self, nzs_in: Any, *args: Any) -> Any:
    """Linearization is not defined: raises ``TypeError``."""
    raise _forward_mode_error(self.remat_prim.f)


def _pair(result, fn, what):
  if not isinstance(result, (tuple, list)) or len(result) != 2:
    raise TypeError(f"custom_remat: {_name(fn)} must return a pair {what}, got "
                    f"{type(result).__name__}")
  return tuple(result)


def _checked_pair(prim: CustomRemat, role: str, result, what):
  """`_pair` of what ``f_fwd``/``f_rem`` returned, its ``out`` checked against f's."""
  fn = prim.params[role]
  out, second = _pair(result, fn, what)
  where = f"custom_remat: {role} ({_name(fn)}) of {_name(prim.f)}"
  try:
    out_flat = prim.out_tree.flatten_up_to(out)
  except (ValueError, TypeError):
    raise TypeError(
        f"{where} returned an output with structure {jax.tree.structure(out)}, "
        f"but {_name(prim.f)} returns structure {prim.out_tree}") from None
  _checks.check_types(
      where, "", "output", prim.out_avals_flat, out_flat, "rule-primal",
      f"custom_remat, from {_name(prim.f)}(*args),",
      f"{role} must return {what} with out equal to {_name(prim.f)}(*args).")
  return out, second


def _cotangents(prim: CustomRemat, cts):
  n = len(prim.in_avals)
  if not isinstance(cts, (tuple, list)) or len(cts) != n:
    raise TypeError(
        f"custom_remat: {_name(prim.f_bwd)} must return a tuple with one "
        f"cotangent per argument of {_name(prim.f)} ({n}), got "
        f"{type(cts).__name__}"
        + (f" of length {len(cts)}" if isinstance(cts, (tuple, list)) else ""))
  return tuple(cts)


def _forward_mode_error(f) -> TypeError:
  hint = ""
  if not jax.config.jax_remat3:
    hint = (" If this happened under jax.checkpoint, enable the new remat "
            "implementation with jax.config.update('jax_remat3', True): the "
            "classic one differentiates checkpointed code in forward mode.")
  return TypeError(
      f"custom_remat function {_name(f)} defines reverse-mode rules only "
      f"(f_fwd, f_rem, f_bwd), so it cannot be differentiated in forward mode "
      f"(jax.jvp, jax.linearize, jax.jacfwd).{hint}")
