"""Implicit differentiation: fixed points, roots and linear solves.

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

A function that closes over traced values (for instance a variable being
differentiated, or one batched by ``vmap``) is closure-converted
(`hijax.closure_convert_params`): the captured arrays are moved into
``params``, so the solution is differentiated and batched with respect to
them too. A capture that cannot be converted (a mutable ref, a function with
side effects) is rejected with an error naming the argument.

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

from typing import Any

from collections.abc import Callable

import jax
import jax.numpy as jnp

from hijax._internals import core
from hijax.closure import closure_convert_params
from hijax.implicit._primitives import (FixedPoint, LinearSolve, Root, _avals,
                                        _name)
from hijax.implicit._solvers import (CG, GMRES, Dense, FixedPointIteration,
                                     Newton)

__all__ = ["fixed_point", "root", "linear_solve", "FixedPointIteration",
           "Newton", "Dense", "CG", "GMRES", "FixedPoint", "Root",
           "LinearSolve"]


# --- the public functions -----------------------------------------------------

def _strong(tree):
  """Arrays of ``tree``'s canonical dtypes, without weak types; integer and
  boolean leaves become floating point (the unknowns are real numbers)."""
  def convert(x):
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.inexact):
      dtype = jnp.result_type(float)
    return jnp.asarray(x, dtype=dtype)
  return jax.tree.map(convert, tree)


def _closure_converted(api: str, argname: str, fn, x, params):
  """``(fn, params)``, with the traced arrays ``fn`` captures moved into
  ``params`` (`hijax.closure.closure_convert_params`)."""
  if not callable(fn):
    return fn, params  # _check_function says what is wrong
  try:
    return closure_convert_params(fn, x, params)
  except TypeError as e:
    raise TypeError(f"hijax.implicit.{api}: `{argname}`: {e}") from None


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


def fixed_point(f: Callable, x0: Any, params: Any, *,
                solver: Callable = FixedPointIteration(),
                linear_solver: Callable = Dense()) -> Any:
  """The ``x`` with ``x == f(x, params)``, differentiable in ``params``.

  Args:
    f: a function ``f(x, params)`` returning a pytree like ``x0``. Traced
      values it closes over are moved into ``params``.
    x0: the starting point (a pytree of arrays); not differentiated.
    params: a pytree of arrays, the parameters the solution depends on.
    solver: ``solver(f, x0, params) -> x``, the forward solve (default: plain
      iteration, `FixedPointIteration`).
    linear_solver: ``linear_solver(matvec, b) -> x``, for the tangent and
      cotangent systems with the matrix ``I - df/dx`` (default `Dense`; `GMRES`
      for large ``x``).
  """
  x0 = _strong(x0)
  f, params = _closure_converted("fixed_point", "f", f, x0, params)
  _check_function("fixed_point", "FixedPoint", "f", f, x0, params)
  return FixedPoint(_avals(x0), _avals(params), f=f, solver=solver,
                    linear_solver=linear_solver)(x0, params)


def root(g: Callable, x0: Any, params: Any, *, solver: Callable = Newton(),
         linear_solver: Callable = Dense()) -> Any:
  """The ``x`` with ``g(x, params) == 0`` (near ``x0``), differentiable in
  ``params``.

  Args:
    g: a function ``g(x, params)`` returning a pytree like ``x0``; traced
      values it closes over are moved into ``params``.
    x0: the starting point; not differentiated.
    params: a pytree of arrays.
    solver: ``solver(g, x0, params) -> x`` (default `Newton`).
    linear_solver: for the tangent and cotangent systems with the matrix
      ``dg/dx`` (default `Dense`).
  """
  x0 = _strong(x0)
  g, params = _closure_converted("root", "g", g, x0, params)
  _check_function("root", "Root", "g", g, x0, params)
  return Root(_avals(x0), _avals(params), g=g, solver=solver,
              linear_solver=linear_solver)(x0, params)


def linear_solve(matvec: Callable, b: Any, params: Any, *,
                 solver: Callable = Dense()) -> Any:
  """The ``x`` with ``matvec(x, params) == b``, differentiable in ``b`` and
  ``params``.

  Args:
    matvec: ``matvec(x, params)``, linear in ``x`` (a pytree like ``b``);
      traced values it closes over are moved into ``params``.
    b: the right-hand side, a pytree of arrays.
    params: a pytree of arrays on which the matrix depends.
    solver: ``solver(matvec1, b) -> x`` with ``matvec1`` a function of ``x``
      alone: `Dense` (the default), `CG` (symmetric positive definite systems)
      or `GMRES`. Also used for the tangent systems and, with the transposed
      matrix, the cotangent ones.
  """
  b = _strong(b)
  matvec, params = _closure_converted("linear_solve", "matvec", matvec, b,
                                      params)
  _check_function("linear_solve", "LinearSolve", "matvec", matvec, b, params)
  return LinearSolve(_avals(b), _avals(params), matvec=matvec,
                     solver=solver)(b, params)
