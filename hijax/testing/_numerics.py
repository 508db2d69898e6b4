"""Numbers: default tolerances, comparing arrays, inner products, formatting."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hijax._internals import core as _core


@dataclasses.dataclass(frozen=True)
class Tol:
  """``|got - want| <= atol + rtol |want| + ulps eps (|want| + max |want|)``
  passes (``eps`` of ``want``'s dtype, ``max`` over the leaf: an element
  near zero is judged on its leaf's scale), plus the reference's bound."""
  atol: float = 0.0
  rtol: float = 0.0
  ulps: float = 0.0


# Two rules computing the same thing (jvp and linearize, vjp and the
# transpose of jvp, vmap and a loop, eager and jit) differ by their rounding
# only: 256 units in the last place, but at most 1/16 (bfloat16, float16).
RULE_ULPS = 256.0
MAX_RULE_RTOL = 1 / 16


def eps_of(dtype) -> float:
  """The machine epsilon of a floating or complex dtype (else float64's)."""
  inexact = jnp.issubdtype(dtype, jnp.inexact)
  return float(jnp.finfo(dtype if inexact else np.float64).eps)


def ulp_factor(tol: Tol, dtype) -> float:
  """``ulps eps`` for ``dtype``, at most `MAX_RULE_RTOL`."""
  return min(tol.ulps * eps_of(dtype), MAX_RULE_RTOL) if tol.ulps else 0.0


def defaults(atol=None, rtol=None) -> Tol:
  """`RULE_ULPS` units in the last place, or the ``atol`` and ``rtol`` given."""
  if atol is None and rtol is None:
    return Tol(ulps=RULE_ULPS)
  return Tol(atol or 0.0, rtol or 0.0)


def describe_tol(tol: Tol) -> str:
  """``tolerance 256 ulps`` or ``tolerance atol=1e-06, rtol=1e-05``."""
  parts = [f"{k}={v:g}" for k, v in (("atol", tol.atol), ("rtol", tol.rtol))
           if v] + ([f"{tol.ulps:g} ulps"] if tol.ulps else [])
  return "tolerance " + (", ".join(parts) or "0")


def on_device(x, dtype=None) -> jax.Array:
  """``x`` as a JAX array (in ``dtype``), compiling nothing (``jnp.asarray``
  compiles a program per shape and dtype on some JAX versions)."""
  if isinstance(x, jax.Array) and (dtype is None or x.dtype == dtype):
    return x
  x = np.asarray(x)
  return jax.device_put(x if dtype is None else x.astype(dtype))


def dtype_of(x) -> np.dtype:
  """The dtype of an array (JAX or NumPy) or of a Python scalar."""
  dtype = getattr(x, "dtype", None)
  return np.dtype(dtype) if dtype is not None else np.result_type(x)


def is_float(x) -> bool:
  """Whether ``x`` is an array or scalar of a floating or complex dtype
  (False for a value of a hi type)."""
  try:
    aval = x if isinstance(x, _core.AbstractValue) else _core.typeof(x)
    dtype = (aval.dtype if isinstance(aval, _core.ShapedArray)
             else np.result_type(x))  # pyright: ignore[reportArgumentType]
    return bool(jnp.issubdtype(dtype, jnp.inexact))
  except Exception:  # pylint: disable=broad-except  (a hi type's value)
    return False


def wide(x) -> np.ndarray:
  x = np.asarray(x)
  return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def real_or_int(dtype) -> bool:
  return any(jnp.issubdtype(dtype, t) for t in (jnp.inexact, jnp.integer,
                                                jnp.bool_))


def check_arrays(what, root, paths_and_leaves, ok) -> None:
  """Raises TypeError naming the first leaf for which ``ok`` fails."""
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
          f"with floating, complex, integer or boolean dtypes, but {what} "
          f"{root}{jax.tree_util.keystr(path)} is {desc}; hi types are not "
          "supported")


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


def describe_leaf(x) -> str:
  """`fmt_array`, or the type of a value of a hi type."""
  aval = _core.typeof(x)
  return (fmt_array(x) if isinstance(aval, _core.ShapedArray)
          else f"a value of hi type {aval.str_short()}")


def inner(xs, ys) -> tuple[float, float]:
  """``Re sum(x y)`` over two lists of arrays (JAX's pairing of a cotangent
  and a tangent: no conjugate), and the sum of ``|x y|``."""
  total, scale = 0.0, 0.0
  for x, y in zip(xs, ys):
    p = wide(x) * wide(y)
    total += float(np.sum(np.real(p)))
    scale += float(np.sum(np.abs(p)))
  return total, scale


def inner_identity(cts_out, j_t, cts_in, tangents, tol: Tol, bounds=None):
  """``(lhs, rhs, bound)`` of ``<ȳ, J ṫ> = <Jᵀ ȳ, ṫ>``: rounding relative to
  the products' magnitudes in the least precise dtype, plus ``bounds`` (of
  ``J ṫ``, from finite differences) weighted by ``|ȳ|``."""
  lhs, lscale = inner(cts_out, j_t)
  rhs, rscale = inner(cts_in, tangents)
  ybar = sum(float(np.sum(np.abs(wide(c)))) for c in cts_out)
  ulp = max([ulp_factor(tol, np.asarray(x).dtype)
             for x in list(cts_out) + list(cts_in) if is_float(x)] or [0.0])
  bound = (tol.atol * ybar + (tol.rtol + ulp) * max(lscale, rscale))
  if bounds is not None:
    with np.errstate(invalid="ignore"):
      for c, b in zip(cts_out, bounds):
        c = np.abs(wide(c))
        bound += float(np.sum(np.where(c > 0, c * np.asarray(b), 0.0)))
  return lhs, rhs, bound


def allowed_error(want, tol: Tol, bound=None, own=None) -> np.ndarray:
  """``atol + rtol |want| + ulps eps (|want| + max |want|) + bound``, with
  ``2 |want|`` for ``|want| + max |want|`` where ``own`` (an element
  resolved on its own scale beside far larger ones), plus the dtype's
  smallest normal number (below it results may be flushed to zero)."""
  w = np.abs(wide(want))
  with np.errstate(invalid="ignore"):
    w = np.where(np.isfinite(w), w, 0.0)
    top = float(np.max(w)) if w.size else 0.0
    scale = w + top if own is None else np.where(own, 2 * w, w + top)
    dtype = np.asarray(want).dtype
    # below the dtype's normal numbers a result may be flushed to zero
    tiny = float(jnp.finfo(dtype).tiny) if is_float(want) else 0.0
    allowed = tol.atol + tol.rtol * w + ulp_factor(tol, dtype) * scale + tiny
    if bound is not None:
      allowed = allowed + np.asarray(bound, np.float64)
  return allowed


def judged_elements(want, tol: Tol, bound=None, skip=None) -> int:
  """How many elements of ``want`` a comparison judges: not skipped, not
  NaN, with a finite error allowed."""
  want = np.asarray(want)
  if not is_float(want):
    return int(want.size)
  w = wide(want)
  with np.errstate(invalid="ignore"):
    ok = ~np.isnan(w) & np.isfinite(allowed_error(want, tol, bound))
  if skip is not None:
    ok &= ~np.asarray(skip, bool)
  return int(np.sum(ok))


def compare_leaf(got, want, tol: Tol, bound=None, skip=None, own=None):
  """``(error, index, got, want)`` of the worst violation of ``|got - want|
  <= allowed_error(want, tol, bound, own)`` outside ``skip``, or None. NaN
  agrees only with NaN, whatever the bound; a different shape or dtype is
  a violation of error ``inf``, the index saying which, the values None."""
  got = np.asarray(got)
  want = np.asarray(want)
  for what, g, w in (("shape", got.shape, want.shape),
                     ("dtype", got.dtype, want.dtype)):
    if g != w:
      return float("inf"), f"{what} {g} instead of {w}", None, None
  if not (is_float(got) or is_float(want)):
    bad = got != want
    if not np.any(bad):
      return None
    idx = np.unravel_index(np.argmax(bad), bad.shape) if bad.ndim else ()
    return float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)))
                 ), idx, got[idx], want[idx]
  g = wide(got)
  w = wide(want)
  with np.errstate(invalid="ignore"):
    err = np.abs(g - w)
    both_nan = np.isnan(g) & np.isnan(w)
    err = np.where((g == w) | both_nan, 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    excess = err - allowed_error(want, tol, bound, own)
    excess = np.where(np.isnan(g) != np.isnan(w), np.inf, excess)
    excess = np.where(np.isnan(excess), np.inf, excess)
    excess = np.where(both_nan, -np.inf, excess)
    if skip is not None:
      excess = np.where(skip, -np.inf, excess)
  if not np.any(excess > 0):
    return None
  idx = (np.unravel_index(np.argmax(np.where(excess > 0, err, -1)), err.shape)
         if err.ndim else ())
  return float(err[idx]), idx, g[idx], w[idx]
