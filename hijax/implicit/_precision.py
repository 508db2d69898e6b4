"""How precisely this backend multiplies matrices of a dtype, and so at which
matmul precision `hijax.implicit` evaluates what it iterates on and checks.

On a CPU a float32 matrix product is as precise as float32 at any
``jax.default_matmul_precision``. On a TPU it is not: at JAX's default
precision a float32 matrix product rounds its operands to bfloat16 (8
significant bits). Measured on a TPU v5e (jax 0.10.2), the largest error of
a 64x64 product relative to ``|A| |B|`` was 1.2e-3 at the default, 7.3e-6
under ``"high"`` and 4.8e-8 under ``"highest"`` (or ``"float32"``), against
3.7e-8 on a CPU; a matrix times one vector (``A @ x``) was float32's even at
the default there, but under ``vmap``, and for the many right-hand sides of
``jacfwd`` and ``jacrev``, ``A @ x`` becomes a matrix product. A check
computed at that precision refuses right answers (a backward error of 1e-3
against a tolerance of 3e-4), and an iteration whose products carry 1e-3
cannot meet a float32 tolerance of 1e-6.

`matmul_roundoff` measures it: one 128x128 matrix product of random normal
values on the default backend, at the precision in force
(``jax.default_matmul_precision``, else the backend's default). Its largest
error relative to ``|A| |B|`` (the sum of the magnitudes of the products,
which bounds what rounding each product and the sum can do), rounded up to
a power of two, is the product's roundoff: within a few units of the
dtype's roundoff (2**-24 for float32) where products are exact to the
dtype, about 2**-9 where the operands are rounded to bfloat16. It is
measured once per backend, dtype and precision, and kept. (A product of a
diagonal matrix, one term per entry, read as exact on a TPU v5e at the
default precision while random products there were off by 1e-3 relative:
the probe measures what solves do.)

`iteration_precision` says at which precision the user's functions (the
matvec of a linear solve, ``f`` and ``g`` of a fixed point or root) are
evaluated inside the solvers, and `check_precision` at which the checks
compute (the residual of a returned solution, the matrix `Dense` builds,
`CG`'s test of symmetry): as they are where the products at the precision
in force are exact to the dtype, ``"highest"`` where they are coarser (a
TPU at the default precision, or at a coarse one you chose). So a solve has
the accuracy of its dtype on any backend, and the tolerances of the dtype
hold; on a CPU every program is as it was. (Tolerances derived from the
coarse products instead were tried: 16 times the roundoff of bfloat16
operands, 2**-7, is a relative residual of 1/8, at which `CG` returned a
solution 25% off as converged. A product written with an explicit
``precision=`` keeps it: the context does not reach it.)
"""
from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["backend", "unit_roundoff", "matmul_roundoff", "coarse_products",
           "iteration_precision", "iteration_precision_of", "check_precision",
           "evaluated_at"]

_PROBE_SIZE = 128  # a matrix product, not a matrix-vector one
_MEASURED: dict[Any, float] = {}
_LOCK = threading.Lock()


def backend() -> str:
  """The platform computations go to: that of ``jax.default_device`` where
  one is set (a CPU beside a TPU), else of JAX's default backend ("cpu",
  "gpu", "tpu")."""
  device = jax.config.jax_default_device
  if device is not None:
    return device if isinstance(device, str) else device.platform
  return jax.default_backend()


def unit_roundoff(dtype: Any) -> float:
  """Half the machine epsilon of ``dtype`` (of its real part if complex):
  the largest relative error of rounding to it (2**-24 for float32)."""
  return float(jnp.finfo(dtype).eps) / 2


def _configured() -> Any:
  """``jax.default_matmul_precision`` in force (None where not set)."""
  return jax.config.jax_default_matmul_precision


def _product(a: Any, b: Any) -> Any:
  """The product measured: ``a @ b`` at the precision in force."""
  return jnp.matmul(a, b)


def _measure(dtype: np.dtype) -> float:
  rng = np.random.default_rng(0)
  a = rng.standard_normal((_PROBE_SIZE, _PROBE_SIZE)).astype(dtype)
  b = rng.standard_normal((_PROBE_SIZE, _PROBE_SIZE)).astype(dtype)
  with jax.ensure_compile_time_eval():  # run it now, also inside a trace
    got = np.asarray(jax.jit(_product)(a, b)).astype(np.float64)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  # relative to the sum of the products' magnitudes, which bounds what the
  # rounding of each product and of the sum can do (and is never zero)
  error = float(np.max(np.abs(got - a64 @ b64) / (np.abs(a64) @ np.abs(b64))))
  if not np.isfinite(error):
    return 1.
  return max(2. ** math.ceil(math.log2(error)), unit_roundoff(dtype)) \
      if error > 0 else unit_roundoff(dtype)


def matmul_roundoff(dtype: Any) -> float:
  """The largest error of a matrix product of ``dtype`` relative to the
  magnitudes summed, on the default backend at the precision in force,
  measured once (see the module's docstring): a few times
  ``unit_roundoff(dtype)`` where products are exact to the dtype (4 for
  float32 on a CPU). Complex dtypes are measured on their real part."""
  dtype = np.dtype(jnp.finfo(dtype).dtype)
  if dtype.itemsize == 8 and not jax.config.jax_enable_x64:
    return unit_roundoff(dtype)  # no 64-bit arrays to measure with
  key = (backend(), dtype, str(_configured()))
  with _LOCK:
    if key not in _MEASURED:
      _MEASURED[key] = _measure(dtype)
    return _MEASURED[key]


def coarse_products(dtype: Any) -> bool:
  """Whether this backend's matrix products of ``dtype``, at the precision
  in force, are less precise than ``dtype`` itself: by more than five bits
  (a sum of 128 products rounds a few units; a product made of several
  narrower ones, as a TPU's "highest", need not be correctly rounded; a
  TPU's "high", 45 units of float32's epsilon, is coarse)."""
  return (jnp.issubdtype(dtype, jnp.inexact)
          and matmul_roundoff(dtype) > 32 * unit_roundoff(dtype))


def iteration_precision(dtype: Any) -> Any:
  """The matmul precision the solvers evaluate the user's functions at:
  None (as they are) unless the products at the precision in force are
  coarser than ``dtype``; then ``"highest"``."""
  return "highest" if coarse_products(dtype) else None


def iteration_precision_of(tree: Any) -> Any:
  """`iteration_precision` for the unknowns ``tree``: ``"highest"`` where any
  of its leaves needs it."""
  for leaf in jax.tree.leaves(tree):
    dtype = jnp.result_type(leaf)
    if jnp.issubdtype(dtype, jnp.inexact) and iteration_precision(dtype):
      return "highest"
  return None


def check_precision(dtype: Any) -> Any:
  """The matmul precision of what the checks compute: ``"highest"`` where
  the precision in force is coarser than ``dtype``, else None."""
  return "highest" if coarse_products(dtype) else None


@contextlib.contextmanager
def evaluated_at(precision: Any) -> Iterator[None]:
  """Traces its body at ``precision`` (None: as it is)."""
  if precision is None:
    yield
  else:
    with jax.default_matmul_precision(precision):
      yield
