"""The primitives of `hijax.implicit` and their rules.

`FixedPoint` and `Root` find ``x`` with ``residual(x, p) = 0`` (for a fixed
point the residual is ``x - f(x, p)``); `LinearSolve` solves ``A(p) x = b``.
Their tangent and cotangent systems are solved by `LinearSolve` itself, with
a matvec built from the residual (`_JvpX`, `_VjpX`) or the transpose of the
user's matvec (`_Transposed`).
"""
from __future__ import annotations

from typing import Any

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from hijax._util import Static
from hijax.autodiff import Zero, NullAccum, instantiate_zeros
from hijax.derived import jvp_from_lin
from hijax.primitive import HiPrim


# --- small pytree helpers ----------------------------------------------------

def _is_zero(t) -> bool:
  return isinstance(t, Zero) or getattr(t, "dtype", None) == jax.dtypes.float0


def _all_zero(tree) -> bool:
  return all(_is_zero(t) for t in jax.tree.leaves(tree, is_leaf=_is_zero))


def _instantiate(tree):
  return jax.tree.map(instantiate_zeros, tree, is_leaf=_is_zero)


def _neg(tree):
  return jax.tree.map(jnp.negative, tree)


def _avals(tree):
  return jax.tree.map(jax.typeof, tree)


def _no_tangent(prim):
  return jax.tree.map(lambda _: None, prim.out_aval)


def _restrict(fn, primals, keep):
  """``fn`` as a function of the leaves of ``primals`` flagged in ``keep``."""
  flat, tree = jax.tree.flatten(primals)

  def restricted(*kept):
    it = iter(kept)
    return fn(jax.tree.unflatten(tree, [next(it) if k else p
                                        for p, k in zip(flat, keep)]))
  return restricted, [p for p, k in zip(flat, keep) if k]


def _jvp_nonzero(fn, primals, tangents):
  """The tangent of ``fn`` at ``primals`` along the nonzero leaves of
  ``tangents`` (zero leaves are not differentiated); None if all are zero."""
  tangents_flat = jax.tree.structure(primals).flatten_up_to(tangents)
  keep = [not _is_zero(t) for t in tangents_flat]
  if not any(keep):
    return None
  restricted, kept = _restrict(fn, primals, keep)
  return jax.jvp(restricted, kept, [t for t, k in zip(tangents_flat, keep)
                                    if k])[1]


def _neg_vjp_nonzero(fn, primals, keep, ct):
  """Minus the cotangent of the leaves of ``primals`` flagged in ``keep`` (None
  for the others, which are not differentiated)."""
  flat, tree = jax.tree.flatten(primals)
  if not any(keep):
    return None
  restricted, kept = _restrict(fn, primals, keep)
  cts = iter(jax.vjp(restricted, *kept)[1](ct))
  return jax.tree.unflatten(tree, [-next(cts) if k else None for k in keep])


# --- matvecs built from an equation g(x, p) = 0 -------------------------------

@dataclasses.dataclass(frozen=True)
class _Residual:
  """``x - f(x, p)``: the fixed-point equation as a root."""
  f: Callable

  def __call__(self, x, p):
    return jax.tree.map(jnp.subtract, x, self.f(x, p))

  def __repr__(self):
    return f"x-{_name(self.f)}"


@dataclasses.dataclass(frozen=True)
class _JvpX:
  """``v -> (dg/dx) v`` at ``(x, p)``, with ``(x, p)`` as the params."""
  g: Callable

  def __call__(self, v, xp):
    x, p = xp
    return jax.jvp(lambda y: self.g(y, p), (x,), (v,))[1]

  def __repr__(self):
    return f"d{_name(self.g)}/dx"


@dataclasses.dataclass(frozen=True)
class _VjpX:
  """``u -> (dg/dx)^T u`` at ``(x, p)``."""
  g: Callable

  def __call__(self, u, xp):
    x, p = xp
    return jax.vjp(lambda y: self.g(y, p), x)[1](u)[0]

  def __repr__(self):
    return f"d{_name(self.g)}/dx^T"


@dataclasses.dataclass(frozen=True)
class _Transposed:
  """The transpose of a matvec linear in its first argument."""
  matvec: Callable

  def __call__(self, u, p):
    zero = jax.tree.map(jnp.zeros_like, u)
    return jax.vjp(lambda v: self.matvec(v, p), zero)[1](u)[0]

  def __repr__(self):
    return f"{_name(self.matvec)}^T"


def _transposed(matvec):
  if isinstance(matvec, _JvpX):
    return _VjpX(matvec.g)
  if isinstance(matvec, _VjpX):
    return _JvpX(matvec.g)
  if isinstance(matvec, _Transposed):
    return matvec.matvec
  return _Transposed(matvec)


def _name(fn):
  return getattr(fn, "__name__", None) or repr(fn)


# --- the primitives -----------------------------------------------------------

class LinearSolve(HiPrim):
  """``x`` with ``matvec(x, params) == b``; built by `linear_solve`."""

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, b_aval: Any, params_aval: Any, *, matvec: Any,
               solver: Any) -> None:
    self.in_avals = (b_aval, params_aval)
    self.out_aval = b_aval
    self.params = dict(matvec=matvec, solver=solver)
    super().__init__()

  def expand(self, b: Any, params: Any) -> Any:
    return self.solver(lambda v: self.matvec(v, params), b)

  def _solve(self, rhs, params, matvec):
    return LinearSolve(_avals(rhs), _avals(params), matvec=matvec,
                       solver=self.solver)(rhs, params)

  def lin(self, nzs_in: Any, b: Any, params: Any) -> Any:
    x = self(b, params)
    return x, (x, params), any(jax.tree.leaves(nzs_in))

  def linearized(self, res: Any, b_dot: Any, params_dot: Any) -> Any:
    # A x = b, so A x_dot = b_dot - (dA p_dot) x.
    x, params = res
    d = _jvp_nonzero(lambda p: self.matvec(x, p), params, params_dot)
    if d is None and _all_zero(b_dot):
      return _no_tangent(self)
    rhs = _instantiate(b_dot) if d is None else jax.tree.map(
        lambda b, d: -d if _is_zero(b) else b - d, b_dot, d, is_leaf=_is_zero)
    return self._solve(rhs, params, self.matvec)

  jvp = jvp_from_lin

  def vjp_fwd(self, nzs_in: Any, b: Any, params: Any) -> Any:
    x = self(b, params)
    return x, (x, params, Static(nzs_in))

  def vjp_bwd_retval(self, res: Any, x_bar: Any) -> Any:
    x, params, nzs = res
    nz_b, nz_params = nzs.value
    if _all_zero(x_bar):
      return None, None
    w = self._solve(_instantiate(x_bar), params, _transposed(self.matvec))
    params_bar = _neg_vjp_nonzero(lambda p: self.matvec(x, p), params,
                              jax.tree.leaves(nz_params), w)
    return (w if any(jax.tree.leaves(nz_b)) else None), params_bar

  def transpose(self, ct: Any, b_accums: Any, params: Any) -> Any:
    # Linear in b only: the transpose solves with the transposed matrix.
    if any(hasattr(a, "accum") for a in jax.tree.leaves(params)):
      raise NotImplementedError(
          "LinearSolve.transpose: the solution is linear in b, not in params; "
          "transpose with respect to b only")
    if _all_zero(ct):
      return
    w = self._solve(_instantiate(ct), params, _transposed(self.matvec))
    for acc, w_leaf in zip(jax.tree.leaves(b_accums), jax.tree.leaves(w)):
      # A leaf of b that is not being transposed arrives as a value, not an
      # accumulator; the map is linear in b, so that leaf is zero here.
      if hasattr(acc, "accum") and not isinstance(acc, NullAccum):
        acc.accum(w_leaf)

  def batch_dim_rule(self, axis_data: Any, in_dims: Any) -> Any:
    return 0


class _Implicit(HiPrim):
  """The rules `FixedPoint` and `Root` share: ``residual(x, p) = 0``."""

  residual: Callable[..., Any]  # set by the subclasses
  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, x_aval: Any, params_aval: Any, **params: Any) -> None:
    self.in_avals = (x_aval, params_aval)
    self.out_aval = x_aval
    self.params = params
    super().__init__()

  def _solve(self, rhs, x, params, matvec):
    return LinearSolve(_avals(rhs), _avals((x, params)), matvec=matvec,
                       solver=self.linear_solver)(rhs, (x, params))

  def lin(self, nzs_in: Any, x0: Any, params: Any) -> Any:
    x = self(x0, params)
    return x, (x, params), any(jax.tree.leaves(nzs_in[1]))

  def linearized(self, res: Any, x0_dot: Any, params_dot: Any) -> Any:
    # g(x(p), p) = 0, so (dg/dx) x_dot = -(dg/dp) p_dot. x0 has no influence.
    x, params = res
    d = _jvp_nonzero(lambda p: self.residual(x, p), params, params_dot)
    if d is None:
      return _no_tangent(self)
    return self._solve(_neg(d), x, params, _JvpX(self.residual))

  jvp = jvp_from_lin

  def vjp_fwd(self, nzs_in: Any, x0: Any, params: Any) -> Any:
    x = self(x0, params)
    nz_params = jax.tree.leaves(nzs_in[1])
    return x, (x, params, Static(nz_params)), any(nz_params)

  def vjp_bwd_retval(self, res: Any, x_bar: Any) -> Any:
    x, params, nz_params = res
    if _all_zero(x_bar) or not any(nz_params.value):
      return None, None
    w = self._solve(_instantiate(x_bar), x, params, _VjpX(self.residual))
    return None, _neg_vjp_nonzero(lambda p: self.residual(x, p), params,
                              nz_params.value, w)

  def batch_dim_rule(self, axis_data: Any, in_dims: Any) -> Any:
    return 0


class FixedPoint(_Implicit):
  """``x`` with ``x == f(x, params)``; built by `fixed_point`."""

  residual: Callable[..., Any]

  def __init__(self, x_aval: Any, params_aval: Any, *, f: Any, solver: Any,
               linear_solver: Any) -> None:
    super().__init__(x_aval, params_aval, f=f, solver=solver,
                     linear_solver=linear_solver)
    self.residual = _Residual(f)

  def expand(self, x0: Any, params: Any) -> Any:
    return self.solver(self.f, x0, params)


class Root(_Implicit):
  """``x`` with ``g(x, params) == 0``; built by `root`."""

  def __init__(self, x_aval: Any, params_aval: Any, *, g: Any, solver: Any,
               linear_solver: Any) -> None:
    super().__init__(x_aval, params_aval, g=g, solver=solver,
                     linear_solver=linear_solver)
    self.residual = g

  def expand(self, x0: Any, params: Any) -> Any:
    return self.solver(self.g, x0, params)
