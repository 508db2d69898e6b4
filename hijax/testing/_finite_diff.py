"""Central finite differences with a step and an error bound that follow the
input's magnitude and dtype.

The tolerance model (documented on the checking-rules page):

* **Tangents scale with the input.** Each element of a random tangent has the
  magnitude of its input element (a power of two times 1, 1.25, 1.5 or 1.75,
  with a random sign), so a step ``h`` is relative: ``x ± h t`` moves each
  element by about ``h |x|``.
* **No rounding of x ± h t.** ``h`` is a power of two and ``t`` has at most
  three significant bits, so ``x ± h t`` is exactly representable in the
  input's dtype for every step used (each step is verified; one that would
  round is dropped). The difference quotient is then a difference quotient
  along exactly ``t``.
* **Low precision is differenced in float32.** For bfloat16 and float16
  inputs, the function is evaluated on the same points in float32 where it
  accepts them (a primitive whose types follow its inputs'): the points and
  tangents are exact in both, and a 8-bit significand leaves no step that
  is both small and above rounding.
* **Many steps, the best one per element.** The quotient ``D(h)`` is computed
  for ``h`` from about ``eps^(1/3)`` (the best step for a function whose
  scale is its argument's) down to a few units in the last place of ``x``.
  For each output element, the error of ``D(h)`` is estimated as its
  truncation error (``|D(h) - D(h/4)|``: central differences converge as
  ``h²``) plus its rounding error (``σ / h``, where ``σ`` is the rounding
  noise of the function, measured from the fourth difference of ``f`` at the
  smallest step and at least ``eps |f|``), and the step with the smallest
  estimate is used. The comparison allows twice that estimate.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass
class FDEstimate:
  """Finite-difference estimates of ``J t`` along exact tangents.

  Attributes:
    tangents: the tangents, arrays of the inputs' dtypes.
    values: ``J t`` per floating-point output leaf (float64).
    bounds: the estimated error of each element of ``values`` (float64).
    resolution: the largest ``bound / max |value|`` over the output leaves
      (elements not resolved left out): how large a relative error in a rule
      the estimate can still see.
    evaluations: the number of evaluations of the function it took.
    unresolved: the number of output elements whose error estimate is of
      the order of their value; their bound is ``inf`` (not compared).
  """
  tangents: list
  values: list
  bounds: list
  resolution: float
  evaluations: int
  unresolved: int = 0


def _bits(dtype) -> int:
  """Significand bits (with the implicit one): 53 for float64."""
  return int(jnp.finfo(dtype).nmant) + 1


def tangent_mantissa_bits(dtype) -> int:
  """Fraction bits of a tangent's significand: 2 where the dtype has room,
  none in 8- to 11-bit formats, whose steps would otherwise be too coarse."""
  return 0


def scaled_tangents(rng: np.random.Generator, xs) -> list[np.ndarray]:
  """Random tangents, each element of the magnitude of its input element.

  An element of ``t`` is ``± m 2^e`` with ``2^e <= |x| < 2^(e+1)`` and ``m``
  one of 1, 1.25, 1.5, 1.75 (only 1 in low-precision dtypes). A zero element
  takes the root mean square of its leaf's nonzero elements (1 if none).
  """
  out = []
  for x in xs:
    x = np.asarray(x)
    a = np.abs(x.astype(np.float64))
    ok = np.isfinite(a) & (a >= float(jnp.finfo(x.dtype).tiny))
    fill = float(np.sqrt(np.mean(a[ok] ** 2))) if np.any(ok) else 1.0
    s = np.where(ok, a, fill)
    e = np.floor(np.log2(s))
    bits = tangent_mantissa_bits(x.dtype)
    m = 1 + rng.integers(0, 2 ** bits, size=x.shape) / 2 ** bits
    sign = rng.choice(np.array([-1.0, 1.0]), size=x.shape)
    out.append((sign * m * np.exp2(e)).astype(x.dtype))
  return out


def candidate_steps(dtypes, eps=None) -> list[float]:
  """Powers of two from about ``eps^(1/3)`` of the least precise dtype down to
  the smallest step that keeps ``x ± h t`` exact in the most precise one, by
  factors of 4. A given ``eps`` gives ``[eps, eps / 4]`` (rounded to a power
  of two), the second only to estimate the first's error."""
  if eps is not None:
    k = int(round(-np.log2(eps)))
    return [2.0 ** -k, 2.0 ** -(k + 2)]
  k0 = max(2, min(_bits(d) - 1 for d in dtypes) // 3)
  k1 = max(_bits(d) - 2 - tangent_mantissa_bits(d) for d in dtypes)
  return [2.0 ** -k for k in range(k0, max(k0, k1) + 1, 2)]


def _shifted(xs, ts, h):
  """``x + h t`` for each leaf, or None if one would round."""
  out = []
  for x, t in zip(xs, ts):
    x64, d = np.asarray(x, np.float64), h * np.asarray(t, np.float64)
    y = (x64 + d).astype(np.asarray(x).dtype)
    with np.errstate(invalid="ignore", over="ignore"):
      if not np.array_equal(y.astype(np.float64) - x64, d):
        return None
    out.append(y)
  return out


def _to64(values):
  return [np.asarray(v, np.float64) for v in values]


def _truncation(D, diff, noise):
  """The truncation error of each quotient, ``inf`` where the quotients are
  not seen to converge.

  The estimate at step ``k`` is the largest of ``|D_k - D_k+1|``, of the
  next difference, of ``|D_k-1 - D_k| / 16`` (the previous difference,
  scaled as an ``h²`` error) and of the disagreement with every finer
  quotient beyond that quotient's rounding (so that coarse quotients agreeing
  by chance do not pass for converged ones). A step counts only where the differences are
  seen to shrink into it (by at least 4 where 16 is expected) or are already
  explained by rounding (``noise``, per step): a sequence that has not yet
  converged can have small differences by chance.
  """
  n = len(D)
  if n == 1:
    return np.full_like(D, np.inf)
  pad = np.zeros((1,) + D.shape[1:])
  nxt = np.concatenate([diff, diff[-1:]])
  after = np.concatenate([diff[1:], diff[-1:], diff[-1:]])[:n]
  before = np.concatenate([pad, diff])
  trunc = np.maximum(np.maximum(nxt, after), before / 16)
  # converged at k, every finer quotient agrees with D_k up to its rounding
  for k in range(n - 2):
    dev = np.max(np.maximum(np.abs(D[k + 1:] - D[k]) - noise[k + 1:], 0), 0)
    trunc[k] = np.maximum(trunc[k], dev)
  # into step k the differences shrink: |D_k-2 - D_k-1| >= 4 |D_k-1 - D_k|
  shrinking = np.zeros(D.shape, bool)
  for k in range(2, n):
    shrinking[k] = diff[k - 2] >= 4 * diff[k - 1]
  shrinking[1:n - 1] |= shrinking[2:]  # or out of it, into the next step
  return np.where(shrinking | (nxt <= noise), trunc, np.inf)


def low_precision(dtype) -> bool:
  """bfloat16 and float16 (and narrower): too few bits for finite
  differences of their own."""
  return jnp.issubdtype(dtype, jnp.floating) and _bits(dtype) < 16


def estimate(f, xs, ts, out_dtypes, f_x, eps=None,
             cast_to=None) -> FDEstimate:
  """``J t`` of ``f`` (a function of the arrays ``xs`` returning a tuple of
  arrays, ``f_x`` at ``xs``) by central differences along ``ts``, with an
  error bound per element (see the module docstring). The values are
  returned in ``cast_to`` (default ``out_dtypes``)."""
  steps, quotients, evals = [], [], 0
  pairs = {}
  with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
    for h in candidate_steps([np.asarray(x).dtype for x in xs], eps):
      plus, minus = _shifted(xs, ts, h), _shifted(xs, ts, -h)
      if plus is None or minus is None:
        continue
      fp = _to64(f(*[jnp.asarray(v) for v in plus]))
      fm = _to64(f(*[jnp.asarray(v) for v in minus]))
      evals += 2
      pairs[h] = (fp, fm)
      steps.append(h)
      quotients.append([(p - m) / (2 * h) for p, m in zip(fp, fm)])
    if not steps:
      raise ValueError("no finite-difference step keeps x ± h t exact")
    f0 = _to64(f_x)
    # the rounding noise of f: its fourth difference at the smallest step
    hs = steps[-1]
    noise = [np.zeros_like(y) for y in f0]
    p2, m2 = _shifted(xs, ts, 2 * hs), _shifted(xs, ts, -2 * hs)
    if p2 is not None and m2 is not None and eps is None:
      fp2 = _to64(f(*[jnp.asarray(v) for v in p2]))
      fm2 = _to64(f(*[jnp.asarray(v) for v in m2]))
      evals += 2
      fp1, fm1 = pairs[hs]
      noise = [np.abs(a - 4 * b + 6 * c - 4 * d + e) / 4
               for a, b, c, d, e in zip(fm2, fm1, f0, fp1, fp2)]
    values, bounds, resolution, lost_n = [], [], 0.0, 0
    for j, dtype in enumerate(out_dtypes):
      ulp = float(jnp.finfo(dtype).eps)
      D = np.stack([q[j] for q in quotients])
      n = len(steps)
      diff = np.abs(np.diff(D, axis=0))                 # |D_k - D_k+1|
      # one noise level per leaf (an element's own fourth difference can be
      # zero by chance, and rounding inside f follows the scale of its
      # intermediates, not of the element); beyond sqrt(eps) max |f| the
      # fourth difference is curvature, not rounding
      top_f = float(np.max(np.abs(f0[j]))) if f0[j].size else 0.0
      measured = float(np.max(noise[j])) if noise[j].size else 0.0
      sigma = max(min(measured, np.sqrt(ulp) * top_f), ulp * top_f)
      h = np.asarray(steps).reshape((n,) + (1,) * f0[j].ndim)
      rounding = sigma / h + 4 * ulp * np.abs(D)
      trunc = _truncation(D, diff, 4 * rounding)
      est = np.where(np.isfinite(trunc + rounding), trunc + rounding, np.inf)
      best = np.argmin(est, axis=0)
      value = np.take_along_axis(D, best[None], 0)[0]
      bound = 2 * np.take_along_axis(est, best[None], 0)[0]
      # nowhere converged: the finest quotient, with an error of the order
      # of the spread of the quotients
      lost = ~np.isfinite(bound)
      if np.any(lost):
        spread = np.max(D, 0) - np.min(D, 0)
        value = np.where(lost, D[-1], value)
        bound = np.where(lost, 2 * (spread + np.abs(D[-1])) + rounding[-1],
                         bound)
      # where the error is of the order of the values, the quotient says
      # nothing: such elements are not compared (the report says so)
      top = float(np.max(np.abs(value))) if value.size else 0.0
      with np.errstate(invalid="ignore"):
        lost = bound > 0.5 * np.maximum(np.abs(value), top)
      lost_n += int(np.sum(lost & ~np.isnan(value)))
      bound = np.where(lost & ~np.isnan(value), np.inf, bound)
      # a tangent has its output's dtype
      values.append(value.astype((cast_to or out_dtypes)[j]))
      bounds.append(bound)
      finite = bound[np.isfinite(bound)]
      if finite.size and top > 0:
        resolution = max(resolution, float(np.max(finite)) / top)
  return FDEstimate([jnp.asarray(t) for t in ts], values, bounds, resolution,
                    evals, lost_n)
