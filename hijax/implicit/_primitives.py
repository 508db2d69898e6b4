"""The primitives of `hijax.implicit` and their rules.

`FixedPoint` and `Root` find ``x`` with ``residual(x, p) = 0`` (for a fixed
point the residual is ``x - f(x, p)``); `LinearSolve` solves ``A(p) x = b``.
Their tangent and cotangent systems are solved by `LinearSolve` itself, with
a matvec built from the residual (`_JvpX`, `_VjpX`) or the transpose of the
user's matvec (`_Transposed`).

Each primitive returns ``(x, Status)``. With ``throw=True`` its ``expand``
raises at run time when the solve failed (`raise_if_failed`), and so do the
linear solves of its derivatives. With ``throw=False`` it returns the Status,
and the derivatives of a failed solve (or of one whose derivative system
failed) are NaN, never a plausible number.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp

from hijax._internals.core import ShapedArray
from hijax._util import Static
from hijax.autodiff import Zero, NullAccum, instantiate_zeros
from hijax.derived import jvp_from_lin
from hijax.primitive import HiPrim
from hijax.implicit._dense import Dense
from hijax.implicit._krylov import CG
from hijax.implicit._linear import MatMul
from hijax.implicit._matrix import MatrixMatvec
from hijax.implicit._status import Status, raise_if_failed, solved


# --- small pytree helpers ----------------------------------------------------

def _is_zero(t: Any) -> bool:
  return isinstance(t, Zero) or getattr(t, "dtype", None) == jax.dtypes.float0


def _all_zero(tree: Any) -> bool:
  return all(_is_zero(t) for t in jax.tree.leaves(tree, is_leaf=_is_zero))


def _instantiate(tree: Any) -> Any:
  return jax.tree.map(instantiate_zeros, tree, is_leaf=_is_zero)


def _neg(tree: Any) -> Any:
  return jax.tree.map(jnp.negative, tree)


def _avals(tree: Any) -> Any:
  return jax.tree.map(jax.typeof, tree)


def _no_tangent(prim: Any) -> Any:
  return jax.tree.map(lambda _: None, prim.out_aval)


def _restrict(fn: Any, primals: Any, keep: Any) -> Any:
  """``fn`` as a function of the leaves of ``primals`` flagged in ``keep``."""
  flat, tree = jax.tree.flatten(primals)

  def restricted(*kept: Any) -> Any:
    it = iter(kept)
    return fn(jax.tree.unflatten(tree, [next(it) if k else p
                                        for p, k in zip(flat, keep)]))
  return restricted, [p for p, k in zip(flat, keep) if k]


def _jvp_nonzero(fn: Any, primals: Any, tangents: Any) -> Any:
  """The tangent of ``fn`` at ``primals`` along the nonzero leaves of
  ``tangents`` (zero leaves are not differentiated); None if all are zero."""
  tangents_flat = jax.tree.structure(primals).flatten_up_to(tangents)
  keep = [not _is_zero(t) for t in tangents_flat]
  if not any(keep):
    return None
  restricted, kept = _restrict(fn, primals, keep)
  return jax.jvp(restricted, kept, [t for t, k in zip(tangents_flat, keep)
                                    if k])[1]


def _neg_vjp_nonzero(fn: Any, primals: Any, keep: Any, ct: Any) -> Any:
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

  def __call__(self, x: Any, p: Any) -> Any:
    return jax.tree.map(jnp.subtract, x, self.f(x, p))

  def __repr__(self) -> Any:
    return f"x-{_name(self.f)}"


@dataclasses.dataclass(frozen=True)
class _JvpX:
  """``v -> (dg/dx) v`` at ``(x, p)``, with ``(x, p)`` as the params."""
  g: Callable

  def __call__(self, v: Any, xp: Any) -> Any:
    x, p = xp
    return jax.jvp(lambda y: self.g(y, p), (x,), (v,))[1]

  def __repr__(self) -> Any:
    return f"d{_name(self.g)}/dx"


@dataclasses.dataclass(frozen=True)
class _VjpX:
  """``u -> (dg/dx)^T u`` at ``(x, p)``."""
  g: Callable

  def __call__(self, u: Any, xp: Any) -> Any:
    x, p = xp
    return jax.vjp(lambda y: self.g(y, p), x)[1](u)[0]

  def __repr__(self) -> Any:
    return f"d{_name(self.g)}/dx^T"


@dataclasses.dataclass(frozen=True)
class _Transposed:
  """The transpose of a matvec linear in its first argument."""
  matvec: Callable

  def __call__(self, u: Any, p: Any) -> Any:
    zero = jax.tree.map(jnp.zeros_like, u)
    return jax.vjp(lambda v: self.matvec(v, p), zero)[1](u)[0]

  def __repr__(self) -> Any:
    return f"{_name(self.matvec)}^T"


def _transposed(matvec: Any) -> Any:
  if isinstance(matvec, MatrixMatvec):
    return MatrixMatvec(_transposed(matvec.matvec), matvec.index,
                        not matvec.transposed)
  if isinstance(matvec, _JvpX):
    return _VjpX(matvec.g)
  if isinstance(matvec, _VjpX):
    return _JvpX(matvec.g)
  if isinstance(matvec, _Transposed):
    return matvec.matvec
  return _Transposed(matvec)


@dataclasses.dataclass(frozen=True)
class _Symmetric:
  """The matvec of a system that `CG` has tested for symmetry, as two
  matvecs equal at these params: ``cheap`` computes its values, and the
  rules differentiate ``exact`` (`_exact`), since a tangent of a symmetric
  matrix need not be symmetric."""
  cheap: Callable
  exact: Callable

  def __call__(self, v: Any, p: Any) -> Any:
    return self.cheap(v, p)

  def __repr__(self) -> Any:
    return _name(self.exact)


def _exact(matvec: Any) -> Any:
  """The matvec to differentiate in params (see `_Symmetric`)."""
  return matvec.exact if isinstance(matvec, _Symmetric) else matvec


def _transposed_for(solver: Any, matvec: Any, rhs: Any) -> Any:
  """The matvec of the transposed system that ``solver`` will solve.

  `CG` solves symmetric systems only, and with ``check=True`` it tests the
  matvec it is given for symmetry: for real unknowns the transposed system
  then has the values of the system itself, computed by its matvec (``A @ v``,
  not the slower ``v @ A`` of a transpose, nor a reverse pass of ``g`` where a
  forward one does), while derivatives in params are still the transpose's.
  Otherwise, the transpose."""
  transposed = _transposed(_exact(matvec))
  real = all(not jnp.issubdtype(leaf.dtype, jnp.complexfloating)
             for leaf in jax.tree.leaves(rhs))
  if isinstance(solver, CG) and solver.check and real:
    cheap = matvec.cheap if isinstance(matvec, _Symmetric) else matvec
    return _Symmetric(cheap, transposed)
  return transposed


def _name(fn: Any) -> Any:
  return getattr(fn, "__name__", None) or repr(fn)


# --- the primitives -----------------------------------------------------------

# A Status of types, of Nones and of flags: the same pytree as the Status of
# arrays a solve returns (its fields are declared as arrays, hence the casts).
_ANY: Any = None
STATUS_AVAL = Status(*(cast(Any, ShapedArray((), dtype)) for dtype in
                       (jnp.bool_, jnp.int32, jnp.float32, jnp.int32)))
_NO_STATUS = Status(_ANY, _ANY, _ANY, _ANY)


def _nzs_out(nz: bool) -> Any:
  """The output's nonzero-tangent flags: the Status never has a tangent."""
  no: Any = False
  return nz, Status(no, no, no, no)


def _nan_unless(ok: Any, tree: Any) -> Any:
  """``tree``, or NaN where ``ok`` is False."""
  return jax.tree.map(lambda t: jnp.where(ok, t, jnp.nan).astype(t.dtype),
                      tree)


def _where(prim: Any) -> str:
  solver = prim.params["solver"]
  return f"hijax.implicit {type(prim).__name__} (solver={_name(solver)})"


class _Checked(HiPrim):
  """What the three primitives share: the output ``(x, Status)``, the
  failure check and the batching rule."""

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def _finish(self, x: Any, st: Any) -> Any:
    if self.throw:
      x = raise_if_failed(x, st, _where(self))
    return x, st

  def _guard(self, ok: Any, tangent: Any) -> Any:
    """The derivative of a solve whose Status said ``ok``: NaN if not."""
    return tangent if self.throw else _nan_unless(ok, tangent)

  def batch_dim_rule(self, axis_data: Any, in_dims: Any) -> Any:
    return 0


class LinearSolve(_Checked):
  """``x`` with ``matvec(x, params) == b``; built by `linear_solve`."""

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, b_aval: Any, params_aval: Any, *, matvec: Any, solver: Any, throw: Any=True):
    self.in_avals = (b_aval, params_aval)
    self.out_aval = (b_aval, STATUS_AVAL)
    self.params = dict(matvec=matvec, solver=solver, throw=throw)
    super().__init__()

  def _factored(self) -> bool:
    # A matrix handed over as one (MatMul), or a matvec that multiplies by
    # one of the params (MatrixMatvec), solved by Dense: factorize it once.
    return isinstance(self.matvec, (MatMul, MatrixMatvec)) and isinstance(
        self.solver, Dense)

  def _matrix(self, params: Any) -> tuple[Any, bool]:
    """For `_factored`: the matrix ``M`` as it is in params, and whether the
    system's matrix is its transpose."""
    if isinstance(self.matvec, MatrixMatvec):
      return self.matvec.leaf(params), self.matvec.transposed
    return params, False

  def expand(self, b: Any, params: Any) -> Any:
    if self._factored():
      matrix, transposed = self._matrix(params)
      if transposed:
        x, st = self.solver.solve_factored(
            matrix, self.solver.factor(matrix), b, True)
      else:
        x, st = self.solver.solve_matrix(matrix, b)
    elif isinstance(self.matvec, (_VjpX, _Transposed)) and isinstance(
        self.solver, Dense):
      # A transposed system (of a gradient): Dense builds the matrix of the
      # matvec this one transposes, as the forward or tangent system does, so
      # that a program solving both builds and factorizes one matrix, once
      forward = _transposed(self.matvec)
      x, st = solved(self.solver.solve_transposed(
          lambda v: forward(v, params), b), _where(self))
    else:
      x, st = solved(self.solver(lambda v: self.matvec(v, params), b),
                     _where(self), b, self.solver)
    return self._finish(x, st)

  def _solve(self, rhs: Any, params: Any, matvec: Any,
             solver: Any = None) -> Any:
    w, st = LinearSolve(_avals(rhs), _avals(params), matvec=matvec,
                        solver=solver or self.solver, throw=self.throw)(
                            rhs, params)
    return self._guard(st.converged, w)

  def lin(self, nzs_in: Any, b: Any, params: Any) -> Any:
    x, st = self(b, params)
    return (x, st), (x, params, st.converged), _nzs_out(
        any(jax.tree.leaves(nzs_in)))

  def linearized(self, res: Any, b_dot: Any, params_dot: Any) -> Any:
    # A x = b, so A x_dot = b_dot - (dA p_dot) x.
    x, params, ok = res
    matvec = _exact(self.matvec)
    d = _jvp_nonzero(lambda p: matvec(x, p), params, params_dot)
    if d is None and _all_zero(b_dot):
      return _no_tangent(self)
    rhs = _instantiate(b_dot) if d is None else jax.tree.map(
        lambda b, d: -d if _is_zero(b) else b - d, b_dot, d, is_leaf=_is_zero)
    return self._guard(ok, self._solve(rhs, params, self.matvec)), _NO_STATUS

  jvp = jvp_from_lin

  def vjp_fwd(self, nzs_in: Any, b: Any, params: Any) -> Any:
    if self._factored():
      matrix, transposed = self._matrix(params)
      factors = self.solver.factor(matrix)
      x, st = self.solver.solve_factored(matrix, factors, b, transposed)
      x, st = self._finish(x, st)
    else:
      factors = None
      x, st = self(b, params)
    return (x, st), (x, params, st.converged, factors, Static(nzs_in)), \
        _nzs_out(any(jax.tree.leaves(nzs_in)))

  def vjp_bwd_retval(self, res: Any, ct: Any) -> Any:
    x, params, ok, factors, nzs = res
    x_bar = ct[0]
    nz_b, nz_params = nzs.value
    if _all_zero(x_bar):
      return None, None
    if factors is not None:  # the transposed solve reuses the LU factors
      matrix, transposed = self._matrix(params)
      w, st = self.solver.solve_factored(matrix, factors, _instantiate(x_bar),
                                         not transposed)
      w, st = self._finish(w, st)
      w = self._guard(st.converged, w)
    else:
      matvec_t, solver = _transposed_for(self.solver, self.matvec,
                                         x_bar), self.solver
      if isinstance(matvec_t, _Symmetric):
        # The forward solve tested this matvec, at these params, for
        # symmetry (and ``ok`` says how that went): CG need not test it again
        solver = dataclasses.replace(solver, check=False)
      w = self._solve(_instantiate(x_bar), params, matvec_t, solver)
    w = self._guard(ok, w)
    matvec = _exact(self.matvec)
    params_bar = _neg_vjp_nonzero(lambda p: matvec(x, p), params,
                                  jax.tree.leaves(nz_params), w)
    return (w if any(jax.tree.leaves(nz_b)) else None), params_bar

  def transpose(self, ct: Any, b_accums: Any, params: Any) -> Any:
    # Linear in b only: the transpose solves with the transposed matrix.
    if any(hasattr(a, "accum") for a in jax.tree.leaves(params)):
      raise NotImplementedError(
          "LinearSolve.transpose: the solution is linear in b, not in params; "
          "transpose with respect to b only")
    ct = ct[0]
    if _all_zero(ct):
      return
    w = self._solve(_instantiate(ct), params,
                    _transposed_for(self.solver, self.matvec, ct))
    for acc, w_leaf in zip(jax.tree.leaves(b_accums), jax.tree.leaves(w)):
      # A leaf of b that is not being transposed arrives as a value, not an
      # accumulator; the map is linear in b, so that leaf is zero here.
      if hasattr(acc, "accum") and not isinstance(acc, NullAccum):
        acc.accum(w_leaf)


class _Implicit(_Checked):
  """The rules `FixedPoint` and `Root` share: ``residual(x, p) = 0``."""

  residual: Callable[..., Any]  # set by the subclasses

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, x_aval: Any, params_aval: Any, **params: Any):
    self.in_avals = (x_aval, params_aval)
    self.out_aval = (x_aval, STATUS_AVAL)
    self.params = params
    super().__init__()

  def _solve(self, rhs: Any, x: Any, params: Any, matvec: Any) -> Any:
    w, st = LinearSolve(_avals(rhs), _avals((x, params)), matvec=matvec,
                        solver=self.linear_solver, throw=self.throw)(
                            rhs, (x, params))
    return self._guard(st.converged, w)

  def lin(self, nzs_in: Any, x0: Any, params: Any) -> Any:
    x, st = self(x0, params)
    return (x, st), (x, params, st.converged), _nzs_out(
        any(jax.tree.leaves(nzs_in[1])))

  def linearized(self, res: Any, x0_dot: Any, params_dot: Any) -> Any:
    # g(x(p), p) = 0, so (dg/dx) x_dot = -(dg/dp) p_dot. x0 has no influence.
    x, params, ok = res
    d = _jvp_nonzero(lambda p: self.residual(x, p), params, params_dot)
    if d is None:
      return _no_tangent(self)
    x_dot = self._solve(_neg(d), x, params, _JvpX(self.residual))
    return self._guard(ok, x_dot), _NO_STATUS

  jvp = jvp_from_lin

  def vjp_fwd(self, nzs_in: Any, x0: Any, params: Any) -> Any:
    x, st = self(x0, params)
    nz_params = jax.tree.leaves(nzs_in[1])
    return (x, st), (x, params, st.converged, Static(nz_params)), _nzs_out(
        any(nz_params))

  def vjp_bwd_retval(self, res: Any, ct: Any) -> Any:
    x, params, ok, nz_params = res
    x_bar = ct[0]
    if _all_zero(x_bar) or not any(nz_params.value):
      return None, None
    w = self._solve(_instantiate(x_bar), x, params, _transposed_for(
        self.linear_solver, _JvpX(self.residual), x_bar))
    return None, _neg_vjp_nonzero(lambda p: self.residual(x, p), params,
                                  nz_params.value, self._guard(ok, w))


class FixedPoint(_Implicit):
  """``x`` with ``x == f(x, params)``; built by `fixed_point`."""

  residual: Callable[..., Any]

  def __init__(self, x_aval: Any, params_aval: Any, *, f: Any, solver: Any, linear_solver: Any,
               throw: Any=True):
    super().__init__(x_aval, params_aval, f=f, solver=solver,
                     linear_solver=linear_solver, throw=throw)
    self.residual = _Residual(f)

  def expand(self, x0: Any, params: Any) -> Any:
    return self._finish(*solved(self.solver(self.f, x0, params),
                                _where(self), x0, self.solver))


class Root(_Implicit):
  """``x`` with ``g(x, params) == 0``; built by `root`."""

  def __init__(self, x_aval: Any, params_aval: Any, *, g: Any, solver: Any, linear_solver: Any,
               throw: Any=True):
    super().__init__(x_aval, params_aval, g=g, solver=solver,
                     linear_solver=linear_solver, throw=throw)
    self.residual = g

  def expand(self, x0: Any, params: Any) -> Any:
    return self._finish(*solved(self.solver(self.g, x0, params),
                                _where(self), x0, self.solver))
