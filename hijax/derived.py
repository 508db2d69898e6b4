"""Rules derived from other rules, assigned in a `HiPrim` subclass's body.

* ``lin, linearized = linearize_from_jvp``: partially evaluate `jvp`;
* ``vjp_fwd, vjp_bwd_retval = vjp_from_lin``: save `lin`'s residuals, transpose
  `linearized` on the backward pass (what ``jax.custom_jvp`` does);
* ``vjp_fwd, vjp_bwd_retval = vjp_from_jvp``: save the primal inputs, then
  linearize and transpose `jvp` on the backward pass (recomputing, remat-style);
* ``jvp = jvp_from_lin``: forward mode from `lin`/`linearized`.

The pairs are named tuples of two functions, so they unpack into two methods.
"""
from __future__ import annotations

from typing import Callable

import jax

from hijax._util import Static, is_zero
from hijax.autodiff import Zero, instantiate_zeros
from hijax.primitive import HiPrim, RULE_INSTALLERS

__all__ = ["linearize_from_jvp", "vjp_from_lin", "vjp_from_jvp", "jvp_from_lin"]


def _zero_tangents(prim: HiPrim, nzs_flat, nz_tangents):
  """Rebuilds the full tangent tuple, with `Zero` where ``nzs_flat`` is False."""
  it = iter(nz_tangents)
  flat = [next(it) if nz else Zero(a.to_tangent_aval())
          for a, nz in zip(prim.in_avals_flat, nzs_flat)]
  return jax.tree.unflatten(prim.in_tree, flat)


def _instantiate(tree):
  return jax.tree.map(instantiate_zeros, tree, is_leaf=is_zero)


def _tangent_examples(prim: HiPrim, nzs_flat):
  return [jax.ShapeDtypeStruct(t.shape, t.dtype)
          for t in (a.to_tangent_aval() for a, nz in
                    zip(prim.in_avals_flat, nzs_flat) if nz)]


# --- linearize_from_jvp -------------------------------------------------------------

def _lin_from_jvp(self, nzs_in, *primals):
  """`lin` derived by partially evaluating `jvp` at ``primals``."""
  nzs_flat = jax.tree.leaves(nzs_in)
  nzs_out_flat = []

  def tangent_out(*nz_tangents):
    out, t_out = self.jvp(primals, _zero_tangents(self, nzs_flat, nz_tangents))
    t_flat = self.out_tree.flatten_up_to(t_out)
    nzs_out_flat[:] = [t is not None and not is_zero(t) for t in t_flat]
    return [instantiate_zeros(Zero(a.to_tangent_aval()) if t is None else t)
            for t, a in zip(t_flat, self.out_avals_flat)], out

  if not any(nzs_flat):  # nothing to linearize: all output tangents are zero
    return self(*primals), (None, Static((nzs_flat, [False] * len(
        self.out_avals_flat)))), False
  examples = [jax.numpy.zeros(e.shape, e.dtype)
              for e in _tangent_examples(self, nzs_flat)]
  _, linear_map, out = jax.linearize(tangent_out, *examples, has_aux=True)
  nzs_out = jax.tree.unflatten(self.out_tree, nzs_out_flat)
  return out, (linear_map, Static((nzs_flat, nzs_out_flat))), nzs_out


def _linearized_from_jvp(self, res, *tangents):
  """`linearized` half of `linearize_from_jvp`: applies the saved linear map."""
  linear_map, flags = res
  nzs_flat, nzs_out_flat = flags.value
  tangents_flat = self.in_tree.flatten_up_to(tangents)
  nz_tangents = [instantiate_zeros(t) for t, nz in zip(tangents_flat, nzs_flat)
                 if nz]
  outs = linear_map(*nz_tangents) if linear_map is not None else nzs_out_flat
  return jax.tree.unflatten(self.out_tree, [
      t if nz else Zero(a.to_tangent_aval())
      for t, nz, a in zip(outs, nzs_out_flat, self.out_avals_flat)])


# --- jvp_from_lin -----------------------------------------------------------------

def jvp_from_lin(self, primals, tangents):
  """`jvp` derived from handwritten `lin` and `linearized` rules."""
  tangents_flat = self.in_tree.flatten_up_to(tangents)
  nzs_in = jax.tree.unflatten(self.in_tree,
                              [not is_zero(t) for t in tangents_flat])
  out, res, *rest = self.lin(nzs_in, *primals)
  if len(rest) > 1:
    return out, self.linearized(res, rest[1], *tangents)
  return out, self.linearized(res, *tangents)


# --- vjp_from_lin and vjp_from_jvp ----------------------------------------------------

def _transpose_tangent_map(prim: HiPrim, nzs_flat, tangent_map, g):
  """Cotangents of the inputs, by transposing a function of the nonzero tangents."""
  examples = _tangent_examples(prim, nzs_flat)
  cts = iter(jax.linear_transpose(
      lambda *ts: _instantiate(tangent_map(*ts)), *examples)(_instantiate(g)))
  return jax.tree.unflatten(prim.in_tree, [next(cts) if nz else None
                                           for nz in nzs_flat])


def _vjp_fwd_from_lin(self, nzs_in, *primals):
  """`vjp_fwd` half of `vjp_from_lin`: runs `lin`, saving its residuals."""
  out, res, *rest = self.lin(nzs_in, *primals)
  sres = rest[1] if len(rest) > 1 else None
  saved = (res, sres, Static(jax.tree.leaves(nzs_in)))
  return (out, saved, rest[0]) if rest else (out, saved)


def _vjp_bwd_from_lin(self, saved, g):
  """`vjp_bwd_retval` half of `vjp_from_lin`: transposes `linearized`."""
  res, sres, nzs = saved
  extra = () if sres is None else (sres,)

  def tangent_map(*nz_tangents):
    tangents = _zero_tangents(self, nzs.value, nz_tangents)
    return self.linearized(res, *extra, *tangents)
  return _transpose_tangent_map(self, nzs.value, tangent_map, g)


def _vjp_fwd_from_jvp(self, nzs_in, *primals):
  """`vjp_fwd` half of `vjp_from_jvp`: saves only the primal inputs."""
  return self(*primals), (primals, Static(jax.tree.leaves(nzs_in)))


def _vjp_bwd_from_jvp(self, saved, g):
  """`vjp_bwd_retval` half of `vjp_from_jvp`: linearizes and transposes `jvp`."""
  primals, nzs = saved

  def tangent_map(*nz_tangents):
    return self.jvp(primals, _zero_tangents(self, nzs.value, nz_tangents))[1]
  return _transpose_tangent_map(self, nzs.value, tangent_map, g)


# --- the pairs ----------------------------------------------------------------------

class RulePair:
  """Two derived methods, to be unpacked in a class body (calling it is an error)."""

  def __init__(self, name: str, targets: str, first: Callable, second: Callable):
    self.name, self.targets = name, targets
    self.first, self.second = first, second

  def __iter__(self):
    return iter((self.first, self.second))

  def __repr__(self):
    return self.name

  def __call__(self, *args, **kwargs):
    raise TypeError(f"{self.name} defines two methods: unpack it in the class "
                    f"body, `{self.targets} = {self.name}`")


linearize_from_jvp = RulePair("linearize_from_jvp", "lin, linearized",
                              _lin_from_jvp, _linearized_from_jvp)
"""``lin, linearized = linearize_from_jvp``: linearization from the `jvp` rule."""

vjp_from_lin = RulePair("vjp_from_lin", "vjp_fwd, vjp_bwd_retval",
                        _vjp_fwd_from_lin, _vjp_bwd_from_lin)
"""``vjp_fwd, vjp_bwd_retval = vjp_from_lin``: reverse mode by transposing `linearized`."""

vjp_from_jvp = RulePair("vjp_from_jvp", "vjp_fwd, vjp_bwd_retval",
                        _vjp_fwd_from_jvp, _vjp_bwd_from_jvp)
"""``vjp_fwd, vjp_bwd_retval = vjp_from_jvp``: reverse mode by transposing `jvp`."""


def _install_circularity_check(cls):
  if cls.jvp is jvp_from_lin and cls.lin is _lin_from_jvp:
    raise TypeError(
        f"{cls.__name__} sets both `jvp = jvp_from_lin` and `lin, linearized = "
        "linearize_from_jvp`: each rule would be derived from the other. Write "
        "`jvp` or `lin`/`linearized` by hand")


RULE_INSTALLERS.append(_install_circularity_check)
