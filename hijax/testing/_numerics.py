"""Numbers: default tolerances, comparing arrays, inner products, formatting."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hijax._internals import core as _core


@dataclasses.dataclass(frozen=True)
class Tol:
  """A comparison passes where ``|got - want| <= atol + rtol |want|``."""
  atol: float
  rtol: float


# The defaults, by the dtype the checks run in: tolerances between two rules,
# tolerances against central finite differences, and the finite-difference
# step. In float32 a central difference with step 1e-3 is good to about 1e-3.
_DEFAULTS = {
    #           rules vs rules    rules vs finite differences  step
    "float64": (Tol(1e-6, 1e-5),  Tol(1e-6, 1e-5),             1e-6),
    "other":   (Tol(1e-5, 1e-4),  Tol(1e-3, 1e-3),             1e-3),
}


def defaults(dtype: str, atol=None, rtol=None, eps=None) -> tuple[Tol, Tol,
                                                                   float]:
  """(tol, fd_tol, eps) for checks in ``dtype``; given values override both
  tolerances."""
  tol, fd_tol, step = _DEFAULTS["float64" if dtype == "float64" else "other"]
  override = {k: v for k, v in (("atol", atol), ("rtol", rtol)) if v is not None}
  return (dataclasses.replace(tol, **override),
          dataclasses.replace(fd_tol, **override),
          step if eps is None else eps)


def is_float(x) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def real_or_int(dtype) -> bool:
  return any(jnp.issubdtype(dtype, t) for t in (jnp.floating, jnp.integer,
                                                jnp.bool_))


def check_arrays(what, root, paths_and_leaves, ok) -> None:
  """Raises TypeError naming the first leaf for which ``ok`` fails: the
  checks support arrays of real or integer dtypes only."""
  for path, x in paths_and_leaves:
    try:
      good = ok(x)
    except Exception:  # pylint: disable=broad-except  (e.g. np.asarray of a hi value)
      good = False
    if not good:
      try:
        desc = (x if isinstance(x, _core.AbstractValue)
                else _core.typeof(x)).str_short()
      except Exception:  # pylint: disable=broad-except
        desc = f"a {type(x).__name__}"
      raise TypeError(
          f"check_rules checks functions of arrays (and pytrees of arrays) "
          f"with real or integer dtypes, but {what} {root}"
          f"{jax.tree_util.keystr(path)} is {desc}; hi types and complex "
          "numbers are not supported")


def type_str(x) -> str:
  """``float32[3]``: the dtype and shape of an array, as JAX prints types."""
  x = np.asarray(x)
  return f"{x.dtype.name}[{','.join(str(d) for d in x.shape)}]"


def to_numpy(xs) -> list:
  return [np.asarray(x) for x in xs]


def fmt_array(x, limit=6) -> str:
  """``f64[3] [-2. ,  0.5,  3. ]``: the type and the first few values."""
  x = np.asarray(x)
  aval = f"{x.dtype.name}{list(x.shape)}".replace("float", "f").replace(
      "uint", "u").replace("int", "i")
  flat = x.ravel()
  vals = np.array2string(flat[:limit], precision=4, separator=", ",
                         max_line_width=200)
  if flat.size > limit:
    vals = vals[:-1] + ", ...]"
  return f"{aval} {vals}" if x.ndim else f"{aval} {flat[0]:.6g}" if is_float(
      x) else f"{aval} {flat[0]}"


def inner(xs, ys) -> tuple[float, float]:
  """Sum of elementwise products of two lists of arrays, and of their |.|."""
  total, scale = 0.0, 0.0
  for x, y in zip(xs, ys):
    p = np.asarray(x, np.float64) * np.asarray(y, np.float64)
    total += float(np.sum(p))
    scale += float(np.sum(np.abs(p)))
  return total, scale


def inner_identity(cts_out, j_t, cts_in, tangents, tol: Tol):
  """Both sides of ``<ȳ, J ṫ> = <Jᵀ ȳ, ṫ>`` and the error allowed:
  ``(lhs, rhs, bound)``."""
  lhs, lscale = inner(cts_out, j_t)
  rhs, rscale = inner(cts_in, tangents)
  bound = (tol.atol * sum(float(np.sum(np.abs(c))) for c in cts_out)
           + tol.rtol * max(lscale, rscale))
  return lhs, rhs, bound


def compare_leaf(got, want, tol: Tol):
  """Returns (max_abs_error, index, got_value, want_value) of the worst
  violation of ``|got - want| <= atol + rtol |want|``, or None.

  A different shape or dtype is a violation with error ``inf``, its index a
  description and the values None: a tangent has the dtype of its primal, so
  the reference's dtype is the one expected.
  """
  got = np.asarray(got)
  want = np.asarray(want)
  if got.shape != want.shape:
    return (float("inf"), f"shape {got.shape} instead of {want.shape}", None,
            None)
  if got.dtype != want.dtype:
    return (float("inf"), f"dtype {got.dtype} instead of {want.dtype}", None,
            None)
  if not (is_float(got) or is_float(want)):
    bad = got != want
    if not np.any(bad):
      return None
    idx = np.unravel_index(np.argmax(bad), bad.shape) if bad.ndim else ()
    return float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)))
                 ), idx, got[idx], want[idx]
  g = got.astype(np.float64)
  w = want.astype(np.float64)
  with np.errstate(invalid="ignore"):
    err = np.abs(g - w)
    err = np.where((g == w) | (np.isnan(g) & np.isnan(w)), 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    scale = np.abs(np.where(np.isfinite(w), w, 0))
    excess = err - (tol.atol + tol.rtol * scale)
  if not np.any(excess > 0):
    return None
  idx = np.unravel_index(np.argmax(err), err.shape) if err.ndim else ()
  return float(err[idx]), idx, g[idx], w[idx]
