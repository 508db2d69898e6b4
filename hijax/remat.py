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
`SaveAndOffloadOnlyTheseNames` is the record of a policy that also offloads
named values to another memory kind. JAX's own ``save_only_these_names``,
``save_any_names_but_these`` and ``save_and_offload_only_these_names``
policies reach ``f_fwd`` converted to these records.
"""
# Imports: `hijax.primitive`, `hijax._checks`, `hijax._compat` and
# `hijax._static_args`.
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from typing import Any, Callable

import jax

from hijax import _checks
from hijax import _compat
from hijax._internals import ad_checkpoint as _ad_checkpoint
from hijax._internals import partial_eval as _pe
from hijax._static_args import Statics, StaticSpec, fn_name as _name
from hijax.primitive import HiPrim

__all__ = ["custom_remat", "SaveOnlyTheseNames", "save_only_these_names",
           "SaveAnyNamesButThese", "save_any_names_but_these",
           "SaveAndOffloadOnlyTheseNames", "save_and_offload_only_these_names"]

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


@dataclasses.dataclass(frozen=True)
class SaveAndOffloadOnlyTheseNames:
  """A policy saving the values named in ``names_which_can_be_saved``,
  offloading those named in ``names_which_can_be_offloaded`` (moving them
  from memory kind ``offload_src`` to ``offload_dst``, e.g. ``"device"`` to
  ``"pinned_host"``, for the backward pass) and recomputing the rest.

  The inspectable counterpart of
  ``jax.checkpoint_policies.save_and_offload_only_these_names``, which
  arrives as one of these at a `custom_remat` forward rule. On a CPU,
  ``"device"`` and ``"pinned_host"`` memory are the same RAM: an offloaded
  value is copied there and back, with the same values, and saves no memory.
  """

  names_which_can_be_saved: frozenset[str]
  """The names whose values are saved where they are."""
  names_which_can_be_offloaded: frozenset[str]
  """The names whose values are saved in ``offload_dst`` memory."""
  offload_src: str
  """The memory kind the offloaded values are in (``"device"``)."""
  offload_dst: str
  """The memory kind they are saved in (``"pinned_host"``)."""

  def __call__(self, prim: Any, *_: Any, **params: Any) -> Any:
    """The policy: save, offload or recompute, by the value's name."""
    if prim is _name_p:
      name = params.get("name")
      if name in self.names_which_can_be_saved:
        return _pe.Saveable
      if name in self.names_which_can_be_offloaded:
        return _pe.Offloadable(src=self.offload_src, dst=self.offload_dst)
    return _pe.Recompute


def save_and_offload_only_these_names(
    *, names_which_can_be_saved: Iterable[str],
    names_which_can_be_offloaded: Iterable[str], offload_src: str,
    offload_dst: str) -> SaveAndOffloadOnlyTheseNames:
  """Policy saving some named values, offloading others, recomputing the rest
  (`SaveAndOffloadOnlyTheseNames`; the keywords of JAX's own function).

  Raises ``ValueError`` if a name is in both sets.
  """
  saved = frozenset(names_which_can_be_saved)
  offloaded = frozenset(names_which_can_be_offloaded)
  _check_names("save_and_offload_only_these_names", tuple(saved | offloaded))
  if saved & offloaded:
    raise ValueError(
        "save_and_offload_only_these_names: a name is either saved or "
        f"offloaded, not both: {sorted(saved & offloaded)} are in both "
        "names_which_can_be_saved and names_which_can_be_offloaded")
  return SaveAndOffloadOnlyTheseNames(saved, offloaded, offload_src,
                                      offload_dst)


def as_inspectable(policy: Any) -> Any:
  """``policy``, with JAX's own name policies replaced by their hijax equivalents.

  ``jax.checkpoint_policies.save_only_these_names`` gives a `SaveOnlyTheseNames`,
  ``save_any_names_but_these`` a `SaveAnyNamesButThese` and
  ``save_and_offload_only_these_names`` a `SaveAndOffloadOnlyTheseNames`
  (equal to those that hijax's functions build); None, ``jax.checkpoint``'s
  default, gives
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
  fields = _compat.offload_fields_of(policy)
  if fields is not None:
    return SaveAndOffloadOnlyTheseNames(*fields)
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
                 f_bwd: Callable, *, static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = ()) -> Callable:
  """Returns ``f`` with its own rematerialization rules for reverse mode.

  Args:
    f: the function, used whenever it is not differentiated (evaluation,
      ``jit``, lowering).
    f_fwd: ``f_fwd(policy, *args) -> (out, res)``, the forward pass. Under
      ``jax.checkpoint`` (with ``jax_remat3``) ``policy`` is the checkpoint's
      policy (``jax.checkpoint_policies.nothing_saveable`` if none was given;
      JAX's own name policies arrive as the equivalent `SaveOnlyTheseNames`,
      `SaveAnyNamesButThese` or `SaveAndOffloadOnlyTheseNames`, see
      `as_inspectable`); under plain ``grad``/``vjp`` it is
      ``jax.checkpoint_policies.everything_saveable``. ``res`` (any pytree of
      arrays, None to save nothing) is saved for the backward pass.
    f_rem: ``f_rem(res, *args) -> (out, res2)``, the rematerialization: given
      the saved residuals it recomputes the output and returns the residuals
      ``res2`` that ``f_bwd`` needs. Under ``jax.checkpoint`` it runs on the
      backward pass; otherwise right after ``f_fwd``.
    f_bwd: ``f_bwd(res2, g) -> cotangents``, a tuple with one cotangent per
      positional argument of ``f`` (None for a zero cotangent, and for a
      static argument).
    static_argnums: positions of arguments that are static, as in
      ``jax.jit``: hashable Python values, passed as they are to ``f``,
      ``f_fwd`` and ``f_rem`` (negative positions count from the end).
    static_argnames: names of parameters that are static, likewise, whether
      passed by position or by keyword.

  An argument passed by keyword to a parameter that ``f`` also takes by
  position counts as positional (as ``jax.custom_vjp`` reads it): it is passed
  on by position, and ``f_bwd`` returns a cotangent for it. A keyword-only
  parameter must be static. Only reverse mode is defined: ``jax.jvp`` and
  ``jax.linearize`` raise a ``TypeError``. ``f``, ``f_fwd``, ``f_rem`` and
  ``f_bwd`` must not close over traced values (pass them as arguments).
  """
  for name, fn in (("f", f), ("f_fwd", f_fwd), ("f_rem", f_rem),
                   ("f_bwd", f_bwd)):
    if not callable(fn):
      raise TypeError(f"custom_remat: {name} must be callable, got {fn!r}")
  spec = StaticSpec(f, static_argnums, static_argnames)

  @functools.wraps(f)
  def wrapped(*args, **kwargs):
    args, statics = spec.split(args, kwargs)
    dynamic = statics.dynamic(args)
    in_avals = jax.tree.map(jax.typeof, dynamic)
    out_aval = _out_types(lambda *dyn: statics.call(f, dyn), dynamic)
    return CustomRemat(in_avals, out_aval, f, f_fwd, f_rem, f_bwd,
                       statics)(*dynamic)

  return wrapped


def _out_types(f, args):
  jaxpr, shapes = jax.make_jaxpr(f, return_shape=True)(*args)
  return jax.tree.unflatten(jax.tree.structure(shapes), jaxpr.out_avals)


class CustomRemat(HiPrim):
  """The primitive behind a `custom_remat` function (one per call signature)."""

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, in_avals: Any, out_aval: Any, f: Any, f_fwd: Any,
               f_rem: Any, f_bwd: Any, statics: Any = None) -> None:
    self.in_avals = tuple(in_avals)
    self.out_aval = out_aval
    if statics is None:
      statics = Statics(len(self.in_avals), (), ())
    self.params = dict(f=f, f_fwd=f_fwd, f_rem=f_rem, f_bwd=f_bwd,
                       statics=statics)
    super().__init__()

  def __repr__(self) -> str:
    return f"CustomRemat[f={_name(self.f)}]"

  def pp_params(self) -> dict[str, Any]:
    """Shows ``f`` and the static arguments in a jaxpr."""
    shown: dict[str, Any] = dict(f=self.f)
    if self.statics.positional or self.statics.keywords:
      shown["static"] = dict(self.statics.positional + self.statics.keywords)
    return shown

  def expand(self, *args: Any) -> Any:
    """Evaluation and lowering: ``f`` itself."""
    return self.statics.call(self.f, args)

  def remat(self, trace: Any, *args: Any) -> Any:
    """Under ``jax.checkpoint``: save what ``f_fwd`` chooses; ``f_rem`` later."""
    policy = as_inspectable(trace.policy)
    out, res = _checked_pair(self, "f_fwd",
                             self.statics.call(self.f_fwd, args, policy),
                             "(out, res)")
    return out, res, self._rematerialize

  def _rematerialize(self, res, *args):
    # Recorded in the backward-pass computation; its own VJP runs f_rem.
    res_avals = jax.tree.map(jax.typeof, res)
    return Rematerialize(self, res_avals)(res, *args)

  def vjp_fwd(self, nzs_in: Any, *args: Any) -> Any:
    """Outside ``jax.checkpoint`` everything is saveable: run both rules now."""
    policy = jax.checkpoint_policies.everything_saveable
    out, res = _checked_pair(self, "f_fwd",
                             self.statics.call(self.f_fwd, args, policy),
                             "(out, res)")
    _, res2 = _checked_pair(self, "f_rem",
                            self.statics.call(self.f_rem, args, res),
                            "(out, res2)")
    return out, res2

  def vjp_bwd_retval(self, res2: Any, g: Any) -> Any:
    """The backward pass: ``f_bwd``, one cotangent per argument."""
    return self.statics.traced_cotangents(self.f, self.f_bwd,
                                          self.f_bwd(res2, g))

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
    out, _ = _checked_pair(prim, "f_rem", prim.statics.call(prim.f_rem, args, res),
                           "(out, res2)")
    return out

  def vjp_fwd(self, nzs_in: Any, res: Any, *args: Any) -> Any:
    """Runs ``f_rem``, keeping its ``res2`` for ``f_bwd``."""
    prim = self.remat_prim
    return _checked_pair(prim, "f_rem", prim.statics.call(prim.f_rem, args, res),
                         "(out, res2)")

  def vjp_bwd_retval(self, res2: Any, g: Any) -> Any:
    """``f_bwd``; the saved residuals get no cotangent."""
    prim = self.remat_prim
    return (None, *prim.statics.traced_cotangents(prim.f, prim.f_bwd,
                                                  prim.f_bwd(res2, g)))

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
