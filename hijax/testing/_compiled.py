"""Compiled evaluations shared by the checks.

The checks evaluate ``prim_fn`` and its transformations many times: at the
points of finite differences, on each element of a batch, along several
tangents and cotangents. Each is compiled once here and reused by every
check that needs it:

* `Compiled.fn`: ``jax.jit(prim_fn)``, compiled once per input types.
* `Compiled.at_points`: ``prim_fn`` at many points in one compiled call, a
  ``lax.map`` over the stacked floating-point inputs, padded to a power of
  two so that the finite differences of every direction share one program.
  It evaluates the function once per point, as a Python loop would: the
  batching rule under test is never involved, and a loop inside the
  function runs as many iterations for each point as it would alone.
* `Compiled.cached`: a transformation of ``prim_fn`` (``jax.jvp`` along one
  set of inputs, its backward pass, ``vmap`` with some ``in_axes``), jitted
  once and called with each new tangent or cotangent.
* `Compiled.together`: several transformations in one program (the ``vmap``
  of every ``in_axes``), where that traces; each alone otherwise.

With ``jit=False`` nothing is compiled: every evaluation runs eagerly (for
an `expand` that branches in Python on values).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from hijax.testing._numerics import is_float

# Batches of points are padded to a power of two, at least this many.
MIN_BATCH = 8


class Compiled:
  """``prim_fn`` of a flat list of leaves (its arguments ``args``), and its
  compiled evaluations.

  Each is compiled as a user's ``jax.jit`` compiles it, with XLA's default
  options: the checks judge the program the user runs. (Compiling without
  the backend's optimization passes, xla_backend_optimization_level=0, was
  faster, but changed hijax.implicit's Newton status at one point and failed
  a right rule: tests/test_testing_compiles.py.)"""

  def __init__(self, prim_fn: Callable, args: Sequence[Any], jit: bool):
    self.prim_fn = prim_fn
    self.jit = jit
    self.leaves, self.in_tree = jax.tree.flatten(tuple(args))
    self.float_idx = [i for i, x in enumerate(self.leaves) if is_float(x)]
    self.fn = jax.jit(prim_fn) if jit else prim_fn
    self._cache: dict[Any, Callable] = {}
    self._mapped_failed = False

  def cached(self, key: Any, build: Callable[[], Callable]) -> Callable:
    """The function ``build()`` returns, jitted (unless ``jit=False``), built
    once per ``key``."""
    if key not in self._cache:
      fn = build()
      self._cache[key] = jax.jit(fn) if self.jit else fn
    return self._cache[key]

  def together(self, key: Any, fns: Sequence[Callable],
               args: Sequence[Sequence[Any]]) -> list | None:
    """``[fn(*a) for fn, a in zip(fns, args)]`` as one compiled program
    (one compile instead of one per function: the checks' per-program cost
    is mostly fixed); None if that program cannot be traced or run, so that
    the caller runs each alone and learns which one fails."""
    if not self.jit or len(fns) < 2:
      return None
    def together(*all_args):
      return [fn(*a) for fn, a in zip(fns, all_args)]
    try:
      return self.cached(key, lambda: together)(*[tuple(a) for a in args])
    except Exception:  # pylint: disable=broad-except  (each alone says why)
      return None

  def call(self, full: Sequence[Any], fn: Callable | None = None) -> list:
    """The output leaves of ``fn`` (default: ``prim_fn``, compiled) at the
    flat leaves ``full``."""
    fn = self.fn if fn is None else fn
    return jax.tree.leaves(fn(*jax.tree.unflatten(self.in_tree, list(full))))

  def _full(self, idx, values) -> list:
    full = list(self.leaves)
    for i, v in zip(idx, values):
      full[i] = v
    return full

  def at_points(self, idx: Sequence[int], points: Sequence[Sequence[Any]]
                ) -> list[list[np.ndarray]]:
    """``prim_fn``'s output leaves at each point, where a point gives the
    values of the leaves ``idx`` (the others keep their values)."""
    if not points:
      return []
    if not self.jit or self._mapped_failed:
      return [[np.asarray(y) for y in self.call(self._full(idx, p))]
              for p in points]
    try:
      return self._mapped(idx, points)
    except Exception:  # pylint: disable=broad-except  (e.g. not traceable in a loop body)
      self._mapped_failed = True
      return self.at_points(idx, points)

  def _mapped(self, idx, points):
    floats = self.float_idx
    n = len(points)
    size = max(MIN_BATCH, 1 << (n - 1).bit_length())
    padded = list(points) + [points[0]] * (size - n)
    stacked = []
    for i in floats:  # every floating-point leaf, so directions share a program
      if i in idx:
        k = list(idx).index(i)
        stacked.append(np.stack([np.asarray(p[k]) for p in padded]))
      else:
        x = np.asarray(self.leaves[i])
        stacked.append(np.broadcast_to(x, (size,) + x.shape))
    others = [x for i, x in enumerate(self.leaves) if i not in floats]
    mapped = self.cached("points", lambda: self._points)
    outs = mapped(tuple(stacked), tuple(others))
    outs = [np.asarray(y) for y in outs]
    return [[y[k] for y in outs] for k in range(n)]

  def _points(self, stacked, others):
    floats = self.float_idx

    def one(float_values):
      full, it_f, it_o = [], iter(float_values), iter(others)
      for i in range(len(self.leaves)):
        full.append(next(it_f) if i in floats else next(it_o))
      return tuple(self.call(full, self.prim_fn))
    return jax.lax.map(one, stacked)
