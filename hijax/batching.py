"""``vmap`` of `HiPrim`: the `HiPrim.batch` rule, or one derived from `batch_dim_rule`.

`batch_dim_rule` only says where the output's batch dimension goes. The batched
computation is then a new primitive, `Batched`, whose rules are the original
rules under ``jax.vmap``: its `expand` vmaps `expand`, its `jvp` vmaps `jvp`, and
so on, so a batched application still differentiates with the user's rules.

The output batch dimension a rule returns is checked once per trace: for an
array output it is None (not batched) or an int axis of the *batched* output,
so from ``-(ndim + 1)`` to ``ndim`` for a per-example output of ``ndim``
dimensions; a negative dimension counts from the end, as in ``vmap``'s
``out_axes``. For a hi-typed output it is None or a `MappingSpec`. What a
`HiPrim.batch` rule returns is also checked against ``out_aval`` with the batch
axis inserted.

Imports: `hijax.primitive`, `hijax.autodiff` and the private modules. Importing
it appends its installer to `hijax.primitive.RULE_INSTALLERS` and sets
``DEFAULT_RULES["batch"]`` to `batch_from_dim_rule`, the default `HiPrim.batch`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import jax.experimental.hijax as _jax_hijax

from hijax import _checks
from hijax._internals import batching
from hijax._internals import core
from hijax._core_rules import flatten_output, taking_prim
from hijax._util import Static, is_float0, is_none
from hijax.autodiff import (NullAccum, ValAccum, Zero, checked_backward,
                            instantiate_zeros)
from hijax.primitive import DEFAULT_RULES, HiPrim, RULE_INSTALLERS

__all__ = ["Batched", "batch_from_dim_rule", "vmap_rule", "bdims_at_front",
           "unmap_avals"]


# --- helpers for writing a `batch` rule (jax 0.12's, or ours with 0.11.2) ------------

def own_unmap_avals(axis_data: Any, avals: Any, dims: Any) -> Any:
  """The batched types: each type of ``avals`` with an axis of size
  ``axis_data.size`` inserted at its entry of ``dims`` (None: unchanged)."""
  return jax.tree.map(lambda a, d: core.unmapped_aval(
      axis_data.size, d, a, axis_data.explicit_mesh_axis), avals, dims)


def own_bdims_at_front(axis_data: Any, args: Any, dims: Any) -> Any:
  """``args`` with each batch axis moved to the front; an unbatched argument
  (dim None) is broadcast along a new leading axis of size ``axis_data.size``."""
  return jax.tree.map(lambda x, d: batching.bdim_at_front(
      x, d, axis_data.size, axis_data.explicit_mesh_axis), args, dims)


def own_vmap_rule(axis_data: Any, f: Any, in_axes: Any, out_axes: Any, *,
                  sum_match: bool = False) -> Any:
  """``f`` vmapped over the batch that ``axis_data`` describes, for a `batch` rule.

  Symbolic zeros among the arguments get the per-example type inside, and
  among the results the batched type outside, so tangents and cotangents may
  pass through. An entry of ``out_axes`` may be ``batching.infer`` (JAX's
  marker); the function then returns ``(out, inferred_out_axes)``.
  """
  size = axis_data.size
  infers = any(d is batching.infer for d in jax.tree.leaves(out_axes))
  vmapped = jax.vmap(f, in_axes=in_axes, out_axes=out_axes, axis_size=size,
                     axis_name=axis_data.name,
                     spmd_axis_name=axis_data.spmd_name or
                     axis_data.explicit_mesh_axis, sum_match=sum_match)

  def to_example(d, x):
    return Zero(core.mapped_aval(size, d, x.aval)) if _is_zero_at(d, x) else x

  def to_batch(d, x):
    if not _is_zero_at(d, x) or d is batching.sum_axis or d is batching.infer:
      return x
    return Zero(core.unmapped_aval(size, d, x.aval,
                                   axis_data.explicit_mesh_axis))

  def batched(*args):
    args = jax.tree.map(to_example, in_axes, args, is_leaf=is_none)
    result = vmapped(*args)
    out, inferred = result if infers else (result, None)
    out = jax.tree.map(to_batch, out_axes, out, is_leaf=is_none)
    return (out, inferred) if infers else out
  return batched


def _is_zero_at(d, x) -> bool:
  return isinstance(x, Zero) and d is not None


# JAX's own helpers where the installed JAX has them (0.12), ours otherwise.
vmap_rule: Any = getattr(_jax_hijax, "vmap_rule", own_vmap_rule)
"""``vmap_rule(axis_data, f, in_axes, out_axes, *, sum_match=False)``: ``f``
vmapped over the batch of a `HiPrim.batch` rule, symbolic zeros passing
through (JAX's own with jax 0.12; `own_vmap_rule` with 0.11.2)."""
bdims_at_front: Any = getattr(_jax_hijax, "bdims_at_front", own_bdims_at_front)
"""``bdims_at_front(axis_data, args, dims)``: each argument with its batch axis
first, unbatched ones broadcast (JAX's own with jax 0.12;
`own_bdims_at_front` with 0.11.2)."""
unmap_avals: Any = getattr(_jax_hijax, "unmap_avals", own_unmap_avals)
"""``unmap_avals(axis_data, avals, dims)``: the batched types (JAX's own with
jax 0.12; `own_unmap_avals` with 0.11.2)."""


def batch_from_dim_rule(prim: HiPrim, axis_data: Any, args: Any,
                        dims: Any) -> Any:
  """`HiPrim.batch` derived from ``prim.batch_dim_rule``."""
  _check_no_batched_hi_values(prim, dims)
  try:
    rule_dims = prim.batch_dim_rule(axis_data, dims)
  except Exception as e:
    _checks.mark_raised_by(e, f"{type(prim).__name__}.batch_dim_rule")
    raise
  out_dim = jax.tree.unflatten(prim.out_tree, _checked_dims(
      prim, "batch_dim_rule", rule_dims))
  return Batched(prim, axis_data, dims, out_dim)(*args), out_dim


def _out_dims_flat(prim: HiPrim, out_dim) -> list:
  """One batch dim per output leaf: a single dim applies to every output."""
  try:
    return prim.out_tree.flatten_up_to(out_dim)
  except (ValueError, TypeError):
    return [out_dim] * prim.out_tree.num_leaves


def _checked_dims(prim: HiPrim, method: str, out_dim) -> list:
  """The output batch dims, one per output leaf, checked and made non-negative."""
  return [_checked_dim(prim, method, d, a)
          for d, a in zip(_out_dims_flat(prim, out_dim), prim.out_avals_flat)]


def _checked_dim(prim: HiPrim, method: str, d, aval):
  if d is None:
    return d
  where = f"{type(prim).__name__}.{method}"
  if isinstance(aval, _jax_hijax.HiType):
    if isinstance(d, _jax_hijax.MappingSpec):
      return d
    raise TypeError(
        f"{where} returned the batch dimension {d!r} for an output of hi type "
        f"{aval.str_short()}: for a hi-typed output it must be None (not "
        "batched) or a MappingSpec saying how the batch is laid out")
  ndim = len(aval.shape)
  if (isinstance(d, (int, np.integer)) and not isinstance(d, bool)
      and -(ndim + 1) <= d <= ndim):
    return int(d) % (ndim + 1)
  raise TypeError(
      f"{where} returned the batch dimension {d!r} for an output of type "
      f"{aval.str_short()}: it must be None (not batched) or an int from "
      f"{-(ndim + 1)} to {ndim}, an axis of the batched output (which has "
      f"{ndim + 1} dimensions; a negative one counts from the end)")


def _check_batched_outputs(prim: HiPrim, size, out_flat, dims_flat):
  """Checks what `HiPrim.batch` returned against ``out_aval`` and its dims."""
  for i, (x, d, aval) in enumerate(zip(out_flat, dims_flat,
                                       prim.out_avals_flat)):
    if isinstance(d, _jax_hijax.MappingSpec):
      continue  # JAX checks a hi output against the spec's inc_rank
    if d is not None:
      aval = aval.update(shape=aval.shape[:d] + (size,) + aval.shape[d:])
    what = "the output" if len(out_flat) == 1 else f"output {i}"
    _checks.check_type(
        prim, "batch", what, aval, x, "rule-primal",
        f"out_aval, with the returned batch dimension {d!r},",
        "The batched output has the declared shape with the batch axis "
        f"(size {size}) inserted at the returned dimension, or is unbatched "
        "for a dimension of None.")


def _check_no_batched_hi_values(prim: HiPrim, dims):
  # The derived rule vmaps `expand`, which reads the fields of concrete hi
  # values. A batched hi value is an opaque tracer under that vmap, and a hi
  # result is built from traced arrays; only a `batch` rule can handle those.
  # (Unbatched hi inputs are passed through as they are, which works.)
  dims_flat = prim.in_tree.flatten_up_to(dims)
  hi = [a for a, d in zip(prim.in_avals_flat, dims_flat)
        if isinstance(a, _jax_hijax.HiType) and d is not None]
  hi += [a for a in prim.out_avals_flat if isinstance(a, _jax_hijax.HiType)]
  if hi:
    raise NotImplementedError(
        f"{type(prim).__name__} has batched hi-typed inputs or hi-typed "
        f"outputs ({', '.join(a.str_short() for a in hi)}), which a rule "
        "derived from batch_dim_rule cannot batch: implement `batch(self, "
        "axis_data, args, dims)`, whose dims for hi values are mapping specs")


def _batch_rule(axis_data, args_flat, dims_flat, *, prim):
  if all(d is None for d in dims_flat):
    # JAX calls a primitive's batcher even when no input is batched (e.g. a
    # rule applying a primitive to closed-over values); nothing to batch then.
    return prim._primitive.bind(*args_flat, _prim=prim), [None] * len(
        prim.out_avals_flat)
  args = jax.tree.unflatten(prim.in_tree, args_flat)
  dims = jax.tree.unflatten(prim.in_tree, dims_flat)
  # An exception from the rule is marked as the rule's (a refusal, or a
  # bug), one from the checks of what it returned as hijax's: hijax.testing
  # reads which (see `_checks.mark_raised_by`).
  try:
    result = prim.batch(axis_data, args, dims)
  except Exception as e:  # the user's batch, or the one derived by hijax
    own_rule = type(prim).batch is not HiPrim.batch
    _checks.mark_raised_by(e, f"{type(prim).__name__}.batch" if own_rule
                           else _checks.HIJAX_CHECK)
    raise
  try:
    if not isinstance(result, tuple) or len(result) != 2:
      raise TypeError(f"{type(prim).__name__}.batch must return a pair "
                      "(batched_out, out_dim)")
    out, out_dim = result
    out_flat = flatten_output(prim, "batch", out)
    dims_flat = _checked_dims(prim, "batch", out_dim)
    _check_batched_outputs(prim, axis_data.size, out_flat, dims_flat)
  except Exception as e:
    _checks.mark_raised_by(e, _checks.HIJAX_CHECK)
    raise
  return out_flat, dims_flat


def _install_batching_rule(cls):
  batching.fancy_primitive_batchers[cls._primitive] = taking_prim(_batch_rule)


RULE_INSTALLERS.append(_install_batching_rule)
# `HiPrim.batch` without an override: the rule derived from batch_dim_rule.
DEFAULT_RULES["batch"] = batch_from_dim_rule


class Batched(HiPrim):
  """The application of ``prim`` to arguments batched along ``in_dims``.

  Built by `batch_from_dim_rule`; each rule vmaps the corresponding rule of
  ``prim`` over the batch axis. A subclass may add ``params``.
  """

  prim: HiPrim
  axis_data: Any
  in_dims: Any
  out_dim: Any
  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, prim: Any, axis_data: Any, in_dims: Any,
               out_dim: Any, **params: Any) -> None:
    self.prim, self.axis_data = prim, axis_data
    self.in_dims, self.out_dim = in_dims, out_dim
    unmap = lambda a, d: a if d is None else core.unmapped_aval(
        axis_data.size, d, a, axis_data.explicit_mesh_axis)
    self.in_avals = jax.tree.map(unmap, prim.in_avals, in_dims)
    self.out_aval = jax.tree.map(unmap, prim.out_aval, out_dim)
    self.params = dict(prim=prim, axis_data=axis_data,
                       dims=Static((in_dims, out_dim)), **params)
    super().__init__()

  def __repr__(self) -> str:
    return f"Batched({self.prim!r}, in_dims={self.in_dims}, out_dim={self.out_dim})"

  def _jet_subject(self) -> HiPrim:
    return self.prim._jet_subject()

  def _vmap(self, f, in_axes, out_axes, **kwargs):
    ad = self.axis_data

    def vmapped(out_axes):
      return jax.vmap(f, in_axes=in_axes, out_axes=out_axes, axis_size=ad.size,
                      axis_name=ad.name,
                      spmd_axis_name=ad.spmd_name or ad.explicit_mesh_axis,
                      **kwargs)

    def call(*args):
      try:
        return vmapped(out_axes)(*args)
      except ValueError as e:
        # Vmapped again, each output's axis inferred: an output declared
        # unbatched (None) that is batched is the declaration's error.
        infer = jax.tree.map(lambda _: batching.infer, out_axes,
                             is_leaf=is_none)
        try:
          inferred = vmapped(infer)(*args)[1]
        except Exception:  # noqa: BLE001 (the error is another one)
          raise e from None
        wrong = jax.tree.map(lambda d, i: d is None and any(
            x is not None for x in jax.tree.leaves(i, is_leaf=is_none)),
            out_axes, inferred, is_leaf=is_none)
        if not any(jax.tree.leaves(wrong)):
          raise
        raise self._batched_where_none(f, e) from e
    return call

  def _batched_where_none(self, f: Any, e: ValueError) -> Exception:
    """The error for ``f``'s output declared unbatched (``e``, JAX's) but
    batched: the out_dim came from the user's batch_dim_rule."""
    del f
    return _checks.with_advice(
        e, f"{type(self.prim).__name__}.batch_dim_rule returned None (not "
        "batched) for an output that depends on the batched inputs: return "
        "the axis of the output that the batch is on")

  def _map_zeros(self, dims, xs):
    """Gives symbolic zeros the per-example type that the vmapped rule sees."""
    def f(d, x):
      if isinstance(x, Zero) and d is not None:
        return Zero(core.mapped_aval(self.axis_data.size, d, x.aval))
      return x
    return jax.tree.map(f, dims, xs, is_leaf=is_none)

  def _unmap_zeros(self, dims, xs):
    def f(d, x):
      if isinstance(x, Zero) and d is not None:
        return Zero(core.unmapped_aval(self.axis_data.size, d, x.aval,
                                       self.axis_data.explicit_mesh_axis))
      return x
    return jax.tree.map(f, dims, xs, is_leaf=is_none)

  def expand(self, *args: Any) -> Any:
    return self._vmap(self.prim.expand, self.in_dims, self.out_dim)(*args)

  def jvp(self, primals: Any, tangents: Any) -> Any:
    tangents = self._map_zeros(self.in_dims, tangents)
    out, out_tangent = self._vmap(
        self.prim.jvp, (self.in_dims, self.in_dims),
        (self.out_dim, self.out_dim))(primals, tangents)
    return out, self._unmap_zeros(self.out_dim, out_tangent)

  def _vmap_forward(self, method, nzs_in, args):
    extra = {}

    def forward(*args):
      out, res, *rest = getattr(self.prim, method)(nzs_in, *args)
      if len(rest) > 1:
        raise NotImplementedError(
            f"{type(self.prim).__name__}.{method} returned structured "
            "residuals, which batch_dim_rule cannot batch: define `batch`")
      extra["nzs_out"] = rest
      return out, res

    (out, res), (_, res_dims) = self._vmap(
        forward, self.in_dims, (self.out_dim, batching.infer))(*args)
    return (out, (res, Static(res_dims)), *extra["nzs_out"])

  def vjp_fwd(self, nzs_in: Any, *args: Any) -> Any:
    return self._vmap_forward("vjp_fwd", nzs_in, args)

  def vjp_bwd(self, res: Any, g: Any, *arg_accums: Any) -> Any:
    res, res_dims = res[0], res[1].value
    accums, accums_tree = jax.tree.flatten(arg_accums)
    wanted = [not isinstance(a, NullAccum) for a in accums]
    prim = self.prim

    def backward(res, g, first):
      # An unbatched output was computed once, but its cotangent reaches every
      # example of the vmapped backward rule: only the first passes it back.
      g = jax.tree.map(lambda d, ct: ct if d is not None or isinstance(
          ct, Zero) or is_float0(ct) else jnp.where(first, ct, 0).astype(
              ct.dtype), self.out_dim, g, is_leaf=is_none)
      inner = [ValAccum(a.to_ct_aval()) if w else NullAccum(a.to_ct_aval())
               for a, w in zip(prim.in_avals_flat, wanted)]
      with checked_backward(prim, inner):
        logs = prim.vjp_bwd(res, g, *jax.tree.unflatten(prim.in_tree, inner))
      cts = [instantiate_zeros(a.freeze()) for a, w in zip(inner, wanted) if w]
      return cts, logs

    in_dims_flat = jax.tree.leaves(self.in_dims, is_leaf=is_none)
    ct_dims = [batching.sum_axis if d is None else d
               for d, w in zip(in_dims_flat, wanted) if w]
    g = self._map_zeros(self.out_dim, g)
    first = jnp.arange(self.axis_data.size) == 0
    cts, logs = self._vmap(backward, (res_dims, self.out_dim, 0), (ct_dims, 0),
                           sum_match=True)(res, g, first)
    for acc, ct in zip([a for a, w in zip(accums, wanted) if w], cts):
      acc.accum(ct)
    return logs

  def lin(self, nzs_in: Any, *args: Any) -> Any:
    return self._vmap_forward("lin", nzs_in, args)

  def linearized(self, res: Any, *tangents: Any) -> Any:
    res, res_dims = res[0], res[1].value
    tangents = self._map_zeros(self.in_dims, tangents)
    out = self._vmap(self.prim.linearized, (res_dims, *self.in_dims),
                     self.out_dim)(res, *tangents)
    return self._unmap_zeros(self.out_dim, out)

  def batch_dim_rule(self, axis_data: Any, in_dims: Any) -> Any:
    # `in_dims` index this primitive's (already batched) arguments; the inner
    # rule expects indices into the unbatched ones, which lack our own axis.
    def drop(d, inner):
      return d if d is None or inner is None else d - (inner < d)

    def restore(d, inner):
      return d if d is None or inner is None else d + (inner <= d)

    inner_dims = jax.tree.map(drop, in_dims, self.in_dims, is_leaf=is_none)
    out = jax.tree.unflatten(self.prim.out_tree, _checked_dims(
        self.prim, "batch_dim_rule", self.prim.batch_dim_rule(axis_data,
                                                              inner_dims)))
    return jax.tree.map(restore, out, self.out_dim, is_leaf=is_none)
