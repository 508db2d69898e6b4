"""Central finite differences with an error bound and a verdict per output
element (the model: docs/checking-rules.md, "How finite differences are
judged"): exact power-of-two steps, per element the step with the smallest
estimated error (truncation seen to converge, plus rounding ``σ / h``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from hijax.testing._numerics import on_device, wide

# --- where the function is evaluated ----------------------------------------

def _bits(dtype) -> int:
  """Significand bits (with the implicit one): 53 for float64."""
  return int(jnp.finfo(dtype).nmant) + 1


def _signed_powers(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
  """``± 2^e`` with ``2^e <= |x| < 2^(e+1)`` per element (a zero: from its
  leaf's root mean square)."""
  a = np.abs(wide(x))
  tiny = float(jnp.finfo(x.dtype).tiny)
  ok = np.isfinite(a) & (a >= tiny)
  fill = float(np.sqrt(np.mean(a[ok] ** 2))) if np.any(ok) else 1.0
  e = np.floor(np.log2(np.where(ok, a, fill)))
  sign = rng.choice(np.array([-1.0, 1.0]), size=x.shape)
  return sign * np.exp2(e)


def scaled_tangents(rng: np.random.Generator, xs) -> list[np.ndarray]:
  """Random tangents: signed powers of two of their inputs' magnitudes."""
  out = []
  for x in map(np.asarray, xs):  # a complex one: each part on its own
    t = (_signed_powers(rng, x.real) + 1j * _signed_powers(rng, x.imag)
         if np.iscomplexobj(x) else _signed_powers(rng, x))
    out.append(t.astype(x.dtype))
  return out


def normalizer(ts, keep_in=None) -> float:
  """The power of two dividing the tangents to at most 1, each nonzero
  element staying normal in its dtype (or ``keep_in``'s)."""
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
  """Powers of two by factors of 4, from about ``eps^(1/3)`` down to the
  smallest step that keeps ``x ± h t`` exact."""
  if eps is not None:
    k = int(round(-np.log2(eps)))
    return [2.0 ** -k, 2.0 ** -(k + 2)]
  k0 = max(2, min(_bits(d) - 1 for d in dtypes) // 3)
  k1 = max(_bits(d) - 2 for d in dtypes)
  return [2.0 ** -k for k in range(k0, max(k0, k1) + 1, 2)]


def shifted(xs, ts, h):
  """``x + h t`` for each leaf, or None if one would round."""
  out = []
  for x, t in zip(xs, ts):
    x64, d = wide(x), h * wide(t)
    y = (x64 + d).astype(np.asarray(x).dtype)
    with np.errstate(invalid="ignore", over="ignore"):
      if not np.array_equal(wide(y) - x64, d):
        return None
    out.append(y)
  return out


def wider(dtype) -> np.dtype | None:
  """The dtype ``dtype`` inputs are differenced in where the function takes
  it (float32 for 16 bits, float64 for float32); None for float64."""
  dtype = np.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.inexact):
    return None
  bits = _bits(dtype)
  if bits >= 53:
    return None
  if jnp.issubdtype(dtype, jnp.complexfloating):
    return np.dtype(np.complex64 if bits < 16 else np.complex128)
  return np.dtype(np.float32 if bits < 16 else np.float64)


# --- the estimate ----------------------------------------------------------

RESOLVED, UNRESOLVED, NOT_SMOOTH, NOT_FINITE, BOUNDED = 0, 1, 2, 3, 4

# What an element's verdict means, as the report says it.
REASONS = {
    UNRESOLVED: "not resolved in this dtype at this point (the error "
                "estimate is of the order of the value)",
    NOT_SMOOTH: "not smooth at the scale of the steps (a kink, a jump, or "
                "a variation faster than the smallest step: one-sided "
                "differences disagree)",
    NOT_FINITE: "not finite on one side of the point (a domain boundary or "
                "a pole), or infinite at it",
    BOUNDED: "flat at this point in this dtype (the function is constant "
             "to its last bit at every step), which bounds the derivative "
             "but does not resolve it: a rule is only checked to stay "
             "within that bound",
}

# Elements with these verdicts are not compared with anything.
SKIPPED = (NOT_SMOOTH, NOT_FINITE)

# Absolute floors (of rounding measured or implied by the inputs' dtype) are
# allowed this many times over.
FLOOR = 4.0


@dataclasses.dataclass
class FDEstimate:
  """Estimates of ``J t`` along ``tangents``, per floating-point output:
  ``values``, error ``bounds`` (``inf``: not resolved), verdicts
  (``status``), ``floors`` (how much two correct evaluations may differ),
  ``center`` (the outputs at the point), ``own`` (elements resolved on
  their own scale, judged against themselves, not their leaf)."""
  tangents: list
  values: list
  bounds: list
  status: list
  evaluations: int
  floors: list = dataclasses.field(default_factory=list)
  center: list = dataclasses.field(default_factory=list)
  own: list = dataclasses.field(default_factory=list)

  def count(self, verdict: int) -> int:
    return int(sum(np.sum(s == verdict) for s in self.status))

  def flat(self) -> list[np.ndarray]:
    """The elements whose derivative is zero to the estimate's resolution
    (judged, and no larger than their bound)."""
    with np.errstate(invalid="ignore"):
      return [~np.isin(s, SKIPPED) & ~(np.abs(np.asarray(v)) > b)
              for v, b, s in zip(self.values, self.bounds, self.status)]

  def uncounted(self) -> list[np.ndarray]:
    """The `BOUNDED` elements: they refute a rule, never confirm one."""
    return [s == BOUNDED for s in self.status]

  def skipped(self) -> list[np.ndarray]:
    """The elements compared with nothing (not smooth or not finite)."""
    return [np.isin(s, SKIPPED) for s in self.status]


def _truncation(D, diff, noise, agree=None):
  """The truncation error of each quotient ``D_k``: the largest of the next
  two differences, the previous one / 16 and the disagreement with every
  finer quotient beyond ``agree`` (its rounding); ``inf`` where the
  differences are not seen to shrink into step k (by 4 where 16 is
  expected) nor explained by rounding (``noise``), or ``D_k`` is NaN."""
  agree = noise if agree is None else agree
  n = len(D)
  if n == 1:
    return np.full(D.shape, np.inf)
  diff = np.where(np.isnan(diff), np.inf, diff)
  pad = np.zeros((1,) + D.shape[1:])
  nxt = np.concatenate([diff, diff[-1:]])
  after = np.concatenate([diff[1:], diff[-1:], diff[-1:]])[:n]
  before = np.concatenate([pad, diff])
  trunc = np.maximum(np.maximum(nxt, after), before / 16)
  # converged at k, every finer quotient agrees with D_k up to its rounding
  with np.errstate(invalid="ignore"):
    for k in range(n - 2):
      gap = np.abs(D[k + 1:] - D[k]) - agree[k + 1:]
      dev = np.max(np.where(np.isnan(gap), 0.0, np.maximum(gap, 0)), 0)
      trunc[k] = np.maximum(trunc[k], dev)
  # into step k the differences shrink: |D_k-2 - D_k-1| >= 4 |D_k-1 - D_k|
  shrinking = np.zeros(D.shape, bool)
  for k in range(2, n):
    shrinking[k] = diff[k - 2] >= 4 * diff[k - 1]
  shrinking[1:n - 1] |= shrinking[2:]  # or out of it, into the next step
  trunc = np.where(shrinking | (nxt <= noise), trunc, np.inf)
  return np.where(np.isnan(D), np.inf, trunc)


def _noise(fm2, fm1, f0, fp1, fp2, fm4=None, fp4=None):
  """Per element, the rounding noise of ``f``: ``|q1| / 4`` (``q1`` the
  fourth difference at the smallest step) or, with the points at ``± 4h``,
  ``|q2 - 16 q1| / 64``, which removes the curvature both share."""
  q1 = fm2 - 4 * fm1 + 6 * f0 - 4 * fp1 + fp2
  if fm4 is None:
    return np.abs(q1) / 4
  q2 = fm4 - 4 * fm2 + 6 * f0 - 4 * fp2 + fp4
  return np.abs(q2 - 16 * q1) / 64


def _not_smooth(S, valid, sigma):
  """Elements whose second differences (steps shrinking by 4) do not shrink
  by about 16 between the two finest steps well above rounding (``16 σ``):
  a kink (they shrink by 4) or a jump (they do not shrink)."""
  n = len(S)
  found = np.zeros(S.shape[1:], bool)
  decided = np.zeros(S.shape[1:], bool)
  with np.errstate(invalid="ignore", divide="ignore"):
    big = valid & (np.abs(S) > 16 * sigma)
    for k in range(n - 2, -1, -1):  # the finest pair first
      pair = big[k] & big[k + 1] & ~decided
      ratio = np.abs(S[k + 1]) / np.abs(S[k])
      found |= pair & (ratio > 1 / 8)
      decided |= pair
  return found


def _rough(S, valid, sigma):
  """Elements whose second differences above rounding (``4 σ``) at two
  successive steps do not shrink by 4 between them: ``f`` varies faster
  than the steps resolve (float32 at a large argument)."""
  found = np.zeros(S.shape[1:], bool)
  with np.errstate(invalid="ignore", divide="ignore"):
    big = valid & (np.abs(S) > 4 * sigma)
    for k in range(len(S) - 1):
      pair = big[k] & big[k + 1]
      found |= pair & (np.abs(S[k + 1]) > np.abs(S[k]) / 4)
  return found


def _curvature(S, valid, sigma, h):
  """Per element, ``|t'H t|`` from the finest second difference above
  rounding (``4 σ``), else the largest rounding allows at the coarsest."""
  with np.errstate(invalid="ignore", divide="ignore"):
    big = valid & (np.abs(S) > 4 * sigma)
    curv = np.where(big, np.abs(S) / h ** 2, np.nan)
    finest = np.full(S.shape[1:], np.nan)
    for k in range(len(S)):
      finest = np.where(big[k], curv[k], finest)
    return np.where(np.isnan(finest), 4 * sigma / h[0] ** 2, finest)


def _finite_max(a) -> float:
  a = np.abs(a)
  a = a[np.isfinite(a)]
  return float(np.max(a)) if a.size else 0.0


def estimate(evaluate: Callable, xs, ts, out_dtypes, f_x=None, eps=None,
             cast_to: Sequence | None = None,
             tangent_dtypes: Sequence | None = None,
             combines: float | None = None) -> FDEstimate:
  """``J t`` by central differences along ``ts`` (`FDEstimate`).
  ``evaluate``: each of a list of points' floating-point outputs, in one
  call; ``f_x``: the outputs at ``xs`` (None: evaluated too); values in
  ``cast_to``, tangents in ``tangent_dtypes``; ``combines``: the size of
  what the function combines (an element far smaller is a cancellation's
  remainder, its noise at least ``eps combines``)."""
  steps, points = [], []
  for h in candidate_steps([np.asarray(x).dtype for x in xs], eps):
    plus, minus = shifted(xs, ts, h), shifted(xs, ts, -h)
    if plus is not None and minus is not None:
      steps.append(h)
      points += [plus, minus]
  if not steps:
    raise ValueError("no finite-difference step keeps x ± h t exact")
  hs = steps[-1]
  p2, m2 = shifted(xs, ts, 2 * hs), shifted(xs, ts, -2 * hs)
  with_noise = p2 is not None and m2 is not None and eps is None
  if with_noise:
    points += [p2, m2]
  if f_x is None:
    points.append([np.asarray(x) for x in xs])
  raw = evaluate(points)
  if f_x is None:
    f_x = raw.pop()
  outs = [[wide(v) for v in o] for o in raw]
  n = len(steps)
  scale = normalizer(ts, tangent_dtypes)
  f0s = [wide(v) for v in f_x]
  values, bounds, status, floors, owns = [], [], [], [], []
  eps_in = max(float(jnp.finfo(d).eps) for d in (
      tangent_dtypes or [np.asarray(t).dtype for t in ts]))
  with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
    for j, dtype in enumerate(out_dtypes):
      ulp = float(jnp.finfo(dtype).eps)
      f0 = f0s[j]
      FP = np.stack([outs[2 * k][j] for k in range(n)])
      FM = np.stack([outs[2 * k + 1][j] for k in range(n)])
      finite0 = np.isfinite(f0)
      valid = np.isfinite(FP) & np.isfinite(FM) & finite0
      h = np.asarray(steps).reshape((n,) + (1,) * f0.ndim)
      D = np.where(valid, (FP - FM) / (2 * h), np.nan)
      S = np.where(valid, FP - 2 * f0 + FM, np.nan)
      # the rounding noise of each element: its own, but at least the
      # median of its leaf's (an element's own fourth difference can be zero
      # by chance) and eps |f|; a kink is judged against the leaf's level
      # alone (at a kink the element's own fourth difference is the kink)
      top_f = _finite_max(f0)
      own = np.zeros(f0.shape)
      if with_noise:
        fp2, fm2 = outs[-2][j], outs[-1][j]
        extra = ((FM[-2], FP[-2]) if n > 1 and steps[-2] == 4 * hs
                 else ())
        own = _noise(fm2, FM[-1], f0, FP[-1], fp2, *extra)
        own = np.where(np.isfinite(own), own, 0.0)
      level = max(float(np.median(own)) if own.size else 0.0, ulp * top_f)
      sigma = np.maximum(own, level)
      if combines:
        small = ~(np.abs(f0) >= np.sqrt(ulp) * combines)
        sigma = np.where(small, np.maximum(sigma, ulp * combines), sigma)
      rounding = sigma / h + 4 * ulp * np.abs(D)
      diff = np.abs(np.diff(D, axis=0))                 # |D_k - D_k+1|
      trunc = _truncation(D, diff, 4 * rounding, agree=2 * rounding)
      est = np.where(np.isfinite(trunc + rounding), trunc + rounding, np.inf)
      best = np.argmin(est, axis=0)
      value = np.take_along_axis(D, best[None], 0)[0]
      bound = 2 * np.take_along_axis(est, best[None], 0)[0]
      # nowhere converged: the finest valid quotient, with an error of the
      # order of the spread of the quotients
      lost = ~np.isfinite(bound)
      if np.any(lost):
        last = np.argmax(np.cumsum(valid, 0) == np.sum(valid, 0)[None], 0)
        finest = np.take_along_axis(D, last[None], 0)[0]
        gaps = np.abs(D - finest)
        spread = np.max(np.where(np.isnan(gaps), 0.0, gaps), 0)
        value = np.where(lost, finest, value)
        bound = np.where(lost, 2 * (spread + np.abs(finest))
                         + np.take_along_axis(rounding, last[None], 0)[0],
                         bound)
      # exact differences: every quotient the same, to the last bit (a
      # function flat, linear or piecewise constant along t at these
      # steps). Their value is known: what the function's rounding could
      # hide at the largest step, and the quotient's own rounding, bound it.
      exact = (np.all(valid, 0) & np.all(D == D[:1], 0) if n >= 3
               else np.zeros(f0.shape, bool))
      if np.any(exact):
        tiny = float(np.finfo(np.dtype(dtype)).tiny)
        hidden = np.maximum(sigma, tiny) / steps[0]
        value = np.where(exact, D[0], value)
        bound = np.where(exact, 2 * (hidden + 4 * ulp * np.abs(D[0])), bound)
      verdict = np.full(f0.shape, RESOLVED, np.int8)
      verdict[_not_smooth(S, valid, level)] = NOT_SMOOTH
      verdict[(finite0 & ~np.any(valid, 0)) | np.isinf(f0)] = NOT_FINITE
      # where the error is of the order of the values, the quotient says
      # nothing: such elements are compared for NaN only. Where f itself is
      # NaN, so is the quotient, and a rule must give NaN too.
      ok = (verdict == RESOLVED) & ~np.isnan(f0)
      top = _finite_max(np.where(ok, value, 0))
      unresolved = ok & ~(bound <= 0.5 * np.maximum(np.abs(value), top))
      # an element resolved only on its leaf's scale claims a derivative of
      # about zero, which holds only where f is seen to be smooth
      small = ok & ~unresolved & ~(bound <= np.abs(value))
      unresolved |= small & _rough(S, valid, sigma)
      unresolved &= ~exact
      verdict[unresolved] = UNRESOLVED
      if np.any(exact):
        # resolved where the bound is small next to the derivative (its
        # own or its leaf's); else it only bounds it
        coarse = exact & (verdict == RESOLVED) & ~(
            bound <= 0.5 * np.maximum(np.abs(value), top))
        verdict[coarse] = BOUNDED
      bound = np.where(np.isin(verdict, (RESOLVED, BOUNDED)), bound, np.inf)
      # what rounding the inputs to their own dtype changes: in f, eps |J t|
      # (t of the size of x); in J t, eps t'H t (from the finest second
      # difference above rounding, or the rounding itself)
      curvature = _curvature(S, valid, sigma, h)
      with np.errstate(invalid="ignore"):
        slope = np.where(np.isfinite(value), np.abs(value), 0.0)
      floors.append(FLOOR * (sigma + eps_in * slope))
      value = np.where(np.isin(verdict, SKIPPED), np.nan, value) / scale
      bound = (bound + FLOOR * eps_in * curvature) / scale
      # a tangent has its output's dtype
      values.append(value.astype((cast_to or out_dtypes)[j]))
      bounds.append(bound)
      status.append(verdict)
      owns.append((verdict == RESOLVED) & (bound <= 0.5 * np.abs(value)))
  tangents = [on_device((np.asarray(t) / scale).astype(
      np.asarray(t).dtype if tangent_dtypes is None else tangent_dtypes[i]))
              for i, t in enumerate(ts)]
  return FDEstimate(tangents, values, bounds, status, len(points),
                    floors, list(f_x), owns)
