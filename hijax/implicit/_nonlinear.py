"""The nonlinear solvers of `hijax.implicit`: `FixedPointIteration` and
`Newton`. Each returns ``(x, Status)``; it stops on a non-finite iterate.

Tolerances are per leaf of the unknown's pytree: a leaf is converged when the
error measure of that leaf is at most ``tol * (1 + max|x_leaf|)``, with
``tol`` (None: `default_tol` of the leaf's dtype) the same for every leaf
when given. ``f`` and ``g`` are evaluated at `iteration_precision`: on a
TPU, where a float32 matrix product at the default precision rounds to
bfloat16, at float32's.

What each checks: `FixedPointIteration` its convergence test alone (the
distance to the fixed point, estimated from the steps, and finiteness).
`Newton` decides convergence on its last step, which is as good as that
step's linear solve, and checks the linear solve of every step: checking
the last one only (each step's solve unchecked, the last step kept out of
the loop, checked after it, and the loop run again with every step checked
where that failed, so that failures kept their reasons) was measured slower
on a CPU (the scalar root of the benchmark 16%, an HVP of a 50-unknown root
7%): under ``vmap`` each array the loop carries costs a select over the
batch per step, and the last step is two or three more; unbatched, carrying
the last step's matrix out cost more than the checks' matrix-vector
products. For one unknown the check of a step is now its finiteness (a
division is correctly rounded: `Dense._check`'s ``quotient``), which took
most of its cost.
"""
from __future__ import annotations

from typing import Any

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hijax.implicit._dense import Dense
from hijax.implicit._precision import evaluated_at, iteration_precision_of
from hijax.implicit._status import (CONVERGED, LINEAR_FAILED, MAX_ITER,
                                    NONFINITE, all_finite, default_tol,
                                    solved, status)

__all__ = ["FixedPointIteration", "Newton"]


def _leaf_max_abs(tree: Any) -> Any:
  return [jnp.max(jnp.abs(x), initial=0.).astype(jnp.float32)
          for x in jax.tree.leaves(tree)]


def _leaf_max_abs2(a: Any, b: Any) -> Any:
  """`_leaf_max_abs` of two trees of the same leaf shapes (a step and the
  iterate: a residual returns the shapes of x, `_api` checks), each pair of
  leaves in one variadic reduction (NaN propagates): XLA's CPU backend
  compiles it as one kernel, where the two maxima of a long leaf were four
  (each reduction split in two)."""
  def pair(u: Any, v: Any) -> Any:
    u, v = jnp.abs(u), jnp.abs(v)
    zeros = (np.array(0, u.dtype), np.array(0, v.dtype))
    return jax.lax.reduce((u, v), zeros, lambda p, q: (
        jax.lax.max(p[0], q[0]), jax.lax.max(p[1], q[1])),
        tuple(range(u.ndim)))
  pairs = [pair(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
  return ([m.astype(jnp.float32) for m, _ in pairs],
          [m.astype(jnp.float32) for _, m in pairs])


def _tols(tol: Any, tree: Any) -> Any:
  return [default_tol(x.dtype) if tol is None else tol
          for x in jax.tree.leaves(tree)]


def _at_iteration_precision(fn: Callable, x0: Any) -> Callable:
  """``fn(x, params)`` evaluated at `iteration_precision_of` ``x0``."""
  precision = iteration_precision_of(x0)
  if precision is None:
    return fn

  def evaluated(x: Any, params: Any) -> Any:
    with evaluated_at(precision):
      return fn(x, params)
  return evaluated


_HISTORY = 8  # past step sizes kept per leaf, to estimate a contraction rate


def _iterate(step: Any, x0: Any, tols: Any, max_iter: Any, estimate: Any,
             history: bool = True) -> Any:
  """Runs ``x, dx, ok = step(x)`` until every leaf's error estimate (from
  ``estimate(k, step, rounding_floor, past_steps)``) is within tolerance, an
  iterate is non-finite, ``ok`` is False, or ``max_iter`` steps.

  ``history=False``: the estimate does not read the past steps (it gets an
  empty array), so the loop does not keep them (under ``vmap`` they are
  ``_HISTORY + 1`` floats per leaf and instance, rewritten every step).

  Why it stops is carried as the Status's reason (`MAX_ITER` while it runs),
  not as flags: on a CPU each carried array costs a copy and a kernel per
  step (under ``vmap``, a pass over the batch), more than the arithmetic of
  a 3-unknown fixed point or 10,000 scalar roots, and the reason needs no
  kernel after the loop (each is compile time at every first call). A leaf's "met" is kept across
  steps only where there are 2 or more leaves (for one, the loop stops)."""
  n = len(jax.tree.leaves(x0))
  inf = jnp.float32(jnp.inf)
  eps = [float(jnp.finfo(x.dtype).eps) if jnp.issubdtype(x.dtype, jnp.inexact)
         else 0. for x in jax.tree.leaves(x0)]

  def within(x_max: Any, est: Any) -> Any:
    return [e <= t * (1 + a) for e, t, a in zip(est, tols, x_max)]

  def cond(c: Any) -> Any:
    k, _, _, _, _, stop = c
    return (k < max_iter) & (stop == MAX_ITER)

  def body(c: Any) -> Any:
    k, x, est, past, done, _ = c
    x, dx, ok = step(x)
    # NaN or inf in x_max when x is not finite
    norms, x_max = _leaf_max_abs2(dx, x)
    # a step below the rounding level of x still carries f's rounding error
    floors = [e * a for e, a in zip(eps, x_max)]
    new = [estimate(k, s, f, h) for s, f, h in zip(norms, floors, past)]
    met = within(x_max, new)
    if done:
      # a leaf that met its tolerance stays converged (and keeps that
      # estimate)
      est = [jnp.where(d, e, n) for d, e, n in zip(done, est, new)]
      met = done = [d | w for d, w in zip(done, met)]
    else:
      est = new
    stop = jnp.where(~jnp.all(jnp.isfinite(jnp.stack(x_max))), NONFINITE,
                     jnp.where(~ok, LINEAR_FAILED,
                               jnp.where(jnp.all(jnp.stack(met)), CONVERGED,
                                         MAX_ITER)))
    # past[:-1]: the last steps, newest first; past[-1]: the first step.
    if history:
      past = [jnp.concatenate([s[None], h[:-2],
                               jnp.where(k == 0, s, h[-1])[None]])
              for s, h in zip(norms, past)]
    return k + 1, x, est, past, done, stop.astype(jnp.int32)

  if not n:
    return x0, status(CONVERGED, 0, 0.)
  past = jnp.full(_HISTORY + 1 if history else 0, inf)
  init = (jnp.int32(0), x0, [inf] * n, [past] * n,
          [jnp.bool_(False)] * n if n > 1 else [],
          jnp.where(all_finite(x0), MAX_ITER, NONFINITE).astype(jnp.int32))
  k, x, est, _, _, code = jax.lax.while_loop(cond, body, init)
  rel = [e / (1 + s) for e, s in zip(est, _leaf_max_abs(x))]
  error = jnp.max(jnp.stack(rel))
  return x, status(code, k, jnp.where(code == NONFINITE, jnp.inf, error))


def _contraction_estimate(k: Any, raw: Any, floor: Any, past: Any) -> Any:
  """``|x_k - x*|`` for a contraction of rate q: at most ``q / (1 - q)`` times
  the last step ``s``. ``q`` is the largest of the last ratio of steps, their
  geometric mean ratio over up to `_HISTORY` steps and that since the first
  step, so that steps at the rounding level cannot fake a fast rate; inf
  after a single step. Only when every step so far was exactly zero (``x0``
  is a fixed point of ``f`` as computed) is the estimate zero."""
  s = jnp.maximum(raw, floor)
  m = jnp.minimum(k, _HISTORY)
  kf = jnp.maximum(k, 1).astype(jnp.float32)
  last = s / past[0]
  span = past[jnp.maximum(m - 1, 0)]
  mean = (s / span) ** (1 / jnp.maximum(m, 1).astype(jnp.float32))
  mean_all = (s / past[-1]) ** (1 / kf)
  q = jnp.maximum(jnp.maximum(last, mean), mean_all)
  est = jnp.where(q < 1, s * q / (1 - q), jnp.inf)
  exact = (raw == 0) & ((k == 0) | (past[-1] == 0))
  return jnp.where(exact | (s == 0), 0., jnp.where(k == 0, jnp.inf, est))


def _step_estimate(k: Any, raw: Any, floor: Any, past: Any) -> Any:
  del k, floor, past
  return raw


@dataclasses.dataclass(frozen=True)
class FixedPointIteration:
  """Iterates ``x <- f(x, params)``; converges when ``f`` is a contraction in
  ``x``.

  ``tol`` bounds the *distance to the fixed point*, estimated from the
  observed rate ``q`` (the larger of the ratio of the last two steps and the
  mean ratio over the last eight) as
  ``q / (1 - q) * |last step|``: each leaf stops when that estimate is at
  most ``tol * (1 + max|x|)``. A slow contraction (``q`` near 1) therefore
  needs steps far smaller than ``tol``. None means 1e-12 for float64 leaves
  and 1e-6 for float32 ones (`default_tol`). ``max_iter`` (10,000) is enough
  for a contraction of rate 0.99 to reach 1e-12; reaching it is a failure.
  """
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None
  max_iter: int = 10_000

  def __call__(self, f: Callable, x0: Any, params: Any) -> Any:
    f = _at_iteration_precision(f, x0)

    def step(x: Any) -> Any:
      new = f(x, params)
      return new, jax.tree.map(jnp.subtract, new, x), jnp.bool_(True)
    return _iterate(step, x0, _tols(self.tol, x0), self.max_iter,
                    _contraction_estimate)


@dataclasses.dataclass(frozen=True)
class Newton:
  """Newton's method for ``g(x, params) = 0``: each step solves with the
  Jacobian ``dg/dx`` (as a matvec) using ``linear_solver``.

  ``tol`` bounds the last Newton step, per leaf, ``|dx| <= tol (1 + |x|)``
  (near a simple root the step is the distance of the previous iterate to the
  root, and the returned iterate is closer still); the linear solve of that
  last step must have succeeded. None: `default_tol`. ``max_iter`` (50)
  reached, a non-finite iterate (a singular Jacobian) or a failed linear
  solve is a failure: the loop stops at the first step whose linear solve
  failed, and says so.
  """
  _status_is_declared = True  # its Status is built by `status`
  tol: float | None = None
  max_iter: int = 50
  linear_solver: Callable = Dense()

  def __call__(self, g: Callable, x0: Any, params: Any) -> Any:
    g = _at_iteration_precision(g, x0)

    def step(x: Any) -> Any:
      gx = lambda y: g(y, params)
      matvec = lambda v: jax.jvp(gx, (x,), (v,))[1]
      rhs = gx(x)
      dx, st = solved(self.linear_solver(matvec, rhs), "Newton", rhs,
                      self.linear_solver)
      return jax.tree.map(jnp.subtract, x, dx), dx, st.converged | (
          st.reason == NONFINITE)  # a non-finite step stops as non-finite
    return _iterate(step, x0, _tols(self.tol, x0), self.max_iter,
                    _step_estimate, history=False)
