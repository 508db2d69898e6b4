"""The inputs ``pytest --hijax-check-rules`` checks a recorded rule at.

A sample recorded with its values (an eager call, or a traced one whose
values JAX knew) is checked at those values. A sample recorded as types
only (a call inside ``jit``, ``vmap``, ``scan``...) gets values leaf by
leaf, in this order of candidates (`candidates`); the first at which the
function runs and returns finite values is checked:

1. from other calls of the same rule with the same pytree structure: a
   leaf's value where the shape is the same, else values drawn uniformly
   between the smallest and the largest that leaf took (integers: the
   smallest; booleans: False);
2. drawn: floating-point values uniformly from `DRAW_RANGE`, [0.1, 0.9]
   (inside the domain of ``log``, ``sqrt``, ``arcsin``, ``logit``...),
   integers 0, booleans False.

The second candidate matters where the other calls were made on purpose
at inputs where the function raises (a test of an error path).
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from hijax.testing._plugin._recorder import RecordedRule, Sample

# The interval floating-point inputs are drawn from, where no call of the
# rule showed values.
DRAW_RANGE = (0.1, 0.9)

SOURCE_ORDER = {"eager": 0, "traced, values known": 1, "traced": 2,
                "too large to keep": 3}


def ordered(rule: RecordedRule) -> list[Sample]:
  """The rule's samples, in the order they are checked: by where their
  values come from (`SOURCE_ORDER`), then smallest first."""
  return sorted(rule.samples.values(),
                key=lambda s: (SOURCE_ORDER.get(s.source, 9), s.size))


def _from_calls(spec: jax.ShapeDtypeStruct, seen: list[Any],
                rng: np.random.Generator) -> tuple[Any, str] | None:
  dtype = np.dtype(spec.dtype)
  same = [x for x in seen if np.shape(x) == tuple(spec.shape)]
  if same:
    return np.asarray(same[0]).astype(dtype), "values of another call"
  seen = [np.asarray(x) for x in seen if np.size(x)]
  if not seen:
    return None
  if dtype.kind == "b":
    return np.zeros(spec.shape, dtype), "drawn"
  if dtype.kind in "iu":
    low = min(int(np.min(x)) for x in seen)
    return np.full(spec.shape, low, dtype), "drawn in the range seen"
  lo = float(min(np.min(x.real) for x in seen))
  hi = float(max(np.max(x.real) for x in seen))
  return _uniform(spec, lo, hi, rng), "drawn in the range seen"


def _uniform(spec, lo, hi, rng):
  dtype = np.dtype(spec.dtype)
  value = rng.uniform(lo, hi, spec.shape)
  if dtype.kind == "c":
    value = value + 1j * rng.uniform(lo, hi, spec.shape)
  return value.astype(dtype)


def _drawn(spec: jax.ShapeDtypeStruct, rng: np.random.Generator) -> Any:
  dtype = np.dtype(spec.dtype)
  if dtype.kind in "biu":
    return np.zeros(spec.shape, dtype)
  return _uniform(spec, *DRAW_RANGE, rng)


_HOW_ORDER = ("drawn", "drawn in the range seen", "values of another call")


def candidates(rule: RecordedRule, sample: Sample,
               rng: np.random.Generator) -> list[tuple[list[Any], str]]:
  """``(array inputs, where they came from)`` to try for ``sample``, in
  order (see the module docstring)."""
  if sample.concrete:
    return [([x for x in sample.leaves if x is not None], sample.source)]
  others = [s for s in rule.samples.values() if s.concrete
            and s.treedef == sample.treedef]
  from_calls, drawn, hows = [], [], set()
  for i, x in enumerate(sample.leaves):
    if x is None:
      continue
    if not isinstance(x, jax.ShapeDtypeStruct):
      from_calls.append(x)
      drawn.append(x)
      continue
    found = _from_calls(x, [s.leaves[i] for s in others
                            if s.leaves[i] is not None], rng)
    value = _drawn(x, rng)
    from_calls.append(value if found is None else found[0])
    hows.add("drawn" if found is None else found[1])
    drawn.append(value)
  how = next(h for h in _HOW_ORDER if h in hows)
  out = [(from_calls, f"{sample.source}; {how}")]
  if how != "drawn":
    out.append((drawn, f"{sample.source}; drawn"))
  return out


def as_jax(arrays: list[Any]) -> list[Any]:
  """NumPy values as JAX arrays (as the tests passed them; a function
  whose arguments are type-checked may refuse NumPy arrays); Python
  scalars as they are."""
  return [jax.numpy.asarray(x) if isinstance(x, (np.ndarray, np.generic))
          else x for x in arrays]
