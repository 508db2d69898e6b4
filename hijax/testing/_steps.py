"""Where finite differences evaluate a function: tangents of signed powers
of two scaled with the inputs, steps that keep ``x ± h t`` exact, and the
wider dtype a narrow one is differenced in."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def _bits(dtype) -> int:
  """Significand bits (with the implicit one): 53 for float64."""
  return int(jnp.finfo(dtype).nmant) + 1


def _real_dtype(dtype) -> np.dtype:
  """The dtype of the real and imaginary parts of ``dtype``."""
  return np.dtype(jnp.finfo(dtype).dtype)


def _signed_powers(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
  """``± 2^e`` with ``2^e <= |x| < 2^(e+1)`` per element (float64); a zero
  element takes the root mean square of its leaf's nonzero elements (1 if
  none)."""
  a = np.abs(x.astype(np.complex128 if np.iscomplexobj(x) else np.float64))
  tiny = float(jnp.finfo(x.dtype).tiny)
  ok = np.isfinite(a) & (a >= tiny)
  fill = float(np.sqrt(np.mean(a[ok] ** 2))) if np.any(ok) else 1.0
  e = np.floor(np.log2(np.where(ok, a, fill)))
  sign = rng.choice(np.array([-1.0, 1.0]), size=x.shape)
  return sign * np.exp2(e)


def scaled_tangents(rng: np.random.Generator, xs) -> list[np.ndarray]:
  """Random tangents, each element a signed power of two of the magnitude of
  its input element (for a complex element, its real and imaginary parts
  each)."""
  out = []
  for x in xs:
    x = np.asarray(x)
    if np.iscomplexobj(x):
      part = _real_dtype(x.dtype)
      t = (_signed_powers(rng, x.real.astype(part))
           + 1j * _signed_powers(rng, x.imag.astype(part)))
    else:
      t = _signed_powers(rng, x)
    out.append(t.astype(x.dtype))
  return out


def normalizer(ts, keep_in=None) -> float:
  """The power of two that the tangents are divided by so that the largest
  element is at most 1 (1 if none is larger), keeping every nonzero element
  a normal number of its dtype (or of the dtype in ``keep_in``)."""
  top, room = -np.inf, np.inf
  for i, t in enumerate(ts):
    t = np.asarray(t)
    dtype = t.dtype if keep_in is None else np.dtype(keep_in[i])
    parts = [t.real, t.imag] if np.iscomplexobj(t) else [t]
    for p in parts:
      a = np.abs(p.astype(np.float64))
      nz = a[a > 0]
      if nz.size:
        top = max(top, float(np.max(np.log2(nz))))
        room = min(room, float(np.min(np.log2(nz)))
                   - float(np.log2(jnp.finfo(dtype).tiny)))
  if not np.isfinite(top) or top <= 0:
    return 1.0
  return float(2.0 ** max(0, min(int(top), int(room))))


def candidate_steps(dtypes, eps=None) -> list[float]:
  """Powers of two from about ``eps^(1/3)`` of the least precise dtype down
  to the smallest step that keeps ``x ± h t`` exact in the most precise one,
  by factors of 4."""
  if eps is not None:
    k = int(round(-np.log2(eps)))
    return [2.0 ** -k, 2.0 ** -(k + 2)]
  k0 = max(2, min(_bits(d) - 1 for d in dtypes) // 3)
  k1 = max(_bits(d) - 2 for d in dtypes)
  return [2.0 ** -k for k in range(k0, max(k0, k1) + 1, 2)]


def _exact_shift(x, d):
  """``x + d`` in ``x``'s dtype, or None if it rounds."""
  wide = np.complex128 if np.iscomplexobj(x) else np.float64
  x64 = np.asarray(x).astype(wide)
  y = (x64 + d).astype(np.asarray(x).dtype)
  with np.errstate(invalid="ignore", over="ignore"):
    if not np.array_equal(y.astype(wide) - x64, d):
      return None
  return y


def shifted(xs, ts, h):
  """``x + h t`` for each leaf, or None if one would round."""
  out = []
  for x, t in zip(xs, ts):
    wide = np.complex128 if np.iscomplexobj(t) else np.float64
    y = _exact_shift(x, h * np.asarray(t).astype(wide))
    if y is None:
      return None
    out.append(y)
  return out


def wider(dtype) -> np.dtype | None:
  """The dtype a function of ``dtype`` inputs is differenced in, where it
  accepts it: float32 for bfloat16 and float16, float64 for float32 (and
  complex128 for complex64); None for float64."""
  dtype = np.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.inexact):
    return None
  bits = _bits(_real_dtype(dtype))
  if bits >= 53:
    return None
  if jnp.issubdtype(dtype, jnp.complexfloating):
    return np.dtype(np.complex64 if bits < 16 else np.complex128)
  return np.dtype(np.float32 if bits < 16 else np.float64)
