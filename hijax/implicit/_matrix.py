"""A matvec that multiplies by one of its params, recognised from its jaxpr.

``linear_solve(lambda x, A: A @ x, b, A)`` says in code what ``MatMul()``
says by name: the matrix is one of the params. `matrix_matvec` reads the
jaxpr of ``matvec(x, params)`` and, when it is exactly one matrix-vector
product of ``x`` with a square params leaf (``A @ x``, ``x @ A``,
``A.T @ x``, ``jnp.dot``, ``jnp.einsum``, possibly inside a nested ``jit``),
returns a `MatrixMatvec`: the same function, marked with which leaf is the
matrix and whether it is transposed. `Dense` then factorizes that leaf as it
is (no matrix built from ``n`` matvecs), once for the solve and its
gradient, as for `MatMul`. Anything else in the jaxpr (a scale, a sum of
two products, a cast) leaves the matvec as it was.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["MatrixMatvec", "matrix_matvec"]


@dataclasses.dataclass(frozen=True)
class MatrixMatvec:
  """``matvec`` (called as it is), known to be ``M @ x`` with ``M`` the
  ``index``-th leaf of the params, or its transpose when ``transposed``."""
  matvec: Callable[..., Any]
  index: int
  transposed: bool

  def __call__(self, x: Any, params: Any) -> Any:
    return self.matvec(x, params)

  def leaf(self, params: Any) -> Any:
    """The params leaf that is the matrix (transposed if `transposed`)."""
    return jax.tree.leaves(params)[self.index]

  def __repr__(self) -> str:
    name = getattr(self.matvec, "__name__", None) or repr(self.matvec)
    which = "transpose of " if self.transposed else ""
    return f"{name} (the {which}params leaf {self.index})"


_CALLS = ("pjit", "jit", "closed_call", "core_call")


def _product(jaxpr: Any, env: dict[Any, Any]) -> Any:
  """Follows ``jaxpr``'s equations from ``env`` (invar -> ("x",) or
  ("leaf", i, transposed)); returns what its one output is, or None."""
  for eqn in jaxpr.eqns:
    ins = [env.get(v) if not hasattr(v, "val") else None for v in eqn.invars]
    name = eqn.primitive.name
    if name == "transpose" and ins[0] and ins[0][0] == "leaf":
      if tuple(eqn.params["permutation"]) != (1, 0):
        return None
      _, i, t = ins[0]
      env[eqn.outvars[0]] = ("leaf", i, not t)
    elif name == "dot_general" and len(ins) == 2:
      found = _dot(ins, eqn.params)
      if found is None:
        return None
      env[eqn.outvars[0]] = found
    elif name in _CALLS and len(eqn.outvars) == 1:
      inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
      inner = getattr(inner, "jaxpr", inner)
      if inner is None or getattr(eqn.params.get("jaxpr"), "consts", ()):
        return None
      sub = {v: s for v, s in zip(inner.invars, ins) if s is not None}
      found = _product(inner, sub)
      if found is None:
        return None
      env[eqn.outvars[0]] = found
    else:
      return None
  if len(jaxpr.outvars) != 1:
    return None
  out = env.get(jaxpr.outvars[0]) if not hasattr(jaxpr.outvars[0],
                                                 "val") else None
  return out if out and out[0] == "Mx" else None


def _dot(ins: list[Any], params: dict[str, Any]) -> Any:
  """("Mx", i, transposed) if this dot_general is a leaf times x."""
  (lc, rc), (lb, rb) = params["dimension_numbers"]
  if lb or rb or len(lc) != 1 or len(rc) != 1:
    return None
  lhs, rhs = ins
  if lhs and lhs[0] == "leaf" and rhs == ("x",):
    (_, i, t), matrix_axis = lhs, lc[0]   # sum over axis lc of the leaf
  elif rhs and rhs[0] == "leaf" and lhs == ("x",):
    (_, i, t), matrix_axis = rhs, rc[0]
  else:
    return None
  # contracting the leaf's axis 1 with x is leaf @ x; its axis 0, leaf.T @ x
  return ("Mx", i, t if matrix_axis == 1 else not t)


def matrix_matvec(matvec: Any, b: Any, params: Any) -> Any:
  """``matvec`` as a `MatrixMatvec` when ``matvec(x, params)`` is one
  product of a square params leaf (of ``b``'s dtype) with the vector ``x``;
  otherwise ``matvec`` itself."""
  if getattr(b, "ndim", None) != 1:
    return matvec
  n, dtype = b.shape[0], b.dtype
  leaves = jax.tree.leaves(params)
  square = [getattr(p, "shape", None) == (n, n) and p.dtype == dtype
            for p in leaves]
  if not any(square):
    return matvec
  try:
    closed = jax.make_jaxpr(matvec)(b, params)
  except Exception:  # _check_function reports it
    return matvec
  jaxpr = closed.jaxpr
  if closed.consts or jaxpr.constvars or len(jaxpr.invars) != 1 + len(leaves):
    return matvec
  env: dict[Any, Any] = {jaxpr.invars[0]: ("x",)}
  for i, (v, ok) in enumerate(zip(jaxpr.invars[1:], square)):
    if ok:
      env[v] = ("leaf", i, False)
  found = _product(jaxpr, env)
  if found is None:
    return matvec
  _, index, transposed = found
  return MatrixMatvec(matvec, index, transposed)
