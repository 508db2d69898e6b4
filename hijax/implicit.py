"""Implicit differentiation: fixed points, roots and linear solves as primitives.

Each function returns the solution of an equation that depends on parameters,
and differentiates it with the implicit function theorem rather than through
the iterations of the solver:

* ``fixed_point(f, x0, params)`` returns ``x`` with ``x == f(x, params)``;
* ``root(g, x0, params)`` returns ``x`` with ``g(x, params) == 0``;
* ``linear_solve(matvec, b, params)`` returns ``x`` with
  ``matvec(x, params) == b`` (``matvec`` linear in its first argument).

``x0``, ``b`` and ``params`` are pytrees of arrays. The solution is
differentiable with respect to ``params`` (and ``b``), in forward and reverse
mode and to any order, under ``jit`` and ``vmap``; it never depends on ``x0``,
which gets a zero derivative.

Everything the functions depend on must come in through ``params``: a function
that closes over a traced value (for instance a variable being differentiated)
is rejected with an error naming the argument, since its dependence would be
invisible to the rules.

**Solvers.** The forward solve is chosen with ``solver=``, a hashable callable:
``solver(f, x0, params)`` for `fixed_point` (default `FixedPointIteration`),
``solver(g, x0, params)`` for `root` (default `Newton`), and a linear solver
``solver(matvec, b)`` (``matvec`` a function of one pytree) for `linear_solve`
(default `Dense`). The tangent and cotangent systems of `fixed_point` and
`root` are solved by ``linear_solver=`` (default `Dense`: the Jacobian is
materialized, one matvec per unknown, and factorized; `CG` and `GMRES` are
matrix-free). `linear_solve` uses its own ``solver`` for them too.

**Rules.** Write ``g(x, p) = 0`` for the equation (``g = x - f`` for a fixed
point) and ``A = dg/dx``, ``B = dg/dp`` at the solution. Then the tangent is
``x_dot = -A^{-1} (B p_dot)`` and the cotangent ``p_bar = -B^T (A^{-T} x_bar)``.
Both linear systems are solved by the `LinearSolve` primitive, itself
differentiable by the same rules, so second derivatives work. The primitives
(`FixedPoint`, `Root`, `LinearSolve`) define ``lin``/``linearized`` (the
linearization keeps the solution and never runs the forward solver again),
``jvp`` (derived from them), ``vjp_fwd``/``vjp_bwd_retval`` (one transposed
solve), ``batch_dim_rule`` and, for `LinearSolve`, ``transpose``. Parameters
whose tangents or cotangents are symbolic zeros are left out of the
Jacobian-vector and vector-Jacobian products, and when all are, no linear
system is solved at all.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg  # noqa: F401  (CG, GMRES)
from jax._src import core
from jax.flatten_util import ravel_pytree

from hijax._util import Static
from hijax.autodiff import NullAccum, Zero, instantiate_zeros
from hijax.derived import jvp_from_lin
from hijax.primitive import HiPrim

__all__ = ["fixed_point", "root", "linear_solve", "FixedPointIteration",
           "Newton", "Dense", "CG", "GMRES", "FixedPoint", "Root",
           "LinearSolve"]


# --- small pytree helpers ------------------------------------------------------------

def _max_abs(tree):
  leaves = [jnp.max(jnp.abs(x), initial=0.) for x in jax.tree.leaves(tree)]
  return jnp.max(jnp.stack(leaves)) if leaves else jnp.float32(0.)


def _default_tol(tol, tree):
  """``tol``, or 1e-12 for float64 unknowns and 1e-6 for narrower ones."""
  if tol is not None:
    return tol
  floats = [x.dtype for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  eps = float(jnp.finfo(floats[0]).eps) if floats else 1e-7
  return max(1e-12 if eps < 1e-10 else 1e-6, 4 * eps)


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


# --- linear solvers ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Dense:
  """Direct linear solver: builds the matrix from one ``matvec`` per unknown
  (vectorized with ``vmap``) and calls ``jnp.linalg.solve``. Exact and robust
  for small to medium systems; memory grows with the square of the size."""

  def __call__(self, matvec: Callable, b):
    b_flat, unravel = ravel_pytree(b)
    flat_matvec = lambda v: ravel_pytree(matvec(unravel(v)))[0]
    eye = jnp.eye(b_flat.size, dtype=b_flat.dtype)
    matrix = jax.vmap(flat_matvec, out_axes=1)(eye)
    return unravel(jnp.linalg.solve(matrix, b_flat))


@dataclasses.dataclass(frozen=True)
class CG:
  """Conjugate gradient (``jax.scipy.sparse.linalg.cg``), matrix-free. Only for
  symmetric positive definite systems. ``tol`` is relative to ``|b|``; None
  means 1e-12 in float64 and 1e-6 otherwise."""
  tol: float | None = None
  atol: float = 0.0
  maxiter: int | None = None

  def __call__(self, matvec: Callable, b):
    return jax.scipy.sparse.linalg.cg(
        matvec, b, tol=_default_tol(self.tol, b), atol=self.atol,
        maxiter=self.maxiter)[0]


@dataclasses.dataclass(frozen=True)
class GMRES:
  """GMRES (``jax.scipy.sparse.linalg.gmres``), matrix-free, for general
  (nonsymmetric) systems. ``tol`` as for `CG`."""
  tol: float | None = None
  atol: float = 0.0
  restart: int = 20
  maxiter: int | None = None

  def __call__(self, matvec: Callable, b):
    return jax.scipy.sparse.linalg.gmres(
        matvec, b, tol=_default_tol(self.tol, b), atol=self.atol,
        restart=self.restart, maxiter=self.maxiter)[0]


# --- nonlinear solvers ---------------------------------------------------------------

def _iterate(step, x0, tol, max_iter):
  """Runs ``x, dx = step(x)`` until ``max|dx| <= tol (1 + max|x|)``."""
  def cond(carry):
    k, x, err = carry
    return (k < max_iter) & (err > tol * (1 + _max_abs(x)))

  def body(carry):
    k, x, _ = carry
    x, dx = step(x)
    return k + 1, x, _max_abs(dx)

  err0 = jnp.full_like(_max_abs(x0), jnp.inf)
  return jax.lax.while_loop(cond, body, (0, x0, err0))[1]


@dataclasses.dataclass(frozen=True)
class FixedPointIteration:
  """Iterates ``x <- f(x, params)`` until the step is below ``tol`` relative to
  ``1 + max|x|`` (None: 1e-12 in float64, 1e-6 otherwise), or ``max_iter``
  steps. Converges when ``f`` is a contraction in ``x``."""
  tol: float | None = None
  max_iter: int = 1000

  def __call__(self, f: Callable, x0, params):
    def step(x):
      new = f(x, params)
      return new, jax.tree.map(jnp.subtract, new, x)
    return _iterate(step, x0, _default_tol(self.tol, x0), self.max_iter)


@dataclasses.dataclass(frozen=True)
class Newton:
  """Newton's method for ``g(x, params) = 0``: each step solves with the
  Jacobian ``dg/dx`` (as a matvec) using ``linear_solver``. Stops like
  `FixedPointIteration`."""
  tol: float | None = None
  max_iter: int = 50
  linear_solver: Callable = Dense()

  def __call__(self, g: Callable, x0, params):
    def step(x):
      gx = lambda y: g(y, params)
      matvec = lambda v: jax.jvp(gx, (x,), (v,))[1]
      dx = self.linear_solver(matvec, gx(x))
      return jax.tree.map(jnp.subtract, x, dx), dx
    return _iterate(step, x0, _default_tol(self.tol, x0), self.max_iter)


# --- matvecs built from an equation g(x, p) = 0 --------------------------------------

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


# --- the primitives ------------------------------------------------------------------

class LinearSolve(HiPrim):
  """``x`` with ``matvec(x, params) == b``; built by `linear_solve`."""

  def __init__(self, b_aval, params_aval, *, matvec, solver):
    self.in_avals = (b_aval, params_aval)
    self.out_aval = b_aval
    self.params = dict(matvec=matvec, solver=solver)
    super().__init__()

  def expand(self, b, params):
    return self.solver(lambda v: self.matvec(v, params), b)

  def _solve(self, rhs, params, matvec):
    return LinearSolve(_avals(rhs), _avals(params), matvec=matvec,
                       solver=self.solver)(rhs, params)

  def lin(self, nzs_in, b, params):
    x = self(b, params)
    return x, (x, params), any(jax.tree.leaves(nzs_in))

  def linearized(self, res, b_dot, params_dot):
    # A x = b, so A x_dot = b_dot - (dA p_dot) x.
    x, params = res
    d = _jvp_nonzero(lambda p: self.matvec(x, p), params, params_dot)
    if d is None and _all_zero(b_dot):
      return _no_tangent(self)
    rhs = _instantiate(b_dot) if d is None else jax.tree.map(
        lambda b, d: -d if _is_zero(b) else b - d, b_dot, d, is_leaf=_is_zero)
    return self._solve(rhs, params, self.matvec)

  jvp = jvp_from_lin

  def vjp_fwd(self, nzs_in, b, params):
    x = self(b, params)
    return x, (x, params, Static(nzs_in))

  def vjp_bwd_retval(self, res, x_bar):
    x, params, nzs = res
    nz_b, nz_params = nzs.value
    if _all_zero(x_bar):
      return None, None
    w = self._solve(_instantiate(x_bar), params, _transposed(self.matvec))
    params_bar = _neg_vjp_nonzero(lambda p: self.matvec(x, p), params,
                              jax.tree.leaves(nz_params), w)
    return (w if any(jax.tree.leaves(nz_b)) else None), params_bar

  def transpose(self, ct, b_accums, params):
    # Linear in b only: the transpose solves with the transposed matrix.
    if any(hasattr(a, "accum") for a in jax.tree.leaves(params)):
      raise NotImplementedError(
          "LinearSolve.transpose: the solution is linear in b, not in params; "
          "transpose with respect to b only")
    if _all_zero(ct):
      return
    w = self._solve(_instantiate(ct), params, _transposed(self.matvec))
    for acc, w_leaf in zip(jax.tree.leaves(b_accums), jax.tree.leaves(w)):
      if not isinstance(acc, NullAccum):
        acc.accum(w_leaf)

  def batch_dim_rule(self, axis_data, in_dims):
    return 0


class _Implicit(HiPrim):
  """Shared rules of `FixedPoint` and `Root`: ``x`` with ``residual(x, p) = 0``."""

  residual: Callable  # set by the subclasses

  def __init__(self, x_aval, params_aval, **params):
    self.in_avals = (x_aval, params_aval)
    self.out_aval = x_aval
    self.params = params
    super().__init__()

  def _solve(self, rhs, x, params, matvec):
    return LinearSolve(_avals(rhs), _avals((x, params)), matvec=matvec,
                       solver=self.linear_solver)(rhs, (x, params))

  def lin(self, nzs_in, x0, params):
    x = self(x0, params)
    return x, (x, params), any(jax.tree.leaves(nzs_in[1]))

  def linearized(self, res, x0_dot, params_dot):
    # g(x(p), p) = 0, so (dg/dx) x_dot = -(dg/dp) p_dot. x0 has no influence.
    x, params = res
    d = _jvp_nonzero(lambda p: self.residual(x, p), params, params_dot)
    if d is None:
      return _no_tangent(self)
    return self._solve(_neg(d), x, params, _JvpX(self.residual))

  jvp = jvp_from_lin

  def vjp_fwd(self, nzs_in, x0, params):
    x = self(x0, params)
    nz_params = jax.tree.leaves(nzs_in[1])
    return x, (x, params, Static(nz_params)), any(nz_params)

  def vjp_bwd_retval(self, res, x_bar):
    x, params, nz_params = res
    if _all_zero(x_bar) or not any(nz_params.value):
      return None, None
    w = self._solve(_instantiate(x_bar), x, params, _VjpX(self.residual))
    return None, _neg_vjp_nonzero(lambda p: self.residual(x, p), params,
                              nz_params.value, w)

  def batch_dim_rule(self, axis_data, in_dims):
    return 0


class FixedPoint(_Implicit):
  """``x`` with ``x == f(x, params)``; built by `fixed_point`."""

  def __init__(self, x_aval, params_aval, *, f, solver, linear_solver):
    super().__init__(x_aval, params_aval, f=f, solver=solver,
                     linear_solver=linear_solver)
    self.residual = _Residual(f)

  def expand(self, x0, params):
    return self.solver(self.f, x0, params)


class Root(_Implicit):
  """``x`` with ``g(x, params) == 0``; built by `root`."""

  def __init__(self, x_aval, params_aval, *, g, solver, linear_solver):
    super().__init__(x_aval, params_aval, g=g, solver=solver,
                     linear_solver=linear_solver)
    self.residual = g

  def expand(self, x0, params):
    return self.solver(self.g, x0, params)


# --- the public functions --------------------------------------------------------------

def _strong(tree):
  """Arrays of ``tree``'s canonical dtypes, without weak types; integer and
  boolean leaves become floating point (the unknowns are real numbers)."""
  def convert(x):
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.inexact):
      dtype = jnp.result_type(float)
    return jnp.asarray(x, dtype=dtype)
  return jax.tree.map(convert, tree)


def _check_function(api: str, cls: str, argname: str, fn, x, params):
  """Traces ``fn(x, params)``; rejects closed-over tracers and a result whose
  types differ from ``x``'s."""
  if not callable(fn):
    raise TypeError(f"hijax.implicit.{api}: `{argname}` must be a function "
                    f"of (x, params), got a {type(fn).__name__}")
  closed, out = jax.make_jaxpr(fn, return_shape=True)(x, params)
  if any(isinstance(c, core.Tracer) for c in closed.consts):
    raise TypeError(
        f"hijax.implicit.{api} ({cls}): the function passed as `{argname}` "
        f"({_name(fn)}) closes over a traced value, whose derivatives and "
        f"batching the {cls} rules cannot see. Pass that value in `params` "
        f"and read it from the second argument of `{argname}(x, params)` "
        "instead of capturing it")
  want = jax.tree.map(lambda a: (a.shape, a.dtype), _avals(x))
  got = jax.tree.map(lambda a: (a.shape, a.dtype), out)
  if jax.tree.structure(want) != jax.tree.structure(got) or want != got:
    raise TypeError(
        f"hijax.implicit.{api} ({cls}): `{argname}(x, params)` must return "
        f"the shapes and dtypes of x, {want}, but returned {got}")


def fixed_point(f: Callable, x0, params, *,
                solver: Callable = FixedPointIteration(),
                linear_solver: Callable = Dense()):
  """The ``x`` with ``x == f(x, params)``, differentiable in ``params``.

  Args:
    f: a function ``f(x, params)`` returning a pytree like ``x0``. It must not
      close over traced values: pass them in ``params``.
    x0: the starting point (a pytree of arrays); not differentiated.
    params: a pytree of arrays, the parameters the solution depends on.
    solver: ``solver(f, x0, params) -> x``, the forward solve (default: plain
      iteration, `FixedPointIteration`).
    linear_solver: ``linear_solver(matvec, b) -> x``, for the tangent and
      cotangent systems with the matrix ``I - df/dx`` (default `Dense`; `GMRES`
      for large ``x``).
  """
  x0 = _strong(x0)
  _check_function("fixed_point", "FixedPoint", "f", f, x0, params)
  return FixedPoint(_avals(x0), _avals(params), f=f, solver=solver,
                    linear_solver=linear_solver)(x0, params)


def root(g: Callable, x0, params, *, solver: Callable = Newton(),
         linear_solver: Callable = Dense()):
  """The ``x`` with ``g(x, params) == 0`` (near ``x0``), differentiable in
  ``params``.

  Args:
    g: a function ``g(x, params)`` returning a pytree like ``x0``; it must not
      close over traced values.
    x0: the starting point; not differentiated.
    params: a pytree of arrays.
    solver: ``solver(g, x0, params) -> x`` (default `Newton`).
    linear_solver: for the tangent and cotangent systems with the matrix
      ``dg/dx`` (default `Dense`).
  """
  x0 = _strong(x0)
  _check_function("root", "Root", "g", g, x0, params)
  return Root(_avals(x0), _avals(params), g=g, solver=solver,
              linear_solver=linear_solver)(x0, params)


def linear_solve(matvec: Callable, b, params, *, solver: Callable = Dense()):
  """The ``x`` with ``matvec(x, params) == b``, differentiable in ``b`` and
  ``params``.

  Args:
    matvec: ``matvec(x, params)``, linear in ``x`` (a pytree like ``b``); it
      must not close over traced values.
    b: the right-hand side, a pytree of arrays.
    params: a pytree of arrays on which the matrix depends.
    solver: ``solver(matvec1, b) -> x`` with ``matvec1`` a function of ``x``
      alone: `Dense` (the default), `CG` (symmetric positive definite systems)
      or `GMRES`. Also used for the tangent systems and, with the transposed
      matrix, the cotangent ones.
  """
  b = _strong(b)
  _check_function("linear_solve", "LinearSolve", "matvec", matvec, b, params)
  return LinearSolve(_avals(b), _avals(params), matvec=matvec,
                     solver=solver)(b, params)
