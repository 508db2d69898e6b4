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

**Failure is never silent.** Every solver returns its solution with a
`Status` (converged, steps, error, reason), and every one checks what it
bounds: `FixedPointIteration` the estimated distance to the fixed point,
`Newton` its last step, the linear solvers the residual (`Dense` its backward
error). A solve that misses its tolerance within ``max_iter`` steps, meets a
non-finite iterate, or (`CG`) a matrix that is not symmetric positive definite
on two probe vectors, fails: with ``throw=True`` (the default) it raises
`SolveError` eagerly (also under an eager ``grad``, ``jvp`` or ``vmap``,
except for a derivative solve of ``grad``'s backward pass, which JAX runs),
and a JAX runtime error carrying the same message under ``jit`` and in that
backward pass (one ``lax.cond`` per solve, no host call unless it fails; under
``vmap`` one failing instance fails the batch; on an accelerator the program
that holds the check costs more per call even so: prefer ``throw=False`` in a
program called many times there). With ``throw=False`` the
functions return ``(x, Status)`` and the derivatives of a failed solve are
NaN. Default tolerances are per leaf dtype (`default_tol`: 1e-12 in float64,
1e-6 in float32, 10 eps in bfloat16 and float16); narrow floats are
factorized in float32.

**Solvers.** The forward solve is chosen with ``solver=``, a hashable callable:
``solver(f, x0, params)`` for `fixed_point` (default `FixedPointIteration`),
``solver(g, x0, params)`` for `root` (default `Newton`), and a linear solver
``solver(matvec, b)`` (``matvec`` a function of one pytree) for `linear_solve`
(default `Dense`). Each returns ``(x, Status)`` (a solver of your own may
return ``x`` alone: then only finiteness is checked). ``matvec=MatMul()`` hands
`linear_solve` a matrix as it is: `Dense` factorizes it once, for the solve
and the transposed solve of its gradient. A matvec that is a product of ``x``
with a square params leaf (``A @ x``, ``x @ A``, ``A.T @ x``, ``jnp.dot``,
``jnp.einsum``) is recognised from its jaxpr and used the same way.

**Eager calls are compiled once.** Called on concrete values, each function
runs a cached ``jax.jit`` of itself keyed on what its functions compute (their
code and the values they read: closure cells, default arguments, the globals
they load, a bound method's object), the solvers and the argument types; the
JAX arrays a function captures are inputs of that program, not constants. A
second call, even of a lambda written again in a loop or a cell, compiles
and traces nothing, and a call whose function reads other values never gets
a program traced for the old ones. The tangent and cotangent systems of `fixed_point` and
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

from hijax.implicit._api import fixed_point, linear_solve, root
from hijax.implicit._dense import Dense
from hijax.implicit._krylov import CG, GMRES
from hijax.implicit._linear import MatMul
from hijax.implicit._nonlinear import FixedPointIteration, Newton
from hijax.implicit._primitives import FixedPoint, LinearSolve, Root
from hijax.implicit._status import REASONS, SolveError, Status, default_tol

__all__ = ["fixed_point", "root", "linear_solve", "FixedPointIteration",
           "Newton", "Dense", "CG", "GMRES", "MatMul", "Status",
           "SolveError", "REASONS", "default_tol", "FixedPoint", "Root",
           "LinearSolve"]
