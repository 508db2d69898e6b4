"""Dead-code elimination of a decorated function's unused outputs: the call
becomes a `PrunedCall`, the same primitive with only the used outputs and
the same rules (a dropped output's tangent or cotangent a symbolic zero).
"""
from __future__ import annotations

from typing import Any

import jax

from hijax.autodiff import Zero
from hijax.primitive import HiPrim

__all__ = ["PrunesOutputs", "PrunedCall"]


def _dce(prim: Any, of: Any, used_before: tuple[bool, ...], used_outs: Any
         ) -> Any:
  """The `HiPrim.dce` result for ``prim``, which computes the outputs
  ``used_before`` of ``of``'s."""
  used = [bool(u) for u in jax.tree.leaves(used_outs)]
  if all(used):
    return True, True, prim
  if not any(used) and not prim.effects:
    return False, False, None
  it = iter(used)
  kept = tuple(next(it) if u else False for u in used_before)
  return True, used_outs, PrunedCall(of, kept)


class PrunesOutputs:
  """The `HiPrim.dce` rule of the decorators' primitives (a mixin placed
  before `HiPrim`): unused outputs are dropped (`PrunedCall`)."""

  effects: Any

  def dce(self, used_outs: Any, live_ins: Any) -> Any:
    """Keeps the call when every output is used, drops it when none is (and
    it has no effects), and otherwise computes only the used outputs."""
    del live_ins
    n = len(self.out_avals_flat)  # pyright: ignore[reportAttributeAccessIssue]
    return _dce(self, self, (True,) * n, used_outs)


class PrunedCall(HiPrim):
  """A call of a decorated function of which only the outputs ``used`` (one
  flag per output leaf of ``of``) are kept, as a tuple of those leaves."""

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]
  _of: Any
  _used: tuple[bool, ...]

  def __init__(self, of: Any, used: tuple[bool, ...]) -> None:
    self.in_avals = of.in_avals
    self.out_aval = tuple(a for a, u in zip(of.out_avals_flat, used) if u)
    self.params = dict(fun=of.params["fun"], _of=of, _used=used)
    self.effects = of.effects
    super().__init__()

  def _select(self, tree: Any) -> Any:
    """The kept leaves of one of ``of``'s outputs (or tangents)."""
    if tree is None:
      return None
    flat = self._of.out_tree.flatten_up_to(tree)
    return tuple(x for x, u in zip(flat, self._used) if u)

  def _full(self, kept: Any, zero: Any) -> Any:
    """``of``'s output structure from the kept leaves, ``zero(aval)`` for
    the others."""
    it = iter(self.out_tree.flatten_up_to(kept))
    return jax.tree.unflatten(self._of.out_tree, [
        next(it) if u else zero(a)
        for a, u in zip(self._of.out_avals_flat, self._used)])

  def dce(self, used_outs: Any, live_ins: Any) -> Any:
    del live_ins
    return _dce(self, self._of, self._used, used_outs)

  def expand(self, *args: Any) -> Any:
    return self._select(self._of.expand(*args))

  def jvp(self, primals: Any, tangents: Any) -> Any:
    out, tangent = self._of.jvp(primals, tangents)
    return self._select(out), self._select(tangent)

  def vjp_fwd(self, nzs_in: Any, *args: Any) -> Any:
    out, res, *rest = self._of.vjp_fwd(nzs_in, *args)
    return (self._select(out), res, *[self._select(r) for r in rest[:1]],
            *rest[1:])

  def vjp_bwd(self, res: Any, g: Any, *arg_accums: Any) -> Any:
    full = self._full(g, lambda a: Zero(a.to_ct_aval()))
    return self._of.vjp_bwd(res, full, *arg_accums)

  def lin(self, nzs_in: Any, *args: Any) -> Any:
    out, res, *rest = self._of.lin(nzs_in, *args)
    return (self._select(out), res, *[self._select(r) for r in rest[:1]],
            *rest[1:])

  def linearized(self, res: Any, *tangents: Any) -> Any:
    return self._select(self._of.linearized(res, *tangents))

  def transpose(self, ct: Any, *args: Any) -> Any:
    return self._of.transpose(
        self._full(ct, lambda a: Zero(a.to_ct_aval())), *args)

  def batch(self, axis_data: Any, args: Any, dims: Any) -> Any:
    out, out_dim = self._of.batch(axis_data, args, dims)
    if not isinstance(out_dim, (tuple, list, dict)) and (
        out_dim is None or isinstance(out_dim, int)):
      out_dim = jax.tree.map(lambda _: out_dim, self._of.out_aval)
    flat_dims = self._of.out_tree.flatten_up_to(out_dim)
    return self._select(out), tuple(
        d for d, u in zip(flat_dims, self._used) if u)
