"""hijax: custom JAX primitives with your own derivative and batching rules.

Subclass `HiPrim`, declare the argument and result types, give an `expand`
implementation in ordinary JAX, and add the rules the transformations you use
need (see the JAX 301 pages, "Custom derivative rules with hijax primitives").
"""
from jax._src.core import ShapedArray

from hijax.primitive import HiPrim
from hijax.autodiff import (GradAccum, NullAccum, RefAccum, ValAccum, Zero,
                            instantiate_zeros)
from hijax import batching as _batching  # noqa: F401  (installs the vmap rule)
from hijax.derived import (jvp_from_lin, linearize_from_jvp, vjp_from_jvp,
                           vjp_from_lin)

__all__ = [
    "HiPrim", "ShapedArray", "Zero", "instantiate_zeros", "GradAccum",
    "ValAccum", "RefAccum", "NullAccum", "linearize_from_jvp", "vjp_from_lin",
    "vjp_from_jvp", "jvp_from_lin",
]
__version__ = "0.1.0"
